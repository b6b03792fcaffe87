"""``dpinfer bench load``: the warm model load in a new process, and where its time goes.

    dpinfer bench load [--runs 3] [--model NAME_OR_FOLDER] [--device cpu]

Each run starts a fresh Python process (the model already converted in the cache: a *warm* load) that, as the command
line does, pauses the cyclic garbage collector until the model is ready
(:func:`dpinfer.models.defer_collection_until_loaded`; ``--collect`` leaves it on), imports torch, then transformers'
model code, then calls :func:`dpinfer.load_model` (tokenizer, model class, weights, packed linears), and exits. It
reports the wall-clock and CPU seconds of each stage and of the whole process; what the stages leave is the
interpreter's start and exit. The median of the runs is printed with the machine's 1-minute load average: on a shared
CPU the wall-clock figures follow the load, the CPU seconds much less.
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
STAGES = ("import torch", "import transformers' model code", "load_model()")
REST = "start (interpreter, dpinfer.models) and exit"

PROBE = r"""
import json, sys, time
from dpinfer.models import defer_collection_until_loaded
if sys.argv[3] == "defer":
    defer_collection_until_loaded()
marks = []
def mark(name, w=[time.perf_counter()], c=[time.process_time()]):
    marks.append({"stage": name, "wall": time.perf_counter() - w[0], "cpu": time.process_time() - c[0]})
    w[0], c[0] = time.perf_counter(), time.process_time()
import torch
mark("import torch")
from dpinfer.models import import_model_code, load_model
import_model_code()
mark("import transformers' model code")
load_model(sys.argv[1] or None, device=sys.argv[2] or None)
mark("load_model()")
print(json.dumps({"stages": marks, "cpu": time.process_time()}))
"""


@dataclass(frozen=True)
class LoadBenchConfig(Config):
    """Settings of ``dpinfer bench load``."""

    runs: int = option(3, help="fresh processes, one load each")
    model: str | None = option(None, type=str, help="model name or local folder (default: the embedded SmolLM2)")
    device: str | None = option(None, type=str, help="cpu, cuda, ... (default: CUDA when available)")
    collect: bool = option(False, help="leave the garbage collector on during the load (the command line pauses it)")

    def __post_init__(self) -> None:
        int_at_least(self.runs, "--runs", 1)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_options(p, LoadBenchConfig)


def config_from_args(args: argparse.Namespace) -> LoadBenchConfig:
    return LoadBenchConfig.from_args(args)


def one_load(config: LoadBenchConfig) -> dict[str, Any]:
    """One warm load in a fresh process: its stages and its whole wall-clock time (interpreter start included)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", PROBE, config.model or "", config.device or "",
                           "collect" if config.collect else "defer"], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        from dpinfer.errors import DPInferError

        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise DPInferError(f"the load probe failed (exit {proc.returncode}): {last}")
    stages = json.loads(proc.stdout.strip().splitlines()[-1])["stages"]
    stages.append({"stage": REST, "wall": max(0.0, wall - sum(s["wall"] for s in stages)),
                   "cpu": max(0.0, cpu - sum(s["cpu"] for s in stages))})
    return {"wall": wall, "cpu": cpu, "stages": stages}


def run(config: LoadBenchConfig, progress: Progress = quiet) -> dict[str, Any]:
    runs = []
    for i in range(config.runs):
        progress(f"load {i + 1}/{config.runs}")
        runs.append(one_load(config))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    median = {"wall": statistics.median(r["wall"] for r in runs), "cpu": statistics.median(r["cpu"] for r in runs)}
    stages = [{"stage": s, "wall": statistics.median(r["stages"][k]["wall"] for r in runs),
               "cpu": statistics.median(r["stages"][k]["cpu"] for r in runs)} for k, s in enumerate((*STAGES, REST))]
    return {"model": config.model or "smollm2-135m-instruct", "runs": runs, "median": median, "stages": stages,
            "collector": "on" if config.collect else "paused until the model is ready",
            "cpu_count": os.cpu_count(), "load_average_1min": None if load is None else round(load, 2)}


def render(res: dict[str, Any]) -> str:
    m = res["median"]
    lines = [f"warm load of {res['model']} in a new process, median of {len(res['runs'])} runs "
             f"({res['cpu_count']} CPUs, 1-minute load average {res['load_average_1min']}; garbage collector "
             f"{res['collector']}):",
             f"  whole process   {m['wall']:6.2f} s wall  {m['cpu']:6.2f} s CPU   (each run: "
             + ", ".join(f"{r['wall']:.2f}" for r in res["runs"]) + " s)"]
    for s in res["stages"]:
        lines.append(f"  {s['stage']:<33} {s['wall']:6.2f} s wall  {s['cpu']:6.2f} s CPU")
    return "\n".join(lines)
