"""The ledger on both backends (a SQLite file and a PostgreSQL database): the same protocol, the same refusals, the
same composition; concurrent spends admit exactly what the budget affords; a dead holder's reservation is settled by
the rule; the database holds no private text. PostgreSQL tests need a server on 127.0.0.1:5432 (tests/conftest.py:
skipped with a reason without one, failed with CI set)."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from test_ledger import DELTA, DOCUMENT, SPANS, _spender, budget_for

from dpinfer.accounting import Zcdp
from dpinfer.accounting.calibration import Budget, Spec
from dpinfer.accounting.ledger import Ledger, holder_id, settle_dead
from dpinfer.accounting.ledger_schema import SCHEMA_VERSION
from dpinfer.accounting.ledger_store import _SCHEMA
from dpinfer.errors import BudgetExceededError, LedgerError
from dpinfer.mechanisms.dp_fusion import DPFusion

FORK = multiprocessing.get_context("fork")
SRC = str(Path(__file__).resolve().parents[3] / "src")


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "b.db")
    return str(request.getfixturevalue("postgres_url"))


def test_the_protocol_is_the_same_on_both_backends(location: str) -> None:
    ledger = Ledger.init(location, epsilon=20.0)
    assert ledger.backend == ("sqlite" if not location.startswith("postgresql") else "postgresql")
    with ledger.spend("demo", Zcdp(0.5), mechanism="gaussian", scope="store"):
        pass
    a = ledger.reserve("demo", Zcdp(0.1), mechanism="gaussian")
    a.cancel()
    b = ledger.reserve("demo", Zcdp(0.1), mechanism="gaussian")
    assert ledger.status("demo").pending == 1
    ledger.void(b.id)
    with pytest.raises(BudgetExceededError, match="budget exceeded for unit 'demo'"):
        ledger.reserve("demo", Zcdp(5.0), mechanism="gaussian")
    with pytest.raises(LedgerError, match="protects a store"):
        ledger.reserve("demo", Zcdp(0.01), mechanism="gaussian", scope="document")
    status = ledger.status("demo")
    assert (status.releases, status.pending, status.scope) == (1, 0, "store")
    assert status.spent == pytest.approx(Zcdp(0.5).to_epsilon(1e-5))
    assert [r.state for r in ledger.history("demo")] == ["committed", "cancelled", "void"]
    assert all(r.holder == holder_id() for r in ledger.history("demo"))
    ledger.set_budget("other", 2.0)
    assert [u.unit for u in ledger.units()] == ["demo", "other"]
    # settle: the exact cost replaces the estimate, re-checked; a resume key takes over its pending charge
    c = ledger.reserve("other", Zcdp(0.01), mechanism="gaussian", resume_key="r-1", settle_first=True)
    assert ledger.charge(c.id).phase == "reserved"
    again = ledger.reserve("other", Zcdp(0.02), mechanism="gaussian", resume_key="r-1", settle_first=True)
    assert again.id == c.id and ledger.status("other").pending == 1
    c.settle(Zcdp(0.03))
    assert ledger.charge(c.id).phase == "releasing"
    c.commit()
    assert ledger.status("other").spent == pytest.approx(Zcdp(0.03).to_epsilon(1e-5))
    # the same keyed unit name in every process that opens the ledger: the secret is in the database
    assert Ledger(location).unit_for_text(DOCUMENT) == ledger.unit_for_text(DOCUMENT)


def test_200_spends_from_8_processes_and_4_threads_admit_exactly_n_on_postgresql(postgres_url: str) -> None:
    rho, n = 0.05, 37
    ledger = Ledger.init(postgres_url)
    ledger.set_budget("doc", epsilon=budget_for(Zcdp(rho), n))
    per_worker = [200 // 32 + (1 if i < 200 % 32 else 0) for i in range(32)]
    with ProcessPoolExecutor(8, mp_context=FORK) as pool:
        futures = [pool.submit(_spender, postgres_url, "doc", per_worker[4 * p: 4 * p + 4], rho) for p in range(8)]
        results = [f.result(timeout=300) for f in futures]
    ok, refused = sum(r[0] for r in results), sum(r[1] for r in results)
    assert (ok, refused) == (n, 200 - n)
    status = ledger.status("doc")
    assert (status.releases, status.pending) == (n, 0)
    assert status.spent == Zcdp(rho).times(n).to_epsilon(DELTA) <= status.epsilon


# ------------------------------------------------------------------------------------------------ dead holders
_HOLDER = """
import sys, time
from dpinfer.accounting import Zcdp
from dpinfer.accounting.ledger import Ledger
ledger = Ledger(sys.argv[1])
a = ledger.reserve("u", Zcdp(0.1), mechanism="gaussian", settle_first=True)   # nothing released yet
b = ledger.reserve("u", Zcdp(0.1), mechanism="gaussian")                      # may be releasing
c = ledger.reserve("u", Zcdp(0.1), mechanism="gaussian", settle_first=True)
c.settle(Zcdp(0.2))                                                           # planned: may be releasing
d = ledger.reserve("u", Zcdp(0.1), mechanism="gaussian", settle_first=True)
d.releasing()
e = ledger.reserve("u", Zcdp(0.1), mechanism="gaussian", resume_key="r-job-1")  # its job's next run takes it over
print(a.id, b.id, c.id, d.id, e.id, flush=True)
time.sleep(600)
"""


def test_a_kill_9_holder_is_settled_by_the_rule_at_the_next_start(location: str) -> None:
    ledger = Ledger.init(location, epsilon=100.0)
    mine = ledger.reserve("u", Zcdp(0.1), mechanism="gaussian", settle_first=True)  # a live holder: untouched
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, location], stdout=subprocess.PIPE, env=env, text=True)
    try:
        ids = [int(x) for x in proc.stdout.readline().split()]  # type: ignore[union-attr]
        assert len(ids) == 5
        assert ledger.settle_dead() == []  # alive: nothing settled
        before = ledger.status("u").spent
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    settled = settle_dead(Ledger(location))  # what a service runs at its start
    assert {r.id: r.state for r in settled} == {ids[0]: "cancelled", ids[1]: "committed", ids[2]: "committed",
                                                ids[3]: "committed"}
    assert ledger.charge(mine.id).state == "pending" and ledger.charge(ids[4]).state == "pending"
    after = ledger.status("u")
    assert (after.releases, after.pending) == (3, 2)
    assert after.spent <= before  # only a never-released reservation stopped counting
    assert settle_dead(ledger) == []  # settled once
    mine.commit()


def test_a_holder_on_another_machine_is_dead_when_its_lease_runs_out(location: str) -> None:
    ledger = Ledger.init(location, epsilon=100.0)
    a = ledger.reserve("u", Zcdp(0.1), mechanism="gaussian", settle_first=True, holder="replica-7")
    b = ledger.reserve("u", Zcdp(0.1), mechanism="gaussian", holder="replica-7")
    assert ledger.settle_dead() == []
    settled = ledger.settle_dead(now=time.time() + 10 * 24 * 3600)
    assert {r.id: r.state for r in settled} == {a.id: "cancelled", b.id: "committed"}
    with pytest.raises(LedgerError, match="cannot become cancelled"):
        b.cancel()  # a holder presumed dead that was alive after all: its cancel is refused (fail closed)
    with pytest.raises(LedgerError, match="only a pending charge can be settled"):
        a.settle(Zcdp(0.1))  # nor can it release on a reservation settled as never released


def test_a_failed_jobs_charges_are_settled_by_the_rule_under_its_resume_keys(location: str) -> None:
    """``settle_job``: the pending charges a dead holder left under a job's resume keys (which ``settle_dead`` leaves
    to the job's next run) settled by the same rule when the job will not run again; another holder's untouched."""
    ledger = Ledger.init(location, epsilon=100.0)
    keys = [ledger.resume_key("job", "a"), ledger.resume_key("job", "b")]
    a = ledger.reserve("u", Zcdp(0.1), mechanism="gaussian", resume_key=keys[0], settle_first=True, holder="gone")
    b = ledger.reserve("v", Zcdp(0.1), mechanism="gaussian", resume_key=keys[1], holder="gone")
    other = ledger.reserve("w", Zcdp(0.1), mechanism="gaussian", resume_key=keys[1], holder="alive")
    assert ledger.settle_dead(now=time.time() + 10 * 24 * 3600) == []  # a job's charges are left to its next run
    settled = ledger.settle_job(keys, "gone")
    assert {r.id: r.state for r in settled} == {a.id: "cancelled", b.id: "committed"}
    assert ledger.charge(other.id).state == "pending" and ledger.settle_job(keys, "gone") == []  # once


# ------------------------------------------------------------------------------------------------ schema
def test_a_version_1_sqlite_ledger_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA application_id=1685081191")
    con.execute("PRAGMA user_version=1")
    con.executescript(_SCHEMA)
    con.execute("INSERT INTO meta VALUES ('secret', ?)", ("ab" * 32,))
    con.execute("INSERT INTO units VALUES ('u', 10, 1e-5, NULL, 0, 0)")
    con.execute("INSERT INTO charges (unit, mechanism, scope, parameters, cost, epsilon, state, created, updated) "
                "VALUES ('u', 'gaussian', NULL, '{}', ?, 1.0, 'pending', 0, 0)", (json.dumps(
                    json.loads(_cost_json(Zcdp(0.1)))),))
    con.close()
    ledger = Ledger(path)
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
    assert sqlite3.connect(path).execute("SELECT COUNT(*) FROM adopted").fetchone() == (0,)  # the service's adoptions
    assert sqlite3.connect(path).execute("SELECT COUNT(*) FROM api_keys").fetchone() == (0,)  # the service's keys
    old = ledger.history("u")[0]
    assert (old.state, old.holder, old.phase) == ("pending", None, None)
    assert ledger.settle_dead() == []  # no holder: left pending for the operator
    ledger.reserve("u", Zcdp(0.1), mechanism="gaussian").commit()
    assert ledger.status("u").releases == 1


def _cost_json(loss: Any) -> str:
    from dpinfer.accounting.costs import Cost

    return Cost.of(loss).to_json()


def test_postgresql_refusals_are_one_line(postgres_url: str) -> None:
    import psycopg

    with pytest.raises(LedgerError, match=r"holds no dpinfer ledger: create it with `dpinfer budget init") as e:
        Ledger(postgres_url)
    assert "\n" not in str(e.value)
    with psycopg.connect(postgres_url, autocommit=True) as con:
        con.execute("CREATE SCHEMA dpinfer_ledger")
        con.execute("CREATE TABLE dpinfer_ledger.meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        con.execute("INSERT INTO dpinfer_ledger.meta VALUES ('application', 'something-else')")
    with pytest.raises(LedgerError, match="of another application"):
        Ledger.init(postgres_url)
    with pytest.raises(LedgerError, match=r"cannot be reached .*check the URL") as e:
        Ledger("postgresql://nobody:s3cret@127.0.0.1:1/none")
    assert "s3cret" not in str(e.value) and "\n" not in str(e.value)


def test_the_postgresql_database_holds_no_text_and_no_guessable_hash(postgres_url: str) -> None:
    import psycopg

    ledger = Ledger.init(postgres_url, epsilon=500.0)
    unit = ledger.unit_for_text(DOCUMENT)
    mech = DPFusion.calibrated(Budget({"PERSON": 40.0, "DATETIME": 40.0, "LOC": 40.0, "ORG": 40.0}, 1e-5), Spec(64))
    for _ in range(3):
        ledger.reserve(unit, mech.guarantee(64), scope="document").commit()
    ledger.void(ledger.reserve(unit, mech.guarantee(64)).id)
    with psycopg.connect(postgres_url) as con:
        tables = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables WHERE "
                                            "table_schema = 'dpinfer_ledger'")]
        assert {"meta", "units", "charges"} <= set(tables)
        rows = [row for t in tables for row in con.execute(f"SELECT * FROM dpinfer_ledger.{t}").fetchall()]
    blob = "\n".join(repr(row) for row in rows).encode("utf-8")
    assert unit.encode() in blob  # the dump is the database's content
    words = {w.strip(".,") for w in DOCUMENT.split()} | set(SPANS)
    for text in [DOCUMENT, *SPANS, *(w for w in words if len(w) >= 4)]:
        assert text.encode("utf-8") not in blob, "private text in the ledger database"
        for algorithm in ("sha256", "md5", "sha1", "sha512", "blake2b"):
            digest = hashlib.new(algorithm, text.encode("utf-8"))
            for form in (digest.hexdigest().encode(), digest.hexdigest()[:16].encode(),
                         digest.hexdigest().upper()[:16].encode(), repr(digest.digest()).encode()):
                assert form not in blob, f"a {algorithm} of private text in the ledger database"


def test_budget_commands_on_postgresql(postgres_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from dpinfer.cli import main

    def cli(*args: str) -> str:
        capsys.readouterr()
        assert main(["budget", *args, "--ledger", postgres_url]) == 0
        return capsys.readouterr().out

    cli("init", "--epsilon", "30")
    cli("set", "case-42", "--epsilon", "60")
    ledger = Ledger(postgres_url)
    ledger.reserve("case-42", Zcdp(0.5), mechanism="gaussian").commit()
    shown = json.loads(cli("show", "case-42", "--json"))
    assert shown["budget"]["epsilon"] == 60 and shown["releases"] == 1
    history = json.loads(cli("history", "case-42", "--json"))
    assert [c["state"] for c in history["charges"]] == ["committed"]
    assert "0 pending charges of dead holders settled" in cli("settle-dead")


@pytest.mark.slow
def test_bench_ledger_measures_both_backends(postgres_url: str) -> None:
    from argparse import Namespace

    from dpinfer.bench import ledger as bench

    base = postgres_url.rsplit("/", 1)[0] + "/test"
    res = bench.run(bench.config_from_args(Namespace(clients="1,2", spends=2, units=2, postgres=base)))
    assert [(r["backend"], r["clients"], r["spends"]) for r in res["rows"]] == [
        ("sqlite", 1, 2), ("sqlite", 2, 4), ("postgresql", 1, 2), ("postgresql", 2, 4)]
    assert all(r["p99_ms"] >= r["p50_ms"] > 0 and r["spends_per_s"] > 0 for r in res["rows"])
    assert "| postgresql | 2 | 4 |" in bench.render(res)
