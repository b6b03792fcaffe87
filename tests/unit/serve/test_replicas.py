"""``dpinfer serve --replicas 2`` on Ray Serve with a PostgreSQL ledger (holding the API keys) and stores on a Chroma
server: 50 concurrent clients against a unit that admits exactly 3 sanitisations → exactly 3 succeed and the ledger
agrees; the same while one replica's process is killed with SIGKILL mid-load: no over-spend, nothing committed lost,
the dead replica's reservations settled by the ledger's rule when Ray starts its successor. Documents added through
one replica are seen through every request, and a key revoked in the database is refused at once. Slow (a local Ray,
two replicas each loading the tiny model: about two minutes on two busy cores); skipped without Ray Serve, PostgreSQL
or Chroma's server (failed without PostgreSQL or Chroma when CI is set)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dpinfer.accounting.costs import Cost, composed_epsilon
from dpinfer.accounting.ledger import Ledger
from dpinfer.defaults import SERVE
from dpinfer.serve.budget import ledger_unit
from dpinfer.serve.keys import LedgerKeys

SRC = str(Path(__file__).resolve().parents[3] / "src")
DOC = "Mr John Smith lives in London and was born on 12 March 1961."
BODY = {"text": DOC, "epsilon": 40, "max_new_tokens": 3}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _replica_pids(server: subprocess.Popen[bytes]) -> list[int]:
    import psutil

    return [p.pid for p in psutil.Process(server.pid).children(recursive=True)
            if any("ServeReplica:dpinfer" in part for part in p.cmdline())]


def _wait(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1.0)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.mark.slow
def test_two_replicas_admit_exactly_what_the_shared_budget_affords(postgres_url, chroma_server, tiny_model_dir,
                                                                   tmp_path):
    pytest.importorskip("ray.serve", reason="Ray Serve is an optional extra (pip install -e '.[ray]')")
    httpx = pytest.importorskip("httpx")
    keys = LedgerKeys(Ledger.init(postgres_url, epsilon=SERVE.default_epsilon, delta=SERVE.default_delta))
    key = keys.create("acme", "admin")  # in the database: no keys file anywhere
    auth = {"Authorization": f"Bearer {key}"}
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1",
           "XDG_DATA_HOME": str(tmp_path / "data"), "RAY_USAGE_STATS_ENABLED": "0"}
    log = open(tmp_path / "serve.log", "wb")
    server = subprocess.Popen([sys.executable, "-m", "dpinfer", "serve", "--replicas", "2", "--ledger", postgres_url,
                               "--stores", chroma_server.url, "--model", str(tiny_model_dir), "--tagger", "regex",
                               "--port", str(port)],
                              env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        def healthy() -> bool:
            if server.poll() is not None:
                pytest.fail("the server exited: " + (tmp_path / "serve.log").read_text(errors="replace")[-2000:])
            try:
                return httpx.get(url + "/healthz", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        _wait(healthy, 400, "two replicas to serve")
        _wait(lambda: len(_replica_pids(server)) == 2, 60, "two replica processes")
        # the price of one sanitisation, from a probe unit: a budget between 3 and 4 of them
        probe = httpx.post(url + "/v1/sanitize", json={**BODY, "unit": "probe"}, headers=auth, timeout=120)
        assert probe.status_code == 200, probe.text
        ledger = Ledger(postgres_url)
        with ledger._connect() as con:
            (cost,) = con.execute("SELECT cost FROM charges WHERE unit = ?",
                                  (ledger_unit("acme", "probe"),)).fetchone()
        one = Cost.from_json(cost)
        delta = probe.json()["budget"]["budget"]["delta"]
        three, four = (max(composed_epsilon([one] * k, delta).values()) for k in (3, 4))
        budget = (three + four) / 2
        # each release is charged to the document's unit too (the unit rule): give it room, so that the unit each
        # load names is the one that binds
        ledger.set_budget(ledger_unit("acme", ledger.unit_for_text(DOC)), 1e6)

        def load(unit: str, kill: bool = False) -> list[int]:
            r = httpx.put(url + f"/v1/budget/{unit}", json={"epsilon": budget}, headers=auth, timeout=60)
            assert r.status_code == 200, r.text

            def one_client(_: int) -> int:
                try:
                    return httpx.post(url + "/v1/sanitize", json={**BODY, "unit": unit}, headers=auth,
                                      timeout=180).status_code
                except httpx.HTTPError:
                    return -1

            with ThreadPoolExecutor(50) as pool:
                futures = [pool.submit(one_client, i) for i in range(50)]
                if kill:  # one replica's process killed mid-load
                    time.sleep(1.0)
                    killed.append(_replica_pids(server)[0])
                    os.kill(killed[0], signal.SIGKILL)
                return [f.result(timeout=600) for f in futures]

        killed: list[int] = []

        codes = load("u3")
        assert codes.count(200) == 3 and codes.count(402) == 47, codes
        status = ledger.status(ledger_unit("acme", "u3"))
        assert (status.releases, status.pending) == (3, 0) and status.spent <= budget
        # a synthesis job is polled through the proxy, whichever replica each poll reaches: never a 404
        synth = {"references": [f"Record {i}: a headache, and rest." for i in range(4)], "epsilon": 8,
                 "batch_size": 2, "max_new_tokens": 4}
        r = httpx.post(url + "/v1/synth", json=synth, headers=auth, timeout=120)
        assert r.status_code == 202, r.text
        polls: list[dict] = []

        def finished() -> bool:
            got = httpx.get(url + r.json()["poll"], headers=auth, timeout=60)
            assert got.status_code == 200, got.text
            polls.append(got.json())
            return polls[-1]["status"] not in ("queued", "running")

        _wait(finished, 180, "the synthesis job")
        again = [httpx.get(url + r.json()["poll"], headers=auth, timeout=60).json() for _ in range(6)]
        assert polls[-1]["status"] == "done" and all(a == polls[-1] for a in again), polls[-1]
        assert [t["batch"] for t in polls[-1]["result"]["texts"]] == [0, 1]

        codes = load("k3", kill=True)
        ok = codes.count(200)
        assert ok <= 3 and set(codes) <= {200, 402, 500, 502, 503, -1}, codes
        # Ray starts a successor, which settles the dead replica's reservations at its start
        _wait(lambda: len(_replica_pids(server)) == 2 and ledger.status(ledger_unit("acme", "k3")).pending == 0, 400,
              "the killed replica's successor to settle its reservations")
        assert killed[0] not in _replica_pids(server)  # a successor, not the same process
        dead = [c for c in ledger.history(ledger_unit("acme", "k3"))
                if c.holder is not None and c.holder.split(":")[1] == str(killed[0])]
        assert all(c.state in ("committed", "cancelled") for c in dead)  # settled by the rule, none left pending
        status = ledger.status(ledger_unit("acme", "k3"))
        assert ok <= status.releases <= 3 and status.spent <= budget  # nothing committed lost, no over-spend
        assert httpx.post(url + "/v1/sanitize", json={**BODY, "unit": "u3"}, headers=auth,
                          timeout=120).status_code == 402
        # the stores: documents added through one request are there for every later one, whichever replica takes it
        docs = {"documents": ["Patient: a migraine. Doctor: rest.", "Patient: a cough. Doctor: an inhaler."]}
        r = httpx.post(url + "/v1/rag/clinic/documents", json=docs, headers=auth, timeout=120)
        assert r.status_code == 200 and r.json()["added"] == 2, r.text
        seen = [httpx.get(url + "/v1/rag/clinic", headers=auth, timeout=60).status_code for _ in range(12)]
        assert seen == [200] * 12
        # a key made while the replicas run works at once; revoked, it is refused at once
        later = keys.create("globex", "user")
        theirs = httpx.get(url + "/v1/rag/clinic", headers={"Authorization": f"Bearer {later}"}, timeout=60)
        assert theirs.status_code == 404  # acme's store is a missing one for globex
        keys.revoke(next(k["id"] for k in keys.list() if k["tenant"] == "globex"))
        refused = [httpx.get(url + "/v1/rag", headers={"Authorization": f"Bearer {later}"}, timeout=60).status_code
                   for _ in range(8)]
        assert refused == [401] * 8
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def test_replicas_on_a_cluster_refuse_a_sqlite_ledger_before_ray_starts(tmp_path, capsys, monkeypatch) -> None:
    pytest.importorskip("ray", reason="Ray is an optional extra (pip install -e '.[ray]')")
    import dpinfer.pipelines.corpus_ray as corpus_ray
    from dpinfer.cli import main

    monkeypatch.setattr(corpus_ray, "init_ray", lambda *a, **k: pytest.fail("Ray started"))
    assert main(["serve", "--replicas", "2", "--ray-address", "auto", "--ledger", str(tmp_path / "l.db")]) == 2
    err = capsys.readouterr().err
    assert "give them one ledger with --ledger postgresql://" in err and err.count("\n") == 1
    assert main(["serve", "--replicas", "0"]) == 2
    assert "--replicas" in capsys.readouterr().err
