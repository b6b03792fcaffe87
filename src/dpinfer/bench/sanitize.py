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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpinfer.bench import plots, speed
from dpinfer.bench.data import Doc, load_tab, mention_pool
from dpinfer.bench.harness import (
    Progress,
    check_choices,
    md_table,
    parse_list,
    quiet,
    write_json,
    write_text,
)
from dpinfer.bench.sanitize_perf import _quant_note, format_perf, run_perf
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
    from dpinfer.pipelines.sanitize import sanitize
    from dpinfer.pipelines.sanitize_contexts import DEFAULT_INSTRUCTION, build_prompt

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

def _eps(eps: float | None) -> str:
    return "" if eps is None else f"{eps:g}"

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
        hf_lm = speed.hf_twin(lm)  # the same model on transformers' forward: the HF baselines and the A/B
        res = run_perf(lm, doc, max_new_tokens=256 if c.max_new_tokens is None else c.max_new_tokens,
                       seed=c.seed, repeats=c.repeats, progress=progress, hf_baselines=c.hf_baselines, hf_lm=hf_lm)
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
