"""The one charge path: every release charged to a privacy-budget ledger (:class:`dpinfer.Ledger`) goes through
:func:`charge` (a library call, the command line, a corpus job; the service at merge).

One release, one :class:`Reservation` on one or more units (charged **in addition**: each unit pays the release's full
cost), in three steps:

1. **reserve**, before the model runs: the cost estimated from the parameters alone
   (:mod:`dpinfer.accounting.spend`'s estimates; ``None``: a placeholder of ε = 0, priced at step 2, that still
   refuses a unit without a budget or of another scope). Every unit is reserved, or none: if one refuses, those
   already reserved are cancelled and the refusal raised, in one line, before anything is loaded or generated.
2. **settle**, once the release is planned and before any token: the planned guarantee's exact cost replaces the
   estimate on every unit, re-checked against each budget (a refusal cancels them all).
3. **commit** once the release is handed over (returned or written), or **cancel** if it failed before that.

A planned task (:class:`dpinfer.task.Plan`) carries its :class:`Charges` (the cost from its ex-ante guarantee, the
scope, the mechanism): :func:`run_charged` is the step that runs it, ``run_charged(ledger, plan.charges, run)``
(settle, run, commit; cancel when ``run`` raises). A cost known before the model loads (an estimate from the settings)
is held with :func:`hold` on the reservation the caller opened with :func:`charge` or :func:`open_reservation`.
Outside :mod:`dpinfer.accounting` nothing calls a reservation's or a ledger's ``reserve`` / ``settle`` / ``commit``
(tests/unit/test_charge_path.py greps for it): those steps are taken here.

``with charge(ledger, units, cost, scope=...) as res:`` reserves ``cost`` on entry (when given), commits when the
block ends and cancels when it raises; inside, ``res.reserve(estimate)`` / ``res.settle(guarantee)`` /
``res.commit()`` / ``res.cancel()`` may run earlier (each is idempotent on a reservation already past it). A
:class:`Reservation` opened by a caller (the command line reserves before it loads the model) may be passed as
``ledger``: the same reservation is used and settled, and committed or cancelled by whichever block ends first.

A process killed between 1 and 3 leaves the reservation pending, which counts as spent (fail closed); an operator
may void it (``dpinfer budget void CHARGE``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from dpinfer.accounting.costs import Cost
from dpinfer.accounting.guarantee import Guarantee
from dpinfer.accounting.ledger import Charge, Ledger
from dpinfer.accounting.ledger_store import check_unit
from dpinfer.accounting.losses import PrivacyLoss, PureDp
from dpinfer.errors import LedgerError

__all__ = ["Charges", "LedgerLike", "RecordCharges", "Reservation", "charge", "close", "commit_left", "hold",
           "open_ledger", "open_reservation", "reserve", "run_charged", "spend_once"]

T = TypeVar("T")

LedgerLike = Ledger | str | os.PathLike[str] | None
"""What ``ledger=`` accepts: a :class:`~dpinfer.Ledger`, the path of one, or None (no ledger)."""

Price = Guarantee | Cost | PrivacyLoss
"""What a reservation is priced with: a release's guarantee, its cost per group, or one loss."""


def open_ledger(ledger: LedgerLike) -> Ledger | None:
    """``ledger`` as a :class:`~dpinfer.Ledger` (a path must hold an existing ledger), or None."""
    if ledger is None or isinstance(ledger, Ledger):
        return ledger
    if isinstance(ledger, (str, os.PathLike)):
        return Ledger(ledger)
    raise LedgerError(f"ledger= takes a dpinfer.Ledger or the path of one, got {type(ledger).__name__}")


class Reservation:
    """One release's charge on ``units`` of ``ledger`` (see the module docstring); ``resume_key``: a resumable job's
    key for this record (a pending charge left by a killed run of the same job is taken over, not reserved twice),
    the same for every unit or one per unit."""

    def __init__(self, ledger: Ledger, units: str | Sequence[str], scope: str | None, *,
                 resume_key: str | Sequence[str] | None = None) -> None:
        names = [units] if isinstance(units, str) else list(units)
        if not names:
            raise LedgerError("a charge needs at least one unit")
        keys = [resume_key] * len(names) if resume_key is None or isinstance(resume_key, str) else list(resume_key)
        if len(keys) != len(names):
            raise LedgerError("a charge takes one resume key, or one per unit")
        pairs: dict[str, str | None] = {}
        for unit, key in zip(names, keys, strict=True):
            pairs.setdefault(check_unit(unit), key)  # a unit named twice is charged once
        self.ledger = ledger
        self.units = tuple(pairs)
        self.resume_keys = tuple(pairs.values())
        self.scope = scope
        self.charges: list[Charge] = []
        self.settled = False
        """Whether the charges hold the release's exact cost (or an estimate from the parameters alone)."""
        self.refused: str | None = None
        """The unit whose budget refused the last reserve or settle (None otherwise)."""
        self.priced: Price | None = None
        """What the last :meth:`settle` priced the charges with."""

    @property
    def unit(self) -> str:
        """The first unit (the entity the release reads)."""
        return self.units[0]

    @property
    def pending(self) -> bool:
        """Whether a charge is reserved and neither committed nor cancelled yet."""
        return any(c.state == "pending" for c in self.charges)

    @property
    def charge(self) -> Charge | None:
        """The first unit's charge (None before step 1)."""
        return self.charges[0] if self.charges else None

    def _reserve_all(self, price: Price, mechanism: str | None, parameters: Mapping[str, Any] | None, *,
                     settle_first: bool = False) -> None:
        try:
            for unit, key in zip(self.units, self.resume_keys, strict=True):
                self.refused = unit
                self.charges.append(self.ledger.reserve(unit, price, mechanism=mechanism, parameters=parameters,
                                                        scope=self.scope, resume_key=key,
                                                        settle_first=settle_first))
            self.refused = None
        except BaseException:
            self.cancel()  # every unit or none
            raise

    def reserve(self, estimate: Price | None, *, mechanism: str, parameters: Mapping[str, Any] | None = None,
                settle_first: bool = False) -> None:
        """Step 1 (before the model runs): reserve ``estimate`` on every unit (None: a placeholder of ε = 0, priced
        at :meth:`settle`). Nothing happens on a reservation already made. ``settle_first``: nothing is released
        before the charges are settled (or marked releasing), so a holder that dies before has them cancelled
        (:meth:`Ledger.reserve <dpinfer.accounting.ledger.Ledger.reserve>`)."""
        if self.charges:
            return
        self._reserve_all(estimate if estimate is not None else Cost.of(PureDp(0.0)), mechanism,
                          {"estimate": estimate is not None, **(parameters or {})}, settle_first=settle_first)
        self.settled = estimate is not None

    def settle(self, price: Price, *, mechanism: str | None = None, force: bool = False) -> None:
        """Step 2 (planned, nothing generated): the release's exact cost on every unit (reserved now if nothing
        was). A unit that cannot afford it cancels every charge and raises. ``force``: a release that already
        happened, priced late (written without the check)."""
        if not self.charges:
            self._reserve_all(price, mechanism, None)
        else:
            cost = price if isinstance(price, Guarantee) else Cost.of(price)  # computed once for every unit
            try:
                for c in self.charges:
                    self.refused = c.unit
                    c.settle(cost, force=force)
                self.refused = None
            except BaseException:
                self.cancel()
                raise
        self.settled = True
        self.priced = price

    def commit(self) -> None:
        """Step 3: the release was handed over."""
        for c in self.charges:
            if c.state == "pending":
                c.commit()

    def releasing(self) -> None:
        """The release may become visible from now on (a stream's first token): a later :meth:`cancel` commits."""
        for c in self.charges:
            c.releasing()

    def cancel(self) -> None:
        """Nothing was released: every pending charge is cancelled; one marked :meth:`releasing` (part of the release
        may have left) is committed instead (fail closed)."""
        for c in self.charges:
            if c.state == "pending":
                c.commit() if c.released else c.cancel()

    def to_dict(self) -> dict[str, Any]:
        """What a release may say about its charge: the unit, the charge's number and its ε alone."""
        out: dict[str, Any] = {"unit": self.unit}
        if self.charge is not None:
            out.update(charge=self.charge.id, epsilon=self.charge.epsilon)
        return out


def open_reservation(ledger: LedgerLike | Reservation, units: str | Sequence[str] | None, *, scope: str | None,
                     default_unit: Callable[[Ledger], str] | None = None, what: str = "this release",
                     resume_key: str | Sequence[str] | None = None) -> Reservation | None:
    """A :class:`Reservation` on ``ledger`` for ``units`` (or ``default_unit(ledger)``), nothing reserved yet; None
    without a ledger. A unit without a ledger is refused (it would charge nothing). A :class:`Reservation` is
    returned as it is."""
    if isinstance(ledger, Reservation):
        return ledger  # opened by the caller (the command line, before it loaded the model)
    book = open_ledger(ledger)
    if book is None:
        if units:
            raise LedgerError("unit= was given without a ledger: give ledger= (CLI: --ledger PATH or DPINFER_LEDGER)")
        return None
    if not units:
        if default_unit is None:
            raise LedgerError(f"{what} needs unit= (CLI: --unit NAME) on a ledger: the {scope} whose budget pays "
                              "for it")
        units = default_unit(book)
    return Reservation(book, units, scope, resume_key=resume_key)


@contextlib.contextmanager
def charge(ledger: LedgerLike | Reservation, units: str | Sequence[str] | None, cost: Price | None = None, *,
           scope: str | None, mechanism: str | None = None, parameters: Mapping[str, Any] | None = None,
           default_unit: Callable[[Ledger], str] | None = None, what: str = "this release",
           resume_key: str | Sequence[str] | None = None) -> Iterator[Reservation | None]:
    """Charge one release to ``units`` of ``ledger`` (see the module docstring): ``cost`` (a
    :class:`~dpinfer.accounting.Guarantee`, :class:`~dpinfer.accounting.ledger.Cost` or loss; None: reserved in the
    block with :meth:`Reservation.reserve` or :meth:`Reservation.settle`) is reserved on entry, on every unit or
    none; the block's work runs; the charges are committed when it ends and cancelled when it raises. Yields the
    :class:`Reservation`, or None without a ledger (nothing is charged)."""
    res = open_reservation(ledger, units, scope=scope, default_unit=default_unit, what=what, resume_key=resume_key)
    if res is None:
        yield None
        return
    try:
        if cost is not None:
            if isinstance(cost, Guarantee) or mechanism is None:
                res.settle(cost, mechanism=mechanism)
            else:
                res.reserve(cost, mechanism=mechanism, parameters=parameters)
        yield res
    except BaseException:
        res.cancel()
        raise
    res.commit()


def reserve(ledger: LedgerLike | Reservation, units: str | Sequence[str] | None, cost: Price, *, scope: str | None,
            mechanism: str | None = None, resume_key: str | Sequence[str] | None = None,
            what: str = "this release") -> Reservation | None:
    """Step 1 alone, for a release that outlives the caller's call (a stream, a background job): ``cost`` on every
    unit or none (a refusal is raised here; :attr:`Reservation.refused` names the unit). A later
    ``with charge(res, None, scope=...)`` around the release commits it, or cancels it if the release fails; None
    without a ledger. ``mechanism``: the release's (a guarantee names its own)."""
    res = open_reservation(ledger, units, scope=scope, resume_key=resume_key, what=what)
    if res is not None:
        res.settle(cost, mechanism=mechanism)
    return res


def commit_left(ledger: Ledger, resume_keys: Sequence[str]) -> None:
    """A resumed job whose release is already out: the charges a killed run left pending under ``resume_keys`` are
    committed (released, so spent)."""
    for key in resume_keys:
        left = ledger.pending_charge(key)
        if left is not None:
            left.commit()


class RecordCharges:
    """A resumable corpus job's per-record charges (the corpus loop's protocol,
    :class:`dpinfer.jobs.resumable.Charge`: ``open(key)`` → ``close(token, released=...)``), one :class:`Reservation`
    per record on ``unit_of(key)``, under a resume key of this job and record, so a run killed and resumed takes over
    its own pending charge instead of reserving twice.

    ``open(key)`` reserves a placeholder before the record is generated (or, ``exact``, its exact cost
    ``bound_of(key)``, known from the parameters alone); the pipeline prices it when it plans the record
    (:meth:`price`; a refusal becomes the record's error); ``close`` charges a record whose line is durable; one
    released without being priced (a torn line settled as released) is charged ``bound_of(key)``, an upper bound
    from the parameters alone.

    ``priced_elsewhere``: another process prices the records (a Ray actor, reserving its exact cost under the same
    resume key, which takes over this placeholder: :mod:`dpinfer.pipelines.corpus_ray`). The placeholder is then
    reserved ``settle_first`` (a holder that dies before it is priced released nothing), and at ``close`` the
    ledger's phase of each charge says whether it was priced there (``releasing``) or still needs the bound."""

    def __init__(self, ledger: Ledger, *, job: str, scope: str, mechanism: str, unit_of: Callable[[str], str],
                 bound_of: Callable[[str], Cost], exact: bool = False, priced_elsewhere: bool = False) -> None:
        self.ledger, self.job, self.scope, self.mechanism = ledger, job, scope, mechanism
        self.unit_of, self.bound_of = unit_of, bound_of
        self.exact = exact
        self.priced_elsewhere = priced_elsewhere
        self.open_charges: dict[str, Reservation] = {}

    def open(self, key: str) -> Reservation:
        """Step 1 for the record ``key``, before it is generated (the corpus loop's protocol)."""
        res = Reservation(self.ledger, self.unit_of(key), self.scope,
                          resume_key=self.ledger.resume_key(self.job, key))
        if self.priced_elsewhere:
            res.reserve(None, mechanism=self.mechanism, settle_first=True)
        else:
            res.reserve(self.bound_of(key) if self.exact else None, mechanism=self.mechanism)
        self.open_charges[key] = res
        return res

    def price(self, key: str, guarantee: Guarantee) -> None:
        """Step 2: the record ``key`` is planned: its exact cost (raises BudgetExceededError when it does not fit)."""
        self.open_charges[key].settle(guarantee)

    def close(self, res: Reservation, *, released: bool) -> None:
        """Step 3: the record ended; ``released``: its line is durable (committed; one never priced is charged
        ``bound_of(key)``), else it released nothing (cancelled)."""
        if not released:
            res.cancel()
            return
        if self.priced_elsewhere and any(c.state == "pending" for c in res.charges):
            res.settled = all(self.ledger.charge(c.id).phase == "releasing" for c in res.charges)
        if not res.settled and res.charge is not None and res.charge.state == "pending":
            key = next(k for k, v in self.open_charges.items() if v is res)
            res.settle(self.bound_of(key), force=True)
        res.commit()

    @staticmethod
    def price_elsewhere(ledger: Ledger, unit: str, guarantee: Price, *, scope: str, resume_key: str) -> None:
        """The other process's half of ``priced_elsewhere`` (a Ray actor): the record's exact cost, reserved under
        its resume key, which takes over the driver's placeholder (or the charge an earlier attempt priced)."""
        ledger.reserve(unit, guarantee, scope=scope, resume_key=resume_key)

    def reconcile(self, released: list[str], errors: list[str]) -> None:
        """After a run: a record whose line is in OUT but whose charge a killed run left pending is committed; an
        error record's pending charge (it released nothing) is cancelled."""
        for keys, done in ((released, True), (errors, False)):
            for key in keys:
                left = self.ledger.pending_charge(self.ledger.resume_key(self.job, key))
                if left is not None:
                    left.commit() if done else left.cancel()


@dataclass(frozen=True)
class Charges:
    """What one planned release is charged (a :class:`dpinfer.task.Plan`'s ``charges``), from its parameters alone:
    ``cost`` (the ex-ante :class:`~dpinfer.accounting.Guarantee`, a :class:`~dpinfer.accounting.ledger.Cost` or a
    loss; None: the release costs nothing and nothing is charged, as plain generation), the ``scope`` of the units it
    is charged to (``document``, ``store``, ``corpus``, ``prompt-source``), the ``mechanism`` named on the ledger
    (a guarantee names its own), and ``units``: the units the plan itself names (usually none: the caller decides
    which units pay, by the service's unit rule or the command's ``--unit``; each unit pays the full cost)."""

    cost: Price | None
    scope: str | None = None
    mechanism: str | None = None
    units: tuple[str, ...] = ()


def hold(res: Reservation | None, estimate: Price | None, *, mechanism: str | None = None, exact: bool = False,
         settle_first: bool = False) -> None:
    """Step 1 on a reservation the caller opened, before the model loads: ``estimate`` (from the settings alone;
    None: a placeholder priced at :func:`run_charged`) on every unit or none (:meth:`Reservation.reserve`);
    ``exact``: it is the release's exact cost (its ex-ante guarantee, known before the model loads), settled at once
    (:meth:`Reservation.settle`). Nothing without a ledger (``res`` None)."""
    if res is None:
        return
    if exact and estimate is not None:
        res.settle(estimate, mechanism=mechanism)
    elif mechanism is None:
        raise LedgerError("an estimate is held with the mechanism's name (mechanism=...)")
    else:
        res.reserve(estimate, mechanism=mechanism, settle_first=settle_first)


def close(res: Reservation | None, *, released: bool) -> None:
    """Step 3 of a release run outside :func:`run_charged` (one of a batch's answers): committed when ``released``,
    else cancelled; nothing without a ledger."""
    if res is not None:
        res.commit() if released else res.cancel()


def run_charged(ledger: LedgerLike | Reservation, charges: Charges, run: Callable[[], T], *,
                units: str | Sequence[str] | None = None, default_unit: Callable[[Ledger], str] | None = None,
                what: str = "this release", resume_key: str | Sequence[str] | None = None,
                released: bool = False) -> T:
    """The charge step of a planned release: ``charges.cost`` settled on ``units`` (and the plan's own
    ``charges.units``) of ``ledger`` before ``run()`` generates anything (refused in one line when a unit cannot
    afford it; nothing runs), then ``run()`` (the engine and the task's ``finish``), then the charges committed; a
    ``run()`` that raises cancels them (or commits them, fail closed, where part of the release may have left:
    :meth:`Reservation.releasing`). ``ledger`` may be a :class:`Reservation` the caller opened (estimate held
    before the model loaded: :func:`hold`). ``released``: the release already happened (a resumed job's batch
    written by a killed run): priced late, without the budget check. Without a ledger ``run()`` just runs."""
    res = open_reservation(ledger, _units(units, charges), scope=charges.scope, default_unit=default_unit, what=what,
                           resume_key=resume_key)
    if res is None:
        return run()
    try:
        if charges.cost is not None and not (res.priced is charges.cost and res.settled):  # settled once
            res.settle(charges.cost, mechanism=charges.mechanism, force=released)
        out = run()
    except BaseException:
        res.cancel()
        raise
    res.commit()
    return out


def spend_once(ledger: LedgerLike, units: str | Sequence[str], cost: Price, *, scope: str | None,
               mechanism: str | None = None) -> None:
    """One release charged in one go (reserved, settled and committed: a benchmark of the ledger, a release already
    out); refused in one line when a unit cannot afford it."""
    run_charged(ledger, Charges(cost, scope=scope, mechanism=mechanism), lambda: None, units=units)


def _units(units: str | Sequence[str] | None, charges: Charges) -> str | list[str] | None:
    if not charges.units:
        return units
    given = [] if units is None else [units] if isinstance(units, str) else list(units)
    return [*given, *charges.units]
