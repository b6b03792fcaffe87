"""Per-unit privacy budgets of ``dpinfer serve``: reserve before generating, commit after the release, cancel on
failure.

:class:`Budgets` is the small interface the service uses; :class:`SqliteBudgets` implements it in one SQLite file
(WAL, ``BEGIN IMMEDIATE`` for every reservation, so many threads and processes can share it). Costs are ex ante: the
guarantee of a planned release, computed from its parameters and ``T_max`` before any token is generated. Releases
of one unit compose by **basic composition** (ε and δ add up), which is a valid upper bound for any mechanisms; it is
looser than composing the units' Rényi/zCDP losses. A reservation whose process died before its commit stays counted
(fail closed): it is shown as pending. The file holds unit names, mechanism names and costs: never text.
"""

from __future__ import annotations

import math
import os
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dpinfer.errors import ConfigurationError, DPInferError

TOLERANCE = 1e-9
"""Relative slack of the budget comparison (three releases at ε = e against a budget of 3e must fit in floats)."""


@dataclass(frozen=True)
class Cost:
    """What one release charges to its unit (from its ex-ante guarantee)."""

    epsilon: float
    delta: float
    mechanism: str


class BudgetRefused(DPInferError):
    """A release would overspend its unit: nothing was generated. ``state`` is the unit's budget (public)."""

    def __init__(self, message: str, state: dict[str, Any]) -> None:
        super().__init__(message)
        self.state = state


class Budgets(Protocol):
    def reserve(self, unit: str, cost: Cost) -> str: ...
    def commit(self, reservation: str) -> None: ...
    def cancel(self, reservation: str) -> None: ...
    def state(self, unit: str) -> dict[str, Any]: ...
    def set_budget(self, unit: str, epsilon: float, delta: float) -> dict[str, Any]: ...
    def owner(self, resource: str, tenant: str | None = None) -> str | None: ...


def _fmt(x: float) -> str:
    return "∞" if math.isinf(x) else f"{x:.6g}"


class SqliteBudgets:
    """:class:`Budgets` in one SQLite file; a unit no one has set gets ``default_epsilon``/``default_delta``."""

    def __init__(self, path: str | os.PathLike[str], *, default_epsilon: float, default_delta: float) -> None:
        self.path = Path(path)
        self.default_epsilon = float(default_epsilon)
        self.default_delta = float(default_delta)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self._tx() as db:
                db.execute("CREATE TABLE IF NOT EXISTS units (unit TEXT PRIMARY KEY, epsilon REAL NOT NULL, "
                           "delta REAL NOT NULL)")
                db.execute("CREATE TABLE IF NOT EXISTS charges (id TEXT PRIMARY KEY, unit TEXT NOT NULL, "
                           "mechanism TEXT NOT NULL, epsilon REAL NOT NULL, delta REAL NOT NULL, "
                           "state TEXT NOT NULL, created REAL NOT NULL)")
                db.execute("CREATE INDEX IF NOT EXISTS charges_unit ON charges (unit)")
                db.execute("CREATE TABLE IF NOT EXISTS owners (resource TEXT PRIMARY KEY, tenant TEXT NOT NULL)")
        except sqlite3.DatabaseError:
            raise ConfigurationError(f"{self.path} is not a dpinfer budget file (SQLite); give another --ledger "
                                     "path") from None
        os.chmod(self.path, 0o600)

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        finally:
            db.close()

    def _state(self, db: sqlite3.Connection, unit: str) -> dict[str, Any]:
        row = db.execute("SELECT epsilon, delta FROM units WHERE unit = ?", (unit,)).fetchone()
        eps, delta = row if row else (self.default_epsilon, self.default_delta)
        spent = dict.fromkeys(("committed", "pending"), (0.0, 0.0, 0))
        for state, e, d, n in db.execute("SELECT state, SUM(epsilon), SUM(delta), COUNT(*) FROM charges "
                                         "WHERE unit = ? GROUP BY state", (unit,)):
            spent[state] = (float(e or 0.0), float(d or 0.0), int(n))
        used_e = spent["committed"][0] + spent["pending"][0]
        used_d = spent["committed"][1] + spent["pending"][1]
        return {"epsilon": eps, "delta": delta, "spent_epsilon": spent["committed"][0],
                "spent_delta": spent["committed"][1], "releases": spent["committed"][2],
                "pending_epsilon": spent["pending"][0], "pending": spent["pending"][2],
                "left_epsilon": max(0.0, eps - used_e), "left_delta": max(0.0, delta - used_d),
                "composition": "basic (ε and δ of the unit's releases add up)", "default": row is None}

    def owner(self, resource: str, tenant: str | None = None) -> str | None:
        """The tenant owning ``resource``; with ``tenant``, claim it for that tenant if no one owns it yet."""
        with self._tx() as db:
            row = db.execute("SELECT tenant FROM owners WHERE resource = ?", (resource,)).fetchone()
            if row is None and tenant is not None:
                db.execute("INSERT INTO owners VALUES (?, ?)", (resource, tenant))
                return tenant
            return row[0] if row else None

    def state(self, unit: str) -> dict[str, Any]:
        with self._tx() as db:
            return self._state(db, unit)

    def set_budget(self, unit: str, epsilon: float, delta: float) -> dict[str, Any]:
        with self._tx() as db:
            db.execute("INSERT INTO units (unit, epsilon, delta) VALUES (?, ?, ?) ON CONFLICT(unit) DO UPDATE SET "
                       "epsilon = excluded.epsilon, delta = excluded.delta", (unit, float(epsilon), float(delta)))
            return self._state(db, unit)

    def reserve(self, unit: str, cost: Cost) -> str:
        """Reserve ``cost`` on ``unit`` in one transaction, or raise :class:`BudgetRefused` (nothing reserved)."""
        with self._tx() as db:
            st = self._state(db, unit)
            used_e = st["epsilon"] - st["left_epsilon"]
            used_d = st["delta"] - st["left_delta"]
            over_e = used_e + cost.epsilon > st["epsilon"] * (1 + TOLERANCE)
            over_d = used_d + cost.delta > st["delta"] * (1 + TOLERANCE)
            if over_e or over_d or math.isnan(cost.epsilon):
                what = "ε" if over_e or math.isnan(cost.epsilon) else "δ"
                raise BudgetRefused(
                    f"budget refused: this release costs ε = {_fmt(cost.epsilon)}, δ = {_fmt(cost.delta)} and the "
                    f"unit has ε = {_fmt(st['left_epsilon'])}, δ = {_fmt(st['left_delta'])} left (of "
                    f"ε = {_fmt(st['epsilon'])}, δ = {_fmt(st['delta'])}; {what} would be overspent); nothing was "
                    "generated: use another unit or ask an admin to raise its budget", st)
            rid = uuid.uuid4().hex
            db.execute("INSERT INTO charges VALUES (?, ?, ?, ?, ?, 'pending', ?)",
                       (rid, unit, cost.mechanism, float(cost.epsilon), float(cost.delta), time.time()))
            return rid

    def commit(self, reservation: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE charges SET state = 'committed' WHERE id = ? AND state = 'pending'", (reservation,))

    def cancel(self, reservation: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM charges WHERE id = ? AND state = 'pending'", (reservation,))
