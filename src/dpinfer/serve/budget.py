"""Budgets of ``dpinfer serve``: every release is charged to units of :class:`dpinfer.Ledger` (reserve before
generating, commit after the release, cancel on failure), each unit keyed by (tenant, name).

:class:`LedgerBudgets` is the small interface the service uses. Costs are ex ante (the guarantee of a planned release,
from its parameters and ``T_max``, before any token is generated) and compose in the ledger by the accountant (Rényi
losses per privacy group, converted once at the unit's δ). A release is reserved on every unit it is charged to (the
entity's own unit, and a unit the request names) or on none, through the one charge path
(:mod:`dpinfer.accounting.charge`; this module only maps a tenant's unit names to the ledger's and words a refusal
with the unit's public budget state). A reservation whose process died
before its commit stays counted (fail closed; ``dpinfer budget show`` lists it as pending). A tenant's unit ``NAME``
is the ledger's unit ``TENANT/NAME`` (:func:`ledger_unit`); units and store folders made outside the service are
reached only through the operator's adoption (``dpinfer serve adopt``; no route adopts), kept in the ledger's own
database (:class:`Tenancy`; replicas sharing a PostgreSQL ledger share them): names only, never text.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

from dpinfer.accounting.charge import Reservation, commit_left
from dpinfer.errors import BudgetExceededError, ConfigurationError, DPInferError, InvalidInputError, LedgerError


class BudgetRefused(DPInferError):
    """A release would overspend one of its units: nothing was generated. ``state`` is that unit's budget (public),
    under the tenant's name of the unit."""

    def __init__(self, message: str, state: dict[str, Any]) -> None:
        super().__init__(message)
        self.state = state


def ledger_unit(tenant: str, name: str) -> str:
    """The ledger's name of the tenant's unit ``name``: ``TENANT/NAME``; ``TENANT/~`` + a SHA-256 prefix of the name
    when that would pass the ledger's limit of 128 characters. Tenant names hold no ``/``, so two tenants' units
    never share a ledger name, and no name a client sends reaches a unit made outside the service (those are
    reachable only once the operator adopts them: :meth:`Tenancy.adopt`)."""
    full = f"{tenant}/{name}"
    if len(full) <= 128:
        return full
    return f"{tenant}/~" + hashlib.sha256(name.encode("utf-8")).hexdigest()[:40]


class Tenancy:
    """The resources made outside the service that the operator adopted for a tenant with ``dpinfer serve adopt``
    (``adopt``: a unit of the ledger by its own name, a store folder by its path; no route of the service adopts), in
    the ledger's own database (its ``adopted`` table, on SQLite and PostgreSQL alike: replicas sharing a PostgreSQL
    ledger see the same adoptions). One transaction each: a resource is adopted by one tenant at most. Names only,
    never text."""

    def __init__(self, ledger: Any) -> None:
        self.ledger = ledger

    def _tx(self) -> Any:
        return self.ledger._transaction("adopt a resource")

    def import_file(self, path: str | os.PathLike[str]) -> None:
        """Take over the adoptions an earlier server kept in a SQLite file beside the ledger (``LEDGER.adopted``):
        copied into the ledger in one transaction, then the file is renamed ``….imported`` (kept, never read
        again)."""
        old = Path(path)
        if not old.is_file():
            return
        try:
            with closing(sqlite3.connect(old, timeout=60)) as db:
                rows = db.execute("SELECT kind, tenant, name, target FROM adopted").fetchall()
        except sqlite3.DatabaseError:
            raise ConfigurationError(f"{old} is not a dpinfer tenants file (SQLite); move it away") from None
        with self._tx() as db:
            for row in rows:
                db.execute("INSERT INTO adopted VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING", tuple(row))
        old.replace(old.with_name(old.name + ".imported"))

    def adopted(self, kind: str, tenant: str, name: str) -> str | None:
        """The target (a ledger unit's name, a store's folder) the tenant's ``kind`` ``name`` stands for, or None."""
        rows = self.ledger._query("SELECT target FROM adopted WHERE kind = ? AND tenant = ? AND name = ?",
                                  (kind, tenant, name))
        return str(rows[0][0]) if rows else None

    def names(self, kind: str, tenant: str) -> dict[str, str]:
        rows = self.ledger._query("SELECT name, target FROM adopted WHERE kind = ? AND tenant = ?", (kind, tenant))
        return {str(n): str(t) for n, t in rows}

    def adopt(self, kind: str, tenant: str, name: str, target: str) -> None:
        """Give the tenant ``kind`` ``name`` standing for ``target``; refused if the target or the name is taken."""
        with self._tx() as db:
            db.execute("INSERT INTO adopted VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING", (kind, tenant, name, target))
            row = db.execute("SELECT tenant, name FROM adopted WHERE kind = ? AND target = ?",
                             (kind, target)).fetchone()
            if row is not None and tuple(row) != (tenant, name):
                raise InvalidInputError(f"that {kind} is already adopted; each is adopted by one tenant at most")
            row = db.execute("SELECT target FROM adopted WHERE kind = ? AND tenant = ? AND name = ?",
                             (kind, tenant, name)).fetchone()
            if row is None or row[0] != target:
                raise InvalidInputError(f"the tenant already has a {kind} of that name; adopt under another name")


class LedgerBudgets:
    """The service's budgets: a :class:`dpinfer.Ledger` at ``path`` (created with a default budget for new units
    when it does not exist; ``default_epsilon`` given: the default is (re)set) and its adoptions (:class:`Tenancy`)."""

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
        self.tenancy = Tenancy(self.ledger)
        if isinstance(self.path, Path):  # the adoptions file of an earlier server: moved into the ledger
            self.tenancy.import_file(self.path.with_name(self.path.name + ".adopted"))

    def state(self, unit: str, name: str | None = None) -> dict[str, Any]:
        """The unit's budget, spent (composed, pending included), left, releases, pending, and its guarantee;
        ``name``: the tenant's name of the unit, shown instead of the ledger's."""
        try:
            out = self.ledger.status(unit).to_dict()
        except LedgerError:  # no charge and no budget yet: the default applies
            eps, delta = self.ledger.default_budget()
            out = {"unit": unit, "budget": {"epsilon": eps, "delta": delta}, "spent": 0.0, "committed": 0.0,
                   "left": eps, "releases": 0, "pending": 0, "scope": None, "groups": {},
                   "guarantee": f"unit {unit!r}: nothing released yet."}
        if name is not None:
            out["unit"] = name
            if isinstance(out.get("guarantee"), str):
                out["guarantee"] = out["guarantee"].replace(repr(unit), repr(name))
        return out

    def set_budget(self, unit: str, epsilon: float, delta: float | None = None) -> dict[str, Any]:
        return self.ledger.set_budget(unit, epsilon, delta).to_dict()

    def resume_keys(self, units: list[tuple[str, str]], resume_key: str, *, per_unit: bool = True) -> list[str]:
        """The resume key of each unit's charge (``per_unit=False``: a job of an earlier server, one unit, the key
        itself)."""
        return [self.ledger.resume_key(resume_key, key) if per_unit else resume_key for _, key in units]

    def open(self, units: list[tuple[str, str]], scope: str, *, resume_key: str | None = None,
             per_unit: bool = True) -> Reservation:
        """A :class:`~dpinfer.accounting.charge.Reservation` of one release on every unit of ``units`` ((the tenant's
        name, the ledger's name) each), nothing reserved yet. ``resume_key``: pending charges under that key (one per
        unit), left by a server killed mid-job, are taken over instead of reserving the same job twice."""
        keys = None if resume_key is None else self.resume_keys(units, resume_key, per_unit=per_unit)
        return Reservation(self.ledger, [key for _, key in units], scope, resume_key=keys)

    @contextmanager
    def refusals(self, res: Reservation, units: list[tuple[str, str]]) -> Iterator[None]:
        """A unit of ``res`` that refuses (:class:`~dpinfer.errors.BudgetExceededError`) is raised as
        :class:`BudgetRefused`: the message without the ledger's name of the unit or its path, and the unit's public
        budget state under the tenant's name."""
        try:
            yield
        except BudgetExceededError as exc:
            key = res.refused or units[0][1]
            name = next((n for n, k in units if k == key), key)
            message = str(exc).replace(f"unit {key!r}", "the unit").replace(
                f"`dpinfer budget set {key} --epsilon E`", "an admin's PUT /v1/budget/UNIT").replace(
                key, "UNIT").replace(str(self.ledger.path), "the service's ledger")  # no name, no path
            raise BudgetRefused(message + " (the unit is the reply's budget.unit)", self.state(key, name)) from None

    def commit_left(self, units: list[tuple[str, str]], resume_key: str, *, per_unit: bool = True) -> None:
        """A resumed job whose texts are out: the charges a killed server left pending under ``resume_key`` (one per
        unit) are committed (:func:`dpinfer.accounting.charge.commit_left`)."""
        commit_left(self.ledger, self.resume_keys(units, resume_key, per_unit=per_unit))


TENANTS = "tenants"
"""The sub-folder of the stores folder that holds each tenant's own stores (``STORES/tenants/TENANT/STORE``); any
other folder of the stores folder was made outside the service (``dpinfer rag add``) and is reached only once
adopted."""


def adopt_unit(budgets: LedgerBudgets, tenant: str, name: str, target: str) -> None:
    """The tenant's unit ``name`` becomes the ledger's existing unit ``target`` (made outside the service, e.g. by
    ``dpinfer sanitize --unit case-42``). Refused if the ledger has no such unit or another tenant adopted it."""
    try:
        budgets.ledger.status(target)
    except LedgerError:
        raise InvalidInputError("the ledger has no unit of that name; nothing to adopt") from None
    budgets.tenancy.adopt("unit", tenant, name, target)


def adopt_store(budgets: LedgerBudgets, root: Path, tenant: str, name: str, folder: str) -> None:
    """The tenant's store ``name`` becomes the store folder ``root/folder`` (made by ``dpinfer rag add``); its folders
    become mode 0700 and its files 0600. Refused if there is no such folder or another tenant adopted it."""
    from dpinfer.rag.store import private_tree

    path = root / folder
    if folder == TENANTS or not path.is_dir():
        raise InvalidInputError("the stores folder has no store folder of that name; nothing to adopt")
    budgets.tenancy.adopt("store", tenant, name, folder)
    private_tree(path)
