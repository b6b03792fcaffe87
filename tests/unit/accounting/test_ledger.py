"""The persistent privacy-budget ledger: composition by the accountant, reserve → commit, concurrency, crashes,
refused files, and nothing private in the file."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import random
import signal
import sqlite3
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import pytest

from dpinfer.accounting import Guarantee, Zcdp
from dpinfer.accounting.calibration import Budget, Spec
from dpinfer.accounting.costs import ALL_GROUPS, ApproxDp, Cost, composed_epsilon
from dpinfer.accounting.dp_fusion import conversion_cost, group_loss, step_epsilon
from dpinfer.accounting.ledger import Ledger
from dpinfer.accounting.losses import PureDp, SingleOrderRdp, compose
from dpinfer.checks import format_up
from dpinfer.errors import BudgetExceededError, DPInferError, LedgerError
from dpinfer.mechanisms.dp_fusion import DPFusion

DELTA = 1e-5
FORK = multiprocessing.get_context("fork")


def budget_for(step: Zcdp, n: int, delta: float = DELTA) -> float:
    """A budget that admits exactly n releases of ``step``: halfway between the composed ε of n and of n + 1."""
    return (step.times(n).to_epsilon(delta) + step.times(n + 1).to_epsilon(delta)) / 2


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger.init(tmp_path / "budget.db")


# ------------------------------------------------------------------------------------------------ basics
def test_reserve_commit_cancel_and_status(ledger: Ledger) -> None:
    step = Zcdp(0.2)
    ledger.set_budget("case-1", epsilon=budget_for(step, 2))
    first = ledger.reserve("case-1", step, mechanism="gaussian", parameters={"sigma": 1.58})
    assert first.state == "pending"
    status = ledger.status("case-1")
    assert (status.pending, status.releases) == (1, 0)
    assert status.spent == step.to_epsilon(DELTA) and status.committed == 0.0  # pending counts as spent
    first.commit()
    second = ledger.reserve("case-1", step, mechanism="gaussian")
    second.cancel()  # nothing released: it no longer counts
    ledger.reserve("case-1", step, mechanism="gaussian").commit()
    status = ledger.status("case-1")
    assert (status.releases, status.pending) == (2, 0)
    assert status.spent == status.committed == step.times(2).to_epsilon(DELTA)
    assert status.left == pytest.approx(status.epsilon - status.spent)
    assert "all 2 releases together" in status.guarantee()
    with pytest.raises(BudgetExceededError):
        ledger.reserve("case-1", step, mechanism="gaussian")
    states = [(c.mechanism, c.state) for c in ledger.history("case-1")]
    assert states == [("gaussian", "committed"), ("gaussian", "cancelled"), ("gaussian", "committed")]
    assert ledger.history("case-1")[0].parameters == {"sigma": 1.58}
    assert [u.unit for u in ledger.units()] == ["case-1"]
    assert set(status.to_dict()) >= {"unit", "budget", "spent", "left", "pending", "releases", "guarantee"}


def test_the_refusal_is_one_line_naming_unit_budget_spent_and_cost(ledger: Ledger) -> None:
    ledger.set_budget("case-42", epsilon=10.0)
    ledger.reserve("case-42", Zcdp(0.5), mechanism="pad").commit()
    with pytest.raises(BudgetExceededError) as info:
        ledger.reserve("case-42", Zcdp(2.0), mechanism="pad")
    message = str(info.value)
    assert "\n" not in message and isinstance(info.value, DPInferError)
    spent, cost = Zcdp(0.5).to_epsilon(DELTA), Zcdp(2.0).to_epsilon(DELTA)
    assert "unit 'case-42'" in message and "budget ε = 10 " in message
    assert f"spent ε = {format_up(spent)} (1 release)" in message and spent > 4.7
    assert f"costs ε = {format_up(cost)} " in message and cost > 10.7
    assert ledger.status("case-42").releases == 1  # the refused spend left no row behind
    assert len(ledger.history("case-42")) == 1


def test_a_unit_without_budget_is_refused_and_the_default_applies_to_new_units(tmp_path: Path) -> None:
    ledger = Ledger.init(tmp_path / "b.db")
    with pytest.raises(BudgetExceededError, match="has no budget"):
        ledger.reserve("new", Zcdp(0.1), mechanism="pad")
    Ledger.init(tmp_path / "b.db", epsilon=3.0, delta=1e-6)  # re-init sets the default, keeps everything else
    ledger.reserve("new", Zcdp(0.1), mechanism="pad").commit()
    status = ledger.status("new")
    assert (status.epsilon, status.delta) == (3.0, 1e-6)
    assert status.spent == Zcdp(0.1).to_epsilon(1e-6)


def test_spend_cancels_before_release_and_commits_after(ledger: Ledger) -> None:
    ledger.set_budget("u", epsilon=50.0)
    with pytest.raises(RuntimeError), ledger.spend("u", Zcdp(0.1), mechanism="m"):
        raise RuntimeError("the model failed to load")
    with pytest.raises(RuntimeError), ledger.spend("u", Zcdp(0.1), mechanism="m") as charge:
        charge.releasing()
        raise RuntimeError("failed after the output became visible")
    with ledger.spend("u", Zcdp(0.1), mechanism="m"):
        pass
    assert [c.state for c in ledger.history("u")] == ["cancelled", "committed", "committed"]


def test_void_only_pending_and_commit_revives_a_voided_reservation(ledger: Ledger) -> None:
    ledger.set_budget("u", epsilon=50.0)
    done = ledger.reserve("u", Zcdp(0.1), mechanism="m")
    done.commit()
    with pytest.raises(LedgerError, match="committed; it cannot become void"):
        ledger.void(done.id)
    stuck = ledger.reserve("u", Zcdp(0.1), mechanism="m")
    assert ledger.void(stuck.id).state == "void"
    assert ledger.status("u").pending == 0
    stuck.commit()  # the release happened after all: it counts (fail closed)
    assert ledger.status("u").releases == 2
    with pytest.raises(LedgerError, match="has no charge 999"):
        ledger.void(999)


def test_units_keep_their_scope(ledger: Ledger) -> None:
    ledger.set_budget("store", epsilon=50.0)
    ledger.reserve("store", Zcdp(0.1), mechanism="pad", scope="store").commit()
    with pytest.raises(LedgerError, match="protects a store"):
        ledger.reserve("store", Zcdp(0.1), mechanism="dp-fusion", scope="document")


@pytest.mark.parametrize("bad", ["", " x", "a\nb", "x" * 129, 42])
def test_bad_unit_names_are_refused_without_echoing_them(ledger: Ledger, bad: object) -> None:
    with pytest.raises(LedgerError) as info:
        ledger.set_budget(bad, epsilon=1.0)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)
    if isinstance(bad, str) and len(bad) > 3:
        assert bad.strip() not in str(info.value)


def test_a_guarantee_without_privacy_costs_infinity(ledger: Ledger) -> None:
    ledger.set_budget("u", epsilon=1e6)
    with pytest.raises(BudgetExceededError, match="costs ε = ∞"):
        ledger.reserve("u", Guarantee.no_privacy("original"))


# ------------------------------------------------------------------------------------------------ composition
def test_ten_dp_fusion_releases_of_one_document_compose_per_group(ledger: Ledger) -> None:
    """m = 2 groups, α = 2, T_max = 200, ε = 20 per group: ten releases compose at order α, per group."""
    mech = DPFusion.calibrated(Budget({"PERSON": 20.0, "DATETIME": 30.0}, DELTA), Spec(200, alpha=2.0))
    guarantee = mech.guarantee(200)
    ledger.set_budget("doc", epsilon=1000.0)
    for _ in range(10):
        ledger.reserve("doc", guarantee).commit()
    status = ledger.status("doc")
    assert set(status.groups) == {"PERSON", "DATETIME"}
    for name, bound in zip(mech.group_names, mech.bounds, strict=True):
        accountant = group_loss(bound, 2, 2.0, 200).times(10).to_epsilon(DELTA)
        closed_form = 10 * 200 * step_epsilon(bound, 2, 2.0) + conversion_cost(2.0, DELTA)
        assert status.groups[name] == accountant
        assert status.groups[name] == pytest.approx(closed_form, rel=1e-12)
    # pinned: one release is ε = 20 / 30 per group; ten cost 10·(ε − c) + c, c ≈ 10.13 the conversion paid once
    c = conversion_cost(2.0, DELTA)
    assert round(c, 4) == 10.1266
    assert status.groups["PERSON"] == pytest.approx(10 * (20.0 - c) + c, rel=1e-6)
    assert status.groups["DATETIME"] == pytest.approx(10 * (30.0 - c) + c, rel=1e-6)
    assert round(status.groups["PERSON"], 2) == 108.86 and round(status.groups["DATETIME"], 2) == 208.86
    assert status.spent == status.groups["DATETIME"] < 10 * 30.0


def test_ten_gaussian_releases_cost_far_less_than_ten_times(ledger: Ledger) -> None:
    """Ten zCDP releases at ε = 4 each: the accountant composes ρ and converts once (≈ 15.8, not 40)."""
    rho = 0.3731
    one = Zcdp(rho).to_epsilon(DELTA)
    assert round(one, 2) == 4.0
    ledger.set_budget("store", epsilon=100.0)
    for _ in range(10):
        ledger.reserve("store", Zcdp(rho), mechanism="pad").commit()
    spent = ledger.status("store").spent
    assert spent == Zcdp(10 * rho).to_epsilon(DELTA)
    assert round(spent, 1) == 15.8 and spent < 0.5 * 10 * one


def test_a_whole_document_charge_counts_against_every_group_and_mixed_orders_split_delta() -> None:
    grouped = Cost({"PERSON": SingleOrderRdp(2.0, 1.0), "LOC": SingleOrderRdp(2.0, 3.0)})
    whole = Cost.of(PureDp(0.5))
    eps = composed_epsilon([grouped, whole], DELTA)
    assert eps == {"LOC": compose(SingleOrderRdp(2.0, 3.0), PureDp(0.5)).to_epsilon(DELTA),
                   "PERSON": compose(SingleOrderRdp(2.0, 1.0), PureDp(0.5)).to_epsilon(DELTA)}
    other_order = Cost({"PERSON": SingleOrderRdp(8.0, 1.0)})
    mixed = composed_epsilon([grouped, other_order], DELTA)["PERSON"]
    assert mixed == SingleOrderRdp(2.0, 1.0).to_epsilon(DELTA / 2) + SingleOrderRdp(8.0, 1.0).to_epsilon(DELTA / 2)
    approx = composed_epsilon([Cost.of(ApproxDp(1.0, 4e-6)), Cost.of(Zcdp(0.1))], DELTA)[ALL_GROUPS]
    assert approx == 1.0 + Zcdp(0.1).to_epsilon(DELTA - 4e-6)


def test_a_guarantee_read_back_from_json_is_charged_as_its_epsilon_delta(ledger: Ledger) -> None:
    g = Guarantee.from_loss(Zcdp(0.1), delta=1e-6, mechanism="pad", adjacency="x", parameters={}, max_new_tokens=8)
    back = Guarantee.from_dict(g.to_dict())
    assert Cost.of(back).parts[ALL_GROUPS] == ApproxDp(g.epsilon, 1e-6)
    assert Cost.of(g).parts[ALL_GROUPS] == Zcdp(0.1)


# ------------------------------------------------------------------------------------------------ concurrency
def _spender(path: str, unit: str, counts: list[int], rho: float) -> tuple[int, int]:
    ledger = Ledger(path)

    def work(n: int) -> tuple[int, int]:
        ok = refused = 0
        for _ in range(n):
            try:
                charge = ledger.reserve(unit, Zcdp(rho), mechanism="gaussian")
            except BudgetExceededError:
                refused += 1
                continue
            charge.commit()
            ok += 1
        return ok, refused

    with ThreadPoolExecutor(len(counts)) as pool:
        results = list(pool.map(work, counts))
    return sum(r[0] for r in results), sum(r[1] for r in results)


def test_200_spends_from_8_processes_and_4_threads_admit_exactly_n(tmp_path: Path) -> None:
    path, rho, n = str(tmp_path / "b.db"), 0.05, 37
    ledger = Ledger.init(path)
    ledger.set_budget("doc", epsilon=budget_for(Zcdp(rho), n))
    per_worker = [200 // 32 + (1 if i < 200 % 32 else 0) for i in range(32)]
    assert sum(per_worker) == 200
    with ProcessPoolExecutor(8, mp_context=FORK) as pool:
        futures = [pool.submit(_spender, path, "doc", per_worker[4 * p: 4 * p + 4], rho) for p in range(8)]
        results = [f.result(timeout=600) for f in futures]
    ok, refused = sum(r[0] for r in results), sum(r[1] for r in results)
    assert (ok, refused) == (n, 200 - n)
    status = ledger.status("doc")
    assert (status.releases, status.pending) == (n, 0)
    assert status.spent == Zcdp(rho).times(n).to_epsilon(DELTA) <= status.epsilon
    assert len(ledger.history("doc")) == n


# ------------------------------------------------------------------------------------------------ crashes
def _crashing_spender(path: str, log: str, refusals: str, total: int, rho: float) -> None:
    """Spend until ``total`` attempts are recorded (ledger rows + refusals); log each id after its commit returns."""
    ledger = Ledger(path)
    rng = random.Random(os.getpid())
    while True:
        with sqlite3.connect(path) as con:
            rows = con.execute("SELECT COUNT(*) FROM charges").fetchone()[0]
        if rows + os.path.getsize(refusals) >= total:
            os._exit(0)
        try:
            charge = ledger.reserve("doc", Zcdp(rho), mechanism="gaussian")
        except BudgetExceededError:
            with open(refusals, "ab") as handle:
                handle.write(b"x")
                handle.flush()
                os.fsync(handle.fileno())
            continue
        time.sleep(rng.random() * 0.004)  # "generating"
        charge.commit()
        with open(log, "a") as handle:
            handle.write(f"{charge.id}\n")
            handle.flush()
            os.fsync(handle.fileno())


def test_kill_9_at_random_points_of_100_spends_loses_nothing_committed(tmp_path: Path) -> None:
    path, log, refusals = str(tmp_path / "b.db"), tmp_path / "committed.log", tmp_path / "refused"
    rho, n, total = 0.05, 60, 100
    ledger = Ledger.init(path)
    ledger.set_budget("doc", epsilon=budget_for(Zcdp(rho), n))
    log.touch()
    refusals.touch()
    rng = random.Random(12345)
    kills = 0
    for _ in range(200):
        child = FORK.Process(target=_crashing_spender, args=(path, str(log), str(refusals), total, rho))
        child.start()
        child.join(timeout=rng.uniform(0.0, 0.25))
        if child.is_alive():
            os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
            child.join()
            kills += 1
        reopened = Ledger(path)  # opens after every kill
        committed = {int(line) for line in log.read_text().split()}
        records = {c.id: c.state for c in reopened.history("doc")}
        assert all(records[i] == "committed" for i in committed)  # nothing committed is lost
        status = reopened.status("doc")
        assert status.spent <= status.epsilon  # nothing over-spent (pending counted)
        for record in reopened.history("doc"):  # the operator voids what a killed process left pending
            if record.state == "pending":
                reopened.void(record.id)
        if child.exitcode == 0 and len(records) + refusals.stat().st_size >= total:
            break
    else:  # a loaded machine spent too little between the kills: the last spender runs to the end
        child = FORK.Process(target=_crashing_spender, args=(path, str(log), str(refusals), total, rho))
        child.start()
        child.join()
        assert child.exitcode == 0
    assert kills >= 3
    final = Ledger(path)
    committed = {int(line) for line in log.read_text().split()}
    assert all(final.charge(i).state == "committed" for i in committed)  # nothing committed is lost
    states = [c.state for c in final.history("doc")]
    assert len(states) + refusals.stat().st_size == total
    assert states.count("committed") <= n
    assert final.status("doc").spent == Zcdp(rho).times(states.count("committed")).to_epsilon(DELTA)


# ------------------------------------------------------------------------------------------------ refused files
def _one_line_refusal(path: Path) -> str:
    with pytest.raises(LedgerError) as info:
        Ledger(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message and info.value.__cause__ is None
    return message


def test_missing_foreign_and_corrupt_files_are_refused_in_one_line(tmp_path: Path) -> None:
    assert "does not exist" in _one_line_refusal(tmp_path / "missing.db")
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(os.urandom(4096))
    assert "not a dpinfer ledger" in _one_line_refusal(garbage)
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as con:
        con.execute("CREATE TABLE charges (id INTEGER)")
    assert "another application" in _one_line_refusal(foreign)
    other_app = tmp_path / "other.db"
    with sqlite3.connect(other_app) as con:
        con.execute("PRAGMA application_id = 1234")
        con.execute("CREATE TABLE t (x)")
    assert "another application" in _one_line_refusal(other_app)

    ledger = Ledger.init(tmp_path / "ok.db")
    ledger.set_budget("doc", epsilon=1e9)
    for _ in range(25):
        ledger.reserve("doc", Zcdp(0.001), mechanism="m", parameters={"padding": "p" * 3000}).commit()
    with sqlite3.connect(tmp_path / "ok.db") as con:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    damaged = tmp_path / "damaged.db"
    data = bytearray((tmp_path / "ok.db").read_bytes())
    data[4096 * 3: 4096 * 3 + 512] = os.urandom(512)  # a page in the middle of the charges table
    damaged.write_bytes(bytes(data))
    assert "damaged" in _one_line_refusal(damaged)
    header = tmp_path / "header.db"
    header.write_bytes(b"\x00" * 16 + bytes(data[16:]))
    assert "not a dpinfer ledger" in _one_line_refusal(header)
    empty = tmp_path / "empty.db"
    empty.touch()
    assert "not a dpinfer ledger" in _one_line_refusal(empty)


# ------------------------------------------------------------------------------------------------ nothing private
DOCUMENT = ("Mr Adebayo Okonkwo-Lindqvist, born on 14 March 1962 in Trondheim, complained that the Zephyrine "
            "Insurance Company withheld his payments.")
SPANS = ["Adebayo Okonkwo-Lindqvist", "14 March 1962", "Trondheim", "Zephyrine Insurance Company"]


def test_the_ledger_file_holds_no_text_and_no_guessable_hash(tmp_path: Path) -> None:
    path = tmp_path / "b.db"
    ledger = Ledger.init(path, epsilon=500.0)
    unit = ledger.unit_for_text(DOCUMENT)
    assert unit == ledger.unit_for_text(DOCUMENT) and unit != ledger.unit_for_text(DOCUMENT + " ")
    assert unit == Ledger(path).unit_for_text(DOCUMENT)  # stable across processes: the secret is in the file
    assert Ledger.init(tmp_path / "other.db").unit_for_text(DOCUMENT) != unit  # another ledger, another secret
    mech = DPFusion.calibrated(Budget({"PERSON": 40.0, "DATETIME": 40.0, "LOC": 40.0, "ORG": 40.0}, 1e-5), Spec(64))
    for _ in range(3):
        ledger.reserve(unit, mech.guarantee(64), scope="document").commit()
    ledger.void(ledger.reserve(unit, mech.guarantee(64)).id)
    blob = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("b.db"))
    words = {w.strip(".,") for w in DOCUMENT.split()} | set(SPANS)
    for text in [DOCUMENT, *SPANS, *(w for w in words if len(w) >= 4)]:
        for encoded in (text.encode("utf-8"), text.encode("utf-16-le")):
            assert encoded not in blob, "private text in the ledger file"
        for algorithm in ("sha256", "md5", "sha1", "sha512", "blake2b"):
            digest = hashlib.new(algorithm, text.encode("utf-8"))
            for form in (digest.digest(), digest.hexdigest().encode(), digest.hexdigest()[:16].encode(),
                         digest.hexdigest().upper()[:16].encode()):
                assert form not in blob, f"a {algorithm} of private text in the ledger file"


def test_threads_share_one_ledger_object(tmp_path: Path) -> None:
    ledger = Ledger.init(tmp_path / "b.db")
    ledger.set_budget("u", epsilon=budget_for(Zcdp(0.01), 10))
    outcomes: list[bool] = []
    lock = threading.Lock()

    def one() -> None:
        try:
            ledger.reserve("u", Zcdp(0.01), mechanism="m").commit()
            ok = True
        except BudgetExceededError:
            ok = False
        with lock:
            outcomes.append(ok)

    threads = [threading.Thread(target=one) for _ in range(25)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes.count(True) == 10


def test_settle_replaces_an_estimate_and_refuses_when_the_exact_cost_does_not_fit(ledger: Ledger) -> None:
    ledger.set_budget("u", epsilon=budget_for(Zcdp(0.1), 3))
    ledger.reserve("u", Zcdp(0.1), mechanism="m").commit()
    charge = ledger.reserve("u", Zcdp(0.1), mechanism="m")  # the estimate, before the model loads
    g = Guarantee.from_loss(Zcdp(0.05), delta=DELTA, mechanism="pad", adjacency="x", parameters={"rho": 0.05},
                            max_new_tokens=8)
    charge.settle(g)  # the exact cost is lower: it replaces the estimate
    charge.commit()
    record = ledger.history("u")[-1]
    assert (record.mechanism, dict(record.parameters), record.state) == ("m", {"rho": 0.05}, "committed")
    assert ledger.status("u").spent == Zcdp(0.15).to_epsilon(DELTA)
    late = ledger.reserve("u", Zcdp(0.1), mechanism="m")
    with pytest.raises(BudgetExceededError):
        late.settle(Zcdp(0.3))  # more than the estimate, and over the budget: cancelled
    assert late.state == "cancelled" and ledger.history("u")[-1].state == "cancelled"


def test_a_resumed_job_takes_over_the_pending_charge_of_its_record(ledger: Ledger) -> None:
    ledger.set_budget("doc", epsilon=budget_for(Zcdp(0.1), 2))
    key = ledger.resume_key("/out/job.jsonl", "record-7")
    assert key.startswith("r-") and "record-7" not in key and key != ledger.resume_key("/out/job.jsonl", "record-8")
    ledger.reserve("doc", Zcdp(0.1), mechanism="m", resume_key=key)  # the run is killed: pending
    again = ledger.reserve("doc", Zcdp(0.1), mechanism="m", resume_key=key)  # the resumed run: the same charge
    again.commit()
    assert [c.state for c in ledger.history("doc")] == ["committed"]
    other = ledger.reserve("doc", Zcdp(0.1), mechanism="m", resume_key=ledger.resume_key("/out/job.jsonl", "r-8"))
    other.commit()
    with pytest.raises(BudgetExceededError):  # a committed record is not taken over: a new release pays
        ledger.reserve("doc", Zcdp(0.1), mechanism="m", resume_key=key)
