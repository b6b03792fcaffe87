"""``dpinfer bench quality``: each task's DP method beside the same model without privacy and the public floor.

    dpinfer bench quality [--tasks sanitize,rag,protect,synth] [--runs 20] [--max-new-tokens N] [--questions 20]
                          [--settings previous,current] [--out DIR]

One run, one table. Every row decodes with the SAME model; per task:

* **sanitize** (the README's main job, ``examples/echr_case_001-66929.txt``, tagged once with the default tagger):
  ``dp-fusion`` beside ``original`` (the same decoding on the full document, no privacy: the ceiling) and
  ``ner-scrub`` (the public context only: the floor), ``--runs`` seeds each. A release *derails* when it leaves the
  document's language or topic: fewer than 5 words, an English function-word share below 0.25, or an
  all-MiniLM-L6-v2 cosine below 0.30 to the NER-scrubbed document (every tagged span replaced by its label). Also
  the median perplexity of the release given the rewriting prompt with the original document, the share of
  repeated 4-grams (loops), generated tokens and seconds per release.
* **rag** (GenMedGPT dialogues from ``../shared/data``): the first ``--docs`` dialogues are stored; the first
  ``--questions`` of them are asked (held-in: the patient's message; reference: the doctor's reply) with ``none``
  (the retrieved context without privacy: the ceiling), ``pad`` at its default ε and ``public`` (the question alone:
  the floor). ROUGE-L and MiniLM cosine to the reference, and the *on-topic* share: cosine ≥ 0.30 to the reference.
  The audit of PAD with each setting's public support (``--audit-trials`` per input) is printed under the rows.
* **protect** (CommonsenseQA dev, as ``dpinfer bench gtr``): DP-GTR's protected questions; the MiniLM answerer's
  accuracy on them beside the original questions (ceiling) and chance (floor), and ROUGE-1 leakage of the question.
* **synth** (Yelp reviews, as ``dpinfer bench synth``): InvisibleInk beside ``public`` (the floor; synthesis has no
  no-privacy method of its own): MAUVE to held-out reviews and the on-topic share (MiniLM cosine ≥ 0.30 to the
  nearest held-out review).

``--settings previous,current`` runs sanitize and rag under the previous defaults (no min-p support,
a document-following T_max without cap, no public opening; RAG's plain completion prompt) and under the current
ones, in the same run;
sanitize's privacy checks (``dpinfer audit dp-fusion`` with the sanitisation support, and the LOSS attack of ``dpinfer
bench sanitize`` on ``--loss-docs`` TAB documents) are printed for both in the same table. ``--max-new-tokens``
caps every sanitize row's T_max (a measurement shortcut on slow machines; it is printed). Intervals: Wilson 95% for
shares (:func:`~dpinfer.eval.metrics.wilson_interval`). Data that is absent skips its task with the reason.

A long bench can be split across processes (``--settings previous`` and ``--settings current``; ``--seed 0 --runs 10``
and ``--seed 10 --runs 10``; ``--runs 0 --baseline-runs 10`` for the ceiling and floor alone; ``--runs 0`` for
the privacy checks alone, ``--audit-trials 0 --loss-docs 0`` in the others), each with its own ``--out``, and printed
as one table with ``--merge A/bench_quality.json,B/bench_quality.json``. The sanitize rows are written after every
release.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpinfer.bench.harness import ProgressLine, md_table, parse_list, write_json, write_text
from dpinfer.bench.quality_tasks import (
    BASELINES,
    ENGLISH_THRESHOLD,
    MAIN_JOB,
    MIN_WORDS,
    SETTINGS,
    TASKS,
    TOPIC_THRESHOLD,
    run_privacy_checks,
    run_protect,
    run_rag,
    run_sanitize,
    run_synth,
    summarise_row,
)
from dpinfer.checks import int_at_least
from dpinfer.configs import Config, add_options, option
from dpinfer.defaults import RAG, SANITIZE
from dpinfer.errors import ConfigurationError
from dpinfer.eval.intervals import share  # noqa: F401 (re-exported)

DESCRIPTION = __doc__


@dataclass(frozen=True)
class QualityBenchConfig(Config):
    """Settings of ``dpinfer bench quality`` (one field per option, its ``--help`` with it), checked when built."""

    tasks: tuple[str, ...] = option(TASKS, type=str, help=f"comma-separated subset of {','.join(TASKS)}")
    settings: tuple[str, ...] = option(SETTINGS, type=str, help="previous (no min-p support, no T_max cap, no "
                                                                "public opening, PAD's completion prompt), current, "
                                                                "or both (default)")
    runs: int = option(20, help="sanitize releases per row (seeds S..S+N-1, S = --seed; 0: only the privacy "
                                "checks)")
    baseline_runs: int | None = option(None, type=int, help="releases of the ceiling and floor rows (original, "
                                                            "ner-scrub; default: --runs)")
    baselines: tuple[str, ...] = option(BASELINES, type=str, help="which of the ceiling and floor rows to run "
                                                                  "(original, ner-scrub; e.g. ner-scrub alone to "
                                                                  "add releases to the floor)")
    document: str = option(MAIN_JOB, help="the sanitize document (default: the README's main job)")
    max_new_tokens: int | None = option(None, type=int, help="cap every sanitize row's T_max (a measurement "
                                                             "shortcut; default: each setting's own T_max)")
    questions: int = option(20, help="held-in GenMedGPT questions asked per row")
    docs: int = option(100, help="GenMedGPT dialogues in the RAG store")
    max_doc_tokens: int = option(RAG.max_doc_tokens, help="RAG: tokens kept per document")
    protect_questions: int = option(10, help="CSQA questions protected")
    synth_texts: int = option(16, help="synthetic texts per synth row")
    synth_tokens: int = option(48, help="T_max of each synthetic text")
    loss_docs: int = option(3, help="TAB documents of the LOSS attack (0: skip)")
    loss_chars: int = 1200
    audit_trials: int = option(20000, help="audit trials per input (0: skip)")
    seed: int = option(0, help="seed of the benchmark's noise (default 0)")
    model: str | None = option(None, type=str, help="model name or local folder (default: the embedded SmolLM2)")
    merge: tuple[str, ...] = option((), type=str, help="comma-separated bench_quality.json files of one bench split "
                                                       "across processes (e.g. --settings previous and --settings "
                                                       "current, or --seed 0 and --seed 10): one table of their rows; "
                                                       "runs no model")
    out: str | None = option(None, type=str, help="folder for bench_quality.json and bench_quality.md")

    def __post_init__(self) -> None:
        for t in self.tasks:
            if t not in TASKS:
                raise ConfigurationError(f"--tasks: unknown task {t!r}; tasks: {', '.join(TASKS)}")
        for b in self.baselines:
            if b not in BASELINES:
                raise ConfigurationError(f"--baselines: unknown row {b!r}; rows: {', '.join(BASELINES)}")
        for s in self.settings:
            if s not in SETTINGS:
                raise ConfigurationError(f"--settings: unknown setting {s!r}; settings: {', '.join(SETTINGS)}")
        for name in ("runs", "questions", "docs", "max_doc_tokens", "protect_questions", "synth_texts",
                     "synth_tokens", "baseline_runs", "loss_docs", "audit_trials"):
            if getattr(self, name) is not None:
                int_at_least(getattr(self, name), "--" + name.replace("_", "-"),
                             0 if name in ("loss_docs", "audit_trials", "runs", "baseline_runs") else 1)
        for path in self.merge:
            if not Path(path).is_file():
                raise ConfigurationError(f"--merge: no such file: {path} (give the bench_quality.json of each run)")
        if self.questions > self.docs:
            raise ConfigurationError("--questions cannot exceed --docs (the questions are held-in: stored dialogues)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_options(p, QualityBenchConfig)


def config_from_args(args: argparse.Namespace) -> QualityBenchConfig:
    """The config of parsed ``dpinfer bench quality`` options (checked when built, before any model loads)."""
    names = ("tasks", "settings", "baselines", "merge")
    lists = {name: tuple(parse_list(getattr(args, name), str, "--" + name)) for name in names
             if name in args and getattr(args, name) not in (None, ())}
    return QualityBenchConfig.from_args(args, **lists)


# ------------------------------------------------------------------------------------------------ run
def run(config: QualityBenchConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    from dpinfer._json import plain
    from dpinfer.eval.embeddings import load_embedder
    from dpinfer.generation import resolve_lm

    if config.merge:
        res = merge_results([Path(p) for p in config.merge])
        if config.out:
            write_json(Path(config.out) / "bench_quality.json", res)
            write_text(Path(config.out) / "bench_quality.md", res["markdown"] + "\n")
        return res
    prog = ProgressLine(progress)
    lm = resolve_lm(config.model)
    emb = load_embedder()
    res: dict[str, Any] = {"model": lm.name, "settings": plain(config.to_kwargs())}
    t0 = time.perf_counter()
    def checkpoint(partial: dict[str, Any]) -> None:  # every release: a run stopped early keeps what it measured
        if config.out:
            write_json(Path(config.out) / "bench_quality.json",
                       {**res, "sanitize": partial, "seconds": time.perf_counter() - t0, "partial": True})

    runners: dict[str, Callable[[], dict[str, Any]]] = {
        "sanitize": lambda: run_sanitize(lm, emb, config, prog, checkpoint),
        "rag": lambda: run_rag(lm, emb, config, prog),
        "protect": lambda: run_protect(lm, config, prog),
        "synth": lambda: run_synth(lm, emb, config, prog),
    }
    steps = [t for t in TASKS if t in config.tasks]
    if "sanitize" in steps:
        steps.insert(1, "checks")
    for task in steps:
        try:
            if task == "checks":
                if "rows" in res["sanitize"]:
                    res["sanitize"]["checks"] = run_privacy_checks(lm, config, prog)
            else:
                res[task] = runners[task]()
        except Exception as exc:  # one task's failure is reported in its section; the others still run
            failed = {"skipped": f"failed: {type(exc).__name__}: {' '.join(str(exc).split())}"}
            if task == "checks":
                res["sanitize"]["checks"] = [{"setting": "–", "min_p": None, "loss": failed}]
            else:
                res[task] = failed
        res["seconds"] = time.perf_counter() - t0
        if config.out:  # written after every task: a long run keeps what it measured
            write_json(Path(config.out) / "bench_quality.json", res)
        res["markdown"] = markdown(res)
        if config.out:
            write_text(Path(config.out) / "bench_quality.md", res["markdown"] + "\n")
    return res


def _unplain(value: Any) -> Any:
    """The inverse of :func:`dpinfer._json.plain` for the bench's JSON ("inf", "-inf", "nan" back to floats)."""
    if isinstance(value, dict):
        return {k: _unplain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unplain(v) for v in value]
    return float(value) if value in ("inf", "-inf", "nan") else value


def merge_results(paths: list[Path]) -> dict[str, Any]:
    """One result of several runs of the same bench (split across processes by ``--settings`` or ``--seed``): the
    sanitize rows of the same setting, method and decoding are pooled (their releases together, the figures
    recomputed); a seed measured twice in one row is refused. The privacy checks and the other tasks are kept as
    each run measured them."""
    import json

    parts = [_unplain(json.loads(p.read_text(encoding="utf-8"))) for p in paths]
    models = {p.get("model") for p in parts}
    if len(models) != 1:
        raise ConfigurationError(f"--merge: the runs used different models ({', '.join(sorted(map(str, models)))})")
    res: dict[str, Any] = {"model": parts[0]["model"], "merged": [str(p) for p in paths],
                           "seconds": max(float(p.get("seconds", 0.0)) for p in parts)}
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    checks: list[dict[str, Any]] = []
    for part in parts:
        s = part.get("sanitize")
        if not s or "rows" not in s:
            continue
        if "sanitize" not in res:
            res["sanitize"] = {k: v for k, v in s.items() if k not in ("rows", "checks")}
        for r in s["rows"]:
            key = (r["setting"], r["method"], r["T_max"], r.get("min_p"), r.get("opening"))
            if key not in rows:
                rows[key] = {**r, "releases": []}
            seen = {x["seed"] for x in rows[key]["releases"]}
            if seen & {x["seed"] for x in r["releases"]}:
                raise ConfigurationError(f"--merge: {r['setting']} {r['method']} has the same seed in two runs "
                                         "(give each run its own --seed)")
            rows[key]["releases"] += r["releases"]
        checks += [c for c in s.get("checks") or [] if c.get("audit") or c.get("loss")]
    if "sanitize" in res:
        order = {"previous": 0, "current": 1, "dp-fusion": 0, "original": 1, "ner-scrub": 2}
        res["sanitize"]["rows"] = [summarise_row({**r, "releases": sorted(r["releases"], key=lambda x: x["seed"])})
                                   for r in sorted(rows.values(), key=lambda r: (order.get(r["setting"], 2),
                                                                                  order.get(r["method"], 3)))]
        res["sanitize"]["checks"] = sorted(_merge_checks(checks), key=lambda c: order.get(c["setting"], 2))
    for task in ("rag", "protect", "synth"):
        found = [p[task] for p in parts if task in p]
        if found:
            res[task] = next((f for f in found if "skipped" not in f), found[0])
    res["markdown"] = markdown(res)
    return res


def _merge_checks(checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One privacy-check row per setting: its audit and its LOSS attack from whichever run measured them (a run
    that skipped one, e.g. ``--audit-trials 0``, gives way to a run that measured it)."""
    out: dict[str, dict[str, Any]] = {}
    for c in checks:
        row = out.setdefault(c["setting"], {"setting": c["setting"], "min_p": c.get("min_p"),
                                            "opening": c.get("opening")})
        for key in ("audit", "loss"):
            value = c.get(key)
            if value and (key not in row or ("skipped" in row[key] and "skipped" not in value)):
                row[key] = value
    return list(out.values())


def _pct(d: dict[str, Any] | None) -> str:
    if not d:
        return "–"
    lo, hi = d["wilson95"]
    return f"{d['count']}/{d['n']} ({100 * d['share']:.0f}% [{100 * lo:.0f}, {100 * hi:.0f}])"


def _f(x: Any, nd: int = 2) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x) and not math.isinf(x)):
        return "–"
    if isinstance(x, float) and math.isinf(x):
        return "∞"
    return f"{x:.{nd}f}"


def _eps(x: Any) -> str:
    if x is None:
        return "–"
    return "∞ (no privacy)" if math.isinf(x) else ("0" if x == 0 else f"{x:.3g}")


def markdown(res: dict[str, Any]) -> str:
    out = [f"Model: {res['model']}; total {res['seconds']:.0f} s" + (
        f" (the longest of {len(res['merged'])} runs side by side)." if res.get("merged") else ".")]
    _section(out, "sanitize", res.get("sanitize"), lambda s: [
        f"**sanitize** (README main job: {s['document_tokens']} document tokens, {s['spans']} tagged spans in "
        f"{s['groups']} groups; derailed = < {MIN_WORDS} words, English function-word share < {ENGLISH_THRESHOLD} or "
        f"MiniLM cosine < {TOPIC_THRESHOLD} to the NER-scrubbed document)", "",
        *md_table(["setting", "method", "ε", "T_max", "min-p", "opening", "derailed (95% CI)", "English share",
                   "cosine", "PPL", "4-gram loops", "tokens", "s / release"], "l" * 13,
                  ([r["setting"], r["method"], _eps(r.get("epsilon")), r["T_max"], r["min_p"] or "–",
                    r.get("opening") or "–", _pct(r["derailed"]), _f(r["english"]), _f(r["similarity"]),
                    _f(r["ppl"], 1), _f(r["loops"]), _f(r["tokens"], 0), _f(r["seconds"], 1)] for r in s["rows"])),
        *(["", *md_table(["setting", "DP-Fusion support", "audit ε lower bound / claimed (trials)",
                          "LOSS ASR (games; chance 0.20)"], "llll", map(_check_row, s["checks"]))]
          if s.get("checks") else [])])
    _section(out, "rag", res.get("rag"), lambda r: [
        f"**rag** ({r['questions']} held-in GenMedGPT questions, {r['docs']} dialogues stored; on topic = MiniLM "
        f"cosine ≥ {TOPIC_THRESHOLD} to the doctor's reply)", "",
        *md_table(["setting", "method", "ε", "on topic (95% CI)", "ROUGE-L", "cosine", "tokens", "s / answer"],
                  "l" * 8, ([x["setting"], x["method"], _eps(x["epsilon"]), _pct(x["on_topic"]), _f(x["rouge_l"]),
                             _f(x["similarity"]), _f(x["tokens"], 0), _f(x["seconds"], 1)] for x in r["rows"])),
        *(["", *md_table(["setting", "PAD support", "audit ε lower bound / claimed (trials)"], "lll",
                         ([c["setting"], f"Top-{c['top_k'] or 'all'}⁺" + (f" ∩ min-p {c['min_p']:g}" if c["min_p"]
                                                                         else ""),
                           _check_row(c)[2]] for c in r["checks"]))] if r.get("checks") else [])])
    _section(out, "protect", res.get("protect"), lambda p: [
        f"**protect-prompt** ({p['questions']} CSQA dev questions, MiniLM answerer)", "",
        *md_table(["method", "ε", "accuracy (95% CI)", "ROUGE-1 leakage"], "llll",
                  ([x["method"], _eps(x["epsilon"]), _f(x["accuracy"]) + (
                      f" [{_f(x['accuracy_ci95'][0])}, {_f(x['accuracy_ci95'][1])}]" if x.get("accuracy_ci95")
                      else ""), _f(x["rouge1"])] for x in p["rows"]))])
    _section(out, "synth", res.get("synth"), lambda y: [
        f"**synth** (Yelp; {y['real']} held-out reviews; on topic = MiniLM cosine ≥ {TOPIC_THRESHOLD} to the "
        "nearest)", "",
        *md_table(["method", "ε", "B", "MAUVE", "on topic (95% CI)", "cosine to nearest"], "llllll",
                  ([x["method"], _eps(x["epsilon"]), x["B"], _f(x["mauve"]), _pct(x["on_topic"]),
                    _f(x["similarity"])] for x in y["rows"]))])
    return "\n".join(out)


def _section(out: list[str], name: str, part: dict[str, Any] | None,
             lines: Callable[[dict[str, Any]], list[str]]) -> None:
    """A task's part of the report: nothing when it did not run, one line when it was skipped, else ``lines``."""
    if not part:
        return
    out.append("")
    out += [f"{name}: skipped ({part['skipped']})"] if "skipped" in part else lines(part)


def _check_row(c: dict[str, Any]) -> list[str]:
    """A row of the sanitisation checks table: the support, the audit's ε lower bound, the LOSS attack."""
    a = c.get("audit")
    audit = f"{a['epsilon_lb']:.3f} / {a['claimed_epsilon']:.3f} ({a['trials']})" if a else "–"
    loss = c.get("loss") or {}
    if "skipped" in loss:
        lt = f"skipped ({loss['skipped']})"
    elif loss:
        ci = loss.get("asr_ci95") or [math.nan, math.nan]
        lt = (f"{_f(loss.get('asr'))} [{_f(ci[0])}, {_f(ci[1])}] ({loss.get('games')} games, {loss['docs']} TAB docs, "
              f"T_max {loss['T_max']})")
    else:
        lt = "–"
    sup = (f"top-k {SANITIZE.top_k}, τ {SANITIZE.temperature}" + (f", min-p {c['min_p']}" if c["min_p"] else "")
           + (f", opening ≤ {c['opening']} tokens (LOSS only)" if c.get("opening") else ""))
    return [c["setting"], sup, audit, lt]


def render(res: dict[str, Any]) -> str:
    return res["markdown"]
