"""The accountant's history (dp_accounting's ``PrivacyAccountant.compose(event, count)``): composition equals the
closed form, adjacency is an enum that composes to the relation every release covers, and a history saved to JSON
loads back to the same loss."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpinfer.accounting import (
    Adjacency,
    NoGuaranteeEvent,
    NoLossEvent,
    PrivacyAccountant,
    Zcdp,
    compose,
    compose_steps,
)
from dpinfer.accounting.calibration import Budget, Spec
from dpinfer.accounting.events import UniformMixtureEvent
from dpinfer.accounting.gaussian import GaussianShiftEvent
from dpinfer.errors import ConfigurationError
from dpinfer.mechanisms.pad import Pad


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])  # a loaded machine draws slowly
@given(st.lists(st.tuples(st.floats(0.01, 5.0), st.floats(0.5, 3.0), st.integers(1, 200)), min_size=1, max_size=6))
def test_composed_history_equals_the_sum_of_its_entries(entries):
    acc = PrivacyAccountant(Adjacency.REPLACE_BY_NULL)
    for sens, sigma, count in entries:
        acc.compose(GaussianShiftEvent(sens, sigma), count)
    expected = compose(*(compose_steps(GaussianShiftEvent(s, g), c) for s, g, c in entries))
    assert acc.loss().rho == pytest.approx(expected.rho, rel=1e-12)
    assert acc.epsilon(1e-5) == pytest.approx(expected.to_epsilon(1e-5), rel=1e-12)


def test_pad_answers_compose_to_the_pinned_session_figure():
    """Two PAD answers at ε = 8, T_max = 10 (replace-by-null): ρ adds, converted once (as the RAG session did)."""
    mech = Pad.calibrated(Budget(8.0, 1e-5), Spec(10))
    acc = PrivacyAccountant()
    for _ in range(2):
        acc.compose(mech.loss_event(), 10, adjacency=mech.adjacency, label="pad", delta=1e-5)
    acc.compose(NoLossEvent(), adjacency="replace-by-null", label="public")
    assert acc.loss() == Zcdp(2 * mech.rho(10))
    assert acc.guarantee(mechanism="s", adjacency="x").epsilon == Zcdp(2 * mech.rho(10)).to_epsilon(1e-5)


def test_a_release_without_a_guarantee_voids_the_history():
    acc = PrivacyAccountant(Adjacency.REPLACE_BY_NULL).compose(GaussianShiftEvent(1.0, 1.0), 3)
    acc.compose(NoGuaranteeEvent(), label="none")
    assert not acc.bounded and acc.loss() is None and math.isinf(acc.epsilon(1e-5))
    assert math.isinf(acc.guarantee(mechanism="s", adjacency="x").epsilon)


def test_adjacency_is_an_enum_and_composes_to_the_relation_all_releases_cover():
    assert Adjacency("replace-one") is Adjacency.REPLACE_ONE and json.dumps(Adjacency.REPLACE_ONE) == '"replace-one"'
    acc = PrivacyAccountant()
    acc.compose(GaussianShiftEvent(1.0, 1.0), adjacency=Adjacency.REPLACE_ONE)
    assert acc.relation() is Adjacency.REPLACE_ONE
    acc.compose(GaussianShiftEvent(1.0, 1.0), adjacency="replace-by-null")
    assert acc.relation() is Adjacency.REPLACE_BY_NULL  # replace-one covers replace-by-null, not the reverse
    strict = PrivacyAccountant(Adjacency.REPLACE_ONE)
    with pytest.raises(ConfigurationError, match="does not cover"):
        strict.compose(GaussianShiftEvent(1.0, 1.0), adjacency=Adjacency.REPLACE_BY_NULL)
    assert len(strict) == 0  # refused: nothing appended
    with pytest.raises(ConfigurationError, match="adjacency must be one of"):
        PrivacyAccountant("add-one")
    with pytest.raises(ConfigurationError, match="do not compose"):
        Adjacency.common(["add-or-remove", "replace-by-null"])


def test_history_saves_and_loads_as_json(tmp_path):
    acc = PrivacyAccountant(Adjacency.REPLACE_BY_NULL)
    acc.compose(GaussianShiftEvent(0.3, 1.5), 64, label="pad", delta=1e-5)
    acc.compose(UniformMixtureEvent(0.5, 4), 7, label="dp-decoding")
    acc.compose(NoLossEvent(), label="public")
    path = tmp_path / "history.json"
    acc.save(path)
    back = PrivacyAccountant.load(path)
    assert back.history == acc.history and back.adjacency is Adjacency.REPLACE_BY_NULL
    assert back.epsilon(1e-5) == acc.epsilon(1e-5)
    assert [p.name for p in tmp_path.iterdir()] == ["history.json"]  # no temporary file left


@pytest.mark.parametrize("text, pattern", [
    ("not json", "not valid JSON"),
    ('{"history": 3}', "'history' list"),
    ('{"history": [{"event": "os:system", "params": {}, "count": 1, "adjacency": "replace-one"}]}', "unknown event"),
    ('{"history": [{"event": "dpinfer.accounting.accountant:PrivacyAccountant", "count": 1, '
     '"adjacency": "replace-one"}]}', "not a loss event"),
    ('{"history": [{"event": "dpinfer.accounting.gaussian:GaussianShiftEvent", "params": {"x": 1}, "count": 1, '
     '"adjacency": "replace-one"}]}', "bad params"),
    ('{"history": [{"event": "dpinfer.accounting.gaussian:GaussianShiftEvent", "params": {"sensitivity": 1, '
     '"sigma": 1}, "count": 0, "adjacency": "replace-one"}]}', "count"),
])
def test_a_bad_saved_history_is_refused_in_one_line(text, pattern):
    with pytest.raises(ConfigurationError, match=pattern) as info:
        PrivacyAccountant.from_json(text)
    assert "\n" not in str(info.value)
