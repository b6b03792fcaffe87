"""The Guarantee every output carries, and the data-dependent figures kept apart from it."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any

import numpy as np
import pytest

from dpinfer.accounting import DataDependentSpend, GroupGuarantee, Guarantee, SingleOrderRdp, Zcdp
from dpinfer.errors import ConfigurationError

ADJACENCY = "replace-by-null of one privacy group's tagged spans"


def fusion_guarantee(**overrides: Any) -> Guarantee:
    losses = {"PERSON": SingleOrderRdp(2.0, 3.0), "CODE": SingleOrderRdp(2.0, 1.0)}
    groups = [
        GroupGuarantee.from_loss(name, loss, delta=1e-5, parameters={"beta": 0.01}) for name, loss in losses.items()
    ]
    arguments: dict[str, Any] = {
        "delta": 1e-5,
        "mechanism": "dp-fusion",
        "adjacency": ADJACENCY,
        "parameters": {"alpha": 2.0, "betas": [0.01, 0.005], "tau": 1.0, "top_p": None},
        "max_new_tokens": 256,
        "groups": groups,
    }
    return Guarantee.from_loss(losses["PERSON"], **{**arguments, **overrides})


def test_from_loss_converts_the_loss_and_records_the_order() -> None:
    guarantee = fusion_guarantee()
    assert guarantee.epsilon == SingleOrderRdp(2.0, 3.0).to_epsilon(1e-5)
    assert guarantee.order == 2.0 and guarantee.loss == SingleOrderRdp(2.0, 3.0)
    plain = Guarantee.from_loss(Zcdp(1.0), delta=1e-6, mechanism="m", adjacency="a", parameters={}, max_new_tokens=9)
    assert plain.order is None and plain.loss == Zcdp(1.0)


def test_statement_is_plain_english_and_ex_ante() -> None:
    text = str(fusion_guarantee())
    assert text.startswith("dp-fusion: (ε = 13.2, δ = 1e-05)-differential privacy for each privacy group")
    assert "PERSON: ε = 13.2; CODE: ε = 11.2" in text and ADJACENCY in text
    assert "before reading the private data" in text and "at most 256 generated tokens" in text
    assert "order α = 2" in text and "as published" not in text


def test_printed_epsilon_is_rounded_up() -> None:
    guarantee = fusion_guarantee()
    printed = float(re.search(r"ε = ([0-9.]+)", str(guarantee)).group(1))  # type: ignore[union-attr]
    assert guarantee.epsilon <= printed < guarantee.epsilon + 0.1


def test_to_dict_is_json_and_round_trips() -> None:
    guarantee = fusion_guarantee()
    data = guarantee.to_dict()
    assert json.loads(json.dumps(data, allow_nan=False)) == data == json.loads(guarantee.to_json())
    assert data["parameters"]["betas"] == [0.01, 0.005] and data["statement"] == str(guarantee)
    assert "loss" not in data
    assert Guarantee.from_dict(json.loads(guarantee.to_json())) == guarantee


def test_no_privacy_renders_plainly_and_serialises_infinity_as_a_string() -> None:
    guarantee = Guarantee.no_privacy(mechanism="sampler")
    assert str(guarantee) == "sampler: no privacy guarantee."
    data = json.loads(json.dumps(guarantee.to_dict(), allow_nan=False))
    assert data["epsilon"] == "inf" and data["delta"] == 0.0
    assert Guarantee.from_dict(data) == guarantee


def test_worst_group_and_headline_must_cover_every_group() -> None:
    guarantee = fusion_guarantee()
    assert guarantee.worst_group().name == "PERSON"  # type: ignore[union-attr]
    assert Guarantee.no_privacy("x").worst_group() is None
    with pytest.raises(ConfigurationError, match="worst group"):
        dataclasses.replace(guarantee, epsilon=1.0)
    with pytest.raises(ConfigurationError, match="distinct"):
        dataclasses.replace(guarantee, groups=(guarantee.groups[0], guarantee.groups[0]))


def test_as_published_and_ex_post_figures_are_flagged() -> None:
    published = fusion_guarantee(accounting="as_published")
    assert "as published by the mechanism's authors" in str(published)
    ex_post = dataclasses.replace(published, ex_ante=False)
    assert str(ex_post).startswith("dp-fusion: no differential-privacy guarantee")
    assert "data-dependent" in str(ex_post) and "before reading" not in str(ex_post)


def test_parameters_are_read_only_sorted_and_plain() -> None:
    guarantee = fusion_guarantee(parameters={"z": np.float64(0.5), "a": np.int64(3), "nested": {"k": [1, 2]}})
    assert list(guarantee.parameters) == ["a", "nested", "z"]
    assert type(guarantee.parameters["a"]) is int and type(guarantee.parameters["z"]) is float
    assert guarantee.parameters["nested"]["k"] == (1, 2)
    with pytest.raises(TypeError):
        guarantee.parameters["a"] = 4  # type: ignore[index]
    assert hash(guarantee) == hash(fusion_guarantee(parameters={"other": 1}))  # parameters are not hashed
    with pytest.raises(dataclasses.FrozenInstanceError):
        guarantee.epsilon = 0.0  # type: ignore[misc]


@pytest.mark.parametrize(
    "overrides",
    [
        {"delta": 1.0},
        {"delta": -1e-5},
        {"epsilon": -1.0},
        {"epsilon": math.nan},
        {"mechanism": ""},
        {"adjacency": ""},
        {"accounting": "mine"},
        {"order": 1.0},
        {"max_new_tokens": -1},
        {"max_new_tokens": 2.5},
        {"parameters": {"model": object()}},
        {"parameters": {1: "non-string key"}},
        {"groups": ("PERSON",)},
    ],
)
def test_guarantee_validates(overrides: dict[str, Any]) -> None:
    base = {"epsilon": 1.0, "delta": 1e-5, "mechanism": "m", "adjacency": "replace-one"}
    with pytest.raises(ConfigurationError):
        Guarantee(**{**base, **overrides})


def test_group_guarantee_validates_and_round_trips() -> None:
    group = GroupGuarantee("PERSON", math.inf, 1e-5)
    assert GroupGuarantee.from_dict(json.loads(json.dumps(group.to_dict(), allow_nan=False))) == group
    with pytest.raises(ConfigurationError):
        GroupGuarantee("", 1.0, 1e-5)


def test_data_dependent_spend_never_reads_as_a_guarantee() -> None:
    spend = DataDependentSpend("dp-fusion", "sum of realised Rényi divergences at order 2 (PERSON)", math.inf)
    assert "data-dependent" in spend.label and "not a guarantee" in spend.label
    assert spend.label in str(spend) and "ε" not in str(spend)
    data = json.loads(json.dumps(spend.to_dict(), allow_nan=False))
    assert data["value"] == "inf" and data["label"] == spend.label
    for quantity in ("realised ε", "empirical Epsilon"):
        with pytest.raises(ConfigurationError, match="not a guarantee"):
            DataDependentSpend("dp-fusion", quantity, 1.0)
    with pytest.raises(ConfigurationError):
        DataDependentSpend("dp-fusion", "divergence", math.nan)
