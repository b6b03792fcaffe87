"""Calibration of a mechanism's knob to a target (ε, δ), and the InvisibleInk worked example (ALGORITHMS §2)."""

from __future__ import annotations

import math
import re

import pytest

from dpinfer.accounting import PrivacyLoss, SingleOrderRdp, Zcdp, calibrate, zcdp_rho_for_target
from dpinfer.errors import ConfigurationError, InfeasibleBudgetError

RTOL = 1e-6


def gaussian(sigma: float) -> PrivacyLoss:
    """100 Gaussian steps of sensitivity 1: a knob where larger is more private."""
    return Zcdp(1 / (2 * sigma**2)).times(100)


def fusion(beta: float, alpha: float = 2.0) -> PrivacyLoss:
    """A DP-Fusion-like bound: 256 steps of α·β each, held at order α only: a knob where larger is less private."""
    return SingleOrderRdp(alpha, alpha * beta).times(256)


def test_increasing_knob_meets_the_target_and_a_slightly_larger_one_does_not() -> None:
    beta = calibrate(fusion, epsilon=12.0, delta=1e-5, lo=0.0, hi=1.0, rtol=RTOL)
    assert fusion(beta).to_epsilon(1e-5) <= 12.0
    assert fusion(beta * (1 + 2 * RTOL)).to_epsilon(1e-5) > 12.0


def test_decreasing_knob_meets_the_target_and_a_slightly_smaller_one_does_not() -> None:
    sigma = calibrate(gaussian, epsilon=2.0, delta=1e-6, lo=0.5, hi=1e3, increasing=False, rtol=RTOL)
    assert gaussian(sigma).to_epsilon(1e-6) <= 2.0
    assert gaussian(sigma * (1 - 2 * RTOL)).to_epsilon(1e-6) > 2.0


def test_the_least_private_end_is_returned_when_it_meets_the_target() -> None:
    assert calibrate(Zcdp, epsilon=100.0, delta=1e-5, lo=0.0, hi=1.0) == 1.0
    assert calibrate(gaussian, epsilon=100.0, delta=1e-5, lo=5.0, hi=50.0, increasing=False) == 5.0


def test_infeasible_target_names_the_smallest_reachable_epsilon() -> None:
    with pytest.raises(InfeasibleBudgetError) as caught:
        calibrate(gaussian, epsilon=0.01, delta=1e-5, lo=0.5, hi=10.0, increasing=False, name="σ")
    message = str(caught.value)
    smallest = gaussian(10.0).to_epsilon(1e-5)
    shown = float(re.search(r"smallest positive ε reachable is ([0-9.e+-]+)", message).group(1))  # type: ignore[union-attr]
    assert smallest <= shown <= smallest * 1.001 and "σ = 10" in message
    assert isinstance(caught.value, ConfigurationError)


@pytest.mark.parametrize("lo", [0.0, 1e-6])
def test_single_order_targets_below_the_conversion_cost_are_infeasible(lo: float) -> None:
    """At α = 2, δ = 1e-5 the conversion alone costs ≈ 10.13: a target of 5 is out of reach for every β > 0."""
    with pytest.raises(InfeasibleBudgetError, match=r"smallest positive ε reachable is 10\.1[3-4]") as caught:
        calibrate(fusion, epsilon=5.0, delta=1e-5, lo=lo, hi=1.0, name="β")
    assert "single order α = 2 pays 10.13" in str(caught.value) and "larger α" in str(caught.value)
    beta = calibrate(lambda b: fusion(b, alpha=8.0), epsilon=5.0, delta=1e-5, lo=lo, hi=1.0)  # a larger α gets there
    assert 0 < fusion(beta, alpha=8.0).to_epsilon(1e-5) <= 5.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"epsilon": 0.0, "delta": 1e-5, "lo": 0.0, "hi": 1.0},
        {"epsilon": math.inf, "delta": 1e-5, "lo": 0.0, "hi": 1.0},
        {"epsilon": 1.0, "delta": 0.0, "lo": 0.0, "hi": 1.0},
        {"epsilon": 1.0, "delta": 1e-5, "lo": 1.0, "hi": 1.0},
        {"epsilon": 1.0, "delta": 1e-5, "lo": 0.0, "hi": math.inf},
        {"epsilon": 1.0, "delta": 1e-5, "lo": 0.0, "hi": 1.0, "rtol": 0.0},
    ],
)
def test_calibrate_validates_its_arguments(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError):
        calibrate(Zcdp, **kwargs)


def test_invisibleink_worked_example() -> None:
    """ε = 10, δ = 1e-6, T_max = 500, τ = 1.1, B = 7 → ρ ≈ 1.539, C = B·τ·sqrt(2ρ/T_max) ≈ 0.604."""
    rho = zcdp_rho_for_target(10.0, 1e-6)
    assert round(rho, 3) == 1.539
    assert Zcdp(rho).to_epsilon(1e-6) <= 10.0 < Zcdp(rho * (1 + 1e-6)).to_epsilon(1e-6)
    clip = 7 * 1.1 * math.sqrt(2 * rho / 500)
    assert round(clip, 3) == 0.604
    # The same clip norm, calibrated directly from the mechanism's ρ = T_max·C²/(2B²τ²).
    direct = calibrate(lambda c: Zcdp(500 * c**2 / (2 * 7**2 * 1.1**2)), epsilon=10.0, delta=1e-6, lo=0.0, hi=10.0)
    assert direct == pytest.approx(clip, rel=1e-6)


@pytest.mark.parametrize(("epsilon", "delta"), [(0.1, 1e-5), (1.0, 1e-9), (1000.0, 1e-5)])
def test_zcdp_rho_for_target_is_tight(epsilon: float, delta: float) -> None:
    rho = zcdp_rho_for_target(epsilon, delta)
    assert Zcdp(rho).to_epsilon(delta) <= epsilon < Zcdp(rho * (1 + 1e-6)).to_epsilon(delta)
