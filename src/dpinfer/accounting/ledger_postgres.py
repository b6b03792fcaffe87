"""The PostgreSQL backend of the privacy-budget ledger (``--ledger postgresql://USER@HOST:PORT/DB``): one ledger
per database, its tables in the schema ``dpinfer_ledger``, shared by every process and machine that opens the URL.

The same schema version, migrations and statements as the SQLite file (:mod:`dpinfer.accounting.ledger_store`),
through psycopg 3 with bound parameters (never SQL assembled from values). A write transaction is ``BEGIN`` …
``COMMIT`` at READ COMMITTED; the statements that read a unit's budget or a charge before changing it lock those
rows (``SELECT … FOR UPDATE``), so two spends of one unit are serialised by the database while spends of other units
run side by side. Each thread of each process keeps one connection (a forked child opens its own).

psycopg is an optional extra: ``.venv/bin/pip install -e ".[postgres]"``.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from dpinfer.accounting.ledger_schema import _SCHEMA, MIGRATIONS, SCHEMA_VERSION
from dpinfer.defaults import LEDGER
from dpinfer.errors import LedgerError, install_hint

SCHEMA = "dpinfer_ledger"
"""The PostgreSQL schema that holds a ledger's tables (the URL names the database)."""
APPLICATION = "dpinfer-ledger"
"""``meta.application`` of a dpinfer ledger: a ``dpinfer_ledger`` schema without it is refused as foreign."""
_CREATE_LOCK = 0x64704C67  # pg_advisory_xact_lock key: one process creates or migrates the schema at a time


def redact(url: str) -> str:
    """``url`` without its password (for messages and ``budget show``).

    >>> redact("postgresql://alice:s3cret@db.example:5432/budgets")
    'postgresql://alice@db.example:5432/budgets'
    """
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = (f"{parts.username}@" if parts.username else "") + host + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


@functools.lru_cache(maxsize=256)
def _placeholders(sql: str) -> str:
    """The shared statements use SQLite's ``?``; psycopg binds ``%s`` (the statements hold no literal ``?`` or
    ``%``: values are always bound)."""
    return sql.replace("?", "%s")


class _Connection:
    """A psycopg connection answering ``execute(sql, args)`` like sqlite3's (``?`` placeholders)."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def execute(self, sql: str, args: tuple[Any, ...] | list[Any] = ()) -> Any:
        return self.raw.execute(_placeholders(sql), tuple(args))


class PostgresDb:
    """The PostgreSQL backend (see the module docstring)."""

    real = "DOUBLE PRECISION"
    lock = " FOR UPDATE"

    def __init__(self, url: str) -> None:
        if importlib.util.find_spec("psycopg") is None:
            raise LedgerError(f"a PostgreSQL ledger needs psycopg, which is not installed; install it "
                              f"{install_hint('postgres')}")
        import psycopg

        self.psycopg = psycopg
        self.url = url
        self.display = redact(url)
        self._local = threading.local()

    def refuse(self, why: str) -> LedgerError:
        return LedgerError(f"the ledger database {self.display} {why}")

    # ---------------------------------------------------------------- connections
    def _open(self) -> _Connection:
        try:
            raw = self.psycopg.connect(self.url, autocommit=True, connect_timeout=int(LEDGER.connect_timeout_s))
        except self.psycopg.Error as exc:
            raise self.refuse(f"cannot be reached ({_first_line(exc)}); check the URL, that PostgreSQL runs and "
                              "accepts this user") from None
        raw.execute(f"SET search_path TO {SCHEMA}")  # a constant, not a value
        raw.execute(f"SET lock_timeout = {int(LEDGER.busy_timeout_s * 1000)}")  # a default, not a value
        return _Connection(raw)

    @contextmanager
    def connect(self) -> Iterator[_Connection]:
        """This thread's connection (opened at its first use, again after a fork or a broken connection)."""
        held = getattr(self._local, "held", None)
        if held is None or held[0] != os.getpid() or held[1].raw.closed or held[1].raw.broken:
            held = (os.getpid(), self._open())
            self._local.held = held
        con = held[1]
        try:
            yield con
        except self.psycopg.OperationalError:
            with suppress(Exception):
                con.raw.close()
            self._local.held = None
            raise

    def run(self, work: Any, what: str) -> Any:
        try:
            return work()
        except self.psycopg.OperationalError as exc:
            raise self.refuse(f"could not {what} ({_first_line(exc)}); retry, or check the server") from None
        except self.psycopg.Error as exc:
            raise self.refuse(f"could not {what} ({type(exc).__name__}: {_first_line(exc)})") from None

    def begin(self, con: _Connection, what: str) -> None:
        self.run(lambda: con.execute("BEGIN"), what)

    def commit(self, con: _Connection, what: str) -> None:
        self.run(lambda: con.execute("COMMIT"), what)

    def rollback(self, con: _Connection) -> None:
        with suppress(Exception):
            con.execute("ROLLBACK")

    # ---------------------------------------------------------------- schema
    def _version(self, con: _Connection) -> tuple[str | None, int] | None:
        """(application, schema version) of the ledger in this database, or None when there is none."""
        if con.execute("SELECT to_regclass(?)", (f"{SCHEMA}.meta",)).fetchone()[0] is None:
            return None
        meta = dict(con.execute("SELECT key, value FROM meta WHERE key IN ('application', 'schema_version')")
                    .fetchall())
        return meta.get("application"), int(meta.get("schema_version", 0))

    def create(self) -> None:
        self._setup(create=True)

    def check(self) -> None:
        self._setup(create=False)

    def _setup(self, *, create: bool) -> None:
        with self.connect() as con:
            found = self.run(lambda: self._version(con), "read the ledger")
            if found is not None and found[0] == APPLICATION and found[1] == SCHEMA_VERSION:
                return self._verify(con)
            if found is None and not create:
                raise self.refuse("holds no dpinfer ledger: create it with `dpinfer budget init --ledger URL` "
                                  "(API: Ledger.init(url))")
            self.begin(con, "create the ledger")
            try:
                self.run(lambda: self._build(con), "create or upgrade the ledger's schema")
            except BaseException:
                self.rollback(con)
                raise
            self.commit(con, "create the ledger")
            self._verify(con)
        return None

    def _build(self, con: _Connection) -> None:
        """Create the schema at version 1 and migrate it, or migrate an older one (under an advisory lock: one
        process at a time)."""
        con.execute("SELECT pg_advisory_xact_lock(?)", (_CREATE_LOCK,))
        found = self._version(con)
        if found is None:
            con.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
            schema = _SCHEMA.replace("REAL", self.real).replace("INTEGER PRIMARY KEY AUTOINCREMENT",
                                                                "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY")
            for statement in filter(str.strip, schema.split(";")):
                con.execute(statement)
            con.execute("INSERT INTO meta VALUES ('application', ?), ('schema_version', '1'), ('secret', ?)",
                        (APPLICATION, secrets.token_hex(32)))
            found = (APPLICATION, 1)
        application, version = found
        if application != APPLICATION:
            raise self.refuse(f"has a schema {SCHEMA} of another application, not a dpinfer ledger; use another "
                              "database")
        if version > SCHEMA_VERSION:
            raise self.refuse(f"was written by a newer dpinfer (ledger schema {version}); upgrade dpinfer")
        for target in range(version + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[target]:
                con.execute(statement.format(real=self.real))
            con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(target),))

    def _verify(self, con: _Connection) -> None:
        found = self.run(lambda: self._version(con), "read the ledger")
        if found is None or found[0] != APPLICATION:
            raise self.refuse(f"has a schema {SCHEMA} of another application, not a dpinfer ledger; use another "
                              "database")
        if found[1] > SCHEMA_VERSION:
            raise self.refuse(f"was written by a newer dpinfer (ledger schema {found[1]}); upgrade dpinfer")
        tables = {row[0] for row in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = ?", (SCHEMA,)).fetchall()}
        if not {"meta", "units", "charges"} <= tables or \
                con.execute("SELECT 1 FROM meta WHERE key = 'secret'").fetchone() is None:
            raise self.refuse("is damaged (tables or its keyed-hash secret are missing); restore it from a backup")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
