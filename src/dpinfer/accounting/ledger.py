"""A persistent privacy-budget ledger: every release spends from a budget that survives processes, threads and crashes.

Each dpinfer release carries the (ε, δ) of that release alone. The ledger makes a *protected unit* (a document, a
corpus, a RAG store, the source of some prompts: docs/budget.md says which unit each mechanism charges) pay for every
release that read it, and refuses a release, before anything is generated, once the unit's budget would be exceeded.
Since every dpinfer guarantee is ex ante, the cost of a release is known from its parameters before the model runs.

One SQLite file (WAL journal, ``synchronous=FULL``), usable by many processes and threads at once: every spend is
checked and written in one ``BEGIN IMMEDIATE`` transaction, so two spends never both see the same remaining budget.

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
import secrets
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from dpinfer._json import plain
from dpinfer.accounting.guarantee import Guarantee
from dpinfer.accounting.losses import PrivacyLoss, PureDp, RdpCurve, SingleOrderRdp, Zcdp, compose
from dpinfer.checks import check_delta, format_up, non_negative_number
from dpinfer.defaults import LEDGER
from dpinfer.errors import BudgetExceededError, ConfigurationError, LedgerError

__all__ = [
    "ALL_GROUPS",
    "ApproxDp",
    "BudgetExceededError",
    "Charge",
    "ChargeRecord",
    "Cost",
    "Ledger",
    "LedgerError",
    "UnitStatus",
    "check_unit",
    "composed_epsilon",
]

APPLICATION_ID = 0x64704C67
"""``PRAGMA application_id`` of a dpinfer ledger ("dpLg"): a SQLite file without it is refused as foreign."""
SCHEMA_VERSION = 1
ALL_GROUPS = "*"
"""The group key of a charge that protects the whole unit (no privacy groups): it counts against every group."""
_SQLITE_HEADER = b"SQLite format 3\x00"
_MAX_UNIT = 128

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS units (
    unit TEXT PRIMARY KEY,
    epsilon REAL NOT NULL CHECK (epsilon >= 0),
    delta REAL NOT NULL CHECK (delta > 0 AND delta < 1),
    scope TEXT,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS charges (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    unit TEXT NOT NULL REFERENCES units(unit),
    mechanism TEXT NOT NULL,
    scope TEXT,
    parameters TEXT NOT NULL,
    cost TEXT NOT NULL,
    epsilon REAL NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending', 'committed', 'cancelled', 'void')),
    created REAL NOT NULL,
    updated REAL NOT NULL,
    resume_key TEXT
);
CREATE INDEX IF NOT EXISTS charges_by_unit ON charges (unit, state);
CREATE INDEX IF NOT EXISTS charges_by_resume_key ON charges (resume_key);
"""


# ------------------------------------------------------------------------------------------------------ the cost
@dataclass(frozen=True)
class ApproxDp:
    """A loss known only as an (ε, δ)-DP pair (e.g. a guarantee read back from JSON): composes by adding ε and δ.

    >>> ApproxDp(1.0, 1e-6)
    ApproxDp(epsilon=1.0, delta=1e-06)
    """

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", non_negative_number(self.epsilon, "ε", allow_inf=True))
        delta = float(self.delta)
        if not 0.0 <= delta < 1.0:
            raise ConfigurationError(f"an (ε, δ) charge needs 0 ≤ δ < 1, got {self.delta!r}")
        object.__setattr__(self, "delta", delta)


Loss = PrivacyLoss | ApproxDp


def _loss_to_json(loss: Loss) -> dict[str, Any]:
    if isinstance(loss, ApproxDp):
        return plain({"kind": "approx", "epsilon": loss.epsilon, "delta": loss.delta})
    if isinstance(loss, Zcdp):
        return {"kind": "zcdp", "rho": loss.rho}
    if isinstance(loss, PureDp):
        return {"kind": "pure", "epsilon": loss.epsilon, "bounded_range": loss.bounded_range}
    if isinstance(loss, SingleOrderRdp):
        return plain({"kind": "single_order", "alpha": loss.alpha, "epsilon": loss.epsilon})
    orders = loss.orders
    return plain({"kind": "curve", "orders": list(orders), "epsilons": [loss.rdp(alpha) for alpha in orders]})


def _loss_from_json(data: Mapping[str, Any]) -> Loss:
    kind = data["kind"]
    if kind == "approx":
        return ApproxDp(float(data["epsilon"]), float(data["delta"]))
    if kind == "zcdp":
        return Zcdp(float(data["rho"]))
    if kind == "pure":
        return PureDp(float(data["epsilon"]), bool(data["bounded_range"]))
    if kind == "single_order":
        return SingleOrderRdp(float(data["alpha"]), float(data["epsilon"]))
    if kind == "curve":
        return RdpCurve([float(a) for a in data["orders"]], [float(e) for e in data["epsilons"]])
    raise ValueError(f"unknown loss kind {kind!r}")


@dataclass(frozen=True)
class Cost:
    """What one release costs its unit: a loss per privacy group (:data:`ALL_GROUPS` for the whole unit).

    Built from parameters only: :meth:`from_guarantee` takes the release's ex-ante guarantee (each group's Rényi loss
    when it carries one, else its (ε, δ) pair); a guarantee with ε = ∞ or without an ex-ante figure costs ε = ∞ and
    is refused by every budget.

    >>> Cost.of(Zcdp(0.1)).parts
    mappingproxy({'*': Zcdp(rho=0.1)})
    """

    parts: Mapping[str, Loss] = field(hash=False)

    def __post_init__(self) -> None:
        if not self.parts:
            raise ConfigurationError("a cost needs at least one loss")
        for name, loss in self.parts.items():
            if not isinstance(name, str) or not name:
                raise ConfigurationError(f"a cost's group names must be non-empty strings, got {name!r}")
            if not isinstance(loss, (PrivacyLoss, ApproxDp)):
                raise ConfigurationError(f"a cost's losses must be PrivacyLoss or ApproxDp, got {type(loss).__name__}")
        object.__setattr__(self, "parts", MappingProxyType(dict(sorted(self.parts.items()))))

    @classmethod
    def of(cls, loss: Loss | Guarantee | Cost) -> Cost:
        """A :class:`Cost` from a guarantee, a whole-unit loss, or a cost."""
        if isinstance(loss, Cost):
            return loss
        if isinstance(loss, Guarantee):
            return cls.from_guarantee(loss)
        if isinstance(loss, (PrivacyLoss, ApproxDp)):
            return cls({ALL_GROUPS: loss})
        raise ConfigurationError(
            f"a ledger charges a Guarantee, a PrivacyLoss or a Cost, got {type(loss).__name__}"
        )

    @classmethod
    def from_guarantee(cls, guarantee: Guarantee) -> Cost:
        """The cost of a release with this ex-ante ``guarantee``: per group if it has groups, else for the unit."""
        if not guarantee.ex_ante or math.isinf(guarantee.epsilon):
            return cls({ALL_GROUPS: ApproxDp(math.inf, 0.0)})
        if guarantee.groups:
            return cls({group.name: group.loss if group.loss is not None else ApproxDp(group.epsilon, group.delta)
                        for group in guarantee.groups})
        loss = guarantee.loss if guarantee.loss is not None else ApproxDp(guarantee.epsilon, guarantee.delta)
        return cls({ALL_GROUPS: loss})

    def to_json(self) -> str:
        return json.dumps({name: _loss_to_json(loss) for name, loss in self.parts.items()}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Cost:
        return cls({name: _loss_from_json(data) for name, data in json.loads(text).items()})

    def epsilon(self, delta: float) -> float:
        """This release's ε alone at ``delta`` (the worst group's)."""
        return max(composed_epsilon([self], delta).values())


def _convert(rdp: list[PrivacyLoss], approx: list[ApproxDp], delta: float) -> float:
    """ε of the composition of ``rdp`` (in RDP) and ``approx`` (basic composition) at total ``delta``."""
    esum = math.fsum(a.epsilon for a in approx)
    dsum = math.fsum(a.delta for a in approx)
    if not rdp:
        return esum if dsum <= delta else math.inf
    left = delta - dsum
    if left <= 0.0 or math.isinf(esum):
        return math.inf
    # single-order bounds hold at their order only: bounds at different orders are converted apart (δ split evenly)
    families: dict[float | None, list[PrivacyLoss]] = {}
    for loss in rdp:
        families.setdefault(loss.alpha if isinstance(loss, SingleOrderRdp) else None, []).append(loss)
    orders = [key for key in families if key is not None]
    if orders and None in families:
        families[orders[0]].extend(families.pop(None))
    share = left / len(families)
    return math.fsum(compose(*losses).to_epsilon(share) for losses in families.values()) + esum


def composed_epsilon(costs: list[Cost], delta: float) -> dict[str, float]:
    """The composed ε of ``costs`` per privacy group, converted once at ``delta`` (composition in RDP; see the module
    docstring). Groups are the named groups of any cost, or :data:`ALL_GROUPS` when none has groups.

    >>> from dpinfer.accounting import Zcdp
    >>> eps = composed_epsilon([Cost.of(Zcdp(0.1))] * 10, 1e-5)
    >>> eps["*"] == Zcdp(1.0).to_epsilon(1e-5)
    True
    """
    delta = check_delta(delta, "the unit's δ")
    named = sorted({name for cost in costs for name in cost.parts if name != ALL_GROUPS}) or [ALL_GROUPS]
    out = {}
    for group in named:
        counts: Counter[str] = Counter()
        for cost in costs:
            for name, loss in cost.parts.items():
                if name in (group, ALL_GROUPS):
                    counts[json.dumps(_loss_to_json(loss), sort_keys=True)] += 1
        rdp: list[PrivacyLoss] = []
        approx: list[ApproxDp] = []
        for key in sorted(counts):
            loss = _loss_from_json(json.loads(key))
            if isinstance(loss, ApproxDp):
                approx += [loss] * counts[key]
            else:
                rdp.append(loss.times(counts[key]))
        out[group] = _convert(rdp, approx, delta) if (rdp or approx) else 0.0
    return out


# ------------------------------------------------------------------------------------------------------ records
def check_unit(unit: object) -> str:
    """A unit name: 1 to 128 printable characters, no line break. The name is never echoed in the error (a caller
    who passed a document by mistake must not see it in a log)."""
    if not isinstance(unit, str) or not 0 < len(unit) <= _MAX_UNIT or not unit.isprintable() or unit != unit.strip():
        size = f"{len(unit)} characters" if isinstance(unit, str) else type(unit).__name__
        raise LedgerError(
            f"a unit name must be 1 to {_MAX_UNIT} printable characters without line breaks or surrounding spaces "
            f"(got {size}); name it (--unit case-42) or derive it from the content with Ledger.unit_for_text"
        )
    return unit


def _utc(timestamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))


@dataclass(frozen=True)
class ChargeRecord:
    """One row of a unit's history: what was charged (never the released text)."""

    id: int
    unit: str
    mechanism: str
    scope: str | None
    parameters: Mapping[str, Any]
    epsilon: float
    """This charge's ε alone, at the unit's δ when it was reserved."""
    state: str
    created: float
    updated: float

    def to_dict(self) -> dict[str, Any]:
        return plain({"id": self.id, "unit": self.unit, "mechanism": self.mechanism, "scope": self.scope,
                      "parameters": dict(self.parameters), "epsilon": self.epsilon, "state": self.state,
                      "created": _utc(self.created), "updated": _utc(self.updated)})


@dataclass(frozen=True)
class UnitStatus:
    """A unit's budget and what its pending and committed charges spend, composed by the accountant."""

    unit: str
    epsilon: float
    """The budget's ε."""
    delta: float
    """The budget's δ: the composed loss is converted once, at this δ."""
    spent: float
    """Composed ε of every pending and committed charge (the worst group's)."""
    committed: float
    """Composed ε of the committed charges alone."""
    releases: int
    pending: int
    scope: str | None
    groups: Mapping[str, float] = field(default_factory=dict)
    """Spent ε per privacy group (``*``: the whole unit)."""

    @property
    def left(self) -> float:
        """``budget − spent`` in ε (0 when over). Composition is not additive: the next release may cost less."""
        return max(self.epsilon - self.spent, 0.0)

    def guarantee(self) -> str:
        """The composed guarantee of every release charged so far, in one sentence."""
        if self.releases + self.pending == 0:
            return f"unit {self.unit!r}: nothing released yet."
        scope = " for each privacy group" if set(self.groups) != {ALL_GROUPS} else ""
        n = self.releases + self.pending
        which = "its one release is" if n == 1 else f"all {n} releases together are"
        text = (f"unit {self.unit!r}: {which} "
                f"(ε = {format_up(self.spent)}, δ = {format_up(self.delta)})-differentially private{scope}")
        if self.pending:
            text += f", {self.pending} of them pending (reserved, not confirmed; counted)"
        return text + "."

    def to_dict(self) -> dict[str, Any]:
        return plain({"unit": self.unit, "budget": {"epsilon": self.epsilon, "delta": self.delta},
                      "spent": self.spent, "committed": self.committed, "left": self.left,
                      "releases": self.releases, "pending": self.pending, "scope": self.scope,
                      "groups": dict(self.groups), "guarantee": self.guarantee()})


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
        """Mark that the release may become visible: from now on :meth:`Ledger.spend` commits even on an error."""
        self.released = True

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
class Ledger:
    """A privacy-budget ledger in one SQLite file (see the module docstring). Safe to share between threads; each
    process opens its own (a forked child may reuse the object: every operation opens its own connection)."""

    def __init__(self, path: str | os.PathLike[str], *, create: bool = False) -> None:
        self.path = Path(path)
        self._secret: bytes | None = None
        self._lock = threading.Lock()
        if create:
            self._create()
        self._check_file()

    # ---------------------------------------------------------------- opening
    @classmethod
    def init(cls, path: str | os.PathLike[str], *, epsilon: float | None = None,
             delta: float = LEDGER.delta) -> Ledger:
        """Create the ledger at ``path`` (or open it, if it is one) and set the default budget for new units
        (``epsilon=None``: none, so every unit needs :meth:`set_budget` before its first spend)."""
        ledger = cls(path, create=True)
        ledger.set_default(epsilon, delta)
        return ledger

    def _create(self) -> None:
        if self.path.exists():
            return
        if not self.path.parent.is_dir():
            raise LedgerError(f"cannot create the ledger {self.path}: its folder does not exist")
        try:
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            return  # another process created it first; _check_file waits for its schema
        except OSError as exc:
            raise LedgerError(f"cannot create the ledger {self.path}: {exc.strerror}") from None
        with self._connect() as con:
            self._run(lambda: con.execute("PRAGMA journal_mode=WAL"), "create the ledger")
            with self._transaction("create the ledger", con):
                con.execute(f"PRAGMA application_id={APPLICATION_ID}")
                con.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    con.execute(statement)
                con.execute("INSERT OR IGNORE INTO meta VALUES ('secret', ?)", (secrets.token_hex(32),))

    def _refuse(self, why: str) -> LedgerError:
        return LedgerError(f"{self.path} {why}")

    def _check_file(self) -> None:
        if not self.path.exists():
            raise self._refuse("does not exist: create it with `dpinfer budget init` (API: Ledger.init(path))")
        if not self.path.is_file():
            raise self._refuse("is not a file: give the path of a dpinfer ledger")
        try:
            with open(self.path, "rb") as handle:
                header = handle.read(len(_SQLITE_HEADER))
        except OSError as exc:
            raise self._refuse(f"cannot be read ({exc.strerror})") from None
        deadline = time.monotonic() + 2.0
        while True:  # a ledger another process is creating is briefly empty, then has no schema yet
            if header == _SQLITE_HEADER:
                with self._connect() as con:
                    app, version = self._read_ids(con)
                    if app == APPLICATION_ID and version == SCHEMA_VERSION:
                        self._verify(con)
                        return
                    foreign = app == 0 and con.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0] > 0
                    if app not in (0, APPLICATION_ID) or foreign:
                        raise self._refuse("is a SQLite file of another application, not a dpinfer ledger; give "
                                           "another path")
                    if version > SCHEMA_VERSION:
                        raise self._refuse(f"was written by a newer dpinfer (ledger schema {version}); upgrade dpinfer")
            elif header:
                raise self._refuse("is not a dpinfer ledger (not a SQLite file, or its header is damaged); give "
                                   "another path, or restore the ledger from a backup")
            if time.monotonic() > deadline:
                raise self._refuse("is not a dpinfer ledger (an empty file, or a SQLite file without the ledger's "
                                   "schema); give another path, or create a ledger with `dpinfer budget init`")
            time.sleep(0.05)
            with open(self.path, "rb") as handle:
                header = handle.read(len(_SQLITE_HEADER))

    def _verify(self, con: sqlite3.Connection) -> None:
        check = self._run(lambda: con.execute("PRAGMA quick_check").fetchall(), "check the ledger")
        if check != [("ok",)]:
            raise self._refuse("is damaged (SQLite's integrity check failed); restore it from a backup")
        tables = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not {"meta", "units", "charges"} <= tables or \
                con.execute("SELECT 1 FROM meta WHERE key = 'secret'").fetchone() is None:
            raise self._refuse("is damaged (tables or its keyed-hash secret are missing); restore it from a backup")

    def _read_ids(self, con: sqlite3.Connection) -> tuple[int, int]:
        try:
            app = con.execute("PRAGMA application_id").fetchone()[0]
            return app, con.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            raise self._refuse(f"is damaged or not a dpinfer ledger (SQLite: {exc}); restore it from a backup") \
                from None

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        try:
            con = sqlite3.connect(self.path, timeout=LEDGER.busy_timeout_s, isolation_level=None)
        except sqlite3.Error as exc:
            raise self._refuse(f"cannot be opened (SQLite: {exc})") from None
        with closing(con):
            try:
                con.execute(f"PRAGMA busy_timeout={int(LEDGER.busy_timeout_s * 1000)}")
                con.execute("PRAGMA synchronous=FULL")
                con.execute("PRAGMA foreign_keys=ON")
            except sqlite3.DatabaseError as exc:
                raise self._refuse(f"is damaged or not a dpinfer ledger (SQLite: {exc}); restore it from a backup") \
                    from None
            yield con

    def _run(self, work: Any, what: str) -> Any:
        try:
            return work()
        except sqlite3.OperationalError as exc:
            raise self._refuse(f"could not {what} (SQLite: {exc}); retry, or check the file's permissions") from None
        except sqlite3.DatabaseError as exc:
            raise self._refuse(f"is damaged (SQLite: {exc}); restore it from a backup") from None

    @contextmanager
    def _transaction(self, what: str, con: sqlite3.Connection | None = None) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction: committed if the block returns, rolled back if it raises."""
        if con is None:
            with self._connect() as own, self._transaction(what, own):
                yield own
            return
        self._run(lambda: con.execute("BEGIN IMMEDIATE"), what)
        try:
            yield con
        except BaseException:
            con.execute("ROLLBACK")
            raise
        self._run(lambda: con.execute("COMMIT"), what)

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._connect() as con:
            return self._run(lambda: con.execute(sql, args).fetchall(), "read")

    # ---------------------------------------------------------------- budgets
    def set_default(self, epsilon: float | None, delta: float = LEDGER.delta) -> None:
        """The budget a unit gets at its first spend when it has none of its own (``None``: no default)."""
        delta = check_delta(delta, "δ")
        with self._transaction("set the default budget") as con:
            if epsilon is None:
                con.execute("DELETE FROM meta WHERE key = 'default_epsilon'")
            else:
                eps = non_negative_number(epsilon, "ε", allow_inf=False)
                con.execute("INSERT OR REPLACE INTO meta VALUES ('default_epsilon', ?)", (repr(eps),))
            con.execute("INSERT OR REPLACE INTO meta VALUES ('default_delta', ?)", (repr(delta),))

    def default_budget(self, con: sqlite3.Connection | None = None) -> tuple[float | None, float]:
        """The default (ε, δ) for new units (ε is None without a default)."""
        sql = "SELECT key, value FROM meta WHERE key LIKE 'default_%'"
        meta = dict(con.execute(sql).fetchall() if con is not None else self._query(sql))
        eps = meta.get("default_epsilon")
        return (None if eps is None else float(eps)), float(meta.get("default_delta", LEDGER.delta))

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
                resume_key: str | None = None) -> Charge:
        """Check that ``cost`` fits ``unit``'s budget and reserve it, in one transaction; or raise
        :class:`~dpinfer.errors.BudgetExceededError` (one line: unit, budget, spent, cost). ``mechanism`` and
        ``parameters`` default to the guarantee's (public parameters only). ``scope`` names what the unit protects
        (``"document"``, ``"corpus"``, ``"store"``, ``"prompt-source"``): a unit keeps the scope of its first charge
        and refuses charges of another, whose adjacency would not compose with it. ``resume_key`` (a job's key for
        one record, :meth:`resume_key`): a PENDING charge of the unit with the same key, left by a killed run of the
        same job, is taken over (re-priced) instead of reserving the record a second time."""
        unit = check_unit(unit)
        if isinstance(cost, Guarantee):
            mechanism = cost.mechanism if mechanism is None else mechanism
            parameters = cost.parameters if parameters is None else parameters
        if not isinstance(mechanism, str) or not mechanism:
            raise ConfigurationError("a charge needs the mechanism's name (mechanism=...)")
        price = Cost.of(cost)
        params = json.dumps(plain(dict(parameters or {})), sort_keys=True, ensure_ascii=False)
        now = time.time()
        with self._transaction("reserve a spend") as con:
            row = con.execute("SELECT epsilon, delta, scope FROM units WHERE unit = ?", (unit,)).fetchone()
            if row is None:
                default_eps, default_delta = self.default_budget(con)
                if default_eps is None:
                    raise BudgetExceededError(
                        f"unit {unit!r} has no budget in {self.path}: set one with `dpinfer budget set {unit} "
                        "--epsilon E` or a default for new units with `dpinfer budget init --epsilon E`"
                    )
                con.execute("INSERT INTO units (unit, epsilon, delta, scope, created, updated) VALUES "
                            "(?, ?, ?, ?, ?, ?)", (unit, default_eps, default_delta, scope, now, now))
                budget, delta, unit_scope = default_eps, default_delta, scope
            else:
                budget, delta, unit_scope = row
            if scope is not None and unit_scope is not None and scope != unit_scope:
                raise LedgerError(
                    f"unit {unit!r} protects a {unit_scope}; this release protects a {scope} (another adjacency): "
                    "charge it to another unit"
                )
            if scope is not None and unit_scope is None:
                con.execute("UPDATE units SET scope = ? WHERE unit = ?", (scope, unit))
            if resume_key is not None:
                left = con.execute("SELECT id FROM charges WHERE unit = ? AND resume_key = ? AND state = 'pending' "
                                   "ORDER BY id LIMIT 1", (unit, resume_key)).fetchone()
                if left is not None:  # the same record of the same job, reserved by a run that was killed
                    alone = self._check_fits(con, unit, budget, delta, price, without=left[0])
                    con.execute("UPDATE charges SET cost = ?, epsilon = ?, parameters = ?, updated = ? WHERE id = ?",
                                (price.to_json(), alone if math.isfinite(alone) else 1e308, params, now, left[0]))
                    return Charge(self, int(left[0]), unit, alone)
            alone = self._check_fits(con, unit, budget, delta, price)
            cursor = con.execute(
                "INSERT INTO charges (unit, mechanism, scope, parameters, cost, epsilon, state, created, updated, "
                "resume_key) VALUES (?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?)",
                (unit, mechanism, scope, params, price.to_json(), alone if math.isfinite(alone) else 1e308, now, now,
                 resume_key))
            charge_id = int(cursor.lastrowid or 0)
        return Charge(self, charge_id, unit, alone)

    def _check_fits(self, con: sqlite3.Connection, unit: str, budget: float, delta: float, price: Cost,
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
                              "WHERE c.id = ?", (charge.id,)).fetchone()
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
                con.execute("UPDATE charges SET cost = ?, epsilon = ?, updated = ? WHERE id = ?",
                            (price.to_json(), alone if math.isfinite(alone) else 1e308, time.time(), charge.id))
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
            row = con.execute("SELECT state FROM charges WHERE id = ?", (charge_id,)).fetchone()
            if row is None:
                raise self._refuse(f"has no charge {charge_id}; list them with `dpinfer budget history UNIT`")
            if row[0] not in allowed:
                raise LedgerError(f"charge {charge_id} is {row[0]}; it cannot become {state}")
            con.execute("UPDATE charges SET state = ?, updated = ? WHERE id = ?", (state, time.time(), charge_id))

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


_RECORD = "id, unit, mechanism, scope, parameters, epsilon, state, created, updated"


def _record(row: tuple[Any, ...]) -> ChargeRecord:
    charge_id, unit, mechanism, scope, params, epsilon, state, created, updated = row
    return ChargeRecord(id=charge_id, unit=unit, mechanism=mechanism, scope=scope,
                        parameters=MappingProxyType(json.loads(params)),
                        epsilon=math.inf if epsilon >= 1e308 else epsilon, state=state, created=created,
                        updated=updated)
