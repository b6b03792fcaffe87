"""``dpinfer bench load``: the warm model load in a new process, and where its time goes.

    dpinfer bench load [--runs 3] [--model NAME_OR_FOLDER] [--device cpu] [--model-backend auto|own|hf] [--compare]

Each run starts a fresh Python process (the model already converted in the cache: a *warm* load) that, as the command
line does, pauses the cyclic garbage collector until the model is ready
(:func:`dpinfer.models.defer_collection_until_loaded`), imports torch, then the model code the backend runs
(:mod:`dpinfer.modeling` for dpinfer's own, transformers' otherwise: :func:`dpinfer.models.import_model_code`), then
calls :func:`dpinfer.load_model` (tokenizer, weights; the packed linears' copies are made at first use), and exits.
It reports the wall-clock and CPU seconds of each stage and of the whole process; what the stages leave is the
interpreter's start (with the import of :mod:`dpinfer.models`) and exit. Each run is alternated with a process that
only imports torch (``python -c "import torch"``, with the collector on, as any plain Python process), the floor of
any command that loads a model: the whole process is printed beside it, with the difference and the ratio.
``--compare`` adds a third process per run that loads the same model with the collector on and every packed copy made
during the load (:func:`dpinfer.packed.pack_now`). The median of the runs is printed with the machine's 1-minute load
average: on a shared CPU the wall-clock figures follow the load, the CPU seconds much less.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from dpinfer.bench.harness import Progress, quiet
from dpinfer.checks import int_at_least
from dpinfer.configs import Config, add_options, option

DESCRIPTION = __doc__
STAGES = ("import torch", "import the model code", "load_model()")
REST = "start (interpreter, dpinfer.models) and exit"
ARMS = {"cli": "collector paused until the model is ready, packed copies at first use (the command line)",
        "baseline": "collector on, every packed copy made during the load"}

PROBE = r"""
import json, sys, time
from dpinfer.models import defer_collection_until_loaded
baseline = sys.argv[3] == "baseline"
if not baseline:
    defer_collection_until_loaded()
marks = []
def mark(name, w=[time.perf_counter()], c=[time.process_time()]):
    marks.append({"stage": name, "wall": time.perf_counter() - w[0], "cpu": time.process_time() - c[0]})
    w[0], c[0] = time.perf_counter(), time.process_time()
import torch
mark("import torch")
from dpinfer.models import import_model_code, load_model
backend = import_model_code(sys.argv[1] or None, sys.argv[4] or None)
mark("import the model code")
lm = load_model(sys.argv[1] or None, device=sys.argv[2] or None, backend=sys.argv[4] or None)
if baseline:
    from dpinfer.packed import pack_now
    pack_now(lm.model)
mark("load_model()")
print(json.dumps({"stages": marks, "backend": lm.backend}))
"""

TORCH_ONLY = "import torch"
"""The floor: a process that imports torch and nothing else."""


@dataclass(frozen=True)
class LoadBenchConfig(Config):
    """Settings of ``dpinfer bench load``."""

    runs: int = option(3, help="fresh processes, one load each")
    model: str | None = option(None, type=str, help="model name or local folder (default: the embedded SmolLM2)")
    device: str | None = option(None, type=str, help="cpu, cuda, ... (default: CUDA when available)")
    model_backend: str | None = option(None, type=str, help="auto, own or hf (default: auto: dpinfer's own model "
                                                           "code where it runs the architecture)")
    compare: bool = option(False, help="alternate each run with a baseline process: collector on, every packed copy "
                                       "made during the load")

    def __post_init__(self) -> None:
        int_at_least(self.runs, "--runs", 1)
        from dpinfer.errors import ConfigurationError

        if self.model_backend not in (None, "auto", "own", "hf"):
            raise ConfigurationError("--model-backend must be auto, own or hf")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_options(p, LoadBenchConfig)


def config_from_args(args: argparse.Namespace) -> LoadBenchConfig:
    return LoadBenchConfig.from_args(args)


def one_load(config: LoadBenchConfig, arm: str = "cli") -> dict[str, Any]:
    """One warm load in a fresh process: its stages and its whole wall-clock and CPU time (the rest: the
    interpreter's start and exit)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", PROBE, config.model or "", config.device or "", arm,
                           config.model_backend or ""], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        from dpinfer.errors import DPInferError

        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise DPInferError(f"the load probe failed (exit {proc.returncode}): {last}")
    probe = json.loads(proc.stdout.strip().splitlines()[-1])
    stages = probe["stages"]
    stages.append({"stage": REST, "wall": max(0.0, wall - sum(s["wall"] for s in stages)),
                   "cpu": max(0.0, cpu - sum(s["cpu"] for s in stages))})
    return {"wall": wall, "cpu": cpu, "stages": stages, "backend": probe["backend"]}


def torch_only() -> dict[str, float]:
    """One fresh ``python -c "import torch"``: its wall-clock and CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", TORCH_ONLY], capture_output=True, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"wall": wall, "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)}


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    median = {"wall": statistics.median(r["wall"] for r in runs), "cpu": statistics.median(r["cpu"] for r in runs)}
    stages = [{"stage": s, "wall": statistics.median(r["stages"][k]["wall"] for r in runs),
               "cpu": statistics.median(r["stages"][k]["cpu"] for r in runs)} for k, s in enumerate((*STAGES, REST))]
    return {"runs": runs, "median": median, "stages": stages}


def run(config: LoadBenchConfig, progress: Progress = quiet) -> dict[str, Any]:
    arms = ("cli", "baseline") if config.compare else ("cli",)
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    floor: list[dict[str, float]] = []
    for i in range(config.runs):
        progress(f"load {i + 1}/{config.runs} (import torch)")
        floor.append(torch_only())
        for arm in arms:  # alternated, so that a change in the machine's load hits every arm alike
            progress(f"load {i + 1}/{config.runs}" + (f" ({arm})" if config.compare else ""))
            runs[arm].append(one_load(config, arm))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    res: dict[str, Any] = {"model": config.model or "smollm2-135m-instruct", **_summary(runs["cli"]),
                           "arm": ARMS["cli"], "cpu_count": os.cpu_count(),
                           "backend": runs["cli"][0]["backend"],
                           "import_torch": {"runs": floor, "median": {
                               "wall": statistics.median(r["wall"] for r in floor),
                               "cpu": statistics.median(r["cpu"] for r in floor)}},
                           "load_average_1min": None if load is None else round(load, 2)}
    if config.compare:
        res["baseline"] = {**_summary(runs["baseline"]), "arm": ARMS["baseline"]}
    return res


def _table(summary: dict[str, Any]) -> list[str]:
    m = summary["median"]
    lines = [f"  {summary['arm']}:",
             f"    whole process   {m['wall']:6.2f} s wall  {m['cpu']:6.2f} s CPU   (each run: "
             + ", ".join(f"{r['wall']:.2f} s / {r['cpu']:.2f} s CPU" for r in summary["runs"]) + ")"]
    for s in summary["stages"]:
        lines.append(f"    {s['stage']:<45} {s['wall']:6.2f} s wall  {s['cpu']:6.2f} s CPU")
    return lines


def render(res: dict[str, Any]) -> str:
    floor, m = res["import_torch"], res["median"]
    lines = [f"warm load of {res['model']} (backend {res['backend']}) in a new process, median of {len(res['runs'])} "
             f"runs ({res['cpu_count']} CPUs, 1-minute load average {res['load_average_1min']}):", *_table(res),
             f"  python -c \"import torch\" alone: {floor['median']['wall']:6.2f} s wall  "
             f"{floor['median']['cpu']:6.2f} s CPU   (each run: "
             + ", ".join(f"{r['wall']:.2f} s / {r['cpu']:.2f} s CPU" for r in floor["runs"]) + ")",
             f"  whole process against importing torch alone: {m['wall'] - floor['median']['wall']:+.2f} s wall "
             f"({m['wall'] / floor['median']['wall']:.2f}×), {m['cpu'] - floor['median']['cpu']:+.2f} s CPU "
             f"({m['cpu'] / floor['median']['cpu']:.2f}×)"]
    if "baseline" in res:
        base = res["baseline"]
        lines += _table(base)
        lines.append(f"  whole process against the baseline: {res['median']['cpu'] / base['median']['cpu']:.2f}× "
                     f"the CPU seconds, {res['median']['wall'] / base['median']['wall']:.2f}× the wall-clock")
    return "\n".join(lines)
