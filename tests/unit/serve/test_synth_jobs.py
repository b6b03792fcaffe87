"""Synthesis jobs survive a restart: kept under the server's state folder, resumed by the next server, finished texts
neither lost nor generated again, the job charged once (tiny model)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from serve_helpers import cli_server, make_runtime, stop

REFS = [f"Record {i}: the patient reported a headache and was given rest." for i in range(8)]
BODY = {"references": REFS, "epsilon": 8, "batch_size": 2, "max_new_tokens": 6, "unit": "acme-corpus"}


class Killed(BaseException):
    """Stands for the process dying: nothing after it runs in the job's thread (no status, no cleanup)."""


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text("utf-8").splitlines() if x.strip()]


def test_a_job_stopped_after_one_text_is_resumed_by_the_next_server(tiny_lm, tmp_path, monkeypatch) -> None:
    from dpinfer.serve import synth_jobs
    from dpinfer.serve.keys import Principal

    acme = Principal(tenant="acme", role="user", key_id="k1")
    real = synth_jobs.synthesize_iter

    def dies_after_one(*args, **kwargs):
        it = real(*args, **kwargs)
        yield next(it)
        it.close()
        raise Killed

    monkeypatch.setattr(synth_jobs, "synthesize_iter", dies_after_one)
    monkeypatch.setattr("threading.excepthook", lambda args: None)  # the thread's death is the point
    first = make_runtime(tiny_lm, tmp_path)
    job = first.jobs.submit(acme, BODY)["id"]
    first.jobs.wait(120)
    first.close()
    folder = tmp_path / "jobs" / job
    held = lines(folder / "out.jsonl")
    assert held[0]["dpinfer"]["kind"] == "synthesis" and len(held) == 2  # the header and one text, durable
    assert json.loads((folder / "job.json").read_text())["status"] == "running"
    assert (folder / "request.json").exists() and (folder / "out.jsonl.partition").exists()
    monkeypatch.setattr(synth_jobs, "synthesize_iter", real)

    second = make_runtime(tiny_lm, tmp_path)  # resumes the job at start
    second.jobs.wait(120)
    got = second.jobs.get(acme, job)
    assert got["status"] == "done", got
    texts = got["result"]["texts"]
    assert [t["batch"] for t in texts] == [0, 1, 2, 3]  # every batch once
    assert held[1] in texts  # the text released before the stop is the one kept, not generated again
    assert all("data_dependent" not in t and "private_tokens" not in t for t in texts)
    assert got["result"]["budget"]["releases"] == 1 and got["result"]["budget"]["pending"] == 0  # charged once
    corpus = got["result"]["units"][0]  # and once on the corpus's own unit
    assert corpus["unit"].startswith("c-") and corpus["releases"] == 1 and corpus["pending"] == 0
    assert not (folder / "request.json").exists() and not (folder / "out.jsonl.partition").exists()
    assert second.jobs.resume() == []  # nothing left to resume
    with pytest.raises(Exception, match="no such job"):  # another tenant's job is a missing one
        second.jobs.get(Principal(tenant="globex", role="user", key_id="k2"), job)
    second.close()


@pytest.mark.full  # two server starts in subprocesses: about 3 minutes on the shared machine
def test_kill_9_mid_job_then_restart(tiny_model_dir, tmp_path) -> None:
    """A real ``kill -9`` of ``dpinfer serve`` while a job runs; the restarted server finishes it: every batch once,
    the texts on disk before the kill kept, one committed charge and nothing pending."""
    from dpinfer.serve.keys import KeyStore

    key = KeyStore(tmp_path / "keys.json").create("acme", "user")
    auth = {"Authorization": f"Bearer {key}"}
    args = ["--model", str(tiny_model_dir), "--tagger", "regex", "--ledger", str(tmp_path / "ledger.db"),
            "--keys", str(tmp_path / "keys.json")]
    env = {"DPINFER_CACHE": str(tmp_path / "cache")}
    proc, url = cli_server(args, tmp_path / "server.log", env=env)
    body = {**BODY, "references": REFS * 2, "max_new_tokens": 64}
    try:
        job = httpx.post(url + "/v1/synth", json=body, headers=auth, timeout=60).json()["id"]
        out = tmp_path / "jobs" / job / "out.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (out.exists() and out.stat().st_size):
            time.sleep(0.01)
        assert out.exists(), "the job never started"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        stop(proc)
    before = lines(out)[1:]
    proc, url = cli_server(args, tmp_path / "server.log", env=env)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            got = httpx.get(url + f"/v1/jobs/{job}", headers=auth, timeout=30).json()
            if got["status"] != "running" and got["status"] != "queued":
                break
            time.sleep(0.2)
        assert got["status"] == "done", got
        texts = got["result"]["texts"]
        assert [t["batch"] for t in texts] == list(range(8))
        assert all(t in texts for t in before)
        budget = httpx.get(url + "/v1/budget/acme-corpus", headers=auth, timeout=30).json()
        assert budget["releases"] == 1 and budget["pending"] == 0
    finally:
        stop(proc)
    assert "headache" not in (tmp_path / "server.log").read_text()


def test_a_job_of_an_earlier_server_is_resumed_on_its_own_unit_and_reservation(tiny_lm, tmp_path) -> None:
    """A job written before units were keyed by tenant (``job.json`` with one ``unit``, its reservation under the
    job's own resume key) is resumed on that unit, taking its pending reservation over: charged once."""
    import uuid

    from dpinfer.accounting.ledger import Ledger
    from dpinfer.pipelines.synthesize import plan_synthesis
    from dpinfer.serve.synth_jobs import JOB

    body = {**BODY, "references": REFS[:4], "unit": "acme-corpus-old"}
    job = uuid.uuid4().hex
    folder = tmp_path / "jobs" / job
    folder.mkdir(parents=True)
    (folder / "request.json").write_text(json.dumps({"body": body}))
    (folder / "job.json").write_text(json.dumps({"id": job, "tenant": "acme", "unit": "acme-corpus-old",
                                                 "status": "running"}))
    ledger = Ledger.init(tmp_path / "ledger.db", epsilon=1000.0, delta=1e-3)
    plan = plan_synthesis(body["references"], epsilon=8, batch_size=2, max_new_tokens=6)
    ledger.reserve("acme-corpus-old", plan.guarantee, scope="corpus", resume_key=ledger.resume_key(JOB, job))
    svc = make_runtime(tiny_lm, tmp_path)  # resumes it at start
    svc.jobs.wait(120)
    svc.close()
    assert json.loads((folder / "job.json").read_text())["status"] == "done"
    st = ledger.status("acme-corpus-old")
    assert st.releases == 1 and st.pending == 0  # the old reservation taken over, not a second one


def _poll(svc, who, job: str, until, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        got = svc.jobs.get(who, job)
        if until(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def test_a_job_started_on_one_replica_is_polled_on_another(tiny_lm, tmp_path, postgres_url, monkeypatch) -> None:
    """Two services on one PostgreSQL ledger (two replicas): the job started on one is polled on the other (running
    with its progress, then done with the same result), another tenant's poll is a missing job's, and a job whose
    holder died reads as failed on either, its charges settled by the ledger's rule (committed: it had released)."""
    import contextlib
    import socket
    import subprocess
    import sys
    import threading

    from dpinfer.serve import synth_jobs
    from dpinfer.serve.job_table import DEAD
    from dpinfer.serve.keys import NotFound, Principal

    acme, globex = Principal("acme", "user", "k1"), Principal("globex", "user", "k2")
    real, gate = synth_jobs.synthesize_iter, threading.Event()

    def held_after_one(*args, **kwargs):
        it = real(*args, **kwargs)
        yield next(it)
        assert gate.wait(120)
        yield from it

    monkeypatch.setattr(synth_jobs, "synthesize_iter", held_after_one)
    one, two = (make_runtime(tiny_lm, tmp_path / name, ledger=postgres_url) for name in ("one", "two"))
    try:
        job = one.jobs.submit(acme, BODY)["id"]
        running = _poll(two, acme, job, lambda g: g["progress"]["done"] >= 1)
        assert running["status"] == "running" and running["progress"] == {"done": 1, "total": 4}, running
        for svc in (one, two):  # another tenant's job answers like a missing one
            with pytest.raises(NotFound, match="no such job"):
                svc.jobs.get(globex, job)
            with pytest.raises(NotFound, match="no such job"):
                svc.jobs.get(acme, "0" * 32)
        gate.set()
        one.jobs.wait(120)
        done = two.jobs.get(acme, job)
        assert done["status"] == "done" and done["progress"] == {"done": 4, "total": 4}, done
        assert done == one.jobs.get(acme, job)  # the same answer from either replica
        assert [t["batch"] for t in done["result"]["texts"]] == [0, 1, 2, 3]
        assert done["result"]["budget"]["releases"] == 1 and done["result"]["budget"]["pending"] == 0

        # a replica that dies mid-job: its holder names a process that is gone (its charges too)
        proc = subprocess.Popen([sys.executable, "-c", "pass"])
        proc.wait()
        dead = f"{socket.gethostname()}:{proc.pid}:1"
        monkeypatch.setattr(one.jobs.table, "holder", dead)
        monkeypatch.setattr("dpinfer.accounting.ledger.holder_id", lambda: dead)

        def dies_after_one(*args, **kwargs):
            it = real(*args, **kwargs)
            yield next(it)
            it.close()
            raise Killed

        @contextlib.contextmanager
        def dies_with_the_process(*args, **kwargs):
            yield  # a process killed inside the charge's block neither commits nor cancels it

        monkeypatch.setattr(synth_jobs, "synthesize_iter", dies_after_one)
        monkeypatch.setattr("dpinfer.jobs.synth.charge", dies_with_the_process)
        monkeypatch.setattr("threading.excepthook", lambda args: None)  # the thread's death is the point
        lost = one.jobs.submit(acme, BODY)["id"]
        one.jobs.wait(120)
        ledger = two.budgets.ledger
        keys = two.jobs._resume_keys(lost, {"units": one.jobs._state(lost)["units"]})
        pending = [c for key in keys for c in ledger._query("SELECT state, phase FROM charges WHERE resume_key = ?",
                                                            (key,))]
        assert pending == [("pending", "releasing")] * 2  # the corpus's unit and the named one, left by the dead job
        failed = two.jobs.get(acme, lost)
        assert failed["status"] == "failed" and failed["error"] == DEAD and "result" not in failed, failed
        assert one.jobs.get(acme, lost) == failed  # failed once, the same on every replica
        settled = [c for key in keys for c in ledger._query("SELECT state FROM charges WHERE resume_key = ?", (key,))]
        assert settled == [("committed",)] * 2  # a text may have left: counted for good, by the rule
        rows = repr(ledger._query("SELECT * FROM synth_jobs"))
        assert not any(ref in rows for ref in REFS) and "Record 0" not in rows  # no reference text in the database
    finally:
        gate.set()
        for svc in (one, two):
            svc.jobs.wait(120)
            svc.close()


def test_a_restarted_server_on_a_postgresql_ledger_takes_its_job_over(tiny_lm, tmp_path, postgres_url,
                                                                      monkeypatch) -> None:
    """A server whose process died mid-job, restarted on its folder before any poll failed the job, takes the job's
    row over (its holder dead) and finishes it: done on every replica, charged once."""
    import socket
    import subprocess
    import sys

    from dpinfer.serve import synth_jobs
    from dpinfer.serve.keys import Principal

    acme = Principal("acme", "user", "k1")
    real = synth_jobs.synthesize_iter

    def dies_after_one(*args, **kwargs):
        it = real(*args, **kwargs)
        yield next(it)
        it.close()
        raise Killed

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    dead = f"{socket.gethostname()}:{proc.pid}:1"
    monkeypatch.setattr(synth_jobs, "synthesize_iter", dies_after_one)
    monkeypatch.setattr("threading.excepthook", lambda args: None)  # the thread's death is the point
    first = make_runtime(tiny_lm, tmp_path / "one", ledger=postgres_url)
    monkeypatch.setattr(first.jobs.table, "holder", dead)  # its process is gone once the job stops
    job = first.jobs.submit(acme, BODY)["id"]
    first.jobs.wait(120)
    first.close()
    monkeypatch.setattr(synth_jobs, "synthesize_iter", real)
    again = make_runtime(tiny_lm, tmp_path / "one", ledger=postgres_url)  # the same folder: resumes the job
    other = make_runtime(tiny_lm, tmp_path / "two", ledger=postgres_url)
    try:
        again.jobs.wait(120)
        got = other.jobs.get(acme, job)
        assert got["status"] == "done" and [t["batch"] for t in got["result"]["texts"]] == [0, 1, 2, 3], got
        assert got["result"]["budget"]["releases"] == 1 and got["result"]["budget"]["pending"] == 0  # charged once
        assert again.jobs.resume() == []
    finally:
        for svc in (again, other):
            svc.close()
