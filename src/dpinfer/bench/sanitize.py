"""``dpinfer bench sanitize``: privacy–utility of every sanitisation method on TAB-ECHR documents, and throughput.

Quality run (default), for each document and each method (the baselines ``original`` and ``ner-scrub``, and every
mechanism registered for sanitisation, ``dp-fusion``, ``dp-decoding``, ``dp-prompt``, at every ε of the sweep), all on
the same engine with the gold TAB spans:

* PPL: ``exp(mean NLL)`` of the released tokens under the LM given the rewriting prompt with the ORIGINAL document;
* LOSS-attack ASR (ALGORITHMS §6) on CODE, PERSON and DATETIME with |C| = 5 candidates (chance 0.20), with a 95%
  Wilson interval over all games;
* verbatim leak rate: share of distinct gold private strings (≥ 3 characters) found verbatim in the release;
* repeated 4-grams: share of the release's token 4-grams seen earlier in it (loops of a small model);
* tokens/s of generation (prefill included).

Documents are cut at a paragraph boundary to at most ``--max-chars`` characters (spans beyond the cut dropped) to
keep CPU runs short; ``--max-new-tokens`` bounds every release (it is the T_max of every guarantee).

``--perf``: DP-Fusion tokens/s with m = 1 and m = 4 privacy groups against ``original`` (plain generation of the same
length on the same document), EOS masked so every run makes exactly ``--max-new-tokens`` tokens, in one run. Each
configuration runs through :func:`~dpinfer.pipelines.sanitize.sanitize` (the engine, ``Engine.step``) and, as its
baseline in the same run, through the former one-job path (the same job on the dynamic-cache runner,
``Engine(runner="dynamic")``: one Hugging Face cache per job, the decoding the one-job engine did).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpinfer.bench import plots, speed
from dpinfer.bench.data import Doc, load_tab, mention_pool
from dpinfer.bench.harness import (
    Progress,
    Timings,
    check_choices,
    md_table,
    parse_list,
    quiet,
    rounds,
    write_json,
    write_text,
)
from dpinfer.configs import Config, add_options, option
from dpinfer.errors import ConfigurationError
from dpinfer.eval.intervals import mean_interval, wilson
from dpinfer.methods import method_names

DESCRIPTION = __doc__

DEFAULT_EPSILONS = (12.0, 20.0, 40.0, 100.0)


def run_quality(lm: Any, docs: list[Doc], pool_docs: list[Doc], *, epsilons: tuple[float, ...],
                methods: tuple[str, ...], max_new_tokens: int, seed: int, progress: Progress = quiet,
                decoding: dict[str, Any] | None = None) -> dict[str, Any]:
    from dpinfer.eval.metrics import loss_attack, perplexity, repeated_ngram_share, verbatim_leak_rate
    from dpinfer.pipelines.sanitize import DEFAULT_INSTRUCTION, build_prompt, sanitize

    def context(text: str) -> list[int]:
        return lm.encode(build_prompt(lm, text, DEFAULT_INSTRUCTION)[0])

    from dpinfer.methods import is_baseline

    decoding = decoding or {}
    runs = [(m, None) for m in methods if is_baseline("sanitize", m)]  # no ε: one run each
    runs += [(m, e) for m in methods if not is_baseline("sanitize", m) for e in epsilons]
    rows: dict[tuple[str, float | None], dict[str, Any]] = {
        r: {"ppl": [], "games": [], "leaks": [0, 0], "tokens": 0, "seconds": 0.0, "epsilon": None, "rep": []}
        for r in runs}
    per_doc: list[dict[str, Any]] = []
    releases: dict[tuple[str, float | None, int], list[int]] = {}  # in memory only, for the paired comparison
    for di, doc in enumerate(docs):
        pool = mention_pool(pool_docs, doc.doc_id)
        original_ctx = context(doc.text)
        secrets = [doc.text[s.start:s.end] for s in doc.spans]
        for method, eps in runs:
            progress(f"doc {di + 1}/{len(docs)} {method}" + (f" ε={eps:g}" if eps else ""))
            res = sanitize(doc.text, lm=lm, method=method, epsilon=eps, spans=doc.spans,
                           max_new_tokens=max_new_tokens, seed=seed + di, **decoding)
            out_ids = res.token_ids
            row = rows[(method, eps)]
            row["epsilon"] = res.guarantee.epsilon
            row["ppl"].append(perplexity(lm, original_ctx, out_ids))
            row["rep"].append(repeated_ngram_share(out_ids))
            games = loss_attack(lm, context, doc.text, doc.spans, out_ids, pool, rng=random.Random(1000 * di + 7))
            row["games"] += games
            hit, total = verbatim_leak_rate(res.text, secrets)
            releases[(method, eps, di)] = list(out_ids)
            per_doc.append({"doc_id": doc.doc_id, "method": method, "target_epsilon": eps, "ppl": row["ppl"][-1],
                            "wins": sum(g.win for g in games), "games": len(games), "leaks": [hit, total],
                            "tokens": res.generated_tokens})
            row["leaks"][0] += hit
            row["leaks"][1] += total
            row["tokens"] += res.generated_tokens
            row["seconds"] += res.seconds
    return {"rows": [_summarise(m, e, r) for (m, e), r in rows.items()], "per_document": per_doc,
            "paired": _paired(per_doc, releases, len(docs))}


def _paired(per_doc: list[dict[str, Any]], releases: dict[tuple[str, float | None, int], list[int]],
            n_docs: int, baseline: str = "ner-scrub") -> list[dict[str, Any]]:
    """Every swept run against ``baseline`` on the same documents and LOSS games. All samplers draw one uniform per
    token from the same seeded stream (common random numbers), so a method close to the baseline releases the same
    text until the first token where their distributions split; per-document differences then measure the gap with
    less noise than two independent tables. Intervals: mean ± 1.96·sd/√n over documents (normal approximation)."""
    by_key = {(r["method"], r["target_epsilon"], r["doc_id"]): r for r in per_doc}
    doc_ids = list(dict.fromkeys(r["doc_id"] for r in per_doc))
    out = []
    for method, eps in dict.fromkeys((r["method"], r["target_epsilon"]) for r in per_doc):
        if method == baseline or not all((baseline, None, d) in by_key for d in doc_ids):
            continue
        d_ppl, d_asr, same, prefix = [], [], 0, []
        for di, d in enumerate(doc_ids):
            a, b = by_key[(method, eps, d)], by_key[(baseline, None, d)]
            if math.isfinite(a["ppl"]) and math.isfinite(b["ppl"]):
                d_ppl.append(a["ppl"] - b["ppl"])
            d_asr.append((a["wins"] - b["wins"]) / max(a["games"], 1))
            x, y = releases[(method, eps, di)], releases[(baseline, None, di)]
            same += x == y
            k = next((i for i, (u, v) in enumerate(zip(x, y, strict=False)) if u != v), min(len(x), len(y)))
            prefix.append(k / max(len(x), len(y), 1))
        (ppl_mean, ppl_ci), (asr_mean, asr_ci) = mean_ci95(d_ppl), mean_ci95(d_asr)
        out.append({"method": method, "target_epsilon": eps, "baseline": baseline, "docs": n_docs,
                    "identical_releases": same, "shared_prefix_share": round(statistics.fmean(prefix), 3),
                    "ppl_diff_mean": ppl_mean, "ppl_diff_ci95": ppl_ci, "asr_diff": asr_mean, "asr_diff_ci95": asr_ci})
    return out


def mean_ci95(xs: list[float]) -> tuple[float | None, list[float] | None]:
    """The mean of per-document differences and its 95% interval (normal approximation,
    :func:`dpinfer.eval.intervals.mean_interval`), rounded to 3 digits; ``(None, None)`` without data."""
    if not xs:
        return None, None
    m, lo, hi = mean_interval(xs, method="normal", digits=3)
    return m, [lo, hi]


def _summarise(method: str, eps: float | None, r: dict[str, Any]) -> dict[str, Any]:
    wins = sum(g.win for g in r["games"])
    n = len(r["games"])
    lo, hi = wilson(wins, n)
    ppls = [p for p in r["ppl"] if math.isfinite(p)]
    return {
        "method": method, "target_epsilon": eps,
        "guarantee_epsilon": None if r["epsilon"] is None or math.isinf(r["epsilon"]) else round(r["epsilon"], 3),
        "ppl_mean": round(statistics.fmean(ppls), 3) if ppls else None,
        "ppl_median": round(statistics.median(ppls), 3) if ppls else None,
        "asr": round(wins / n, 3) if n else None, "asr_ci95": [round(lo, 3), round(hi, 3)], "games": n,
        "leak_rate": round(r["leaks"][0] / r["leaks"][1], 3) if r["leaks"][1] else None,
        "repeated_4grams": round(statistics.fmean(r["rep"]), 3) if r["rep"] else None,
        "tokens_per_s": round(r["tokens"] / r["seconds"], 2) if r["seconds"] else None,
    }


def run_perf(lm: Any, doc: Doc, *, max_new_tokens: int, seed: int, repeats: int = 1,
             progress: Progress = quiet, hf_baselines: bool = True, ms: tuple[int, ...] = (1, 4),
             slot_engine: bool = False) -> dict[str, Any]:
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
    ``decode_step`` (``"compiled"`` or ``"eager"``)."""
    from dpinfer.pipelines import sanitize as pipeline

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

    def engine_timer(name: str, groups: dict[str, list[str]] | None) -> Callable[[], tuple[float, float]]:
        def once() -> tuple[float, float]:
            cpu: list[float] = []  # process CPU seconds over the span res.seconds measures (from the progress calls)
            res = pipeline.sanitize(doc.text, lm=lm, method="original" if groups is None else "dp-fusion",
                                    groups=groups, progress=lambda done, total: cpu.append(time.process_time()),
                                    **opts)
            assert res.generated_tokens == max_new_tokens
            info[name] = {"groups": len(res.groups) if groups is not None else 0, "prompt_tokens": res.prompt_tokens,
                          "path": "engine (sanitize, Engine.step)", "decode_step": steps[name]}
            return res.seconds, cpu[-1] - cpu[0]
        return once

    timers: list[tuple[str, Callable[[], tuple[float, float]]]] = []
    for name, groups in configs:
        timers += [(name, engine_timer(name, groups)),
                   (f"{name} (former path)", _former_sanitize(lm, doc.text, groups, opts))]
    for label, timer in timers[::2]:  # first calls timed apart (the engine's decode step compiles on CUDA)
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
    names = [n for c in configs for n in (c[0], f"{c[0]} (former path)")]
    if slot_engine:
        names += [f"{c[0]} (run_jobs)" for c in configs]
    compile_seconds = None
    if hf_baselines:  # the prompt `original` decodes, through transformers' own generate loop
        ids = pipeline.prepare_contexts(lm, doc.text, doc.spans, pipeline.resolve_groups(doc.spans, None),
                                        pipeline.DEFAULT_INSTRUCTION).original
        progress("hf generate static+compile (first call: compiles)")
        compile_seconds = speed.time_hf(lm, ids, max_new_tokens, compiled=True)
        hf = [("hf generate eager", False), ("hf generate static+compile", True)]
        for _, order in rounds(repeats, hf):
            for label, compiled in order:
                progress(label)
                timings.add(label, speed.time_hf(lm, ids, max_new_tokens, compiled=compiled))
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
    settings = {"doc_id": doc.doc_id, "prompt_tokens": info["original"]["prompt_tokens"],
                "new_tokens": max_new_tokens, "repeats": repeats, "model": lm.name,
                "device": str(lm.device), "dtype": str(lm.model.dtype).removeprefix("torch."),
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
        run = Engine(plan.lm, runner="dynamic").stream(
            job.contexts, job.mechanism, max_new_tokens=job.max_new_tokens, seed=job.seed, processors=job.processors,
            min_new_tokens=job.min_new_tokens)
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


def format_quality(res: dict[str, Any]) -> str:
    s = res["settings"]
    lines = [
        f"Sanitisation quality: {s['model']}{_quant_note(s)}, {s['docs']} TAB-ECHR documents "
        f"(≤ {s['max_chars']} chars), "
        f"T_max = {s['max_new_tokens']}, δ = {s['delta']}, α = 2, seed {s['seed']}, decoding {s['decoding']}; "
        "ASR chance = 0.20",
        "",
        *md_table(["method", "target ε", "guarantee ε (worst group)", "PPL mean", "PPL median", "ASR [95% CI]",
                   "games", "leak rate", "repeated 4-grams", "tokens/s"], "lrrrrlrrrr",
                  ([r["method"], _eps(r["target_epsilon"]),
                    "∞" if r["guarantee_epsilon"] is None else f"{r['guarantee_epsilon']:g}", r["ppl_mean"],
                    r["ppl_median"], f"{r['asr']} [{r['asr_ci95'][0]}, {r['asr_ci95'][1]}]", r["games"],
                    r["leak_rate"], r["repeated_4grams"], r["tokens_per_s"]] for r in res["rows"])),
    ]
    if res.get("paired"):
        lines += ["", "Paired with ner-scrub on the same documents and games (common random numbers; 95% intervals "
                  "over documents, normal approximation):", "",
                  *md_table(["method", "target ε", "identical releases", "shared prefix", "PPL − ner-scrub's",
                             "ASR − ner-scrub's"], "lrrrll",
                            ([r["method"], _eps(r["target_epsilon"]), f"{r['identical_releases']}/{r['docs']}",
                              f"{r['shared_prefix_share']:.0%}", f"{r['ppl_diff_mean']} {r['ppl_diff_ci95']}",
                              f"{r['asr_diff']} {r['asr_diff_ci95']}"] for r in res["paired"]))]
    return "\n".join(lines)


def format_perf(res: dict[str, Any]) -> str:
    s = res["settings"]
    compiled = s.get("hf_compile_first_call_seconds")
    lines = [f"DP-Fusion throughput: {s['model']}{_quant_note(s)} on {s.get('device', 'cpu')} "
             f"({s.get('dtype', 'float32')}), TAB document {s['doc_id']} ({s['prompt_tokens']}-token prompt), "
             f"{s['new_tokens']} new tokens, prefill included, median (and range) of {s['repeats']} interleaved "
             "round(s); CPU s: the process's CPU time over the same span (less sensitive to a loaded machine)"
             + (f"; HF static+compile's first (compiling) call took {compiled:.1f} s" if compiled else ""),
             "", *md_table(
                 ["config", "path", "decode step", "groups", "seconds", "range", "tokens/s", "ratio vs original",
                  "vs former path", "CPU s (range)", "vs former path (CPU)"], "lllrrrrrrrr",
                 ([r["config"], r.get("path", ""), r.get("decode_step", ""), r["groups"], f"{r['seconds']:.2f}",
                   _range(r.get("seconds_range")), f"{r['tokens_per_s']:.2f}", f"{r['ratio_vs_original']:.2f}",
                   _times(r.get("ratio_vs_former")),
                   f"{r['cpu_seconds']:.2f} ({_range(r['cpu_seconds_range'])})" if "cpu_seconds" in r else "",
                   _times(r.get("cpu_ratio_vs_former"))] for r in res["rows"]))]
    return "\n".join(lines)


def _eps(eps: float | None) -> str:
    return "" if eps is None else f"{eps:g}"


def _times(ratio: float | None) -> str:
    return "" if ratio is None else f"{ratio:.2f}×"


def _range(spread: list[float] | None) -> str:
    return "" if not spread else f"{spread[0]:.2f}–{spread[1]:.2f}"


QUANTIZE_HELP = ("generate with decode-step int8 Linear layers (CPU only; see dpinfer sanitize --help); PPL and the "
                 "LOSS attack score whole sequences at once, which always runs the float32 layers, so the scorer is "
                 "the float32 model either way")


@dataclass(frozen=True)
class SanitizeBenchConfig(Config):
    """Settings of ``dpinfer bench sanitize`` (one field per option; its ``--help`` with it)."""

    data: str | None = option(None, type=str, help="TAB jsonl (default ../shared/data/tab/tab_echr_docs.jsonl)")
    n: int = option(4, help="documents (default 4)")
    skip: int = option(0, help="skip the first documents (default 0)")
    max_chars: int | None = option(None, type=int,
                                   help="cut documents to this many characters (default 2000; --perf: 2600)")
    max_new_tokens: int | None = option(None, type=int, help="T_max of every release (default 128; --perf: 256)")
    epsilons: tuple[float, ...] = option(DEFAULT_EPSILONS, type=str,
                                         help="ε sweep, comma-separated (default 12,20,40,100)")
    methods: tuple[str, ...] | None = option(
        None, type=str, help="methods, comma-separated (default: every method of dpinfer sanitize, baselines first)")
    seed: int = option(0, help="seed of the benchmark's noise (default 0)")
    model: str | None = option(None, type=str, help="model name or local folder (default: the embedded SmolLM2)")
    quantize: str | None = option(None, type=str, choices=("int8",), help=QUANTIZE_HELP)
    out: str = option("bench-out", help="folder for the markdown table, JSON and PNG plot")
    temperature: float | None = option(None, type=float, help="decoding temperature (default: sanitize's)")
    top_k: int | None = option(None, type=int, help="public top-k support (default: sanitize's; 0 = full)")
    no_repeat_ngram: int | None = option(None, type=int,
                                         help="ban repeated n-grams of the output (default: sanitize's; 0 = off)")
    perf: bool = option(False, help="throughput run (m = 1 and m = 4 vs original) instead")
    repeats: int = option(1, help="--perf, --corpus: interleaved rounds, median reported")
    corpus: int | None = option(None, type=int, metavar="N",
                                help="corpus throughput instead: N documents (default --max-chars 1200, ε = first of "
                                     "--epsilons, T_max 128) one by one vs through sanitize_many / one "
                                     "Engine.run_jobs call, in one run")
    device: str | None = None
    dtype: str | None = None
    shape: str | None = None
    """``--perf`` / ``--corpus``: a random-weight model of this :data:`dpinfer.bench.speed.SHAPES` shape."""
    hf_baselines: bool = option(True, flag="--hf", help="--perf: also time the Hugging Face generate baselines "
                                                        "(--no-hf: skip them)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_options(p, SanitizeBenchConfig)
    speed.add_speed_arguments(p, "--perf or --corpus N")


def config_from_args(args: argparse.Namespace) -> SanitizeBenchConfig:
    """The config of parsed ``dpinfer bench sanitize`` options; the ε list and the methods are checked here, before
    any model loads."""
    lists: dict[str, Any] = {}
    if "epsilons" in args:
        lists["epsilons"] = tuple(parse_list(args.epsilons, float, "--epsilons"))
    if getattr(args, "methods", None) is not None:
        lists["methods"] = tuple(parse_list(args.methods, str, "--methods"))
        check_choices(lists["methods"], method_names("sanitize"), "--methods")
    c = SanitizeBenchConfig.from_args(args, **lists)
    if c.perf and c.corpus:
        raise ConfigurationError("--perf and --corpus are two benchmarks; choose one")
    speed.check_speed_arguments(args, speed_run=bool(c.perf or c.corpus), runs="--perf or --corpus N")
    return c


def run(config: SanitizeBenchConfig, progress: Progress = quiet) -> dict[str, Any]:
    """Run the quality sweep (or, with ``perf``, the throughput run); write its files into ``config.out``; return
    the measurements with their Markdown (``"markdown"``) and plot path (``"plot"``)."""
    from dpinfer.defaults import SANITIZE
    from dpinfer.methods import BASELINES, mechanism_names

    c = config
    lm = speed.speed_model(c.model, device=c.device, dtype=c.dtype, shape=c.shape, quantize=c.quantize)
    out = Path(c.out)
    out.mkdir(parents=True, exist_ok=True)
    if c.corpus:
        from dpinfer.bench.corpus import format_corpus, run_corpus

        docs = load_tab(c.data, c.corpus, 1200 if c.max_chars is None else c.max_chars, skip=c.skip)
        res = run_corpus(lm, docs, epsilon=c.epsilons[0] if c.epsilons else 12.0,
                         max_new_tokens=128 if c.max_new_tokens is None else c.max_new_tokens, seed=c.seed,
                         repeats=c.repeats, progress=progress)
        res["markdown"] = format_corpus(res)
        write_text(out / "sanitize_corpus.md", res["markdown"] + "\n")
        write_json(out / "sanitize_corpus.json", res)
        return res
    if c.perf:
        doc = load_tab(c.data, 1, 2600 if c.max_chars is None else c.max_chars, skip=c.skip)[0]
        res = run_perf(lm, doc, max_new_tokens=256 if c.max_new_tokens is None else c.max_new_tokens,
                       seed=c.seed, repeats=c.repeats, progress=progress, hf_baselines=c.hf_baselines)
        res["settings"]["quantize"] = c.quantize
        res["markdown"] = format_perf(res)
        write_text(out / "sanitize_perf.md", res["markdown"] + "\n")
        write_json(out / "sanitize_perf.json", res)
        return res
    max_chars = 2000 if c.max_chars is None else c.max_chars
    max_new_tokens = 128 if c.max_new_tokens is None else c.max_new_tokens
    methods = c.methods if c.methods is not None else (*BASELINES["sanitize"], *mechanism_names("sanitize"))
    docs = load_tab(c.data, c.n, max_chars, skip=c.skip)
    pool_docs = load_tab(c.data, 10_000, 10**9)
    t0 = time.perf_counter()
    decoding: dict[str, Any] = {}
    if c.temperature is not None:
        decoding["temperature"] = c.temperature
    if c.top_k is not None:
        decoding["top_k"] = None if c.top_k == 0 else c.top_k
    if c.no_repeat_ngram is not None:
        decoding["no_repeat_ngram"] = c.no_repeat_ngram or None
    res = run_quality(lm, docs, pool_docs, epsilons=c.epsilons, methods=methods, max_new_tokens=max_new_tokens,
                      seed=c.seed, progress=progress, decoding=decoding)
    res["settings"] = {"model": lm.name, "docs": len(docs), "doc_ids": [d.doc_id for d in docs],
                       "max_chars": max_chars, "max_new_tokens": max_new_tokens, "delta": SANITIZE.delta,
                       "seed": c.seed, "epsilons": list(c.epsilons), "seconds": round(time.perf_counter() - t0, 1),
                       "decoding": decoding or "sanitize defaults", "quantize": c.quantize,
                       "scorer": "float32 (whole-sequence passes)"}
    res["markdown"] = format_quality(res)
    write_text(out / "sanitize_quality.md", res["markdown"] + "\n")
    write_json(out / "sanitize_quality.json", res)
    png = plots.sanitize_privacy_utility(res, out / "sanitize_privacy_utility.png")
    res["plot"] = str(png) if png else None
    return res


def render(res: dict[str, Any]) -> str:
    """What ``dpinfer bench sanitize`` prints: the Markdown table, and the plot's path when one was drawn."""
    return res["markdown"] + (f"\n\nplot: {res['plot']}" if res.get("plot") else "")
