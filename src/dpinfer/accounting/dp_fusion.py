"""DP-Fusion's accounting (ALGORITHMS §1): the per-token Rényi loss of a mollified mixture, its composition over
``T_max`` tokens, the per-group guarantee and the calibration of the bounds b_i.

Thareja et al., "DP-Fusion: Token-Level Differentially Private Inference for Large Language Models" (ICLR 2026).
Each privacy group i has a bound ``b_i = α·β_i`` that the mechanism (:mod:`dpinfer.mechanisms.dp_fusion`) enforces
on its mollified distribution ``q_i = (1 − λ_i)·p_pub + λ_i·p_i``: ``D↔_α(q_i, p_pub) ≤ b_i``; it releases a token
from ``p_out = (1/m)·Σ_i q_i``.

Privacy. Adjacency is replace-by-null of one group's tagged spans: D′ equals D with the tokens of group i replaced
by placeholders, so ``private_i(D′) = public(D)`` while the public context and every other private context are
unchanged (they already hide group i). Under D′ the mixture for group i is ``p_pub`` itself; the other q_j are the
same. The map ``(P, Q) ↦ Σ_v P_v^α Q_v^(1−α)`` is jointly convex for α > 1 (the perspective of ``t ↦ t^α``), and it
equals 1 for P = Q, so for both orders of the arguments

    D_α(p_out(D) ‖ p_out(D′)) ≤ 1/(α−1) · log( (m−1)/m + e^{(α−1)·b_i}/m )  =  :func:`step_epsilon` (b_i, m, α),

which is ``b_i`` for m = 1. This holds at the order α only. Over at most ``T_max`` tokens, adaptive composition
(Mironov 2017, "Rényi Differential Privacy", Prop. 1) gives ``SingleOrderRdp(α, T_max·ε_step)``
(:class:`MollifiedMixtureEvent` composed by the accountant), converted to (ε, δ) at that order (Canonne, Kamath &
Steinke 2020; Balle et al. 2020): ``ε = T_max·ε_step + log1p(−1/α) − (log δ + log α)/(α − 1)`` (:func:`conversion_cost`
is the last two terms: ≈ 10.1 at α = 2, δ = 1e-5, ≈ 1.2 at α = 8). Under replace-one
adjacency the bound is enforced at 2α and a group moves by at most ``replace_one_factor(α)·b_i`` at order α.
``accounting="as_published"`` reproduces the authors' 4·β per token. Everything here is a function of parameters
only; nothing reads a logit.

>>> round(group_loss(0.05, 2, 2.0, 100).to_epsilon(1e-5), 3)
12.658
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from dpinfer.accounting.accountant import LossEvent, calibrate_event, compose_steps, grow_bracket
from dpinfer.accounting.guarantee import GroupGuarantee
from dpinfer.accounting.losses import PrivacyLoss, SingleOrderRdp
from dpinfer.checks import (
    check_alpha,
    check_delta,
    dp_fusion_floor_message,
    non_negative_number,
    positive_int,
    positive_number,
    rdp_conversion_cost,
)
from dpinfer.errors import ConfigurationError, InfeasibleBudgetError

__all__ = [
    "ACCOUNTINGS",
    "ADJACENCIES",
    "ADJACENCY",
    "ADJACENCY_REPLACE_ONE",
    "ALPHA_HINT",
    "MollifiedMixtureEvent",
    "bound_for_step_epsilon",
    "calibrate_bound",
    "check_accounting",
    "check_adjacency",
    "conversion_cost",
    "enforcement_order",
    "group_guarantees",
    "group_loss",
    "per_step_rdp",
    "replace_one_factor",
    "step_epsilon",
]

ADJACENCIES = ("replace-by-null", "replace-one")
ADJACENCY = (
    "replace-by-null of one privacy group's tagged spans (the content of the spans is protected; their existence, "
    "positions and token lengths are not)"
)
"""The adjacency DP-Fusion's guarantee states by default (ALGORITHMS §1)."""
ADJACENCY_REPLACE_ONE = (
    "replace-one of one privacy group's tagged spans (their content swapped for any other values; existence, "
    "positions and token lengths are not protected)"
)
ACCOUNTINGS = ("dpinfer", "as_published")

ALPHA_HINT = " (DP-Fusion's default is α = 2; a larger α, e.g. 8, lowers the cost of converting the bound to (ε, δ))"


def _alpha(alpha: object) -> float:
    return check_alpha(alpha, "the Rényi order α", ALPHA_HINT, label="")


def _groups(value: object) -> int:
    return positive_int(value, "the number of privacy groups m")


def _tokens(value: object) -> int:
    return positive_int(value, "max_new_tokens (T_max)")


def check_adjacency(adjacency: object, accounting: str = "dpinfer") -> str:
    if adjacency not in ADJACENCIES:
        raise ConfigurationError(
            f"adjacency must be 'replace-by-null' (a group's spans replaced by placeholders; the default) or "
            f"'replace-one' (a group's values swapped for others), got {adjacency!r}"
        )
    if adjacency == "replace-one" and accounting == "as_published":
        raise ConfigurationError(
            "accounting='as_published' reproduces the authors' replace-by-null charge; use accounting='dpinfer' "
            "with adjacency='replace-one'"
        )
    return str(adjacency)


def replace_one_factor(alpha: float) -> float:
    """``(α − ½)/(α − 1) + 1``: under replace-one adjacency a group whose mollified distribution is held within b of
    ``p_pub`` at order 2α (both directions) moves by at most this times b at order α.

    Mironov's weak triangle inequality (Mironov 2017, "Rényi Differential Privacy", Prop. 11) with ``p_pub`` in the
    middle: ``D_α(q‖q′) ≤ (α − ½)/(α − 1)·D_2α(q‖p_pub) + D_{2α−1}(p_pub‖q′)``, and ``D_{2α−1} ≤ D_2α``.

    >>> replace_one_factor(2.0)
    2.5
    """
    a = _alpha(alpha)
    return (a - 0.5) / (a - 1.0) + 1.0


def enforcement_order(alpha: float, adjacency: str = "replace-by-null") -> float:
    """The Rényi order at which the mollification bound is enforced: α (replace-by-null) or 2α (replace-one)."""
    a = _alpha(alpha)
    return 2.0 * a if check_adjacency(adjacency) == "replace-one" else a


def check_accounting(accounting: object) -> str:
    if accounting not in ACCOUNTINGS:
        raise ConfigurationError(
            f"accounting must be 'dpinfer' (this project's analysis) or 'as_published' (the authors' 4·β per step, "
            f"kept for comparison), got {accounting!r}"
        )
    return str(accounting)


def step_epsilon(bound: float, num_groups: int, alpha: float) -> float:
    """The per-token Rényi loss at order α of one group: ``1/(α−1)·log((m−1)/m + e^{(α−1)·b}/m)`` (b for m = 1).

    By joint convexity of ``Σ P^α Q^(1−α)``: replacing one of the m mollified distributions (each within ``b`` of
    ``p_pub``) by ``p_pub`` itself moves the average ``p_out`` by at most this much, in both directions. Computed as
    ``log1p(expm1((α−1)·b)/m)/(α−1)``.

    >>> step_epsilon(0.05, 1, 2.0)
    0.05
    >>> round(step_epsilon(0.05, 3, 2.0), 10) == round(math.log((2 + math.exp(0.05)) / 3), 10)
    True
    """
    b, m, a = non_negative_number(bound, "a bound b"), _groups(num_groups), _alpha(alpha)
    if m == 1:
        return b
    x = (a - 1.0) * b
    if x > 700.0:  # e^x overflows: log((m−1)/m + e^x/m) = x − log m + log1p((m−1)·e^{−x})
        return (x - math.log(m) + math.log1p((m - 1) * math.exp(-x))) / (a - 1.0)
    return math.log1p(math.expm1(x) / m) / (a - 1.0)


def bound_for_step_epsilon(step_eps: float, num_groups: int, alpha: float) -> float:
    """The inverse of :func:`step_epsilon`: the bound b whose per-token loss is ``step_eps``.

    ``b = log1p(m·expm1((α−1)·ε_step))/(α−1)``.

    >>> b = bound_for_step_epsilon(0.02, 4, 2.0)
    >>> round(step_epsilon(b, 4, 2.0), 12)
    0.02
    """
    e, m, a = non_negative_number(step_eps, "a per-step ε"), _groups(num_groups), _alpha(alpha)
    if m == 1:
        return e
    x = (a - 1.0) * e
    if x > 700.0:
        return (x + math.log(m) + math.log1p(-math.exp(-x) * (m - 1) / m)) / (a - 1.0)
    return math.log1p(m * math.expm1(x)) / (a - 1.0)


def per_step_rdp(bound: float, num_groups: int, alpha: float, accounting: str = "dpinfer",
                 adjacency: str = "replace-by-null") -> float:
    """The per-token Rényi loss at order α charged to a group with bound b: :func:`step_epsilon` (``"dpinfer"``) or
    the authors' ``4·β = 4·b/α`` (``"as_published"``). Under ``adjacency="replace-one"`` the bound is enforced at
    order 2α and the group's mollified distribution moves by at most ``replace_one_factor(α)·b`` at order α, which
    enters the same mixture formula: ``step_epsilon(replace_one_factor(α)·b, m, α)``.

    >>> per_step_rdp(0.05, 3, 2.0, "as_published")
    0.1
    >>> per_step_rdp(0.05, 1, 2.0, adjacency="replace-one")
    0.125
    """
    accounting = check_accounting(accounting)
    if check_adjacency(adjacency, accounting) == "replace-one":
        return step_epsilon(replace_one_factor(alpha) * non_negative_number(bound, "a bound b"), num_groups, alpha)
    if accounting == "as_published":
        _groups(num_groups)
        return 4.0 * non_negative_number(bound, "a bound b") / _alpha(alpha)
    return step_epsilon(bound, num_groups, alpha)


@dataclass(frozen=True)
class MollifiedMixtureEvent(LossEvent):
    """One DP-Fusion token, charged to one privacy group: ``SingleOrderRdp(α, per_step_rdp(b, m, α))``.

    The group's mollified distribution is held within ``bound`` = b of ``p_pub`` (at order α, or 2α under replace-one
    adjacency) and averaged with the other ``num_groups − 1``; by joint convexity the released ``p_out`` moves by at
    most :func:`step_epsilon` (b, m, α) at order α (``"as_published"``: the authors' 4·b/α; replace-one: the bound
    scaled by :func:`replace_one_factor`). The bound holds at the order α only. Parameters only.

    >>> MollifiedMixtureEvent(0.05, 1, 2.0).step_loss()
    SingleOrderRdp(alpha=2.0, epsilon=0.05)
    """

    bound: float
    num_groups: int
    alpha: float
    accounting: str = "dpinfer"
    adjacency: str = "replace-by-null"

    def step_loss(self) -> SingleOrderRdp:
        rdp = per_step_rdp(self.bound, self.num_groups, self.alpha, self.accounting, self.adjacency)
        return SingleOrderRdp(_alpha(self.alpha), rdp)


def group_loss(
    bound: float, num_groups: int, alpha: float, max_new_tokens: int, accounting: str = "dpinfer",
    adjacency: str = "replace-by-null",
) -> PrivacyLoss:
    """The ex-ante loss of one group over at most ``T_max`` tokens: ``SingleOrderRdp(α, T_max·ε_step)``, the
    :class:`MollifiedMixtureEvent` composed over ``T_max`` tokens by the accountant."""
    t = _tokens(max_new_tokens)
    return compose_steps(MollifiedMixtureEvent(bound, num_groups, alpha, accounting, adjacency), t)


def group_guarantees(
    bounds: Sequence[float],
    group_names: Sequence[str],
    *,
    alpha: float,
    delta: float,
    max_new_tokens: int,
    accounting: str = "dpinfer",
    adjacency: str = "replace-by-null",
) -> tuple[GroupGuarantee, ...]:
    """One :class:`~dpinfer.accounting.GroupGuarantee` per privacy group, ex ante (from b_i, m, α, δ and T_max).

    >>> groups = group_guarantees([0.05, 0.1], ["PERSON", "LOC"], alpha=2.0, delta=1e-5, max_new_tokens=100)
    >>> [(g.name, round(g.epsilon, 3)) for g in groups]
    [('PERSON', 12.658), ('LOC', 15.252)]
    """
    if len(bounds) != len(group_names):
        raise ConfigurationError(f"one bound per group is needed: {len(group_names)} names, {len(bounds)} bounds")
    m = _groups(len(bounds))
    delta = check_delta(delta, "δ")
    out = []
    for name, b in zip(group_names, bounds, strict=True):
        loss = group_loss(b, m, alpha, max_new_tokens, accounting, adjacency)
        params = {
            "bound": float(b),
            "beta": float(b) / alpha,
            "alpha": float(alpha),
            "step_rdp": per_step_rdp(b, m, alpha, accounting, adjacency),
        }
        if adjacency != "replace-by-null":
            params["adjacency"] = adjacency
            params["enforced_order"] = enforcement_order(alpha, adjacency)
        out.append(GroupGuarantee.from_loss(name, loss, delta=delta, parameters=params))
    return tuple(out)


def calibrate_bound(
    epsilon: float,
    *,
    num_groups: int,
    max_new_tokens: int,
    delta: float = 1e-5,
    alpha: float = 2.0,
    accounting: str = "dpinfer",
    group: str = "",
    adjacency: str = "replace-by-null",
) -> float:
    """The largest bound b whose group guarantee over ``max_new_tokens`` tokens is at most ``(epsilon, delta)``.

    Raises :class:`~dpinfer.errors.InfeasibleBudgetError` with the smallest reachable ε when even b → 0 misses the
    target (the single-order conversion costs ``log1p(−1/α) − (log δ + log α)/(α − 1)`` on its own).

    >>> b = calibrate_bound(20.0, num_groups=3, max_new_tokens=100)
    >>> round(b, 4), group_loss(b, 3, 2.0, 100).to_epsilon(1e-5) <= 20.0
    (0.271, True)
    """
    m, t = _groups(num_groups), _tokens(max_new_tokens)
    alpha, delta, accounting = _alpha(alpha), check_delta(delta, "δ"), check_accounting(accounting)
    adjacency = check_adjacency(adjacency, accounting)
    epsilon = positive_number(epsilon, "the target ε")
    name = f"bound b of group {group}" if group else "bound b"

    def event(b: float) -> MollifiedMixtureEvent:
        return MollifiedMixtureEvent(b, m, alpha, accounting, adjacency)

    hi = grow_bracket(lambda b: compose_steps(event(b), t).to_epsilon(delta) <= epsilon)
    try:
        b = calibrate_event(event, steps=t, epsilon=epsilon, delta=delta, lo=0.0, hi=hi, increasing=True, name=name)
    except InfeasibleBudgetError as err:
        raise InfeasibleBudgetError(_infeasible_message(epsilon, delta, alpha, t, group)) from err
    if not b > 0.0:
        raise InfeasibleBudgetError(_infeasible_message(epsilon, delta, alpha, t, group))
    return b


def conversion_cost(alpha: float, delta: float) -> float:
    """What converting a Rényi bound held at the single order α to (ε, δ) costs on its own (Canonne, Kamath & Steinke
    2020): ``log1p(−1/α) − (log δ + log α)/(α − 1)``; the infimum of every reachable DP-Fusion ε at that α and δ.

    >>> round(conversion_cost(2.0, 1e-5), 4), round(conversion_cost(8.0, 1e-5), 4)
    (10.1266, 1.2141)
    """
    return rdp_conversion_cost(_alpha(alpha), check_delta(delta, "δ"))


def _infeasible_message(epsilon: float, delta: float, alpha: float, max_new_tokens: int, group: str) -> str:
    return dp_fusion_floor_message(epsilon, delta, alpha, group=group, max_new_tokens=max_new_tokens)

