"""Charging one release to a privacy-budget ledger (:class:`dpinfer.Ledger`) from a pipeline.

Every pipeline that takes ``ledger=`` and ``unit=`` follows the same three steps (:class:`Spend`):

1. **reserve**, before the model loads: the cost estimated from the parameters alone (:func:`single_order_estimate`
   for DP-Fusion's groups, :func:`zcdp_estimate` for zCDP mechanisms, both from the target ε the mechanism is
   calibrated to, which its guarantee never exceeds). A unit that cannot afford it is refused here, in one line,
   before anything is loaded or generated. A method without an estimate reserves nothing yet (its unit must still
   have a budget).
2. **settle**, once the release is planned and before any token is generated: the planned guarantee's exact cost
   replaces the estimate, re-checked against the budget (refused and cancelled if it does not fit).
3. **commit** once the release is handed over (returned or written), or **cancel** if it failed before that.

A process killed between 1 and 3 leaves the reservation pending, which counts as spent (fail closed); an operator
may void it (``dpinfer budget void CHARGE``).
"""

from __future__ import annotations

import contextvars
import functools
import math
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from dpinfer.accounting import (
    Guarantee,
    PrivacyLoss,
    PureDp,
    SingleOrderRdp,
    Zcdp,
    calibrate,
    grow_bracket,
    zcdp_rho_for_target,
)
from dpinfer.accounting.dp_fusion import conversion_cost
from dpinfer.accounting.ledger import ApproxDp, Charge, Cost, Ledger, check_unit
from dpinfer.errors import LedgerError

__all__ = ["LedgerCharges", "LedgerLike", "Spend", "charged", "current_spend", "open_ledger", "pure_steps_estimate",
           "single_order_estimate", "start_spend", "zcdp_estimate"]

LedgerLike = Ledger | str | os.PathLike[str] | None
"""What ``ledger=`` accepts: a :class:`~dpinfer.Ledger`, the path of one, or None (no ledger)."""

NO_PRIVACY = Cost.of(ApproxDp(math.inf, 0.0))
"""The cost of a release that protects nothing: refused by every budget."""


def open_ledger(ledger: LedgerLike) -> Ledger | None:
    """``ledger`` as a :class:`~dpinfer.Ledger` (a path must hold an existing ledger), or None."""
    if ledger is None or isinstance(ledger, Ledger):
        return ledger
    if isinstance(ledger, (str, os.PathLike)):
        return Ledger(ledger)
    raise LedgerError(f"ledger= takes a dpinfer.Ledger or the path of one, got {type(ledger).__name__}")


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


class Spend:
    """One release's reservation on a unit (see the module docstring)."""

    def __init__(self, ledger: Ledger, unit: str, scope: str, resume_key: str | None = None) -> None:
        self.ledger = ledger
        self.unit = check_unit(unit)
        self.scope = scope
        self.resume_key = resume_key
        """A resumable job's key for this record: a pending charge left by a killed run is taken over."""
        self.charge: Charge | None = None
        self.settled = False
        """Whether the charge holds the release's exact cost (or an estimate from the parameters alone)."""

    def reserve(self, estimate: Cost | None, *, mechanism: str, parameters: Mapping[str, Any] | None = None) -> None:
        """Step 1 (before the model loads): reserve ``estimate`` (None: a placeholder of ε = 0, priced at
        :meth:`settle`; it still refuses a unit without a budget, or of another scope)."""
        if self.charge is not None:
            return  # already reserved
        cost = estimate if estimate is not None else Cost.of(PureDp(0.0))
        self.settled = estimate is not None
        self.charge = self.ledger.reserve(self.unit, cost, mechanism=mechanism,
                                          parameters={"estimate": estimate is not None, **(parameters or {})},
                                          scope=self.scope, resume_key=self.resume_key)

    def settle(self, guarantee: Guarantee | Cost | PrivacyLoss, *, mechanism: str | None = None) -> None:
        """Step 2 (planned, nothing generated): the exact cost of ``guarantee`` (or of a loss)."""
        if self.charge is None:
            self.charge = self.ledger.reserve(self.unit, guarantee, scope=self.scope, mechanism=mechanism,
                                              resume_key=self.resume_key)
        else:
            self.charge.settle(guarantee)
        self.settled = True

    def commit(self) -> None:
        """Step 3: the release was handed over."""
        if self.charge is not None and self.charge.state == "pending":
            self.charge.commit()

    def cancel(self) -> None:
        """Nothing was released."""
        if self.charge is not None and self.charge.state == "pending":
            self.charge.cancel()

    def to_dict(self) -> dict[str, Any]:
        """What a release may say about its charge: the unit, the charge's number and its ε alone."""
        out: dict[str, Any] = {"unit": self.unit}
        if self.charge is not None:
            out.update(charge=self.charge.id, epsilon=self.charge.epsilon)
        return out


def start_spend(ledger: LedgerLike | Spend, unit: str | None, *, scope: str,
                default_unit: Callable[[Ledger], str] | None = None, what: str = "this release") -> Spend | None:
    """A :class:`Spend` on ``ledger`` for ``unit`` (or ``default_unit(ledger)``), or None without a ledger. A unit
    without a ledger is refused (it would charge nothing). A :class:`Spend` is returned as it is."""
    if isinstance(ledger, Spend):
        return ledger  # reserved by the caller (the command line, before it loaded the model)
    book = open_ledger(ledger)
    if book is None:
        if unit is not None:
            raise LedgerError("unit= was given without a ledger: give ledger= (CLI: --ledger PATH or DPINFER_LEDGER)")
        return None
    if unit is None:
        if default_unit is None:
            raise LedgerError(
                f"{what} needs unit= (CLI: --unit NAME) on a ledger: the {scope} whose budget pays for it"
            )
        unit = default_unit(book)
    return Spend(book, unit, scope)


_CURRENT: contextvars.ContextVar[Spend | None] = contextvars.ContextVar("dpinfer_spend", default=None)
F = TypeVar("F", bound=Callable[..., Any])


def current_spend() -> Spend | None:
    """The :class:`Spend` of the :func:`charged` release running in this context (None without a ledger)."""
    return _CURRENT.get()


def charged(scope: str, *, what: str, default_unit: Callable[[Ledger, tuple[Any, ...], dict[str, Any]], str] | None
            = None) -> Callable[[F], F]:
    """Decorate a release function whose keyword arguments include ``ledger=`` and ``unit=``: with a ledger, a
    :class:`Spend` on the unit is active while it runs (:func:`current_spend`: the function reserves and settles
    it); it is committed when the function returns and cancelled when it raises."""
    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            ledger, unit = kwargs.pop("ledger", None), kwargs.pop("unit", None)
            default = None if default_unit is None else (lambda book: default_unit(book, args, kwargs))
            spend = start_spend(ledger, unit, scope=scope, default_unit=default, what=what)
            if spend is None:
                return fn(*args, **kwargs)
            token = _CURRENT.set(spend)
            try:
                result = fn(*args, **kwargs)
            except BaseException:
                spend.cancel()
                raise
            finally:
                _CURRENT.reset(token)
            spend.commit()
            return result

        return run  # type: ignore[return-value]

    return wrap


class LedgerCharges:
    """A resumable corpus job's per-record charge hook on a ledger (``reserve(key)`` → ``commit(token)`` /
    ``cancel(token)``, the protocol of the corpus loop), one unit per record.

    ``reserve(key)`` reserves, before the record is generated, a placeholder on its unit (``unit_of(key)``) under a
    resume key of this job and record, so a run killed and resumed takes over its own pending charge instead of
    reserving twice; the pipeline prices it exactly when it plans the record (:meth:`settle`; a refusal becomes the
    record's error); ``commit`` charges a record whose line is durable; one released without being priced (a torn
    line settled as released) is charged ``bound_of(key)``, an upper bound from the parameters alone."""

    def __init__(self, ledger: Ledger, *, job: str, scope: str, mechanism: str, unit_of: Callable[[str], str],
                 bound_of: Callable[[str], Cost], exact: bool = False, priced_elsewhere: bool = False) -> None:
        self.ledger, self.job, self.scope, self.mechanism = ledger, job, scope, mechanism
        self.unit_of, self.bound_of = unit_of, bound_of
        self.exact = exact
        """``bound_of`` is each record's exact cost (from the parameters alone): reserved as it is, never settled."""
        self.priced_elsewhere = priced_elsewhere
        """Records are priced by another process (a Ray actor) reserving under the same resume key: the placeholder
        is reserved ``settle_first`` and its phase in the ledger says whether it was priced."""
        self.spends: dict[str, Spend] = {}

    def reserve(self, key: str) -> Spend:
        spend = Spend(self.ledger, self.unit_of(key), self.scope, resume_key=self.ledger.resume_key(self.job, key))
        if self.priced_elsewhere:
            spend.charge = self.ledger.reserve(spend.unit, Cost.of(PureDp(0.0)), mechanism=self.mechanism,
                                               parameters={"estimate": False}, scope=self.scope,
                                               resume_key=spend.resume_key, settle_first=True)
        else:
            spend.reserve(self.bound_of(key) if self.exact else None, mechanism=self.mechanism)
        self.spends[key] = spend
        return spend

    def settle(self, key: str, guarantee: Guarantee) -> None:
        """The record ``key`` is planned: its exact cost (raises BudgetExceededError when it does not fit)."""
        self.spends[key].settle(guarantee)

    def commit(self, spend: Spend) -> None:
        if self.priced_elsewhere and spend.charge is not None and spend.charge.state == "pending":
            spend.settled = self.ledger.charge(spend.charge.id).phase == "releasing"
        if spend.charge is not None and spend.charge.state == "pending" and not spend.settled:
            spend.charge.settle(self.bound_of(_key_of(self.spends, spend)), force=True)
        spend.commit()

    def cancel(self, spend: Spend) -> None:
        spend.cancel()

    def reconcile(self, released: list[str], errors: list[str]) -> None:
        """After a run: a record whose line is in OUT but whose charge a killed run left pending is committed; an
        error record's pending charge (it released nothing) is cancelled."""
        for keys, done in ((released, True), (errors, False)):
            for key in keys:
                left = self.ledger.pending_charge(self.ledger.resume_key(self.job, key))
                if left is not None:
                    left.commit() if done else left.cancel()


def _key_of(spends: Mapping[str, Spend], spend: Spend) -> str:
    return next(key for key, value in spends.items() if value is spend)
