"""An independent 50-digit re-implementation of the RDP → (ε, δ) conversion, against every loss type."""

from __future__ import annotations

import math
from collections.abc import Callable

import mpmath
import pytest

from dpinfer.accounting import PrivacyLoss, PureDp, SingleOrderRdp, Zcdp

Curve = Callable[[mpmath.mpf], mpmath.mpf]


def oracle_epsilon(orders: tuple[float, ...], curve: Curve, delta: float) -> mpmath.mpf:
    """min over the grid of ε(α) + log1p(−1/α) − (log δ + log α)/(α − 1), with dp_accounting's rules: the KL bound
    gives 0 when δ² > 1 − e^{−ε(α)}, orders ≤ 1.01 are skipped, and α = ∞ contributes ε(∞)."""
    with mpmath.workdps(50):
        d, best = mpmath.mpf(delta), mpmath.inf
        for order in orders:
            a = mpmath.mpf(order)
            r = curve(a)
            if mpmath.isinf(a):
                value = r
            elif d**2 + mpmath.expm1(-r) > 0:
                value = mpmath.mpf(0)
            elif order > 1.01:
                value = r + mpmath.log1p(-1 / a) - (mpmath.log(d) + mpmath.log(a)) / (a - 1)
            else:
                continue
            best = min(best, value)
        return max(mpmath.mpf(0), best)


def pure_curve(epsilon: float, bounded_range: bool, n: int = 1) -> Curve:
    divisor = 8 if bounded_range else 2

    def curve(a: mpmath.mpf) -> mpmath.mpf:
        e = mpmath.mpf(epsilon)
        return n * (e if mpmath.isinf(a) else min(e, a * e**2 / divisor))

    return curve


CASES: list[tuple[str, PrivacyLoss, Curve]] = []
for rho in (0.001, 0.1, 1.539, 20.0):
    CASES.append((f"zcdp-{rho}", Zcdp(rho), lambda a, rho=rho: mpmath.mpf(rho) * a))
for epsilon in (0.05, 1.0, 8.0):
    for bounded_range in (False, True):
        for n in (1, 50):
            loss = PureDp(epsilon, bounded_range).times(n)
            CASES.append((f"pure-{epsilon}-br{bounded_range}-x{n}", loss, pure_curve(epsilon, bounded_range, n)))
for alpha in (1.5, 2.0, 8.0, 64.0):
    for epsilon in (0.3, 5.0):
        CASES.append((f"single-{alpha}-{epsilon}", SingleOrderRdp(alpha, epsilon), lambda a, e=epsilon: mpmath.mpf(e)))
for rho, epsilon in ((0.1, 0.5), (2.0, 3.0)):
    pure = pure_curve(epsilon, False)
    CASES.append(
        (f"zcdp{rho}+pure{epsilon}", Zcdp(rho) + PureDp(epsilon), lambda a, r=rho, p=pure: r * a + p(a))  # type: ignore[misc]
    )


@pytest.mark.parametrize(("loss", "curve"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
@pytest.mark.parametrize("delta", [1e-9, 1e-6, 1e-3])
def test_to_epsilon_agrees_with_a_50_digit_oracle(loss: PrivacyLoss, curve: Curve, delta: float) -> None:
    expected = oracle_epsilon(loss.orders, curve, delta)
    assert math.isfinite(expected) and expected > 0
    assert loss.to_epsilon(delta) == pytest.approx(float(expected), rel=1e-6)
