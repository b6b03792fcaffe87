"""The shared checks (dpinfer.validation) as the API meets them: every parameter refused before the model loads, with
a message that says what was expected, and the torch-free DP-Fusion budget pre-check (moved from the CLI suites)."""

from __future__ import annotations

import pytest

from dpinfer.accounting.calibration import Budget, Spec
from dpinfer.errors import ConfigurationError, InfeasibleBudgetError, InvalidInputError
from dpinfer.pipelines.synthesize import synthesize


def test_synthesize_refuses_non_text_references_before_the_model() -> None:
    with pytest.raises(InvalidInputError, match="Reference or a string, got int"):
        synthesize([1, 2, 3], lm="no/such-model", epsilon=5.0, batch_size=1)
    with pytest.raises(InvalidInputError, match="got str"):
        synthesize("abc", lm="no/such-model", epsilon=5.0, batch_size=1)
    with pytest.raises(InvalidInputError, match="empty"):
        synthesize([], lm="no/such-model", epsilon=5.0, batch_size=1)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"epsilon": -1.0}, ConfigurationError, "epsilon"),
    ({"epsilon": None}, ConfigurationError, "required"),
    ({"temperature": 0.0}, ConfigurationError, "temperature"),
    ({"top_k": 0}, ConfigurationError, "top_k"),
    ({"seed": -1}, ConfigurationError, "seed"),
    ({"max_texts": 0}, ConfigurationError, "max_texts"),
    ({"max_reference_tokens": 0}, ConfigurationError, "max_reference_tokens"),
    ({"epsilon": 1e-6}, InfeasibleBudgetError, "reach"),
])
def test_synthesize_parameter_errors_come_before_the_model(kwargs, error, match) -> None:
    args = {"epsilon": 5.0, "batch_size": 2, **kwargs}
    with pytest.raises(error, match=match):
        synthesize(["a", "b", "c", "d"], lm="no/such-model", **args)


def test_generate_type_errors_say_what_was_expected() -> None:
    from dpinfer.generation import generate, generate_many

    with pytest.raises(InvalidInputError, match="must be a string, got int"):
        generate(123, lm="no/such-model")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="white space"):
        generate(" \n ", lm="no/such-model")
    with pytest.raises(ConfigurationError, match="temperature"):
        generate("x", lm="no/such-model", temperature=-1)
    with pytest.raises(InvalidInputError, match="got str"):
        generate_many("abc", lm="no/such-model")
    with pytest.raises(InvalidInputError, match="dict"):
        generate(messages=[{"role": "user"}], lm="no/such-model")


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"alpha": 0.5}, ConfigurationError, "alpha"),
    ({"temperature": 0.0}, ConfigurationError, "temperature"),
    ({"top_k": 0}, ConfigurationError, "top_k"),
    ({"max_new_tokens": 0}, ConfigurationError, "max_new_tokens"),
    ({"no_repeat_ngram": -1}, ConfigurationError, "no_repeat_ngram"),
    ({"tagger": "nope"}, ConfigurationError, "tagger"),
    ({"group_epsilon": {"NAMES": 3}}, InvalidInputError, "neither a group nor a label"),
    ({"groups": {"ID": ["NOPE"]}}, InvalidInputError, "unknown label"),
])
def test_sanitize_api_parameter_errors_come_before_the_model(kwargs, error, match) -> None:
    from dpinfer.pipelines.sanitize import sanitize

    with pytest.raises(error, match=match):
        sanitize("The applicant lives in Vienna.", lm="no/such-model", **kwargs)
    with pytest.raises(InvalidInputError, match="must be a string, got int"):
        sanitize(123, lm="no/such-model")  # type: ignore[arg-type]


@pytest.mark.parametrize("alpha", [1.5, 2.0, 4.0, 8.0, 32.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-9])
def test_fast_budget_check_matches_dp_fusion_calibration(alpha, delta) -> None:
    """The torch-free pre-check refuses exactly what DP-Fusion's calibration refuses (at any T_max)."""
    from dpinfer.defaults import SANITIZE
    from dpinfer.mechanisms.dp_fusion import DPFusion
    from dpinfer.mechanisms.dp_fusion import conversion_cost as slow
    from dpinfer.validation import check_sanitize_budget, conversion_cost

    assert conversion_cost(alpha, delta) == pytest.approx(slow(alpha, delta), rel=1e-12)
    floor = slow(alpha, delta)
    below, above = floor * (1 - 1e-3), floor * (1 + 1e-2)
    with pytest.raises(InfeasibleBudgetError, match="smallest reachable"):
        check_sanitize_budget(epsilon=below, delta=delta, alpha=alpha)
    check_sanitize_budget(epsilon=above, delta=delta, alpha=alpha)
    for t_max in (1, 700):
        with pytest.raises(InfeasibleBudgetError):
            DPFusion.calibrated(Budget({"G": below}, delta), Spec(t_max, alpha=alpha))
        DPFusion.calibrated(Budget({"G": above}, delta), Spec(t_max, alpha=alpha))
    assert SANITIZE.epsilon == 40.0  # the default the pre-check assumes (it reads it from dpinfer.defaults)
