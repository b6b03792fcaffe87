"""What a release costs before the model loads: the estimates that :func:`dpinfer.accounting.charge.charge`
reserves (step 1 of the one charge path), from the parameters alone.

:func:`single_order_estimate` for DP-Fusion's groups, :func:`zcdp_estimate` for zCDP mechanisms (both from the target
ε the mechanism is calibrated to, which its guarantee never exceeds), :func:`pure_steps_estimate` for a composition of
pure-DP tokens. A unit that cannot afford the estimate is refused before anything is loaded or generated; the planned
guarantee's exact cost replaces it before any token (step 2).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from dpinfer.accounting import (
    PrivacyLoss,
    PureDp,
    SingleOrderRdp,
    Zcdp,
    calibrate,
    grow_bracket,
    zcdp_rho_for_target,
)
from dpinfer.accounting.costs import ApproxDp, Cost
from dpinfer.accounting.dp_fusion import conversion_cost

__all__ = ["NO_PRIVACY", "pure_steps_estimate", "single_order_estimate", "zcdp_estimate"]

NO_PRIVACY = Cost.of(ApproxDp(math.inf, 0.0))
"""The cost of a release that protects nothing: refused by every budget."""


def single_order_estimate(targets: Mapping[str, float], *, alpha: float, delta: float) -> Cost:
    """DP-Fusion's cost per group from its target ε_i alone: ``SingleOrderRdp(α, ε_i − c(α, δ))``, since a group's
    (ε, δ) is its Rényi bound at α plus the conversion cost c (:func:`~dpinfer.accounting.dp_fusion.conversion_cost`)
    whatever T_max is, and the calibrated bound never exceeds the target."""
    c = conversion_cost(alpha, delta)
    return Cost({name: SingleOrderRdp(alpha, max(float(eps) - c, 0.0)) for name, eps in targets.items()})


def zcdp_estimate(epsilon: float, delta: float) -> Cost:
    """The cost of a mechanism calibrated to ``(epsilon, delta)`` whose loss is ρ-zCDP: the largest such ρ."""
    return Cost.of(Zcdp(zcdp_rho_for_target(epsilon, delta)))


def pure_steps_estimate(epsilon: float, delta: float, steps: int, *, bounded_range: bool) -> Cost:
    """The cost of ``steps`` pure-DP tokens calibrated to ``(epsilon, delta)`` (DP-Prompt, DP-Decoding): the largest
    per-token ε whose ``steps``-fold composition meets the target, composed."""
    def loss(eps: float) -> PrivacyLoss:
        return PureDp(eps, bounded_range=bounded_range).times(steps)

    hi = grow_bracket(lambda eps: loss(eps).to_epsilon(delta) <= epsilon, start=epsilon / steps)
    return Cost.of(loss(calibrate(loss, epsilon=epsilon, delta=delta, lo=0.0, hi=hi, name="ε per token")))
