"""Algebraic properties of composition on RdpCurve, checked by hypothesis."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpinfer.accounting import RdpCurve, compose, compose_parallel

ORDERS = (1.25, 1.5, 2.0, 3.0, 4.0, 8.0, 16.0, 64.0, 256.0, math.inf)
values = st.one_of(st.floats(0.0, 50.0), st.just(math.inf))
curves = st.dictionaries(st.sampled_from(ORDERS), values, min_size=1, max_size=6).map(
    lambda curve: RdpCurve(list(curve), list(curve.values()))
)


@given(curves, curves)
def test_composition_commutes(first: RdpCurve, second: RdpCurve) -> None:
    assert first + second == second + first
    assert compose_parallel(first, second) == compose_parallel(second, first)


@given(curves, curves, curves)
def test_composition_associates(first: RdpCurve, second: RdpCurve, third: RdpCurve) -> None:
    left, right = (first + second) + third, first + (second + third)
    assert isinstance(left, RdpCurve) and isinstance(right, RdpCurve)
    assert left.orders == right.orders and left.epsilons == pytest.approx(right.epsilons, rel=1e-12)
    assert compose_parallel(compose_parallel(first, second), third) == compose_parallel(
        first, compose_parallel(second, third)
    )


@given(curves, curves)
def test_composition_adds_and_parallel_takes_the_max_at_every_order(first: RdpCurve, second: RdpCurve) -> None:
    for alpha in ORDERS:
        assert compose(first, second).rdp(alpha) == first.rdp(alpha) + second.rdp(alpha)
        assert compose_parallel(first, second).rdp(alpha) == max(first.rdp(alpha), second.rdp(alpha))


@given(curves, st.integers(1, 12))
def test_times_is_repeated_composition(curve: RdpCurve, n: int) -> None:
    repeated = compose(*[curve] * n)
    assert isinstance(repeated, RdpCurve)
    assert curve.times(n).orders == repeated.orders
    assert curve.times(n).epsilons == pytest.approx(repeated.epsilons, rel=1e-12)
