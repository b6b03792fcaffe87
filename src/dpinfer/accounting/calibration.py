"""Calibration: solve a mechanism's knob so that its ex-ante guarantee meets a target (ε, δ)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dpinfer.accounting.losses import DELTA_HINT, PrivacyLoss, SingleOrderRdp, Zcdp
from dpinfer.checks import check_delta, format_up, positive_number
from dpinfer.errors import ConfigurationError, InfeasibleBudgetError


def calibrate(
    loss_fn: Callable[[float], PrivacyLoss],
    *,
    epsilon: float,
    delta: float,
    lo: float,
    hi: float,
    increasing: bool = True,
    rtol: float = 1e-9,
    name: str = "knob",
) -> float:
    """The most permissive knob in [lo, hi] whose loss meets the target: ``loss_fn(knob).to_epsilon(delta) ≤ epsilon``.

    ``loss_fn`` maps the knob (β, clip norm C, 1/σ, ...) to the ex-ante loss; its ε(δ) must be non-decreasing in the
    knob if ``increasing``, non-increasing otherwise (σ, temperature). Bisection keeps a feasible and an infeasible end
    and stops when they are within ``rtol`` (relative) of each other; the feasible end is returned, so the result
    always meets the target. If the least private end of the bracket meets the target it is returned as is. If the
    most private end (``lo`` if ``increasing``) misses it, :class:`~dpinfer.errors.InfeasibleBudgetError` says which ε
    is the smallest reachable. ``name`` names the knob in that message.

    The conversion is discontinuous at 0: a loss with every ε(α) below about δ² converts to ε = 0 (dp_accounting's KL
    bound), any larger one to at least the conversion cost of its best order (≈ 10.1 for a bound held at α = 2 only, at
    δ = 1e-5). A target inside that gap is met only by knobs at which the loss vanishes (the output then ignores the
    private data); this is reported as infeasible too, with the smallest positive ε reachable.

    >>> sigma = calibrate(lambda s: Zcdp(1 / (2 * s**2)), epsilon=1.0, delta=1e-5, lo=0.1, hi=100.0, increasing=False)
    >>> round(sigma, 4), Zcdp(1 / (2 * sigma**2)).to_epsilon(1e-5) <= 1.0
    (4.0451, True)
    """
    epsilon, delta = positive_number(epsilon, "a target ε"), check_delta(delta, "δ", DELTA_HINT)
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ConfigurationError(f"the bracket for {name} must be finite with lo < hi, got lo = {lo!r}, hi = {hi!r}")
    if not 0.0 < rtol < 1.0:
        raise ConfigurationError(f"rtol must lie in (0, 1), got {rtol!r}")

    def epsilon_at(knob: float) -> float:
        return loss_fn(knob).to_epsilon(delta)

    feasible, infeasible = (lo, hi) if increasing else (hi, lo)
    if epsilon_at(infeasible) <= epsilon:
        return infeasible
    reached = epsilon_at(feasible)
    if reached <= epsilon:
        while True:
            middle, width = 0.5 * (feasible + infeasible), abs(infeasible - feasible)
            if middle in (feasible, infeasible) or width <= rtol * max(abs(feasible), abs(infeasible)):
                break
            value = epsilon_at(middle)
            if value <= epsilon:
                feasible, reached = middle, value
            else:
                infeasible = middle
        if reached > 0.0:
            return feasible
        # The target lies in the gap above ε = 0 (see the docstring): report the first positive ε.
        feasible, reached, where = infeasible, epsilon_at(infeasible), "; only a vanishing loss does better"
    else:
        where = ", the most private end of the bracket"
    message = (
        f"no {name} in [{lo:g}, {hi:g}] reaches ε = {epsilon:g} at δ = {delta:g}: the smallest positive ε reachable is "
        f"{format_up(reached, 4)} ({name} = {feasible:.6g}{where}); ask for ε ≥ {format_up(reached, 4)}, a larger δ, "
        "or another bracket."
    )
    loss = loss_fn(feasible)
    if isinstance(loss, SingleOrderRdp):
        message += (
            f" A Rényi bound held at the single order α = {loss.alpha:g} pays {format_up(reached - loss.epsilon, 4)} "
            "for the conversion to (ε, δ) alone; enforce it at a larger α to lower that cost."
        )
    raise InfeasibleBudgetError(message)


def zcdp_rho_for_target(epsilon: float, delta: float) -> float:
    """The largest ρ such that ρ-zCDP converts (on :data:`DEFAULT_ORDERS`) to (ε, δ)-DP with at most ``epsilon``.

    The worked example of InvisibleInk's calibration (ALGORITHMS §2): ε = 10, δ = 1e-6 gives ρ ≈ 1.539, hence the clip
    norm C = B·τ·sqrt(2ρ/T_max) = 7 · 1.1 · sqrt(2ρ/500) ≈ 0.604.

    >>> rho = zcdp_rho_for_target(10.0, 1e-6)
    >>> round(rho, 3), round(7 * 1.1 * math.sqrt(2 * rho / 500), 3)
    (1.539, 0.604)
    """
    epsilon, delta = positive_number(epsilon, "a target ε"), check_delta(delta, "δ", DELTA_HINT)
    hi = 1.0
    while Zcdp(hi).to_epsilon(delta) <= epsilon:
        hi *= 2.0
    return calibrate(Zcdp, epsilon=epsilon, delta=delta, lo=0.0, hi=hi, name="ρ")


@dataclass(frozen=True)
class Budget:
    """The target of a calibration: ε (one figure, or one per group of a mechanism that bounds groups apart, e.g.
    DP-Fusion's ``{"PERSON": 15.0}``) and δ. Public parameters only.

    >>> Budget(10.0, 1e-6).scalar(), Budget({"PERSON": 15.0}, 1e-5).groups()
    (10.0, {'PERSON': 15.0})
    """

    epsilon: float | Mapping[str, float]
    delta: float

    def scalar(self, name: str = "the target ε", hint: str = "") -> float:
        """ε as one positive number (a per-group budget is refused: the mechanism has one ε)."""
        if isinstance(self.epsilon, Mapping):
            raise ConfigurationError(f"{name} must be one number, not one per group (got {len(self.epsilon)} groups)")
        return positive_number(self.epsilon, name, hint)

    def groups(self) -> dict[str, float]:
        """ε per group (group name → ε); one number is refused (the mechanism needs the groups)."""
        if not isinstance(self.epsilon, Mapping):
            raise ConfigurationError(f"the target ε must be one figure per group ({{group: ε}}), got {self.epsilon!r}")
        return dict(self.epsilon)

class Spec:
    """What a calibration reads besides the :class:`Budget`: the maximum length ``T_max`` (``max_new_tokens``) and
    the mechanism's other public parameters (its constructor's keywords, e.g. ``batch_size``, ``temperature``,
    ``top_k``), never private data. ``Spec(200, batch_size=8)``.

    >>> s = Spec(200, batch_size=8, temperature=1.1)
    >>> s.max_new_tokens, s.params, s.with_params(top_k=None).params["top_k"] is None
    (200, {'batch_size': 8, 'temperature': 1.1}, True)
    """

    __slots__ = ("max_new_tokens", "params")

    def __init__(self, max_new_tokens: int, /, **params: Any) -> None:
        object.__setattr__(self, "max_new_tokens", max_new_tokens)
        object.__setattr__(self, "params", dict(params))

    max_new_tokens: int
    params: dict[str, Any]

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("a Spec is frozen")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Spec) and (self.max_new_tokens, self.params) == (other.max_new_tokens, other.params)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in self.params.items())
        return f"Spec({self.max_new_tokens!r}{extra})"

    def with_params(self, **params: Any) -> Spec:
        """A copy with ``params`` added or replaced."""
        return Spec(self.max_new_tokens, **{**self.params, **params})


def zcdp_rho(loss: PrivacyLoss) -> float:
    """ρ of a loss that composes in zCDP (an event whose per-step loss is :class:`Zcdp`); anything else is refused
    (a programming error: its ρ would not mean what the caller reports).

    >>> zcdp_rho(Zcdp(0.25))
    0.25
    """
    if not isinstance(loss, Zcdp):
        raise TypeError(f"expected a zCDP loss, got {type(loss).__name__}")
    return loss.rho
