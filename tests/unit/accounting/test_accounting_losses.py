"""Closed forms of the privacy losses: conversion, composition, parallel composition, validation."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable

import pytest
from dp_accounting.rdp import compute_epsilon
from scipy.optimize import minimize_scalar

from dpinfer.accounting import (
    DEFAULT_ORDERS,
    PrivacyLoss,
    PureDp,
    RdpCurve,
    SingleOrderRdp,
    Zcdp,
    compose,
    compose_parallel,
    delta_from_rdp,
    epsilon_from_rdp,
)
from dpinfer.errors import ConfigurationError


def conversion_term(alpha: float, delta: float) -> float:
    """log1p(−1/α) − (log δ + log α)/(α − 1): what converting an RDP bound at order α adds to ε(α)."""
    return math.log1p(-1 / alpha) - (math.log(delta) + math.log(alpha)) / (alpha - 1)


def continuous_zcdp_epsilon(rho: float, delta: float) -> float:
    """min over real α > 1 of ρα + conversion_term(α, δ), optimised over log(α − 1)."""
    result = minimize_scalar(
        lambda t: rho * (1 + math.exp(t)) + conversion_term(1 + math.exp(t), delta),
        bounds=(math.log(1e-3), math.log(1e5)),
        method="bounded",
        options={"xatol": 1e-12},
    )
    return float(result.fun)


def test_default_orders_are_a_dense_increasing_grid_that_dp_accounting_converts() -> None:
    assert list(DEFAULT_ORDERS) == sorted(set(DEFAULT_ORDERS))
    assert 1.01 < DEFAULT_ORDERS[0] < 1.011 and 9e3 < DEFAULT_ORDERS[-1] < 1e4
    assert max(b / a for a, b in itertools.pairwise(DEFAULT_ORDERS)) < 1.02


@pytest.mark.parametrize("rho", [0.01, 0.1, 0.5, 1.539, 5.0, 30.0, 100.0])
@pytest.mark.parametrize("delta", [1e-10, 1e-6, 1e-5, 1e-3])
def test_zcdp_conversion_is_within_1e_4_of_the_continuous_optimum(rho: float, delta: float) -> None:
    exact = continuous_zcdp_epsilon(rho, delta)
    assert 0 <= (Zcdp(rho).to_epsilon(delta) - exact) / exact < 1e-4


@pytest.mark.parametrize("alpha", [1.5, 2.0, 8.0, 64.0])
@pytest.mark.parametrize("epsilon", [1e-4, 0.3, 4.0])
@pytest.mark.parametrize("delta", [1e-8, 1e-5, 1e-3])
def test_single_order_conversion_is_the_closed_form_at_that_order(alpha: float, epsilon: float, delta: float) -> None:
    assert SingleOrderRdp(alpha, epsilon).to_epsilon(delta) == pytest.approx(
        epsilon + conversion_term(alpha, delta), rel=1e-12
    )


def test_single_order_conversion_overhead_matches_algorithms_md() -> None:
    assert SingleOrderRdp(2.0, 1e-9).to_epsilon(1e-5) == pytest.approx(10.1, abs=0.05)
    assert SingleOrderRdp(8.0, 1e-9).to_epsilon(1e-5) == pytest.approx(1.2, abs=0.05)


def test_a_vanishing_loss_converts_to_zero_through_the_kl_bound() -> None:
    assert SingleOrderRdp(2.0, 0.0).to_epsilon(1e-5) == 0.0
    assert SingleOrderRdp(2.0, 1e-11).to_epsilon(1e-5) == 0.0  # ε(α) ≤ −log(1 − δ²)
    assert Zcdp(0.0).to_epsilon(1e-5) == 0.0


def test_epsilon_from_rdp_wraps_dp_accounting_and_handles_the_pure_order() -> None:
    orders, rdp = [1.5, 2.0, 8.0, 32.0], [0.05, 0.1, 0.4, 1.6]
    assert epsilon_from_rdp(orders, rdp, 1e-5) == compute_epsilon(orders, rdp, 1e-5)
    assert epsilon_from_rdp([*orders, math.inf], [*rdp, 0.5], 1e-5) == (0.5, math.inf)
    assert epsilon_from_rdp([2.0], [math.inf], 1e-5)[0] == math.inf


def test_delta_from_rdp_inverts_epsilon_from_rdp() -> None:
    orders, rdp = [1.5, 2.0, 8.0, 32.0], [0.05, 0.1, 0.4, 1.6]
    epsilon, order = epsilon_from_rdp(orders, rdp, 1e-5)
    delta, same_order = delta_from_rdp(orders, rdp, epsilon)
    assert delta == pytest.approx(1e-5, rel=1e-9) and same_order == order
    assert delta_from_rdp([2.0, math.inf], [1.0, 3.0], 3.0) == (0.0, math.inf)
    assert delta_from_rdp([2.0], [1.0], math.inf) == (0.0, math.inf)


@pytest.mark.parametrize(
    ("orders", "rdp"),
    [([], []), ([2.0], [0.1, 0.2]), ([1.0], [0.1]), ([2.0], [-0.1]), ([2.0], [math.nan]), ([math.nan], [0.1])],
)
def test_bad_curves_raise(orders: list[float], rdp: list[float]) -> None:
    with pytest.raises(ConfigurationError):
        epsilon_from_rdp(orders, rdp, 1e-5)
    with pytest.raises(ConfigurationError):
        RdpCurve(orders, rdp)


def test_rdp_curve_sorts_tightens_and_extends_upward() -> None:
    curve = RdpCurve([8.0, math.inf, 2.0, 4.0], [0.4, 5.0, 0.1, 0.9])
    assert curve.orders == (2.0, 4.0, 8.0, math.inf)
    assert curve.epsilons == (0.1, 0.4, 0.4, 5.0)  # RDP is non-decreasing in α: ε(4) ≤ ε(8)
    assert (curve.rdp(1.5), curve.rdp(3.0), curve.rdp(100.0), curve.rdp(math.inf)) == (0.1, 0.4, 5.0, 5.0)
    assert RdpCurve([2.0], [0.1]).rdp(2.5) == math.inf
    with pytest.raises(ConfigurationError, match="distinct"):
        RdpCurve([2.0, 2.0], [0.1, 0.2])


def test_rdp_curve_repr_is_short_for_long_grids() -> None:
    text = repr(Zcdp(1.0) + PureDp(1.0))
    assert text.startswith("RdpCurve(<698 orders") and len(text) < 120


def test_zcdp_closed_forms() -> None:
    assert Zcdp(0.5) + Zcdp(0.25) == Zcdp(0.75)
    assert Zcdp(0.5).times(4) == 4 * Zcdp(0.5) == Zcdp(0.5) * 4 == Zcdp(2.0)
    assert compose_parallel(Zcdp(0.5), Zcdp(0.25), Zcdp(0.1)) == Zcdp(0.5)
    assert Zcdp(0.5).rdp(3.0) == 1.5 and Zcdp(0.5).rdp(math.inf) == math.inf and Zcdp(0.0).rdp(math.inf) == 0.0


def test_single_order_composition_adds_at_its_order() -> None:
    step = SingleOrderRdp(2.0, 0.25)
    assert step + step == step.times(2) == SingleOrderRdp(2.0, 0.5)
    assert step + Zcdp(0.1) == Zcdp(0.1) + step == SingleOrderRdp(2.0, 0.45)
    assert step + PureDp(1.0) == SingleOrderRdp(2.0, 0.25 + min(1.0, 2 * 1.0 / 2))
    assert step + RdpCurve([1.5, 3.0], [0.1, 0.7]) == SingleOrderRdp(2.0, 0.95)
    assert step.rdp(2.0) == 0.25 and step.rdp(2.5) == math.inf and step.orders == (2.0,)


def test_single_order_parallel_takes_the_max_at_its_order() -> None:
    assert compose_parallel(SingleOrderRdp(2.0, 0.25), SingleOrderRdp(2.0, 0.5)) == SingleOrderRdp(2.0, 0.5)
    assert SingleOrderRdp(2.0, 0.25).parallel(Zcdp(0.5)) == SingleOrderRdp(2.0, 1.0)


@pytest.mark.parametrize("combine", [compose, compose_parallel])
def test_single_orders_at_different_orders_do_not_combine(combine: Callable[..., PrivacyLoss]) -> None:
    with pytest.raises(ConfigurationError, match="same α"):
        combine(SingleOrderRdp(2.0, 0.1), SingleOrderRdp(8.0, 0.1))


@pytest.mark.parametrize("bounded_range", [False, True])
@pytest.mark.parametrize("epsilon", [0.0, 0.05, 1.0, 6.0])
def test_pure_dp_rdp_bounds(epsilon: float, bounded_range: bool) -> None:
    loss = PureDp(epsilon, bounded_range)
    divisor = 8 if bounded_range else 2
    for alpha in (1.5, 2.0, 10.0, 1e3):
        assert loss.rdp(alpha) == min(epsilon, alpha * epsilon**2 / divisor)
    assert loss.rdp(math.inf) == epsilon
    assert loss.to_epsilon(1e-5) <= epsilon


def test_pure_dp_composition_takes_the_better_of_basic_and_rdp_composition() -> None:
    assert PureDp(0.01).times(10).to_epsilon(1e-5) == pytest.approx(0.1, rel=1e-12)  # basic composition wins
    many = PureDp(0.01).times(10_000)  # basic: 100; as 0.5-zCDP: about 5
    assert many.to_epsilon(1e-5) == pytest.approx(Zcdp(0.5).to_epsilon(1e-5), rel=1e-12)
    two, three = PureDp(2.0), PureDp(3.0)
    assert two + three == RdpCurve(many.orders, [two.rdp(alpha) + three.rdp(alpha) for alpha in many.orders])
    assert compose_parallel(PureDp(2.0), PureDp(3.0)) == PureDp(3.0)
    assert compose_parallel(PureDp(2.0), PureDp(3.0, bounded_range=True)).rdp(math.inf) == 3.0


def test_mixed_types_fall_back_to_a_curve_on_the_union_of_orders() -> None:
    curve = RdpCurve([2.0, 8.0], [0.1, 0.4])
    mixed = Zcdp(0.01) + curve
    assert isinstance(mixed, RdpCurve) and set(mixed.orders) == set(DEFAULT_ORDERS) | {2.0, 8.0}
    assert mixed.rdp(2.0) == pytest.approx(0.12) and mixed.rdp(8.0) == pytest.approx(0.48)
    assert all(mixed.rdp(alpha) == pytest.approx(0.01 * alpha + curve.rdp(alpha)) for alpha in DEFAULT_ORDERS)
    parallel = compose_parallel(Zcdp(0.01), curve)
    assert parallel.rdp(2.0) == 0.1 and parallel.rdp(8.0) == 0.4


def test_compose_validates_its_arguments() -> None:
    with pytest.raises(ConfigurationError, match="at least one"):
        compose()
    with pytest.raises(ConfigurationError, match="PrivacyLoss"):
        compose(Zcdp(1.0), 3)  # type: ignore[arg-type]
    assert compose(Zcdp(1.0)) == Zcdp(1.0)


@pytest.mark.parametrize("n", [0, -1, 1.5, "2"])
def test_times_needs_a_positive_integer(n: object) -> None:
    with pytest.raises(ConfigurationError):
        Zcdp(1.0).times(n)  # type: ignore[arg-type]


def test_operators_reject_other_types() -> None:
    with pytest.raises(TypeError):
        Zcdp(1.0) * 2.0  # type: ignore[operator]
    with pytest.raises(TypeError):
        Zcdp(1.0) + 1  # type: ignore[operator]
    with pytest.raises(TypeError):
        PureDp(1.0) * True  # type: ignore[operator]
    loss = Zcdp(1.0)
    assert loss.times(1) is loss


@pytest.mark.parametrize(
    "make",
    [
        lambda: Zcdp(-0.1),
        lambda: Zcdp(math.inf),
        lambda: Zcdp(math.nan),
        lambda: PureDp(-1.0),
        lambda: PureDp(math.inf),
        lambda: SingleOrderRdp(1.0, 0.1),
        lambda: SingleOrderRdp(math.inf, 0.1),
        lambda: SingleOrderRdp(2.0, -0.1),
    ],
)
def test_constructors_validate(make: Callable[[], PrivacyLoss]) -> None:
    with pytest.raises(ConfigurationError):
        make()


def test_losses_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Zcdp(1.0).rho = 2.0  # type: ignore[misc]
    with pytest.raises(ConfigurationError, match="order"):
        Zcdp(1.0).rdp(1.0)
