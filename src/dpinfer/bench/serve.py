"""``dpinfer bench serve``: batching across HTTP requests, measured on a live loopback server.

One run: an in-process ``dpinfer serve`` (one model, one engine, a throwaway ledger) on a free 127.0.0.1 port; TAB
documents with their gold spans, DP-Fusion, every rewrite exactly ``--max-new-tokens`` tokens (EOS masked until then:
a public transform, so both arms do the same work). First the same N documents sent one after another (each request
alone in the engine), then all N at once (decoded together in the same forward passes): the ratio of their total
times is the batching speed-up. Then latency (p50, p99) and throughput at each ``--clients`` level (1 = the
sequential run; other levels send that many requests at once). Everything is measured in this run.

``--replicas 1,2``: instead, the throughput of ``dpinfer serve --replicas K`` (Ray Serve, a local Ray, each replica
its own process with its own model; a throwaway SQLite ledger shared by the replicas) for each K, with
``--replica-clients`` clients (default 8) each sending ``--requests-per-client`` sanitisations one after another; the
one-replica run is the baseline, measured in the same run. Each replica takes one CPU (one GPU on CUDA): on a
machine with fewer free cores than replicas the replicas share them.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from dpinfer.bench.ledger import client_levels

DESCRIPTION = __doc__


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--docs", type=int, default=8, help="documents of the sequential/concurrent comparison (default 8)")
    p.add_argument("--clients", default="1,8,32", help="concurrency levels for p50/p99 (default 1,8,32)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens per rewrite (default 128)")
    p.add_argument("--max-chars", type=int, default=1200, help="TAB documents cut to this many characters")
    p.add_argument("--model", default=None, help="model (default: the embedded SmolLM2-135M)")
    p.add_argument("--tab", default=None, help="TAB JSONL (default: the shared data's tab/tab_echr_docs.jsonl)")
    p.add_argument("--replicas", default=None, metavar="LIST",
                   help="measure dpinfer serve --replicas K for each K (e.g. 1,2) instead (needs the ray extra)")
    p.add_argument("--replica-clients", type=int, default=8, help="--replicas: concurrent clients (default 8)")
    p.add_argument("--requests-per-client", type=int, default=2,
                   help="--replicas: sanitisations each client sends one after another (default 2)")


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = max(0, min(len(xs) - 1, math.ceil(q / 100 * len(xs)) - 1))  # nearest rank
    return xs[k]


def config_from_args(args: argparse.Namespace) -> argparse.Namespace:
    """The parsed options (the bench's config), ``--clients`` checked before any model loads."""
    from dpinfer.checks import positive_int

    client_levels(args.clients)
    if getattr(args, "replicas", None) is not None:
        client_levels(args.replicas)
        positive_int(args.replica_clients, "--replica-clients")
        positive_int(args.requests_per_client, "--requests-per-client")
    return args


def run(args: argparse.Namespace, progress: Any = None) -> dict[str, Any]:
    import httpx
    import uvicorn

    progress = progress or (lambda stage: None)
    if getattr(args, "replicas", None) is not None:
        return run_replicas(args, progress)

    from dpinfer.bench.sanitize import load_tab
    from dpinfer.checks import positive_int
    from dpinfer.models import load_model
    from dpinfer.serve.app import create_app
    from dpinfer.serve.budget import LedgerBudgets
    from dpinfer.serve.service import Service

    levels = client_levels(args.clients)
    n = positive_int(args.docs, "--docs")
    t_max = positive_int(args.max_new_tokens, "--max-new-tokens")
    docs = load_tab(args.tab, max(n, *levels), positive_int(args.max_chars, "--max-chars"))
    lm = load_model(args.model)
    tmp = Path(tempfile.mkdtemp(prefix="dpinfer-bench-serve-"))
    budgets = LedgerBudgets(tmp / "ledger.db", create_epsilon=1e12, create_delta=0.5)
    runtime = Service(lm, budgets, tagger="regex", stores=None, min_new_tokens=t_max)
    app = create_app(runtime, None)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, access_log=False, log_config=None,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)

    def request(i: int, tokens: int = t_max) -> tuple[float, int]:
        d = docs[i % len(docs)]
        body = {"text": d.text, "spans": [s.to_dict() for s in d.spans], "max_new_tokens": tokens,
                "unit": f"bench-{i % len(docs)}"}
        t0 = time.perf_counter()
        r = httpx.post(url + "/v1/sanitize", json=body, timeout=3600)
        r.raise_for_status()
        return time.perf_counter() - t0, int(r.json()["generated_tokens"])

    def at_once(k: int) -> tuple[float, list[float], int]:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(k) as pool:
            got = list(pool.map(request, range(k)))
        return time.perf_counter() - t0, [g[0] for g in got], sum(g[1] for g in got)

    try:
        progress("warm-up")
        request(0, min(t_max, 4))  # warm-up (first forward passes, tokenizer, ledger), a few tokens
        t0 = time.perf_counter()
        seq = []
        for i in range(n):
            progress(f"one after another: {i + 1}/{n}")
            seq.append(request(i))
        seq_total = time.perf_counter() - t0
        progress(f"{n} at once")
        conc_total, conc_lat, conc_tokens = at_once(n)
        rows = []
        for k in levels:
            progress(f"{k} clients")
            if k == 1:
                total, lat, tokens = seq_total, [x[0] for x in seq], sum(x[1] for x in seq)
            elif k == n:
                total, lat, tokens = conc_total, conc_lat, conc_tokens
            else:
                total, lat, tokens = at_once(k)
            rows.append({"clients": k, "requests": len(lat), "p50_s": round(_percentile(lat, 50), 2),
                         "p99_s": round(_percentile(lat, 99), 2), "mean_s": round(statistics.mean(lat), 2),
                         "requests_per_s": round(len(lat) / total, 3), "tokens": tokens,
                         "tokens_per_s": round(tokens / total, 1),
                         "total_s": round(total, 2)})
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        runtime.close()
    return {"model": lm.name, "documents": n, "max_new_tokens": t_max, "method": "dp-fusion",
            "sequential_s": round(seq_total, 2), "concurrent_s": round(conc_total, 2),
            "speedup": round(seq_total / conc_total, 2), "target_speedup": 1.5,
            "met": seq_total / conc_total >= 1.5, "levels": rows}


def run_replicas(args: argparse.Namespace, progress: Any) -> dict[str, Any]:
    """``--replicas``: throughput of ``dpinfer serve --replicas K`` at ``--replica-clients`` clients, per K."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    import httpx

    from dpinfer.bench import machine_load
    from dpinfer.bench.sanitize import load_tab
    from dpinfer.checks import positive_int
    from dpinfer.serve.replicas import check_replica_args

    counts = client_levels(args.replicas)
    clients, per_client = args.replica_clients, args.requests_per_client
    t_max = positive_int(args.max_new_tokens, "--max-new-tokens")
    check_replica_args(argparse.Namespace(replicas=max(counts), ray_address=None, ledger=None))
    docs = load_tab(args.tab, clients, positive_int(args.max_chars, "--max-chars"))
    rows = []
    for k in counts:
        tmp = Path(tempfile.mkdtemp(prefix="dpinfer-bench-replicas-"))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        progress(f"{k} replicas: starting")
        # budgets no benchmark exhausts (as the one-process bench): each release also charges its document's unit
        cmd = [sys.executable, "-m", "dpinfer", "serve", "--replicas", str(k), "--ledger", str(tmp / "ledger.db"),
               "--default-epsilon", "1e12", "--default-delta", "0.5",
               "--tagger", "regex", "--port", str(port), *(["--model", args.model] if args.model else [])]
        with open(tmp / "serve.log", "wb") as log:
            server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                      env={**os.environ, "XDG_DATA_HOME": str(tmp / "data")})
        try:
            deadline = time.monotonic() + 900
            while True:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"dpinfer serve --replicas {k} did not start; see {tmp / 'serve.log'}")
                try:
                    if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(1.0)

            def request(i: int, tokens: int = t_max, url: str = url) -> tuple[float, int]:
                """(seconds, tokens released); tokens -1 when the request failed (counted, not retried)."""
                d = docs[i % len(docs)]
                body = {"text": d.text, "spans": [s.to_dict() for s in d.spans], "max_new_tokens": tokens,
                        "unit": f"bench-{i}"}
                t0 = time.perf_counter()
                try:
                    r = httpx.post(url + "/v1/sanitize", json=body, timeout=3600)
                except httpx.HTTPError:
                    return time.perf_counter() - t0, -1
                if r.status_code != 200:
                    return time.perf_counter() - t0, -1
                return time.perf_counter() - t0, int(r.json()["generated_tokens"])

            def client(c: int) -> list[tuple[float, int]]:
                return [request(c * per_client + j) for j in range(per_client)]

            progress(f"{k} replicas: warm-up")
            with ThreadPoolExecutor(2 * k) as pool:  # every replica's first forward passes
                list(pool.map(lambda i: request(10_000 + i, min(t_max, 4)), range(2 * k)))
            progress(f"{k} replicas: {clients} clients")
            t0 = time.perf_counter()
            with ThreadPoolExecutor(clients) as pool:
                got = [x for part in pool.map(client, range(clients)) for x in part]
            total = time.perf_counter() - t0
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=120)
            except subprocess.TimeoutExpired:
                server.kill()
        done = [g for g in got if g[1] >= 0]
        lat = [g[0] for g in done] or [math.nan]
        tokens = sum(g[1] for g in done)
        rows.append({"replicas": k, "clients": clients, "requests": len(got), "failed": len(got) - len(done),
                     "total_s": round(total, 2), "requests_per_s": round(len(done) / total, 3), "tokens": tokens,
                     "tokens_per_s": round(tokens / total, 1), "p50_s": round(_percentile(lat, 50), 2),
                     "p99_s": round(_percentile(lat, 99), 2)})
    base = rows[0]["requests_per_s"]
    for r in rows:
        r["vs_first"] = round(r["requests_per_s"] / base, 2) if base else math.nan
    return {"replicas": rows, "max_new_tokens": t_max, "model": args.model or "embedded", "load": machine_load()}


def render(result: dict[str, Any]) -> str:
    if "replicas" in result:
        load = result["load"]
        lines = [f"dpinfer bench serve --replicas: DP-Fusion sanitisations of TAB documents, up to "
                 f"{result['max_new_tokens']} tokens each, model {result['model']}; {load['cpu_count']} CPUs, load "
                 f"average {load['load_average_1min']}", "",
                 "| replicas | clients | requests | failed | total (s) | requests/s | tokens/s | p50 (s) | p99 (s) | "
                 "vs first |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in result["replicas"]:
            lines.append(f"| {r['replicas']} | {r['clients']} | {r['requests']} | {r['failed']} | {r['total_s']:.1f} | "
                         f"{r['requests_per_s']:.3f} | {r['tokens_per_s']:.1f} | {r['p50_s']:.2f} | "
                         f"{r['p99_s']:.2f} | {r['vs_first']:.2f}x |")
        return "\n".join(lines) + "\n"
    lines = [f"dpinfer bench serve: {result['documents']} TAB documents, {result['method']}, "
             f"{result['max_new_tokens']} tokens each, model {result['model']}",
             f"  one after another: {result['sequential_s']:.2f} s; all at once: {result['concurrent_s']:.2f} s; "
             f"speed-up {result['speedup']:.2f}x (target >= {result['target_speedup']}x: "
             f"{'met' if result['met'] else 'NOT met'})",
             "",
             "| clients | requests | p50 (s) | p99 (s) | requests/s | tokens/s |",
             "|---:|---:|---:|---:|---:|---:|"]
    for r in result["levels"]:
        lines.append(f"| {r['clients']} | {r['requests']} | {r['p50_s']:.2f} | {r['p99_s']:.2f} | "
                     f"{r['requests_per_s']:.3f} | {r['tokens_per_s']:.1f} |")
    return "\n".join(lines) + "\n"
