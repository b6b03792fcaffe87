"""``dpinfer bench engine --jobs N --mechanism M``: the decode step of N jobs of one mechanism, timed by phase
(scheduler, decisions, forward) with the host reads counted, beside plain sampling of the same rows, on the per-job
decision path and on the batched one (:attr:`Engine.batched_decisions <dpinfer.engine.Engine.batched_decisions>`).

The mechanisms' DATA-DEPENDENT per-step statistics stay on the device unless ``--debug-stats`` asks for them (then
they come with each step's one transfer): a run with the flag shows what fetching them costs.
"""

from __future__ import annotations

from typing import Any

from dpinfer.bench.harness import Progress, md_table, quiet, rounds
from dpinfer.bench.speed import job_prompts
from dpinfer.errors import ConfigurationError

MECHANISMS = ("dp-fusion", "invisibleink")
"""``--mechanism`` choices: the mechanism of ``--jobs N --mechanism M`` (timed per step beside plain sampling)."""


def mechanism_jobs(lm: Any, n_jobs: int, prompt_tokens: int, new_tokens: int, mechanism: str, *,
                   plain: bool = False, seed: int = 0, debug_stats: bool = False) -> list[Any]:
    """``n_jobs`` jobs of K = 5 rows (row 0 a window of the example document, row i the same window with every 11th
    token from the i-th changed, as a private context differs from the public one at its tagged spans), exactly
    ``new_tokens`` each: DP-Fusion m = 4 with the defaults of ``dpinfer sanitize`` (temperature, top-k, min-p;
    bounds b = 0.05), or InvisibleInk with B = 4 references and the defaults of ``dpinfer synth`` (temperature,
    top-k; C calibrated to ε = 8 over its T_max); ``plain``: the same rows sampled one by one (the mechanism's
    temperature and top-k, independent mode); ``debug_stats``: the jobs record their statistics."""
    from dpinfer.accounting.calibration import Budget, Spec
    from dpinfer.defaults import SANITIZE, SYNTH
    from dpinfer.engine import Job
    from dpinfer.mechanisms.dp_fusion import DPFusion
    from dpinfer.mechanisms.invisibleink import InvisibleInk
    from dpinfer.mechanisms.sampler import Sampler

    if mechanism not in MECHANISMS:
        raise ConfigurationError(f"unknown --mechanism {mechanism!r}; choose one of {', '.join(MECHANISMS)}")
    m = 4
    out = []
    for j, p in enumerate(job_prompts(lm, n_jobs, prompt_tokens)):
        rows = [list(p)] + [[(t + 1) % lm.vocab_size if (x >= i and (x - i) % 11 == 0) else t
                             for x, t in enumerate(p)] for i in range(1, m + 1)]
        mech: Any
        if mechanism == "invisibleink":
            mech = (Sampler(temperature=SYNTH.temperature, top_k=SYNTH.top_k) if plain else
                    InvisibleInk.calibrated(Budget(8.0, SYNTH.delta), Spec(SYNTH.max_new_tokens, batch_size=m,
                                                                             temperature=SYNTH.temperature,
                                                                             top_k=SYNTH.top_k)))
        else:
            mech = (Sampler(temperature=SANITIZE.temperature, top_k=SANITIZE.top_k) if plain else
                    DPFusion(bounds=[0.05] * m, group_names=[f"G{i}" for i in range(1, m + 1)], alpha=SANITIZE.alpha,
                             temperature=SANITIZE.temperature, top_k=SANITIZE.top_k, min_p=SANITIZE.min_p))
        out.append(Job(rows, mech, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_width=len(p),
                             seed=seed + j, debug_stats=debug_stats))
    return out


def run_mechanism_bench(lm: Any, *, n_jobs: int, mechanism: str, new_tokens: int = 16, prompt_tokens: int = 300,
                        repeats: int = 1, max_rows: int | None = None, debug_stats: bool = False,
                        progress: Progress = quiet) -> dict[str, Any]:
    """``--jobs N --mechanism M``: N jobs of M through ``run_jobs`` (all in one batch), each decode step timed by
    phase (:class:`~dpinfer.engine.core.StepTimes`: scheduler, decisions, forward; host reads counted by
    :class:`~dpinfer.bench.speed.HostReads`), beside plain sampling of the same rows, each on the per-job decision
    path and on the batched one (:attr:`Engine.batched_decisions`); arms interleaved over ``repeats`` rounds,
    per-step medians. The ratio is the mechanism's step time to plain sampling's on the same path. ``debug_stats``:
    the mechanism's statistics are fetched too (``--debug-stats``)."""
    import statistics

    import torch

    from dpinfer.bench.speed import HostReads
    from dpinfer.engine import Engine
    from dpinfer.engine.core import StepTimes

    rows_per_job = 5
    engine = Engine(lm, max_rows=max_rows or n_jobs * rows_per_job)
    arms = [(f"{mechanism} {path}", plain, path == "batched")
            for path in ("per-job", "batched") for plain in (False, True)]
    arms = [(label.replace(mechanism, "plain sampling") if plain else label, plain, batched)
            for label, plain, batched in arms]
    per_step: dict[str, list[dict[str, float]]] = {label: [] for label, _, _ in arms}
    outputs: dict[str, list[list[int]]] = {}
    progress("warm-up")
    list(engine.run_jobs(mechanism_jobs(lm, 2, 32, 2, mechanism)))
    for _, order in rounds(repeats, arms):
        for label, plain, batched in order:
            progress(label)
            engine.batched_decisions = batched
            with HostReads() as reads:
                engine.timing = StepTimes(host_reads=reads)
                try:
                    got = dict(engine.run_jobs(mechanism_jobs(lm, n_jobs, prompt_tokens, new_tokens, mechanism,
                                                              plain=plain, debug_stats=debug_stats)))
                finally:
                    timing, engine.timing = engine.timing, None
            per_step[label].append(timing.per_step())
            outputs[label] = [got[i].sequences[0] for i in range(n_jobs)]
    rows = []
    for label, _, batched in arms:
        runs = per_step[label]
        row: dict[str, Any] = {"config": label, "path": "batched" if batched else "per-job", "rows": n_jobs * 5}
        for key in ("schedule_ms", "decide_ms", "forward_ms", "step_ms", "syncs"):
            row[key] = statistics.median(r[key] for r in runs)
        row["steps"] = runs[0]["steps"]
        rows.append(row)
    by = {r["config"]: r for r in rows}
    for r in rows:
        base = by[f"plain sampling {r['path']}"]
        r["ratio_vs_plain"] = r["step_ms"] / base["step_ms"]
    same = {kind: sum(a == b for a, b in zip(outputs[f"{kind} per-job"], outputs[f"{kind} batched"], strict=True))
            for kind in (mechanism, "plain sampling")}
    return {
        "settings": {"model": lm.name, "device": str(lm.device), "dtype": str(lm.dtype).replace("torch.", ""),
                     "jobs": n_jobs, "mechanism": mechanism, "rows": n_jobs * rows_per_job,
                     "new_tokens": new_tokens, "prompt_tokens": prompt_tokens, "repeats": repeats,
                     "torch_threads": torch.get_num_threads(), "max_rows": engine.scheduler.max_rows,
                     "debug_stats": debug_stats},
        "rows": rows,
        "same_tokens_batched_vs_per_job": {k: f"{v}/{n_jobs}" for k, v in same.items()},
    }


def format_mechanism_markdown(res: dict[str, Any]) -> str:
    s = res["settings"]
    same = ", ".join(f"{k} {v}" for k, v in res["same_tokens_batched_vs_per_job"].items())
    lines = [
        f"Decode step by phase: {s['jobs']} {s['mechanism']} jobs ({s['rows']} rows) on {s['model']} "
        f"({s['device']}, {s['dtype']}, {s['torch_threads']} threads), prompts of ~{s['prompt_tokens']} tokens, "
        f"{s['new_tokens']} new tokens, median of {s['repeats']} run(s) of the per-step means (steps without an "
        "admission); syncs = host reads per step (device-to-host syncs on CUDA); statistics "
        f"{'fetched (--debug-stats)' if s.get('debug_stats') else 'left on the device'}",
        "",
        *md_table(["config", "forward ms", "decisions ms", "scheduler ms", "step ms", "syncs/step",
                   "ratio vs plain"], "lrrrrrr",
                  ([r["config"], f"{r['forward_ms']:.1f}", f"{r['decide_ms']:.1f}", f"{r['schedule_ms']:.2f}",
                    f"{r['step_ms']:.1f}", f"{r['syncs']:.0f}", f"{r['ratio_vs_plain']:.2f}"] for r in res["rows"])),
        "",
        f"Same tokens, batched vs per-job path (jobs): {same}",
    ]
    return "\n".join(lines)
