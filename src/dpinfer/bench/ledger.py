"""``dpinfer bench ledger``: the privacy-budget ledger's reserve + commit latency and throughput, SQLite beside
PostgreSQL, at several numbers of concurrent clients.

One run: for each backend and each ``--clients`` level, a fresh ledger (a SQLite file in a temporary folder; a
scratch database created on the ``--postgres`` server and dropped afterwards), then that many client processes
(forked), each doing ``--spends`` spends one after another: ``reserve`` (one transaction: the unit's budget checked
against its charges, composed by the accountant) then ``commit`` (a second transaction). A spend charges a zCDP
loss to one of ``--units`` units in turn, so the clients meet on the same units, as a service's requests do.
Printed: each spend's reserve + commit latency (p50, p99) and spends per second (all clients' spends over the
level's wall time). SQLite is the baseline, measured in the same run. The composition reads all of a unit's charges,
so the figures depend on how many charges a unit holds (``--spends × clients / --units`` by the end of a level).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import secrets
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

DESCRIPTION = __doc__


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clients", default="1,8,32", help="concurrent client processes per level (default 1,8,32)")
    p.add_argument("--spends", type=int, default=25, help="spends per client at each level (default 25)")
    p.add_argument("--units", type=int, default=16, help="units the spends are spread over (default 16)")
    p.add_argument("--postgres", default=os.environ.get("DPINFER_BENCH_POSTGRES"), metavar="URL",
                   help="a PostgreSQL server where a scratch database may be created and dropped, e.g. "
                        "postgresql://postgres@127.0.0.1:5432/postgres (default: $DPINFER_BENCH_POSTGRES; without "
                        "it, SQLite alone)")


def client_levels(text: str) -> list[int]:
    """A ``--clients`` list (``1,8,32``): sorted distinct integers from 1 to 64, or a one-line refusal."""
    from dpinfer.errors import ConfigurationError

    try:
        levels = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ConfigurationError("--clients takes integers separated by commas, e.g. 1,8,32") from None
    if not levels or levels[0] < 1 or levels[-1] > 64:
        raise ConfigurationError("--clients levels must be between 1 and 64")
    return levels


def config_from_args(args: argparse.Namespace) -> argparse.Namespace:
    from dpinfer.checks import positive_int

    client_levels(args.clients)
    positive_int(args.spends, "--spends")
    positive_int(args.units, "--units")
    return args


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[max(0, min(len(xs) - 1, math.ceil(q / 100 * len(xs)) - 1))]  # nearest rank


def _client(location: str, first: int, spends: int, units: int, start_at: float, out: Any) -> None:
    from dpinfer.accounting import Zcdp
    from dpinfer.accounting.charge import spend_once
    from dpinfer.accounting.costs import Cost, composed_epsilon
    from dpinfer.accounting.ledger import Ledger

    ledger = Ledger(location)
    ledger.status("u0")  # connected and checked, the accountant imported, before the clock starts
    composed_epsilon([Cost.of(Zcdp(1e-4))], 1e-5)
    while time.time() < start_at:
        time.sleep(0.001)
    latencies = []
    for i in range(spends):
        t0 = time.perf_counter()
        spend_once(ledger, f"u{(first + i) % units}", Zcdp(1e-4), scope=None, mechanism="gaussian")
        latencies.append(time.perf_counter() - t0)
    out.put(latencies)


def _level(location: str, clients: int, spends: int, units: int) -> dict[str, Any]:
    from dpinfer.accounting.ledger import Ledger

    ledger = Ledger.init(location, epsilon=1e9)
    for u in range(units):
        ledger.set_budget(f"u{u}", 1e9)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    start_at = time.time() + 1.0 + 0.05 * clients
    procs = [ctx.Process(target=_client, args=(location, c, spends, units, start_at, queue)) for c in range(clients)]
    for proc in procs:
        proc.start()
    latencies = [x for _ in procs for x in queue.get(timeout=600)]
    wall = time.time() - start_at
    for proc in procs:
        proc.join()
    assert sum(s.releases for s in ledger.units()) == clients * spends  # every spend is in the ledger
    return {"clients": clients, "spends": len(latencies), "p50_ms": 1000 * statistics.median(latencies),
            "p99_ms": 1000 * _percentile(latencies, 99), "spends_per_s": len(latencies) / wall, "wall_s": wall}


def run(args: argparse.Namespace, progress: Any = None) -> dict[str, Any]:
    from dpinfer.bench import machine_load

    progress = progress or (lambda stage: None)
    levels = client_levels(args.clients)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="dpinfer-bench-ledger-") as tmp:
        for clients in levels:
            progress(f"sqlite, {clients} clients")
            rows.append({"backend": "sqlite", **_level(str(Path(tmp) / f"l{clients}.db"), clients, args.spends,
                                                        args.units)})
    if args.postgres:
        import psycopg

        base = args.postgres.rsplit("/", 1)[0]
        for clients in levels:
            progress(f"postgresql, {clients} clients")
            name = f"dpinfer_bench_{secrets.token_hex(6)}"
            with psycopg.connect(args.postgres, autocommit=True) as con:
                con.execute(f"CREATE DATABASE {name}")  # a generated name, not a value
            try:
                rows.append({"backend": "postgresql", **_level(f"{base}/{name}", clients, args.spends, args.units)})
            finally:
                with psycopg.connect(args.postgres, autocommit=True) as con:
                    con.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    return {"rows": rows, "spends_per_client": args.spends, "units": args.units, "load": machine_load(),
            "postgres": bool(args.postgres)}


def render(result: dict[str, Any]) -> str:
    load = result["load"]
    lines = [f"dpinfer bench ledger: reserve + commit of one zCDP charge, {result['spends_per_client']} spends per "
             f"client spread over {result['units']} units; {load['cpu_count']} CPUs, load average "
             f"{load['load_average_1min']}",
             "", "| backend | clients | spends | p50 (ms) | p99 (ms) | spends/s |", "|---|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['backend']} | {r['clients']} | {r['spends']} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
                     f"{r['spends_per_s']:.0f} |")
    if not result["postgres"]:
        lines.append("(PostgreSQL not measured: give --postgres URL)")
    return "\n".join(lines) + "\n"
