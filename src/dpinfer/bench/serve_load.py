"""A bounded loopback load test of ``dpinfer serve``: 50 concurrent clients against one unit whose budget admits
exactly 3 sanitisations, then the same after a ``kill -9`` of the server in the middle of the load and a restart.

    python -m dpinfer.bench.serve_load [--model M] [--clients 50] [--admits 3] [--max-new-tokens 16]

It starts its own servers (``dpinfer serve`` subprocesses on a free 127.0.0.1 port, a fresh ledger in a temp folder),
sends only to them, sends each client's request once (phase 2: once more after the restart, for the clients whose
connection died with the server), gives every request a timeout and the whole run a deadline, prints what it
measured as JSON and exits 1 if an invariant fails:

* phase 1: exactly ``admits`` requests succeed, the others are refused (402), and the ledger agrees (``admits``
  committed releases, nothing pending, composed ε ≤ budget);
* phase 2: no over-spend (committed + pending ≤ ``admits``, composed ε ≤ budget) and nothing committed lost (every
  200 a client received before the kill is a committed charge after the restart; the restarted server settles the
  killed one's pending reservations by the ledger's rule, so they may become committed, never disappear unless
  provably unreleased).

The budget that admits exactly ``admits`` releases is read from the server: a calibration unit is charged ``admits``
times and its composed ε (the ledger's own figure) becomes the budget of the test units.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

DOC = ("Mr John Smith, born on 12 March 1961, lives at 14 Baker Street in London. He was treated at St Mary's "
       "Hospital for a fracture of the left wrist.")
SPANS = [{"start": 3, "end": 13, "label": "PERSON"}, {"start": 23, "end": 36, "label": "DATETIME"},
         {"start": 47, "end": 62, "label": "LOC"}]
DEADLINE_S = 900.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(model: str | None, ledger: Path, log: Path, port: int) -> subprocess.Popen[bytes]:
    """``dpinfer serve`` on 127.0.0.1:port (no keys: loopback only), ready when /healthz answers."""
    import httpx

    args = [sys.executable, "-m", "dpinfer", "serve", "--host", "127.0.0.1", "--port", str(port), "--ledger",
            str(ledger), "--stores", str(ledger.parent / "stores"), "--tagger", "regex",
            "--default-epsilon", "1e9"]  # the document's own unit (charged with every release) never refuses here
    if model:
        args += ["--model", model]
    with open(log, "ab") as fh:
        proc = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode} (see {log})")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError("the server did not start within 300 s")


def sanitize_body(unit: str, max_new_tokens: int) -> dict[str, Any]:
    return {"text": DOC, "spans": SPANS, "epsilon": 40, "max_new_tokens": max_new_tokens, "unit": unit}


def fire(url: str, body: dict[str, Any], clients: int, *, on_start: threading.Event | None = None) -> list[int]:
    """``clients`` concurrent requests, each sent once; returns each one's status (0: the connection failed)."""
    import httpx

    barrier = threading.Barrier(clients)

    def one(_: int) -> int:
        barrier.wait(timeout=60)
        if on_start is not None:
            on_start.set()
        try:
            return httpx.post(url + "/v1/sanitize", json=body, timeout=300).status_code
        except httpx.HTTPError:
            return 0

    with ThreadPoolExecutor(clients) as pool:
        return list(pool.map(one, range(clients)))


def _charges(ledger: Path, unit: str) -> int:
    """Pending and committed charges of ``unit`` (0 while the unit has none)."""
    from dpinfer.accounting.ledger import Ledger
    from dpinfer.errors import LedgerError

    try:
        st = Ledger(ledger).status(unit)
    except LedgerError:
        return 0
    return st.releases + st.pending


def ledger_state(ledger: Path, unit: str) -> dict[str, Any]:
    from dpinfer.accounting.ledger import Ledger

    st = Ledger(ledger).status(unit)
    return {"releases": st.releases, "pending": st.pending, "spent": st.spent, "budget": st.epsilon}


def run(model: str | None, *, clients: int = 50, admits: int = 3, max_new_tokens: int = 16,
        kill_after: float = 1.0) -> dict[str, Any]:
    import httpx

    t0 = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="dpinfer-load-"))
    ledger, log = tmp / "ledger.db", tmp / "server.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start(model, ledger, log, port)
    out: dict[str, Any] = {"clients": clients, "admits": admits, "max_new_tokens": max_new_tokens}
    try:
        delta = 1e-3
        httpx.put(url + "/v1/budget/calibration", json={"epsilon": 1e6, "delta": delta}).raise_for_status()
        for _ in range(admits):
            r = httpx.post(url + "/v1/sanitize", json=sanitize_body("calibration", max_new_tokens), timeout=300)
            r.raise_for_status()
        budget = r.json()["budget"]["spent"]  # the ledger's composed ε of `admits` such releases
        out["budget_epsilon"] = budget
        for unit in ("load-1", "load-2"):
            httpx.put(url + f"/v1/budget/{unit}", json={"epsilon": budget, "delta": delta}).raise_for_status()

        # phase 1: all clients at once
        statuses = fire(url, sanitize_body("load-1", max_new_tokens), clients)
        p1 = {"ok": statuses.count(200), "refused": statuses.count(402),
              "other": len(statuses) - statuses.count(200) - statuses.count(402), "ledger": None}
        p1["ledger"] = ledger_state(ledger, "local/load-1")
        out["phase1"] = p1

        # phase 2: kill -9 in the middle of the load, restart, the clients whose connection died send again
        started = threading.Event()
        results: list[int] = []

        def load() -> None:
            results.extend(fire(url, sanitize_body("load-2", max_new_tokens), clients, on_start=started))

        th = threading.Thread(target=load)
        th.start()
        started.wait(timeout=120)
        # kill once the ledger holds a charge of this unit (a reservation or a commit), or after kill_after seconds
        until = time.monotonic() + max(kill_after, 60.0)
        time.sleep(kill_after)
        while time.monotonic() < until and _charges(ledger, "local/load-2") == 0:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        th.join(timeout=600)
        before = ledger_state(ledger, "local/load-2")
        ok_before = results.count(200)
        proc = start(model, ledger, log, port)
        retry = fire(url, sanitize_body("load-2", max_new_tokens), results.count(0)) if results.count(0) else []
        after = ledger_state(ledger, "local/load-2")
        out["phase2"] = {"ok_before_kill": ok_before, "refused_before_kill": results.count(402),
                         "connections_cut": results.count(0), "ledger_at_restart": before,
                         "ok_after_restart": retry.count(200), "refused_after_restart": retry.count(402),
                         "ledger": after}
        logtext = log.read_text(encoding="utf-8", errors="replace")
        out["log_has_document_text"] = any(w in logtext for w in ("John Smith", "Baker Street", "fracture"))
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
    out["seconds"] = round(time.monotonic() - t0, 1)
    p1, p2 = out["phase1"], out["phase2"]
    led1, led2, restart = p1["ledger"], p2["ledger"], p2["ledger_at_restart"]
    eps_ok = lambda st: st["spent"] <= st["budget"] * (1 + 1e-12)  # noqa: E731
    out["checks"] = {
        "phase1_exactly_admits_succeed": p1["ok"] == admits and p1["refused"] == clients - admits,
        "phase1_ledger_agrees": led1["releases"] == admits and led1["pending"] == 0 and eps_ok(led1),
        "phase2_no_overspend": led2["releases"] + led2["pending"] <= admits and eps_ok(led2),
        "phase2_nothing_committed_lost": restart["releases"] >= p2["ok_before_kill"]
                                          and led2["releases"] >= restart["releases"] + p2["ok_after_restart"]
                                          and led2["releases"] + led2["pending"]
                                          <= restart["releases"] + restart["pending"] + p2["ok_after_restart"],
        "phase2_every_client_answered_or_refused": p2["ok_before_kill"] + p2["refused_before_kill"]
                                                   + p2["ok_after_restart"] + p2["refused_after_restart"] == clients,
        "no_document_text_in_the_log": not out["log_has_document_text"],
    }
    out["ok"] = all(out["checks"].values()) and out["seconds"] < DEADLINE_S
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dpinfer.bench.serve_load", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model for the servers (default: the embedded one)")
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--admits", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--kill-after", type=float, default=1.0,
                   help="kill -9 the server this many seconds after the load starts, or later, once the ledger holds "
                        "a charge of the unit (at most 60 s)")
    args = p.parse_args(argv)
    if not (1 <= args.clients <= 200 and 1 <= args.admits < args.clients):
        print("load: --clients must be 1-200 and --admits below it", file=sys.stderr)
        return 2
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = run(args.model, clients=args.clients, admits=args.admits, max_new_tokens=args.max_new_tokens,
              kill_after=args.kill_after)
    print(json.dumps(out, indent=1))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
