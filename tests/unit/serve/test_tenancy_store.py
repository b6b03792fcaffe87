"""The service's adoptions live in the ledger's own database (SQLite file or PostgreSQL), so every replica sharing a
ledger sees the same ones; an adoptions file an earlier server kept beside a SQLite ledger is imported once. The
PostgreSQL cases need a server on 127.0.0.1:5432 (tests/conftest.py: skipped with a reason without one, failed with
CI set)."""

from __future__ import annotations

import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dpinfer.errors import InvalidInputError
from dpinfer.serve.budget import LedgerBudgets


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "ledger.db")
    return str(request.getfixturevalue("postgres_url"))


def test_two_replicas_on_one_ledger_share_the_adoptions(location: str, tmp_path: Path) -> None:
    one = LedgerBudgets(location, create_epsilon=10.0)
    two = LedgerBudgets(location)  # another replica's view of the same ledger
    one.tenancy.adopt("unit", "acme", "case-42", "case-42")
    assert two.tenancy.adopted("unit", "acme", "case-42") == "case-42"
    assert two.tenancy.adopted("unit", "globex", "case-42") is None
    with pytest.raises(InvalidInputError, match="already adopted"):
        two.tenancy.adopt("unit", "globex", "case-42", "case-42")  # one tenant at most, whichever replica asks
    with pytest.raises(InvalidInputError, match="already has a unit of that name"):
        two.tenancy.adopt("unit", "acme", "case-42", "case-43")
    two.tenancy.adopt("unit", "acme", "case-42", "case-42")  # adopting again is a no-op
    two.tenancy.adopt("store", "acme", "cli-notes", "notes")
    assert one.tenancy.names("store", "acme") == {"cli-notes": "notes"} and one.tenancy.names("store", "x") == {}
    assert list(tmp_path.glob("*.adopted*")) == []  # nothing beside the ledger


def test_concurrent_adoptions_of_one_target_give_it_to_one_tenant(location: str) -> None:
    budgets = LedgerBudgets(location, create_epsilon=10.0)

    def adopt(tenant: str) -> bool:
        try:
            budgets.tenancy.adopt("store", tenant, "shared", "folder-1")
        except InvalidInputError:
            return False
        return True

    with ThreadPoolExecutor(8) as pool:
        won = list(pool.map(adopt, [f"t{i}" for i in range(16)]))
    assert sum(won) == 1
    winner = f"t{won.index(True)}"
    assert [t for t in (f"t{i}" for i in range(16)) if budgets.tenancy.adopted("store", t, "shared")] == [winner]


def test_an_earlier_servers_adoptions_file_is_imported_into_the_ledger(tmp_path: Path) -> None:
    old = tmp_path / "ledger.db.adopted"
    db = sqlite3.connect(old)
    db.execute("CREATE TABLE adopted (kind TEXT NOT NULL, tenant TEXT NOT NULL, name TEXT NOT NULL, target TEXT NOT "
               "NULL, PRIMARY KEY (kind, tenant, name), UNIQUE (kind, target))")
    db.execute("INSERT INTO adopted VALUES ('unit', 'acme', 'case-42', 'case-42')")
    db.commit()
    db.close()
    budgets = LedgerBudgets(tmp_path / "ledger.db", create_epsilon=10.0)
    assert budgets.tenancy.adopted("unit", "acme", "case-42") == "case-42"
    assert not old.exists() and (tmp_path / "ledger.db.adopted.imported").is_file()
    rows = sqlite3.connect(tmp_path / "ledger.db").execute("SELECT kind, tenant, name, target FROM adopted").fetchall()
    assert rows == [("unit", "acme", "case-42", "case-42")]


def test_serve_adopt_writes_into_the_ledger_on_both_backends(location: str) -> None:
    from dpinfer.accounting.ledger import Ledger
    from dpinfer.cli import main

    Ledger.init(location, epsilon=10.0).set_budget("case-42", 5.0)
    assert main(["serve", "adopt", "--ledger", location, "--tenant", "acme", "--unit", "case-42"]) == 0
    assert LedgerBudgets(location).tenancy.adopted("unit", "acme", "case-42") == "case-42"
