"""Budgets of ``dpinfer serve``: every release is charged to a unit of :class:`dpinfer.Ledger` (reserve before
generating, commit after the release, cancel on failure), and each unit and store belongs to one tenant.

:class:`LedgerBudgets` is the small interface the service uses. Costs are ex ante (the guarantee of a planned release,
from its parameters and ``T_max``, before any token is generated) and compose in the ledger by the accountant (Rényi
losses per privacy group, converted once at the unit's δ). A reservation whose process died before its commit stays
counted (fail closed; ``dpinfer budget show`` lists it as pending). Which tenant owns which unit and store is kept in
a small SQLite file beside the ledger (``LEDGER.tenants``): names only, never text.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dpinfer.errors import BudgetExceededError, ConfigurationError, DPInferError, LedgerError


class BudgetRefused(DPInferError):
    """A release would overspend its unit: nothing was generated. ``state`` is the unit's budget (public)."""

    def __init__(self, message: str, state: dict[str, Any]) -> None:
        super().__init__(message)
        self.state = state


class Owners:
    """Which tenant owns each resource (``unit:NAME``, ``store:NAME``), in one SQLite file (WAL, one transaction per
    claim: two tenants claiming the same name at once get one owner)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            with self._tx() as db:
                db.execute("CREATE TABLE IF NOT EXISTS owners (resource TEXT PRIMARY KEY, tenant TEXT NOT NULL)")
        except sqlite3.DatabaseError:
            raise ConfigurationError(f"{self.path} is not a dpinfer tenants file (SQLite); move it away") from None
        os.chmod(self.path, 0o600)

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        finally:
            db.close()

    def owner(self, resource: str, tenant: str | None = None) -> str | None:
        """The tenant owning ``resource``; with ``tenant``, claim it for that tenant if no one owns it yet."""
        with self._tx() as db:
            row = db.execute("SELECT tenant FROM owners WHERE resource = ?", (resource,)).fetchone()
            if row is None and tenant is not None:
                db.execute("INSERT INTO owners VALUES (?, ?)", (resource, tenant))
                return tenant
            return row[0] if row else None


class DatabaseOwners:
    """:class:`Owners` in the ledger's own database (its ``owners`` table): replicas sharing a PostgreSQL ledger share
    their tenants. A claim is one transaction (two tenants claiming the same name at once get one owner)."""

    def __init__(self, ledger: Any) -> None:
        self.ledger = ledger

    def owner(self, resource: str, tenant: str | None = None) -> str | None:
        with self.ledger._transaction("claim a resource") as con:
            if tenant is not None:
                con.execute("INSERT INTO owners VALUES (?, ?) ON CONFLICT (resource) DO NOTHING", (resource, tenant))
            row = con.execute("SELECT tenant FROM owners WHERE resource = ?", (resource,)).fetchone()
            return None if row is None else str(row[0])


class LedgerBudgets:
    """The service's budgets: a :class:`dpinfer.Ledger` at ``path`` (created with a default budget for new units
    when it does not exist; ``default_epsilon`` given: the default is (re)set) and the tenants file beside it."""

    def __init__(self, path: str | os.PathLike[str], *, default_epsilon: float | None = None,
                 default_delta: float | None = None, create_epsilon: float | None = None,
                 create_delta: float | None = None) -> None:
        from dpinfer.accounting.ledger import Ledger
        from dpinfer.accounting.ledger_store import is_database_url

        if is_database_url(path):  # one PostgreSQL ledger shared by replicas: the tenants are in it too
            self.path: Any = str(path)
        else:
            self.path = Path(path)
            self.path.parent.mkdir(parents=True, exist_ok=True)
        if not Ledger.exists(self.path):
            self.ledger = Ledger.init(self.path, epsilon=create_epsilon, **({"delta": create_delta}
                                                                           if create_delta is not None else {}))
        else:
            self.ledger = Ledger(self.path)
        if default_epsilon is not None:
            delta = default_delta if default_delta is not None else self.ledger.default_budget()[1]
            self.ledger.set_default(default_epsilon, delta)
        self.owners: Any = DatabaseOwners(self.ledger) if isinstance(self.path, str) else \
            Owners(self.path.with_name(self.path.name + ".tenants"))

    def owner(self, resource: str, tenant: str | None = None) -> str | None:
        return self.owners.owner(resource, tenant)

    def state(self, unit: str) -> dict[str, Any]:
        """The unit's budget, spent (composed, pending included), left, releases, pending, and its guarantee."""
        try:
            return self.ledger.status(unit).to_dict()
        except LedgerError:  # no charge and no budget yet: the default applies
            eps, delta = self.ledger.default_budget()
            return {"unit": unit, "budget": {"epsilon": eps, "delta": delta}, "spent": 0.0, "committed": 0.0,
                    "left": eps, "releases": 0, "pending": 0, "scope": None, "groups": {},
                    "guarantee": f"unit {unit!r}: nothing released yet."}

    def set_budget(self, unit: str, epsilon: float, delta: float | None = None) -> dict[str, Any]:
        return self.ledger.set_budget(unit, epsilon, delta).to_dict()

    def reserve(self, unit: str, guarantee: Any, *, scope: str, resume_key: str | None = None) -> Any:
        """Reserve the release's cost on ``unit`` (one transaction), or raise :class:`BudgetRefused` (nothing
        reserved, nothing generated). ``resume_key``: a pending charge under that key, left by a server killed
        mid-job, is taken over instead of reserving the same job twice (:meth:`dpinfer.Ledger.reserve`)."""
        try:
            return self.ledger.reserve(unit, guarantee, scope=scope, resume_key=resume_key)
        except BudgetExceededError as exc:
            raise BudgetRefused(str(exc), self.state(unit)) from None

    @staticmethod
    def commit(charge: Any) -> None:
        charge.commit()

    @staticmethod
    def cancel(charge: Any) -> None:
        charge.cancel()
