"""The ledger's database: its schema and migrations, opening and checking it, connections and transactions, the default
budget, and the records read back (:class:`ChargeRecord`, :class:`UnitStatus`). The spending API is
:class:`dpinfer.accounting.ledger.Ledger`, built on :class:`LedgerStore`.

Two backends behind one interface, the same schema version and the same migrations: a SQLite file (the embedded
default; every write transaction is ``BEGIN IMMEDIATE``, one writer at a time) and a PostgreSQL database
(``postgresql://…``, :mod:`dpinfer.accounting.ledger_postgres`; the tables live in the schema ``dpinfer_ledger``,
and a spend locks its unit's row with ``SELECT … FOR UPDATE``, so two spends of one unit never both see the same
remaining budget while spends of different units run side by side)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from dpinfer._json import plain
from dpinfer.accounting.costs import ALL_GROUPS
from dpinfer.accounting.ledger_schema import (
    _MAX_UNIT,
    _SCHEMA,
    _SQLITE_HEADER,
    APPLICATION_ID,
    MIGRATIONS,
    SCHEMA_VERSION,
)
from dpinfer.checks import check_delta, format_up, non_negative_number
from dpinfer.defaults import LEDGER
from dpinfer.errors import LedgerError

__all__ = [ "ChargeRecord", "LedgerStore", "UnitStatus",
           "check_unit", "is_database_url"]


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
    holder: str | None = None
    """Who reserved it (``host:pid:start``, or a replica's id): settle_dead's liveness check."""
    phase: str | None = None
    """A pending charge's phase: ``reserved`` (provably nothing released yet) or ``releasing`` (may be)."""

    def to_dict(self) -> dict[str, Any]:
        return plain({"id": self.id, "unit": self.unit, "mechanism": self.mechanism, "scope": self.scope,
                      "parameters": dict(self.parameters), "epsilon": self.epsilon, "state": self.state,
                      "created": _utc(self.created), "updated": _utc(self.updated), "holder": self.holder,
                      "phase": self.phase})


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


_RECORD = "id, unit, mechanism, scope, parameters, epsilon, state, created, updated, holder, phase"


def _record(row: tuple[Any, ...]) -> ChargeRecord:
    charge_id, unit, mechanism, scope, params, epsilon, state, created, updated, holder, phase = row
    return ChargeRecord(id=int(charge_id), unit=unit, mechanism=mechanism, scope=scope,
                        parameters=MappingProxyType(json.loads(params)),
                        epsilon=math.inf if epsilon >= 1e308 else epsilon, state=state, created=created,
                        updated=updated, holder=holder, phase=phase)


def is_database_url(location: object) -> bool:
    """Whether ``location`` names a PostgreSQL ledger (``postgresql://…`` or ``postgres://…``), not a SQLite file."""
    return isinstance(location, str) and location.startswith(("postgresql://", "postgres://"))


class SqliteDb:
    """The SQLite backend: one file (WAL, ``synchronous=FULL``), one connection per operation."""

    real = "REAL"
    lock = ""
    """Appended to a SELECT that reads the rows a transaction is about to change: nothing (``BEGIN IMMEDIATE``
    already holds the file's write lock)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def refuse(self, why: str) -> LedgerError:
        return LedgerError(f"{self.path} {why}")

    def create(self) -> None:
        if self.path.exists():
            return
        if not self.path.parent.is_dir():
            raise LedgerError(f"cannot create the ledger {self.path}: its folder does not exist")
        try:
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            return  # another process created it first; check() waits for its schema
        except OSError as exc:
            raise LedgerError(f"cannot create the ledger {self.path}: {exc.strerror}") from None
        with self.connect() as con:
            self.run(lambda: con.execute("PRAGMA journal_mode=WAL"), "create the ledger")
            self.begin(con, "create the ledger")
            try:
                con.execute(f"PRAGMA application_id={APPLICATION_ID}")
                con.execute("PRAGMA user_version=1")
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    con.execute(statement)
                con.execute("INSERT INTO meta VALUES ('secret', ?) ON CONFLICT (key) DO NOTHING",
                            (secrets.token_hex(32),))
                self._migrate(con, 1)
            except BaseException:
                con.execute("ROLLBACK")
                raise
            self.commit(con, "create the ledger")

    def _migrate(self, con: sqlite3.Connection, version: int) -> None:
        for target in range(version + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[target]:
                con.execute(statement.format(real=self.real))
            con.execute(f"PRAGMA user_version={target}")

    def check(self) -> None:
        if not self.path.exists():
            raise self.refuse("does not exist: create it with `dpinfer budget init` (API: Ledger.init(path))")
        if not self.path.is_file():
            raise self.refuse("is not a file: give the path of a dpinfer ledger")
        try:
            with open(self.path, "rb") as handle:
                header = handle.read(len(_SQLITE_HEADER))
        except OSError as exc:
            raise self.refuse(f"cannot be read ({exc.strerror})") from None
        deadline = time.monotonic() + 2.0
        while True:  # a ledger another process is creating is briefly empty, then has no schema yet
            if header == _SQLITE_HEADER:
                with self.connect() as con:
                    app, version = self._read_ids(con)
                    if app == APPLICATION_ID and 1 <= version < SCHEMA_VERSION:
                        self.begin(con, "upgrade the ledger's schema")
                        try:  # another process may have migrated it since: read again under the write lock
                            if self._read_ids(con)[1] < SCHEMA_VERSION:
                                self._migrate(con, self._read_ids(con)[1])
                        except BaseException:
                            con.execute("ROLLBACK")
                            raise
                        self.commit(con, "upgrade the ledger's schema")
                        app, version = self._read_ids(con)
                    if app == APPLICATION_ID and version == SCHEMA_VERSION:
                        self._verify(con)
                        return
                    foreign = app == 0 and con.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0] > 0
                    if app not in (0, APPLICATION_ID) or foreign:
                        raise self.refuse("is a SQLite file of another application, not a dpinfer ledger; give "
                                          "another path")
                    if version > SCHEMA_VERSION:
                        raise self.refuse(f"was written by a newer dpinfer (ledger schema {version}); upgrade dpinfer")
            elif header:
                raise self.refuse("is not a dpinfer ledger (not a SQLite file, or its header is damaged); give "
                                  "another path, or restore the ledger from a backup")
            if time.monotonic() > deadline:
                raise self.refuse("is not a dpinfer ledger (an empty file, or a SQLite file without the ledger's "
                                  "schema); give another path, or create a ledger with `dpinfer budget init`")
            time.sleep(0.05)
            with open(self.path, "rb") as handle:
                header = handle.read(len(_SQLITE_HEADER))

    def _verify(self, con: sqlite3.Connection) -> None:
        check = self.run(lambda: con.execute("PRAGMA quick_check").fetchall(), "check the ledger")
        if check != [("ok",)]:
            raise self.refuse("is damaged (SQLite's integrity check failed); restore it from a backup")
        tables = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not {"meta", "units", "charges"} <= tables or \
                con.execute("SELECT 1 FROM meta WHERE key = 'secret'").fetchone() is None:
            raise self.refuse("is damaged (tables or its keyed-hash secret are missing); restore it from a backup")

    def _read_ids(self, con: sqlite3.Connection) -> tuple[int, int]:
        try:
            app = con.execute("PRAGMA application_id").fetchone()[0]
            return app, con.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            raise self.refuse(f"is damaged or not a dpinfer ledger (SQLite: {exc}); restore it from a backup") \
                from None

    @contextmanager
    def connect(self) -> Iterator[Any]:
        try:
            con = sqlite3.connect(self.path, timeout=LEDGER.busy_timeout_s, isolation_level=None)
        except sqlite3.Error as exc:
            raise self.refuse(f"cannot be opened (SQLite: {exc})") from None
        with closing(con):
            try:
                con.execute(f"PRAGMA busy_timeout={int(LEDGER.busy_timeout_s * 1000)}")
                con.execute("PRAGMA synchronous=FULL")
                con.execute("PRAGMA foreign_keys=ON")
            except sqlite3.DatabaseError as exc:
                raise self.refuse(f"is damaged or not a dpinfer ledger (SQLite: {exc}); restore it from a backup") \
                    from None
            yield con

    def run(self, work: Any, what: str) -> Any:
        try:
            return work()
        except sqlite3.OperationalError as exc:
            raise self.refuse(f"could not {what} (SQLite: {exc}); retry, or check the file's permissions") from None
        except sqlite3.DatabaseError as exc:
            raise self.refuse(f"is damaged (SQLite: {exc}); restore it from a backup") from None

    def begin(self, con: Any, what: str) -> None:
        self.run(lambda: con.execute("BEGIN IMMEDIATE"), what)

    def commit(self, con: Any, what: str) -> None:
        self.run(lambda: con.execute("COMMIT"), what)

    def rollback(self, con: Any) -> None:
        with contextlib.suppress(sqlite3.Error):
            con.execute("ROLLBACK")


class LedgerStore:
    """The ledger's database, SQLite file or PostgreSQL (see the module docstring): opened (created with
    ``create``) and checked, connections and transactions, the default budget. Safe to share between threads."""

    def __init__(self, path: str | os.PathLike[str], *, create: bool = False) -> None:
        self._secret: bytes | None = None
        self._lock = threading.Lock()
        self._db: Any
        if is_database_url(path):
            from dpinfer.accounting.ledger_postgres import PostgresDb

            self._db = PostgresDb(str(path))
            self.path: Path | str = self._db.display
            """Where the ledger is, for messages: the file's path, or the database URL without its password."""
        else:
            self.path = Path(path)
            self._db = SqliteDb(self.path)
        self.backend = "postgresql" if is_database_url(path) else "sqlite"
        self.location = str(path) if is_database_url(path) else os.path.abspath(path)
        """What opens this ledger again (the absolute path, or the full URL): for a worker process."""
        if create:
            self._db.create()
        self._db.check()

    @staticmethod
    def exists(location: str | os.PathLike[str]) -> bool:
        """Whether a ledger (of any version) is at ``location``: the file exists, or the database has its schema."""
        if not is_database_url(location):
            return Path(location).exists()
        from dpinfer.accounting.ledger_postgres import PostgresDb

        db = PostgresDb(str(location))
        with db.connect() as con:
            return db.run(lambda: db._version(con), "read the ledger") is not None

    def _refuse(self, why: str) -> LedgerError:
        return self._db.refuse(why)

    @property
    def lock_rows(self) -> str:
        """Appended to a SELECT whose rows a transaction will change: `` FOR UPDATE`` on PostgreSQL."""
        return str(self._db.lock)

    @contextmanager
    def _connect(self) -> Iterator[Any]:
        with self._db.connect() as con:
            yield con

    def _run(self, work: Any, what: str) -> Any:
        return self._db.run(work, what)

    @contextmanager
    def _transaction(self, what: str, con: Any = None) -> Iterator[Any]:
        """One write transaction (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: ``BEGIN``, rows locked by the statements
        that read them with :attr:`lock_rows`): committed if the block returns, rolled back if it raises."""
        if con is None:
            with self._connect() as own, self._transaction(what, own):
                yield own
            return
        self._db.begin(con, what)
        try:
            yield con
        except BaseException:
            self._db.rollback(con)
            raise
        self._db.commit(con, what)

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._connect() as con:
            return list(self._run(lambda: con.execute(sql, args).fetchall(), "read"))

    # ---------------------------------------------------------------- budgets
    def set_default(self, epsilon: float | None, delta: float = LEDGER.delta) -> None:
        """The budget a unit gets at its first spend when it has none of its own (``None``: no default)."""
        delta = check_delta(delta, "δ")
        upsert = "INSERT INTO meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"
        with self._transaction("set the default budget") as con:
            if epsilon is None:
                con.execute("DELETE FROM meta WHERE key = 'default_epsilon'")
            else:
                eps = non_negative_number(epsilon, "ε", allow_inf=False)
                con.execute(upsert, ("default_epsilon", repr(eps)))
            con.execute(upsert, ("default_delta", repr(delta)))

    def default_budget(self, con: Any = None) -> tuple[float | None, float]:
        """The default (ε, δ) for new units (ε is None without a default)."""
        sql = "SELECT key, value FROM meta WHERE key IN ('default_epsilon', 'default_delta')"
        meta = dict(con.execute(sql).fetchall() if con is not None else self._query(sql))
        eps = meta.get("default_epsilon")
        return (None if eps is None else float(eps)), float(meta.get("default_delta", LEDGER.delta))
