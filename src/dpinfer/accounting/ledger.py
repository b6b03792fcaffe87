"""A persistent privacy-budget ledger: every release spends from a budget that survives processes, threads and crashes.

Each dpinfer release carries the (ε, δ) of that release alone. The ledger makes a *protected unit* (a document, a
corpus, a RAG store, the source of some prompts: docs/budget.md says which unit each mechanism charges) pay for every
release that read it, and refuses a release, before anything is generated, once the unit's budget would be exceeded.
Since every dpinfer guarantee is ex ante, the cost of a release is known from its parameters before the model runs.

One SQLite file (WAL journal, ``synchronous=FULL``), usable by many processes and threads at once: every spend is
checked and written in one ``BEGIN IMMEDIATE`` transaction, so two spends never both see the same remaining budget.
Or one PostgreSQL database (``Ledger("postgresql://USER@HOST/DB")``, :mod:`dpinfer.accounting.ledger_postgres`),
shared by processes on many machines: a spend locks its unit's row (``SELECT … FOR UPDATE``) in one transaction.

Composition is the accountant's: a unit's charges are kept as their Rényi-DP losses (:class:`Cost`, from the
release's :class:`~dpinfer.accounting.Guarantee`), composed per privacy group in RDP (:func:`compose`: ten releases at
ε = 4 cost far less than 40) and converted to ε once, at the unit's δ. A charge known only as an (ε, δ) pair (a
guarantee read back from JSON) composes by adding ε and δ. DP-Fusion's groups compose separately (the budget holds
for each group: the unit's spent ε is the worst group's); a whole-document charge (a :class:`Cost` without groups)
counts against every group.

API::

    ledger = Ledger.init(path, epsilon=40.0, delta=1e-5)   # create (or open) a ledger; default budget for new units
    ledger = Ledger(path)                                  # open an existing ledger (refused in one line if it is
                                                           # missing, corrupt, or not a dpinfer ledger)
    ledger.set_budget("case-42", epsilon=60.0)             # a unit's own budget (δ: the ledger's default δ)
    charge = ledger.reserve("case-42", guarantee)          # check + reserve in one transaction, or BudgetExceededError
    ...generate, write the release...                      # (a Cost or a PrivacyLoss is accepted too)
    charge.settle(exact_guarantee)                         # optional: the planned release's exact cost, re-checked
    charge.commit()                                        # after the release is durable
    charge.cancel()                                        # instead, if nothing was released
    with ledger.spend("case-42", guarantee) as charge:     # reserve → commit; cancelled if the block raises before
        charge.releasing()                                 # charge.releasing() (after it, an exception commits)
    ledger.status("case-42")                               # UnitStatus: budget, spent (pending included), left, ...
    ledger.units()                                         # every unit's UnitStatus
    ledger.history("case-42")                              # every ChargeRecord of the unit, oldest first
    ledger.void(charge_id)                                 # operator: void a PENDING reservation (a killed process)
    ledger.unit_for_text(document)                         # "h-" + HMAC-SHA256 under the ledger's own secret
    ledger.reserve(unit, cost, resume_key=ledger.resume_key(job, record_id))   # a resumed job takes over the
                                                           # pending charge its killed run left for the record

States of a charge: ``pending`` (reserved; counted as spent, so a process killed between reserve and commit fails
closed), ``committed``, ``cancelled`` (nothing was released), ``void`` (an operator's decision that a pending
reservation released nothing). Only ``pending`` and ``committed`` count.

What the file holds: unit names, budgets, each charge's mechanism, public parameters, Rényi loss, state and times.
Never private text, never a seed, never a plain hash of a document: :meth:`Ledger.unit_for_text` is an HMAC under a
random 256-bit secret stored in the ledger, so the same document maps to the same unit while nobody without the file
can test a guess (keep the file as private as the documents' metadata: whoever holds it can test guesses).

>>> import tempfile, os
>>> from dpinfer.accounting import Zcdp
>>> path = os.path.join(tempfile.mkdtemp(), "budget.db")
>>> ledger = Ledger.init(path, epsilon=5.0)
>>> with ledger.spend("demo", Zcdp(0.5), mechanism="gaussian") as charge:
...     pass
>>> status = ledger.status("demo")
>>> status.releases, round(status.spent, 3) == round(Zcdp(0.5).to_epsilon(1e-5), 3)
(1, True)
>>> ledger.reserve("demo", Zcdp(0.5).times(3), mechanism="gaussian")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
dpinfer.errors.BudgetExceededError: budget exceeded for unit 'demo': budget ε = 5 (δ = 1e-05), spent ε = 4.73 ...
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import socket
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from dpinfer._json import plain
from dpinfer.accounting.costs import Cost, Loss, composed_epsilon
from dpinfer.accounting.guarantee import Guarantee
from dpinfer.accounting.ledger_store import _RECORD, ChargeRecord, LedgerStore, UnitStatus, _record, check_unit
from dpinfer.checks import check_delta, format_up, non_negative_number
from dpinfer.defaults import LEDGER
from dpinfer.errors import BudgetExceededError, ConfigurationError, LedgerError

__all__ = [
    "Charge",
    "Ledger",
    "holder_alive",
    "holder_id",
    "settle_dead",
]


class Charge:
    """A reservation on a unit (:meth:`Ledger.reserve`): :meth:`commit` once the release is durable, :meth:`cancel`
    if nothing was released. Until one of them, it is pending and counted as spent."""

    def __init__(self, ledger: Ledger, id: int, unit: str, epsilon: float) -> None:
        self.ledger = ledger
        self.id = id
        self.unit = unit
        self.epsilon = epsilon
        """This release's ε alone, at the unit's δ."""
        self.state = "pending"
        self.released = False

    def releasing(self) -> None:
        """Mark that the release may become visible: from now on :meth:`Ledger.spend` commits even on an error, and
        the ledger holds the charge in the ``releasing`` phase (a dead holder's charge is then committed)."""
        self.released = True
        self.ledger._mark_releasing(self.id)

    def commit(self) -> None:
        """The release happened: the charge stays spent for good (a voided reservation is revived: fail closed)."""
        self.ledger._transition(self.id, "committed", ("pending", "void", "committed"))
        self.state = "committed"

    def settle(self, cost: Cost | Guarantee | Loss, *, force: bool = False) -> None:
        """Replace the reserved cost by the release's exact ``cost`` (e.g. the guarantee of the planned release, when
        the reservation was made from its target before the model loaded), re-checked against the budget in one
        transaction; if it does not fit, the reservation is cancelled and :class:`BudgetExceededError` raised.
        ``force=True`` (a release that already happened, priced late): written without the check."""
        params = None
        if isinstance(cost, Guarantee):
            params = json.dumps(plain(dict(cost.parameters)), sort_keys=True, ensure_ascii=False)
        self.epsilon = self.ledger._settle(self, Cost.of(cost), params, force=force)

    def cancel(self) -> None:
        """Nothing was released: the reservation no longer counts."""
        if self.released:
            raise LedgerError(f"charge {self.id} was marked as releasing; a release cannot be cancelled, commit it")
        self.ledger._transition(self.id, "cancelled", ("pending", "cancelled"))
        self.state = "cancelled"

    def __repr__(self) -> str:
        return f"Charge(id={self.id}, unit={self.unit!r}, epsilon={self.epsilon:.4g}, state={self.state!r})"


# ------------------------------------------------------------------------------------------------------ the ledger
class Ledger(LedgerStore):
    """A privacy-budget ledger in one SQLite file or one PostgreSQL database (see the module docstring). Safe to share
    between threads; a forked child may reuse the object (it opens its own connections)."""

    # ---------------------------------------------------------------- opening
    @classmethod
    def init(cls, path: str | os.PathLike[str], *, epsilon: float | None = None,
             delta: float = LEDGER.delta) -> Ledger:
        """Create the ledger at ``path`` (or open it, if it is one) and set the default budget for new units
        (``epsilon=None``: none, so every unit needs :meth:`set_budget` before its first spend)."""
        ledger = cls(path, create=True)
        ledger.set_default(epsilon, delta)
        return ledger

    def set_budget(self, unit: str, epsilon: float, delta: float | None = None) -> UnitStatus:
        """Set ``unit``'s budget (δ: the ledger's default δ when not given). A budget below what is spent is kept:
        every later spend on the unit is refused."""
        unit = check_unit(unit)
        eps = non_negative_number(epsilon, "ε", allow_inf=False)
        delta = self.default_budget()[1] if delta is None else check_delta(delta, "δ")
        now = time.time()
        with self._transaction("set a budget") as con:
            con.execute(
                "INSERT INTO units (unit, epsilon, delta, created, updated) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT(unit) DO UPDATE SET epsilon = excluded.epsilon, delta = excluded.delta, "
                "updated = excluded.updated", (unit, eps, delta, now, now))
        return self.status(unit)

    # ---------------------------------------------------------------- spending
    def reserve(self, unit: str, cost: Cost | Guarantee | Loss, *, mechanism: str | None = None,
                parameters: Mapping[str, Any] | None = None, scope: str | None = None,
                resume_key: str | None = None, settle_first: bool = False, holder: str | None = None) -> Charge:
        """Check that ``cost`` fits ``unit``'s budget and reserve it, in one transaction; or raise
        :class:`~dpinfer.errors.BudgetExceededError` (one line: unit, budget, spent, cost). ``mechanism`` and
        ``parameters`` default to the guarantee's (public parameters only). ``scope`` names what the unit protects
        (``"document"``, ``"corpus"``, ``"store"``, ``"prompt-source"``): a unit keeps the scope of its first charge
        and refuses charges of another, whose adjacency would not compose with it. ``resume_key`` (a job's key for
        one record, :meth:`resume_key`): a PENDING charge of the unit with the same key, left by a killed run of the
        same job or by a failed attempt of a retried task, is taken over (re-priced) instead of reserving the record
        a second time, so reserving under one key is idempotent.

        The charge records its holder (``holder``, default this process: ``host:pid:start``) and a lease.
        ``settle_first``: the caller releases nothing before :meth:`Charge.settle` or :meth:`Charge.releasing`;
        until then the charge is in the ``reserved`` phase, and if its holder dies :func:`settle_dead` cancels it.
        Without it (the default) the charge is ``releasing`` from the start and a dead holder's charge is committed
        (counted for good): never an under-count."""
        unit = check_unit(unit)
        if isinstance(cost, Guarantee):
            mechanism = cost.mechanism if mechanism is None else mechanism
            parameters = cost.parameters if parameters is None else parameters
        if not isinstance(mechanism, str) or not mechanism:
            raise ConfigurationError("a charge needs the mechanism's name (mechanism=...)")
        price = Cost.of(cost)
        params = json.dumps(plain(dict(parameters or {})), sort_keys=True, ensure_ascii=False)
        now = time.time()
        owner = holder_id() if holder is None else check_unit(holder)
        phase = "reserved" if settle_first else "releasing"
        lock = self.lock_rows
        with self._transaction("reserve a spend") as con:
            row = con.execute(f"SELECT epsilon, delta, scope FROM units WHERE unit = ?{lock}", (unit,)).fetchone()
            if row is None:
                default_eps, default_delta = self.default_budget(con)
                if default_eps is None:
                    raise BudgetExceededError(
                        f"unit {unit!r} has no budget in {self.path}: set one with `dpinfer budget set {unit} "
                        "--epsilon E` or a default for new units with `dpinfer budget init --epsilon E`"
                    )
                con.execute("INSERT INTO units (unit, epsilon, delta, scope, created, updated) VALUES "
                            "(?, ?, ?, ?, ?, ?) ON CONFLICT (unit) DO NOTHING",
                            (unit, default_eps, default_delta, scope, now, now))
                # the row is ours, or another spend's that created it first (its insert is committed by now)
                row = con.execute(f"SELECT epsilon, delta, scope FROM units WHERE unit = ?{lock}", (unit,)).fetchone()
            budget, delta, unit_scope = row
            if scope is not None and unit_scope is not None and scope != unit_scope:
                raise LedgerError(
                    f"unit {unit!r} protects a {unit_scope}; this release protects a {scope} (another adjacency): "
                    "charge it to another unit"
                )
            if scope is not None and unit_scope is None:
                con.execute("UPDATE units SET scope = ? WHERE unit = ?", (scope, unit))
            if resume_key is not None:
                left = con.execute("SELECT id, phase FROM charges WHERE unit = ? AND resume_key = ? AND "
                                   f"state = 'pending' ORDER BY id LIMIT 1{lock}", (unit, resume_key)).fetchone()
                if left is not None:  # the same record of the same job, reserved by a run that was killed
                    alone = self._check_fits(con, unit, budget, delta, price, without=left[0])
                    taken = phase if left[1] == "reserved" else "releasing"  # a phase never goes back
                    con.execute("UPDATE charges SET cost = ?, epsilon = ?, parameters = ?, updated = ?, holder = ?, "
                                "lease = ?, phase = ? WHERE id = ?",
                                (price.to_json(), _stored(alone), params, now, owner, now + LEDGER.lease_s, taken,
                                 left[0]))
                    return Charge(self, int(left[0]), unit, alone)
            alone = self._check_fits(con, unit, budget, delta, price)
            charge_id = con.execute(
                "INSERT INTO charges (unit, mechanism, scope, parameters, cost, epsilon, state, created, updated, "
                "resume_key, holder, lease, phase) VALUES (?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?) "
                "RETURNING id",
                (unit, mechanism, scope, params, price.to_json(), _stored(alone), now, now, resume_key, owner,
                 now + LEDGER.lease_s, phase)).fetchone()[0]
        return Charge(self, int(charge_id), unit, alone)

    def _check_fits(self, con: Any, unit: str, budget: float, delta: float, price: Cost,
                    without: int | None = None) -> float:
        """Raise BudgetExceededError unless ``price`` fits ``unit``'s budget next to its counted charges (except
        charge ``without``); return the ε of ``price`` alone."""
        rows = con.execute("SELECT id, cost, state FROM charges WHERE unit = ? AND state IN ('pending', 'committed')",
                           (unit,)).fetchall()
        costs = [Cost.from_json(text) for charge_id, text, _ in rows if charge_id != without]
        spent = max(composed_epsilon(costs, delta).values()) if costs else 0.0
        after = max(composed_epsilon([*costs, price], delta).values())
        alone = price.epsilon(delta)
        if math.isinf(alone):
            raise BudgetExceededError(
                f"unit {unit!r}: this release costs ε = ∞ (its method has no privacy guarantee), which no budget "
                "affords; nothing was generated. Use a private method, or release without a ledger"
            )
        if not after <= budget:
            pending = sum(1 for charge_id, _, state in rows if state == "pending" and charge_id != without)
            waiting = f", {pending} pending" if pending else ""
            raise BudgetExceededError(
                f"budget exceeded for unit {unit!r}: budget ε = {format_up(budget)} (δ = {format_up(delta)}), "
                f"spent ε = {format_up(spent)} ({len(costs)} release{'' if len(costs) == 1 else 's'}{waiting}), "
                f"this release costs ε = {format_up(alone)} and would bring it to ε = {format_up(after)}; nothing "
                f"was generated. Raise the budget (`dpinfer budget set {unit} --epsilon E`) or use another unit"
            )
        return alone

    def _settle(self, charge: Charge, price: Cost, params: str | None, force: bool = False) -> float:
        refused: BudgetExceededError | None = None
        with self._transaction(f"settle charge {charge.id}") as con:
            row = con.execute("SELECT c.state, u.epsilon, u.delta FROM charges c JOIN units u ON u.unit = c.unit "
                              f"WHERE c.id = ?{self.lock_rows}", (charge.id,)).fetchone()
            if row is None or row[0] != "pending":
                raise LedgerError(f"charge {charge.id} is {row[0] if row else 'unknown'}; only a pending charge can "
                                  "be settled")
            try:
                alone = price.epsilon(row[2]) if force else \
                    self._check_fits(con, charge.unit, row[1], row[2], price, without=charge.id)
            except BudgetExceededError as exc:
                refused = exc
                con.execute("UPDATE charges SET state = 'cancelled', updated = ? WHERE id = ?",
                            (time.time(), charge.id))
            else:
                now = time.time()  # settled: the release is planned and may start (never back to 'reserved')
                con.execute("UPDATE charges SET cost = ?, epsilon = ?, updated = ?, lease = ?, phase = 'releasing' "
                            "WHERE id = ?", (price.to_json(), _stored(alone), now, now + LEDGER.lease_s, charge.id))
                if params is not None:
                    con.execute("UPDATE charges SET parameters = ? WHERE id = ?", (params, charge.id))
        if refused is not None:
            charge.state = "cancelled"
            raise refused
        return alone

    @contextmanager
    def spend(self, unit: str, cost: Cost | Guarantee | Loss, *, mechanism: str | None = None,
              parameters: Mapping[str, Any] | None = None, scope: str | None = None) -> Iterator[Charge]:
        """Reserve → release → commit around a block: committed when the block returns; cancelled when it raises
        before :meth:`Charge.releasing` was called, committed (fail closed) when it raises after."""
        charge = self.reserve(unit, cost, mechanism=mechanism, parameters=parameters, scope=scope)
        try:
            yield charge
        except BaseException:
            if charge.released:
                charge.commit()
            elif charge.state == "pending":
                charge.cancel()
            raise
        if charge.state == "pending":
            charge.commit()

    def _transition(self, charge_id: int, state: str, allowed: tuple[str, ...]) -> None:
        with self._transaction(f"mark charge {charge_id} {state}") as con:
            row = con.execute(f"SELECT state FROM charges WHERE id = ?{self.lock_rows}", (charge_id,)).fetchone()
            if row is None:
                raise self._refuse(f"has no charge {charge_id}; list them with `dpinfer budget history UNIT`")
            if row[0] not in allowed:
                raise LedgerError(f"charge {charge_id} is {row[0]}; it cannot become {state}")
            con.execute("UPDATE charges SET state = ?, updated = ? WHERE id = ?", (state, time.time(), charge_id))

    def _mark_releasing(self, charge_id: int) -> None:
        now = time.time()
        with self._transaction(f"mark charge {charge_id} releasing") as con:
            con.execute("UPDATE charges SET phase = 'releasing', updated = ?, lease = ? WHERE id = ? AND "
                        "state = 'pending'", (now, now + LEDGER.lease_s, charge_id))

    def settle_dead(self, *, now: float | None = None) -> list[ChargeRecord]:
        """Settle the pending charges whose holder died, by one rule (docs/budget.md): a charge still in the
        ``reserved`` phase (nothing can have been released: its holder had neither settled it nor marked it
        releasing) is cancelled; any other is committed, counted for good. A holder is dead when it ran on this
        machine and its process is gone (or its id now names another process), or when it ran elsewhere and its
        lease ran out. A charge without a holder (written before ledger schema 2) is left pending (void it by hand
        if you know it released nothing), and so is a charge reserved under a resume key: it belongs to a resumable
        job whose next run takes it over (or commits it, when its release reached the output), and settling it here
        would make that run charge the record a second time. Returns the charges settled."""
        now = time.time() if now is None else now
        settled: list[ChargeRecord] = []
        rows = self._query("SELECT id, holder, lease FROM charges WHERE state = 'pending' AND holder IS NOT NULL "
                           "AND resume_key IS NULL ORDER BY id")
        for charge_id, holder, lease in rows:
            if not holder_alive(holder, lease, now):
                settled += self._settle_dead(int(charge_id), holder)
        return settled

    def settle_job(self, resume_keys: list[str], holder: str) -> list[ChargeRecord]:
        """The pending charges of a resumable job that will not run again (its holder ``holder`` died, and the job
        is reported failed) reserved under ``resume_keys`` by that holder, settled by :meth:`settle_dead`'s rule."""
        settled: list[ChargeRecord] = []
        for key in resume_keys:
            for (charge_id,) in self._query("SELECT id FROM charges WHERE resume_key = ? AND state = 'pending' AND "
                                            "holder = ? ORDER BY id", (key, holder)):
                settled += self._settle_dead(int(charge_id), holder)
        return settled

    def _settle_dead(self, charge_id: int, holder: str) -> list[ChargeRecord]:
        with self._transaction(f"settle charge {charge_id} of a dead holder") as con:
            row = con.execute(f"SELECT state, phase, holder FROM charges WHERE id = ?{self.lock_rows}",
                              (charge_id,)).fetchone()
            if row is None or row[0] != "pending" or row[2] != holder:
                return []  # settled meanwhile, or taken over by a live run
            state = "cancelled" if row[1] == "reserved" else "committed"
            con.execute("UPDATE charges SET state = ?, updated = ? WHERE id = ?", (state, time.time(), charge_id))
        return [self.charge(charge_id)]

    def void(self, charge_id: int) -> ChargeRecord:
        """Operator's decision that a PENDING reservation released nothing (e.g. its process was killed before it
        wrote anything): it stops counting. Committed charges cannot be voided: their release happened."""
        if isinstance(charge_id, bool) or not isinstance(charge_id, int):
            raise LedgerError(f"a charge is named by its number (see `dpinfer budget history UNIT`), got {charge_id!r}")
        self._transition(charge_id, "void", ("pending",))
        return self.charge(charge_id)

    # ---------------------------------------------------------------- reading
    def charge(self, charge_id: int) -> ChargeRecord:
        rows = self._query(f"SELECT {_RECORD} FROM charges WHERE id = ?", (charge_id,))
        if not rows:
            raise self._refuse(f"has no charge {charge_id}; list them with `dpinfer budget history UNIT`")
        return _record(rows[0])

    def history(self, unit: str) -> list[ChargeRecord]:
        """Every charge of ``unit`` (all states), oldest first."""
        unit = check_unit(unit)
        self._unit_row(unit)
        return [_record(row) for row in self._query(f"SELECT {_RECORD} FROM charges WHERE unit = ? ORDER BY id",
                                                    (unit,))]

    def _unit_row(self, unit: str) -> tuple[Any, ...]:
        rows = self._query("SELECT unit, epsilon, delta, scope FROM units WHERE unit = ?", (unit,))
        if not rows:
            raise self._refuse(f"has no unit {unit!r}; list them with `dpinfer budget show`")
        return rows[0]

    def status(self, unit: str) -> UnitStatus:
        """``unit``'s budget and spend (pending reservations counted as spent)."""
        unit = check_unit(unit)
        return self._status(self._unit_row(unit))

    def _status(self, row: tuple[Any, ...]) -> UnitStatus:
        unit, budget, delta, scope = row
        rows = self._query("SELECT cost, state FROM charges WHERE unit = ? AND state IN ('pending', 'committed')",
                           (unit,))
        counted = [Cost.from_json(text) for text, _ in rows]
        committed = [Cost.from_json(text) for text, state in rows if state == "committed"]
        groups = composed_epsilon(counted, delta) if counted else {}
        return UnitStatus(
            unit=unit, epsilon=budget, delta=delta, spent=max(groups.values(), default=0.0),
            committed=max(composed_epsilon(committed, delta).values()) if committed else 0.0,
            releases=len(committed), pending=len(counted) - len(committed), scope=scope, groups=groups)

    def units(self) -> list[UnitStatus]:
        """Every unit's status, by name."""
        return [self._status(row) for row in self._query("SELECT unit, epsilon, delta, scope FROM units ORDER BY unit")]

    # ---------------------------------------------------------------- keyed hash
    def unit_for_text(self, text: str) -> str:
        """The unit of a document named by its content: ``"h-"`` + the first 128 bits of HMAC-SHA256 of the text
        under this ledger's secret. The same text always maps to the same unit of this ledger; without the ledger
        file the name cannot be tested against a guess, and nothing in the file is a plain hash of the text."""
        if not isinstance(text, str):
            raise LedgerError(f"unit_for_text needs the text as a str, got {type(text).__name__}")
        with self._lock:
            if self._secret is None:
                self._secret = bytes.fromhex(self._query("SELECT value FROM meta WHERE key = 'secret'")[0][0])
        digest = hmac.new(self._secret, text.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()
        return "h-" + digest[:32]

    def pending_charge(self, resume_key: str) -> Charge | None:
        """The pending charge reserved under ``resume_key`` (by a run that was killed), or None."""
        rows = self._query("SELECT id, unit, epsilon FROM charges WHERE resume_key = ? AND state = 'pending' "
                           "ORDER BY id LIMIT 1", (resume_key,))
        if not rows:
            return None
        charge_id, unit, epsilon = rows[0]
        return Charge(self, int(charge_id), unit, math.inf if epsilon >= 1e308 else epsilon)

    def resume_key(self, job: str, record: str) -> str:
        """The key of one ``record`` of a resumable ``job`` (e.g. the output file's path and the record's id): an
        HMAC under the ledger's secret, so the ledger holds no job or record name."""
        return "r-" + self.unit_for_text(f"{job}\x00{record}")[2:]

    def __repr__(self) -> str:
        return f"Ledger({str(self.path)!r})"


def _stored(epsilon: float) -> float:
    return epsilon if math.isfinite(epsilon) else 1e308


def _start_ticks(pid: int) -> str:
    """The start time of process ``pid`` in clock ticks since boot (Linux; "" elsewhere or when it is gone): with
    the pid, it names one process even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def holder_id() -> str:
    """This process as a reservation's holder: ``host:pid:start``."""
    return f"{socket.gethostname()}:{os.getpid()}:{_start_ticks(os.getpid())}"


def holder_alive(holder: str, lease: float | None, now: float) -> bool:
    """Whether a reservation's holder may still be alive: a process of this machine is looked up (gone, or its pid
    reused by another process: dead); any other holder (another machine, a replica's id) is alive until its lease
    runs out."""
    host, _, rest = holder.partition(":")
    pid, _, start = rest.partition(":")
    if host == socket.gethostname() and pid.isdigit():
        ticks = _start_ticks(int(pid))
        if not ticks:
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
            return not start  # alive, but /proc cannot tell which process it is: trust the pid without a start
        return not start or ticks == start
    return lease is None or lease > now


def settle_dead(ledger: Ledger) -> list[ChargeRecord]:
    """Settle the pending charges of dead holders by the ledger's rule (:meth:`Ledger.settle_dead`): what a service
    calls at its start and ``dpinfer budget settle-dead`` runs."""
    return ledger.settle_dead()
