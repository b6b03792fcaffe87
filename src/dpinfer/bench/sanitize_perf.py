"""``dpinfer bench sanitize --perf``: DP-Fusion tokens/s with m = 1 and m = 4 privacy groups against ``original``,
each configuration beside the former one-job path, in one run (see :mod:`dpinfer.bench.sanitize`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from dpinfer.bench import speed
from dpinfer.bench.data import Doc
from dpinfer.bench.harness import Progress, Timings, md_table, quiet, rounds


def run_perf(lm: Any, doc: Doc, *, max_new_tokens: int, seed: int, repeats: int = 1,
             progress: Progress = quiet, hf_baselines: bool = True, ms: tuple[int, ...] = (1, 4),
             slot_engine: bool = False, hf_lm: Any = None) -> dict[str, Any]:
    """DP-Fusion with m privacy groups (``ms``: 1 and 4) vs ``original`` on one document: ``repeats`` rounds, the
    order alternating between rounds (ABBA), the median and the range (``seconds_range``) of each row reported; with
    ``hf_baselines``, Hugging Face ``generate`` on the same prompt (eager, and static cache + ``torch.compile``, its
    first, compiling call timed apart) in the same run.

    Every row runs :func:`~dpinfer.pipelines.sanitize.sanitize` (the engine, ``Engine.stream`` over
    ``Engine.step``); each configuration also runs through the former one-job path (:func:`_former_sanitize`), rows
    ``<name> (former path)``, with ``ratio_vs_former`` on the engine's row. With
    ``slot_engine``, each configuration also runs as ONE job through ``Engine.run_jobs`` (the slot engine:
    :func:`~dpinfer.pipelines.sanitize.plan_sanitize`, ``run_jobs``, ``finish_sanitize``, what ``sanitize_many`` does
    per document), on an engine of its own so that its compiled decode step is reused across repeats; its first call
    (which compiles on CUDA) is timed apart (``settings["slot_first_call_seconds"]``). Rows carry their ``path`` and
    ``decode_step`` (``"compiled"`` or ``"eager"``). ``hf_lm``: the same model on transformers' forward
    (``backend="hf"``): the Hugging Face baselines run on it and, when ``lm`` runs dpinfer's own model code, each
    configuration again (rows ``<name> [hf forward]``, with ``ratio_vs_hf_forward`` on the engine's row)."""
    from dpinfer.bench.engine import HF_FORWARD
    from dpinfer.pipelines import sanitize as pipeline
    from dpinfer.pipelines import sanitize_contexts
    from dpinfer.taggers.resolve import resolve_groups

    labels = sorted({s.label for s in doc.spans})
    configs: list[tuple[str, dict[str, list[str]] | None]] = [("original", None)]
    for m in ms:
        groups = {"ALL": labels} if m == 1 else {f"G{i + 1}": labels[i::m] for i in range(min(m, len(labels)))}
        configs.append((f"dp-fusion m={m}", groups))
    timings, cpu_timings = Timings(), Timings()  # wall-clock and process CPU seconds (less sensitive to load)
    info: dict[str, Any] = {}
    opts = {"spans": doc.spans, "max_new_tokens": max_new_tokens, "min_new_tokens": max_new_tokens, "seed": seed,
            "epsilon": 40.0}
    first_calls: dict[str, float] = {}
    steps = {name: speed.slot_decode_step(lm, pipeline.plan_sanitize(
        doc.text, lm=lm, method="original" if groups is None else "dp-fusion", groups=groups, **opts).job)
        for name, groups in configs}

    hf_lm = hf_lm if hf_lm is not None else speed.hf_twin(lm)
    ab = hf_lm is not lm

    def engine_timer(name: str, groups: dict[str, list[str]] | None, model: Any = lm
                     ) -> Callable[[], tuple[float, float]]:
        def once() -> tuple[float, float]:
            cpu: list[float] = []  # process CPU seconds over the span res.seconds measures (from the progress calls)
            res = pipeline.sanitize(doc.text, lm=model, method="original" if groups is None else "dp-fusion",
                                    groups=groups, progress=lambda done, total: cpu.append(time.process_time()),
                                    **opts)
            assert res.generated_tokens == max_new_tokens
            info[name] = {"groups": len(res.groups) if groups is not None else 0, "prompt_tokens": res.prompt_tokens,
                          "path": "engine (sanitize, Engine.step)",
                          "decode_step": steps[name.removesuffix(f" {HF_FORWARD}")]}
            return res.seconds, cpu[-1] - cpu[0]
        return once

    timers: list[tuple[str, Callable[[], tuple[float, float]]]] = []
    for name, groups in configs:
        timers += [(name, engine_timer(name, groups)),
                   (f"{name} (former path)", _former_sanitize(lm, doc.text, groups, opts))]
        if ab:
            timers.append((f"{name} {HF_FORWARD}", engine_timer(f"{name} {HF_FORWARD}", groups, hf_lm)))
    for label, timer in timers:  # first calls timed apart (the decode step compiles on CUDA), on either forward
        if label.endswith("(former path)"):
            continue
        progress(f"{label}, first call")
        first_calls[label] = round(timer()[0], 3)
    if slot_engine:
        for name, groups in configs:
            label = f"{name} (run_jobs)"
            timer, step = _slot_sanitize(lm, doc.text, groups, opts)
            progress(f"{label}, first call")
            first_calls[label] = round(timer(), 3)
            timers.append((label, lambda timer=timer: (timer(), math.nan)))
            info[label] = {"path": "slot engine (run_jobs, 1 job)", "decode_step": step}
    for _, order in rounds(repeats, timers):  # engine and former path alternate (ABBA), so load drift hits both
        for label, timer in order:
            progress(label)
            wall, cpu = timer()
            timings.add(label, wall)
            cpu_timings.add(label, cpu)
    for name, _ in configs:
        info[f"{name} (former path)"] = {**info[name], "path": "former one-job path (dynamic-cache runner)",
                                         "decode_step": "eager"}
        if slot_engine:
            info[f"{name} (run_jobs)"] = {**info[name], **info[f"{name} (run_jobs)"]}
    for name, _ in configs:
        if ab:
            info[f"{name} {HF_FORWARD}"] = {**info[f"{name} {HF_FORWARD}"], "path": "engine on transformers' forward"}
    names = [n for c in configs for n in (c[0], f"{c[0]} (former path)") + ((f"{c[0]} {HF_FORWARD}",) if ab else ())]
    if slot_engine:
        names += [f"{c[0]} (run_jobs)" for c in configs]
    compile_seconds = None
    if hf_baselines:  # the prompt `original` decodes, through transformers' own generate loop
        ids = sanitize_contexts.prepare_contexts(lm, doc.text, doc.spans, resolve_groups(doc.spans, None),
                                        sanitize_contexts.DEFAULT_INSTRUCTION).original
        progress("hf generate static+compile (first call: compiles)")
        compile_seconds = speed.time_hf(hf_lm, ids, max_new_tokens, compiled=True)
        hf = [("hf generate eager", False), ("hf generate static+compile", True)]
        for _, order in rounds(repeats, hf):
            for label, compiled in order:
                progress(label)
                timings.add(label, speed.time_hf(hf_lm, ids, max_new_tokens, compiled=compiled))
        for label, compiled in hf:
            info[label] = {"groups": 0, "path": "hugging face generate", "decode_step": "compiled" if compiled
                           else "eager"}
            names.append(label)
    rows = []
    for name in names:
        t = timings.median(name)
        rows.append({"config": name, "groups": info[name]["groups"], "seconds": round(t, 3),
                     "seconds_range": timings.spread(name), "tokens_per_s": round(max_new_tokens / t, 2),
                     "ratio_vs_original": round(timings.ratio("original", name), 3),
                     "path": info[name]["path"], "decode_step": info[name]["decode_step"]})
        if name in cpu_timings.runs and not math.isnan(cpu_timings.median(name)):
            rows[-1]["cpu_seconds"] = round(cpu_timings.median(name), 3)
            rows[-1]["cpu_seconds_range"] = cpu_timings.spread(name)
        if f"{name} (former path)" in timings.runs:
            former = f"{name} (former path)"
            rows[-1]["ratio_vs_former"] = round(timings.ratio(former, name), 3)
            rows[-1]["cpu_ratio_vs_former"] = round(cpu_timings.ratio(former, name), 3)
        if f"{name} {HF_FORWARD}" in timings.runs:
            rows[-1]["ratio_vs_hf_forward"] = round(timings.ratio(f"{name} {HF_FORWARD}", name), 3)
            rows[-1]["cpu_ratio_vs_hf_forward"] = round(cpu_timings.ratio(f"{name} {HF_FORWARD}", name), 3)
    settings = {"doc_id": doc.doc_id, "prompt_tokens": info["original"]["prompt_tokens"],
                "new_tokens": max_new_tokens, "repeats": repeats, "model": lm.name,
                "device": str(lm.device), "dtype": str(lm.model.dtype).removeprefix("torch."),
                "backend": getattr(lm, "backend", "hf"),
                "hf_compile_first_call_seconds": compile_seconds and round(compile_seconds, 2)}
    settings["first_call_seconds"] = first_calls
    if slot_engine:
        settings["slot_first_call_seconds"] = {k: v for k, v in first_calls.items() if k.endswith("(run_jobs)")}
    return {"settings": settings, "rows": rows, "runs": timings.runs, "cpu_runs": cpu_timings.runs}


def _former_sanitize(lm: Any, text: str, groups: dict[str, list[str]] | None, opts: dict[str, Any]
                     ) -> Callable[[], tuple[float, float]]:
    """A timer of one document through the former one-job path: what :func:`sanitize` does (plan, a new engine,
    ``stream`` to the end, finish), on the dynamic-cache runner (one Hugging Face cache per job: the one-job engine's
    decoding); the timer returns the seconds :func:`sanitize`'s ``seconds`` measures, wall-clock and CPU."""
    from dpinfer.engine import Engine
    from dpinfer.pipelines.sanitize import finish_sanitize, plan_sanitize

    method = "original" if groups is None else "dp-fusion"

    def once() -> tuple[float, float]:
        plan = plan_sanitize(text, lm=lm, method=method, groups=groups, **opts)
        job = plan.job
        t0, c0 = time.perf_counter(), time.process_time()
        run = Engine(plan.lm, runner="dynamic").stream(job)
        for _ in run:
            pass
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        assert finish_sanitize(plan, run.output).generated_tokens == job.max_new_tokens
        return seconds, cpu

    return once


def _slot_sanitize(lm: Any, text: str, groups: dict[str, list[str]] | None, opts: dict[str, Any]
                   ) -> tuple[Callable[[], float], str]:
    """A timer of one document as ONE job through ``Engine.run_jobs``, on an engine of its own (its slot pool, and
    so its compiled decode step, is reused by every call): plan, run, finish; the timer returns the seconds of
    ``run_jobs`` (the part that :func:`sanitize`'s ``seconds`` measures). With it, whether the job's decode step is
    ``"compiled"`` or ``"eager"`` (:func:`dpinfer.bench.engine.slot_decode_step`; the one ``original`` row has no
    public width: it runs alone, eager)."""
    from dpinfer.engine import Engine
    from dpinfer.pipelines.sanitize import finish_sanitize, plan_sanitize

    engine = Engine(lm)
    method = "original" if groups is None else "dp-fusion"

    def once() -> float:
        plan = plan_sanitize(text, lm=lm, method=method, groups=groups, **opts)
        speed.sync(lm)
        t0 = time.perf_counter()
        ((_, output),) = engine.run_jobs([plan.job])
        speed.sync(lm)
        seconds = time.perf_counter() - t0
        assert finish_sanitize(plan, output).generated_tokens == plan.job.max_new_tokens
        return seconds

    return once, speed.slot_decode_step(lm, plan_sanitize(text, lm=lm, method=method, groups=groups, **opts).job)


def _quant_note(settings: dict[str, Any]) -> str:
    q = settings.get("quantize")
    return f" ({q} decode steps, float32 prompt processing and scoring)" if q else ""


def format_perf(res: dict[str, Any]) -> str:
    s = res["settings"]
    compiled = s.get("hf_compile_first_call_seconds")
    lines = [f"DP-Fusion throughput: {s['model']}{_quant_note(s)} (backend {s.get('backend', 'hf')}) on "
             f"{s.get('device', 'cpu')} "
             f"({s.get('dtype', 'float32')}), TAB document {s['doc_id']} ({s['prompt_tokens']}-token prompt), "
             f"{s['new_tokens']} new tokens, prefill included, median (and range) of {s['repeats']} interleaved "
             "round(s); CPU s: the process's CPU time over the same span (less sensitive to a loaded machine)"
             + (f"; HF static+compile's first (compiling) call took {compiled:.1f} s" if compiled else ""),
             "", *md_table(
                 ["config", "path", "decode step", "groups", "seconds", "range", "tokens/s", "ratio vs original",
                  "vs former path", "vs hf forward", "CPU s (range)", "vs former path (CPU)", "vs hf forward (CPU)"],
                 "lllrrrrrrrrrr",
                 ([r["config"], r.get("path", ""), r.get("decode_step", ""), r["groups"], f"{r['seconds']:.2f}",
                   _range(r.get("seconds_range")), f"{r['tokens_per_s']:.2f}", f"{r['ratio_vs_original']:.2f}",
                   _times(r.get("ratio_vs_former")), _times(r.get("ratio_vs_hf_forward")),
                   f"{r['cpu_seconds']:.2f} ({_range(r['cpu_seconds_range'])})" if "cpu_seconds" in r else "",
                   _times(r.get("cpu_ratio_vs_former")), _times(r.get("cpu_ratio_vs_hf_forward"))]
                  for r in res["rows"]))]
    return "\n".join(lines)


def _times(ratio: float | None) -> str:
    return "" if ratio is None else f"{ratio:.2f}×"


def _range(spread: list[float] | None) -> str:
    return "" if not spread else f"{spread[0]:.2f}–{spread[1]:.2f}"
