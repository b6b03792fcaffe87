"""``dpinfer bench synth``: quality of DP synthetic text against compute (B) at fixed ε, and throughput.

Quality run (default). The corpus (Yelp reviews by default; TAB texts with ``--data`` and ``--text-field text``) is
split by record order into a *private* part (the references, the first ``--n-private`` records) and a *held-out* part
(the next ``--n-real`` records, never shown to any method). For each method and each batch size B of ``--batch-sizes``,
``--n-texts`` synthetic texts are generated at the target ε (``public`` once: it reads no reference), then:

* MAUVE (Pillutla et al. 2021; mauve-text, optional GPL extra) between the synthetic texts and the held-out texts, on
  all-MiniLM-L6-v2 sentence embeddings (the offline stand-in for the paper's all-mpnet-base-v2). The held-out texts
  are cut to ``--max-new-tokens`` tokens, like the synthetic ones. The interval is a 95% t-interval over
  ``--mauve-repeats`` repeats, each on a random 80% of both sets with its own k-means seed: it covers quantisation
  and part of the sampling variability, not a new draw of texts.
* PPL of synthetic and held-out texts under the LM, each given its label's public prompt, and ΔPPL = synthetic − real;
* mean length (tokens), LM calls per token (B + 1; 1 for ``public``), tokens/s (prefill included), and for the
  baselines the share of private tokens (Amin et al.) or of texts stopped by the data-dependent budget (AdaPMixED).

``--perf``: InvisibleInk tokens/s with B = 8 against plain generation (``public``) of the same length on the same
labels, EOS masked so that every run makes exactly ``--max-new-tokens`` tokens, in one run.

Amin et al. runs with ``as_published`` sensitivity (C/B, the advantage the InvisibleInk paper grants it) unless
``--amin-sound``; its sparse-vector cost is dpinfer's sound accounting either way (see dpinfer.mechanisms.amin).
"""

from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpinfer.bench import plots, speed
from dpinfer.bench.harness import Progress, Timings, md_table, parse_list, quiet, rounds, write_json, write_text
from dpinfer.configs import Config, add_options, option
from dpinfer.defaults import SYNTH
from dpinfer.errors import ConfigurationError

DESCRIPTION = __doc__

DEFAULT_METHODS = ("public", "invisibleink", "amin")
DEFAULT_BATCH_SIZES = (2, 4, 8)


def mauve_with_interval(p: Any, q: Any, repeats: int, seed: int = 0) -> dict[str, Any]:
    """MAUVE mean and 95% interval over ``repeats`` random 80% subsets of both sets (own k-means seed each)."""
    from dpinfer.eval.mauve import mauve_interval

    res = mauve_interval(p, q, seeds=range(seed, seed + max(2, repeats)), subsample=0.8, threads=1)
    return {"mauve": res.mean, "mauve_low": res.low, "mauve_high": res.high, "mauve_scores": list(res.scores)}


def _ppl(lm: Any, context: list[int], text: str, max_tokens: int) -> tuple[float, int]:
    from dpinfer.eval.metrics import perplexity

    ids = lm.encode(text)[:max_tokens]
    return (perplexity(lm, context, ids) if ids else math.nan), len(ids)


def run_quality(lm: Any, refs: list[Any], real: list[Any], *, methods: tuple[str, ...],
                batch_sizes: tuple[int, ...], epsilon: float, delta: float, n_texts: int, max_new_tokens: int,
                top_k: int | None, temperature: float, template: str, seed: int, mauve_repeats: int,
                amin_sound: bool, progress: Progress = quiet) -> dict[str, Any]:
    from dpinfer.configs.synth import TEMPLATES
    from dpinfer.eval.embeddings import load_embedder
    from dpinfer.methods import is_baseline
    from dpinfer.pipelines.synthesize import synthesize

    emb = load_embedder()
    tpl = TEMPLATES[template]

    def public_ctx(labels: Any) -> list[int]:
        return lm.encode(lm.instruction_prompt(tpl.render_public(labels)) + tpl.render_prefix(labels))

    real_texts = [lm.decode(lm.encode(r.text)[:max_new_tokens]) for r in real]
    real_ppl = [_ppl(lm, public_ctx(r.labels), r.text, max_new_tokens)[0] for r in real]
    q = emb.encode(real_texts)
    rows: list[dict[str, Any]] = []
    for method in methods:
        public = is_baseline("synthesize", method)
        for b in (batch_sizes[-1:] if public else batch_sizes):
            progress(f"{method} B={b}")
            options: dict[str, Any] = {}
            if method == "amin" and not amin_sound:
                options["as_published"] = True
            res = synthesize(refs, lm=lm, method=method, epsilon=epsilon, delta=delta, batch_size=b,
                             max_new_tokens=max_new_tokens, top_k=top_k, temperature=temperature,
                             prompt_template=template, seed=seed, max_texts=n_texts, options=options)
            texts = [t.text for t in res.texts]
            ppl = [_ppl(lm, public_ctx(t.labels), t.text, max_new_tokens)[0] for t in res.texts]
            ppl = [x for x in ppl if math.isfinite(x)]
            p = emb.encode([t if t.strip() else "." for t in texts])
            row: dict[str, Any] = {
                "method": method, "B": b if not public else 0,
                "epsilon": None if public else epsilon,
                "texts": len(texts), "mean_tokens": statistics.fmean(t.tokens for t in res.texts),
                "ppl": statistics.median(ppl) if ppl else math.nan,
                "lm_calls_per_token": res.lm_calls_per_token, "tokens_per_second": res.tokens_per_second,
                "guarantee": res.guarantee.to_dict(),
                **mauve_with_interval(p, q, mauve_repeats, seed),
            }
            row["delta_ppl"] = row["ppl"] - statistics.median(real_ppl)
            if method == "amin":
                priv = [t.private_tokens or 0 for t in res.texts]
                row["private_token_share"] = sum(priv) / max(1, sum(t.tokens for t in res.texts))
            if method == "adapmixed":
                row["stopped_by_budget"] = sum(t.finish_reason == "budget" for t in res.texts) / len(res.texts)
            row["examples"] = texts[:2]
            rows.append(row)
    return {"rows": rows, "real": {"n": len(real), "ppl": statistics.median(real_ppl),
                                   "mean_tokens": statistics.fmean(len(lm.encode(t)) for t in real_texts)}}


def run_perf(lm: Any, refs: list[Any], *, batch_size: int, max_new_tokens: int, template: str, seed: int,
             repeats: int, epsilon: float, top_k: int | None, max_reference_tokens: int = 512,
             slot_engine: bool = False, progress: Progress = quiet) -> dict[str, Any]:
    """InvisibleInk (B = ``batch_size``) against plain generation (``public``) of the same length on the first batch
    of ``refs``, through the one-job engine (``Engine.generate``), median of ``repeats``. References are cut to
    ``max_reference_tokens`` tokens (the public padding width follows from it).

    With ``slot_engine``, both also run as ONE job through ``Engine.run_jobs`` (the slot engine), each on an engine of
    its own so that its compiled decode step is reused across repeats; the first call of each (it compiles on CUDA)
    is timed apart. Their figures are under ``"slot_engine"``, with the same keys."""
    from dpinfer.configs.synth import TEMPLATES, SynthConfig
    from dpinfer.engine import Engine, Job
    from dpinfer.methods.synthesize import batch_contexts, build, public_pad_width
    from dpinfer.references import partition

    batches, _ = partition(refs, batch_size, seed)
    public, *private = batch_contexts(lm, TEMPLATES[template], [refs[i] for i in batches[0]], max_reference_tokens)
    engine = Engine(lm)
    pad = public_pad_width(lm, TEMPLATES[template], refs[batches[0][0]].labels, max_reference_tokens)
    methods = ("public", "invisibleink")
    timings, slot_timings = Timings(sync=lambda: speed.sync(lm)), Timings(sync=lambda: speed.sync(lm))
    slot_engines = {m: Engine(lm) for m in methods} if slot_engine else {}
    first_calls: dict[str, float] = {}
    tokens: dict[tuple[int, str], list[int]] = {}  # released tokens per (timer, label) and run

    def job(method: str, r: int) -> Any:
        mech = build(SynthConfig(method=method, epsilon=epsilon, delta=1e-6, batch_size=batch_size,
                                 max_new_tokens=max_new_tokens, top_k=top_k, temperature=1.0))
        contexts = [public] if method == "public" else [public, *private]
        return Job(contexts, mech, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, seed=seed + r,
                         pad_width=pad)

    def through_slots(method: str, r: int, timer: Timings, label: str) -> None:
        j = job(method, r)  # the mechanism's calibration is not timed (nor is it on the one-job path)
        ((_, res),) = timer.time(label, lambda: list(slot_engines[method].run_jobs([j])))
        tokens.setdefault((id(timer), label), []).append(len(res.sequences[0]))

    def one_job(method: str, r: int) -> None:
        j = job(method, r)
        res = timings.time(method, lambda: engine.generate(j.contexts, j.mechanism, max_new_tokens=max_new_tokens,
                                                           min_new_tokens=max_new_tokens, seed=j.seed, pad_width=pad))
        tokens.setdefault((id(timings), method), []).append(res.num_generated)

    firsts = Timings(sync=lambda: speed.sync(lm))
    for method in slot_engines:  # first calls (compilation on CUDA), timed apart
        progress(f"{method} (run_jobs), first call")
        through_slots(method, 0, firsts, method)
        first_calls[method] = round(firsts.median(method), 3)
    for r, order in rounds(repeats, methods):
        for method in order:
            progress(method)
            one_job(method, r)
            if slot_engine:
                progress(f"{method} (run_jobs)")
                through_slots(method, r, slot_timings, method)
    out = {m: [n / t for n, t in zip(tokens[(id(timings), m)], timings.runs[m], strict=True)] for m in methods}
    slot_out = {m: [n / t for n, t in zip(tokens[(id(slot_timings), m)], slot_timings.runs[m], strict=True)]
                for m in slot_engines}
    seconds, slot_seconds = timings.runs, slot_timings.runs
    plain = statistics.median(out["public"])
    ink = statistics.median(out["invisibleink"])
    result: dict[str, Any] = {
        "batch_size": batch_size, "max_new_tokens": max_new_tokens, "repeats": repeats,
        "prompt_tokens": [len(public), *[len(p) for p in private]],
        "plain_tokens_per_second": plain, "invisibleink_tokens_per_second": ink, "ratio": ink / plain,
        "runs": out, "seconds": seconds}
    if slot_engine:
        plain, ink = statistics.median(slot_out["public"]), statistics.median(slot_out["invisibleink"])
        result["slot_engine"] = {
            "plain_tokens_per_second": plain, "invisibleink_tokens_per_second": ink, "ratio": ink / plain,
            "runs": slot_out, "seconds": slot_seconds, "first_call_seconds": first_calls,
            "decode_step": {m: speed.slot_decode_step(lm, job(m, 0)) for m in methods}}
    return result


def format_quality(res: dict[str, Any]) -> str:
    s = res["settings"]
    lines = [
        f"MAUVE vs {res['real']['n']} held-out texts (MiniLM embeddings), ε = {s['epsilon']:g}, δ = {s['delta']:g}, "
        f"T_max = {s['max_new_tokens']}, {s['n_texts']} texts per row, model {s['model']}; real texts: median PPL "
        f"{res['real']['ppl']:.1f}, {res['real']['mean_tokens']:.0f} tokens",
        "",
        *md_table(["method", "B", "LM calls/token", "MAUVE (95% interval)", "median PPL", "ΔPPL", "mean tokens",
                   "tokens/s", "notes"], "lrrlrrrrl",
                  ([r["method"], r["B"] or "–", r["lm_calls_per_token"],
                    f"{r['mauve']:.3f} ({r['mauve_low']:.3f}–{r['mauve_high']:.3f})", f"{r['ppl']:.1f}",
                    f"{r['delta_ppl']:+.1f}", f"{r['mean_tokens']:.0f}", f"{r['tokens_per_second']:.1f}", _note(r)]
                   for r in res["rows"])),
    ]
    return "\n".join(lines)


def _note(row: dict[str, Any]) -> str:
    if "stopped_by_budget" in row:
        return f"stopped by its data-dependent budget: {row['stopped_by_budget']:.0%} of texts"
    if "private_token_share" in row:
        return f"private tokens {row['private_token_share']:.0%}"
    return ""


def format_perf(res: dict[str, Any]) -> str:
    return (
        f"InvisibleInk B = {res['batch_size']} ({res['batch_size'] + 1} contexts): "
        f"{res['invisibleink_tokens_per_second']:.2f} tokens/s vs plain generation "
        f"{res['plain_tokens_per_second']:.2f} tokens/s: {res['ratio']:.2f}× "
        f"({res['max_new_tokens']} tokens, prefill included, median of {res['repeats']})"
    )


@dataclass(frozen=True)
class SynthBenchConfig(Config):
    """Settings of ``dpinfer bench synth`` (one field per option; its ``--help`` with it)."""

    data: str | None = option(None, type=str, help="corpus .csv/.jsonl (default ../shared/data/yelp/yelp_reviews.csv)")
    text_field: str = option("text", help="the records' text field (default text)")
    label_fields: tuple[str, ...] = option(("label1", "label2"), type=str, help="public label fields ('' for none)")
    template: str = option("yelp", choices=("generic", "yelp", "tab"), help="prompt template (default yelp)")
    methods: tuple[str, ...] = option(DEFAULT_METHODS, type=str, help="comma-separated methods of dpinfer synth "
                                                                      f"(default {','.join(DEFAULT_METHODS)})")
    batch_sizes: tuple[int, ...] = option(DEFAULT_BATCH_SIZES, type=str, help="B values, e.g. 2,4,8")
    epsilon: float = option(10.0, help="target ε (default 10)")
    delta: float = option(SYNTH.delta, help=f"δ (default {SYNTH.delta:g})")
    n_texts: int = option(24, help="synthetic texts per (method, B)")
    n_private: int = option(2000, help="records used as references")
    n_real: int = option(200, help="held-out records MAUVE compares with")
    max_new_tokens: int = option(64, help="T_max of every text (default 64)")
    top_k: int | None = option(SYNTH.top_k, type=int, help="0 = full vocabulary")
    temperature: float = option(SYNTH.temperature, help=f"temperature (default {SYNTH.temperature:g})")
    mauve_repeats: int = option(5, help="MAUVE repeats of the interval (default 5)")
    amin_sound: bool = option(False, help="Amin et al. with the sound 2C/B sensitivity")
    seed: int = option(0, help="seed of the benchmark's noise (default 0)")
    model: str | None = option(None, type=str, help="model name or local folder (default: the embedded SmolLM2)")
    perf: bool = option(False, help="throughput of InvisibleInk (B = 8) vs plain generation")
    perf_batch_size: int = option(8, help="--perf: B (default 8)")
    repeats: int = option(1, help="--perf repeats (median)")
    out_dir: str = option("bench-out", help="where the JSON, markdown and PNG go")
    append: bool = option(False, help="add the rows to bench_synth.json of an earlier run with the same settings (to "
                                      "split a long sweep into several runs); the table and plot then show all rows")
    device: str | None = None
    dtype: str | None = None
    shape: str | None = None
    """``--perf``: a random-weight model of this :data:`dpinfer.bench.speed.SHAPES` shape (speed only)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_options(p, SynthBenchConfig)
    speed.add_speed_arguments(p, "--perf")


def config_from_args(args: argparse.Namespace) -> SynthBenchConfig:
    """The config of parsed ``dpinfer bench synth`` options; the methods and batch sizes are checked here, before
    any model loads."""
    from dpinfer.validation import check_method

    lists: dict[str, Any] = {}
    if "methods" in args:
        lists["methods"] = tuple(parse_list(args.methods, str, "--methods"))
        for m in lists["methods"]:
            check_method("synthesize", m, "--methods")
    if "batch_sizes" in args:
        lists["batch_sizes"] = tuple(parse_list(args.batch_sizes, int, "--batch-sizes"))
        if min(lists["batch_sizes"]) < 1:
            raise ConfigurationError("--batch-sizes needs integers ≥ 1")
    if "label_fields" in args:
        lists["label_fields"] = tuple(f.strip() for f in args.label_fields.split(",") if f.strip())
    if getattr(args, "top_k", None) == 0:
        lists["top_k"] = None
    c = SynthBenchConfig.from_args(args, **lists)
    speed.check_speed_arguments(args, speed_run=c.perf, runs="--perf")
    return c


def run(config: SynthBenchConfig, progress: Progress = quiet) -> dict[str, Any]:
    """Run the MAUVE sweep (or, with ``perf``, the throughput run); write its files into ``config.out_dir``; return
    the measurements with their Markdown (``"markdown"``) and plot path (``"plot"``)."""
    import json

    from dpinfer._json import plain
    from dpinfer.errors import DataNotFoundError
    from dpinfer.paths import data_file
    from dpinfer.references import load_references

    c = config
    path = Path(c.data) if c.data else data_file("yelp", "yelp_reviews.csv")
    if not path.is_file():
        raise DataNotFoundError(f"benchmark data not found: {path} (expected ../shared/data beside the repo, or "
                                "$DPINFER_DATA, or --data)")
    records = load_references(path, text_field=c.text_field, label_fields=list(c.label_fields),
                              limit=c.n_private + c.n_real)
    if len(records) < c.n_private + c.n_real:
        raise ConfigurationError(f"{path.name} has {len(records)} records, fewer than --n-private + --n-real")
    refs, real = records[:c.n_private], records[c.n_private:]
    progress("loading the model")
    lm = speed.speed_model(c.model, device=c.device, dtype=c.dtype, shape=c.shape)
    out_dir = Path(c.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if c.perf:
        res = run_perf(lm, refs, batch_size=c.perf_batch_size, max_new_tokens=c.max_new_tokens,
                       template=c.template, seed=c.seed, repeats=c.repeats, epsilon=c.epsilon, top_k=c.top_k)
        res["markdown"] = format_perf(res)
        res["settings"] = {"model": lm.name, "data": str(path), "device": str(lm.device),
                           "dtype": str(lm.model.dtype).removeprefix("torch.")}
        write_json(out_dir / "bench_synth_perf.json", res)
        return res
    res = run_quality(lm, refs, real, methods=c.methods, batch_sizes=c.batch_sizes, epsilon=c.epsilon,
                      delta=c.delta, n_texts=c.n_texts, max_new_tokens=c.max_new_tokens, top_k=c.top_k,
                      temperature=c.temperature, template=c.template, seed=c.seed,
                      mauve_repeats=c.mauve_repeats, amin_sound=c.amin_sound, progress=progress)
    res["settings"] = {"epsilon": c.epsilon, "delta": c.delta, "max_new_tokens": c.max_new_tokens,
                       "n_texts": c.n_texts, "top_k": c.top_k, "temperature": c.temperature,
                       "template": c.template, "model": lm.name, "data": str(path), "seed": c.seed,
                       "amin_sensitivity": "2C/B (sound)" if c.amin_sound else "C/B (as published)"}
    previous = out_dir / "bench_synth.json"
    if c.append and previous.is_file():
        old = json.loads(previous.read_text(encoding="utf-8"))
        same = {k: v for k, v in old.get("settings", {}).items() if k != "seed"} == {
            k: v for k, v in plain(res["settings"]).items() if k != "seed"}
        if not same:
            raise ConfigurationError(f"--append: {previous} was measured with other settings; use another --out-dir")
        keys = {(r["method"], r["B"]) for r in res["rows"]}
        res["rows"] = [r for r in old["rows"] if (r["method"], r["B"]) not in keys] + res["rows"]
        if not math.isclose(old.get("real", {}).get("ppl", math.nan), res["real"]["ppl"], rel_tol=1e-4):
            raise ConfigurationError("--append: the held-out texts differ from the earlier run's")
    res["markdown"] = format_quality(res)
    plot = plots.synth_mauve(res, out_dir / "bench_synth_mauve.png")
    res["plot"] = str(plot) if plot else None
    write_json(out_dir / "bench_synth.json", res)
    write_text(out_dir / "bench_synth.md", res["markdown"] + "\n")
    return res


def render(res: dict[str, Any]) -> str:
    """What ``dpinfer bench synth`` prints: the Markdown table, and the plot's path when one was drawn."""
    return res["markdown"] + (f"\n\nplot: {res['plot']}" if res.get("plot") else "")
