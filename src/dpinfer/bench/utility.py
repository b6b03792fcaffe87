"""``dpinfer bench utility``: what the private data buys: each DP method over ε, on a measure only the private input
can raise, beside its public floor and the no-privacy ceiling.

    dpinfer bench utility [--tasks rag,synth,protect,sanitize] [--questions 60] [--epsilons 4,8,16,32,64,128]
                          [--merge A/bench_utility.json,B/...] [--support-of RUN/bench_utility.json] [--out DIR]

One table and one plot per task; every row decodes with the SAME model, on the same items (paired):

* **rag** (GenMedGPT dialogues from ``../shared/data``): the first ``--docs`` dialogues are stored; the questions are
  the patient messages of the first ``--questions`` of them whose doctor's reply names a drug or a test that the
  message does not (held-in). The vocabulary of drugs and tests is computed deterministically from the dialogues'
  replies (:func:`~dpinfer.bench.utility_vocab.medical_vocabulary`). Rows: ``none`` (the ceiling), ``public`` (the
  floor; both skipped with ``--no-rag-baselines``) and ``pad`` at each ``--epsilons`` value (``--pad-min-p``: its
  public support). Figures: the share of answers naming at least one of the reply's facts (Wilson 95%), the same on
  the questions whose reply names a drug, the mean share of the facts named (t 95%), each row's paired difference
  to the floor (t 95%). ``--support-of`` adds, for a finished run, where the first token of each fact the ceiling
  names stands in the public row (rank, gap to the maximum, inside PAD's support or not): why ``pad`` can or
  cannot name it.
* **synth** (Yelp): a sentiment classifier (all-MiniLM-L6-v2 + logistic regression; 1–2 stars negative, 4–5
  positive) trained on ``--synth-per-class`` texts per star rating from ``invisibleink`` at each
  ``--synth-epsilons`` value, from ``public`` (floor) and on real references (ceiling), tested on held-out real
  reviews; MAUVE beside it.
* **protect** (CommonsenseQA): ``dpinfer bench gtr``'s measurement, called, over ``--protect-temperatures``: the
  MiniLM answerer's accuracy against ROUGE-1 leakage, the original question (ceiling) and chance (floor).
* **sanitize** (TAB-ECHR, gold spans): ``original`` (ceiling), ``ner-scrub`` (floor), ``dp-fusion`` at each
  ``--sanitize-epsilons`` value: the share of the document's DATETIME, QUANTITY, LOC, ORG, DEM and MISC values the
  release keeps verbatim, the share of its years kept, PPL under the rewriting prompt with the original document.

A long bench can be split across processes (by ``--tasks``, or ``--epsilons`` with ``--no-rag-baselines``) and
printed as one table with ``--merge`` (the rag rows on the questions every run asked).

Intervals: :mod:`dpinfer.eval.intervals`. The JSON (per item: the targets, what was found, the answer) is written
after every row, so a run that is stopped keeps what it measured. Data that is absent skips its task with the reason.
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
from dpinfer.checks import int_at_least
from dpinfer.configs import Config, add_options, option
from dpinfer.defaults import RAG, SANITIZE
from dpinfer.errors import ConfigurationError

DESCRIPTION = __doc__
PROTECT_LABELS = {"dp-prompt": "DP-Prompt (one rewrite)", "dp-gtr-ndp": "DP-GTR (NDP)", "dp-gtr-jem": "DP-GTR (JEM)"}
TASKS = ("rag", "synth", "protect", "sanitize")
RAG_EPSILONS = (4.0, 8.0, 16.0, 32.0, 64.0, 128.0)
SYNTH_EPSILONS = (3.0, 10.0, 30.0)
PROTECT_TEMPERATURES = (0.5, 0.75, 1.0)
SANITIZE_EPSILONS = (20.0, 40.0, 160.0)
"""dp-fusion's ε per group (10 is out of reach at α = 2, δ = 1e-5: the conversion alone costs 10.13)."""


def _floats(values: tuple[float, ...]) -> str:
    return ",".join(f"{v:g}" for v in values)


@dataclass(frozen=True)
class UtilityBenchConfig(Config):
    """Settings of ``dpinfer bench utility`` (one field per option, its ``--help`` with it), checked when built."""

    tasks: tuple[str, ...] = option(TASKS, type=str, help=f"comma-separated subset of {','.join(TASKS)}")
    questions: int = option(60, help="rag: held-in GenMedGPT questions asked per row")
    docs: int = option(500, help="rag: GenMedGPT dialogues in the store (the questions are chosen among them)")
    epsilons: tuple[float, ...] = option(RAG_EPSILONS, type=str, help=(
        f"rag: comma-separated ε of the pad rows (default {_floats(RAG_EPSILONS)})"))
    rag_tokens: int = option(RAG.max_new_tokens, help=f"rag: T_max of each answer (default {RAG.max_new_tokens})")
    pad_min_p: str = option("default", help=f"rag: min-p of PAD's public support: a number, 'none' (Top-1⁺ alone) "
                                            f"or 'default' ({RAG.support_min_p})")
    synth_per_class: int = option(8, help="synth: training texts per star rating (1, 2, 4, 5) and row")
    synth_test: int = option(252, help="synth: held-out real reviews (as many of each of the 4 star ratings)")
    synth_tokens: int = option(48, help="synth: T_max of each synthetic text (the real texts are cut to it)")
    synth_epsilons: tuple[float, ...] = option(SYNTH_EPSILONS, type=str, help="synth: comma-separated ε of the "
                                                                              "invisibleink rows (default "
                                                                              f"{_floats(SYNTH_EPSILONS)})")
    protect_questions: int = option(20, help="protect: CSQA dev questions protected per τ")
    protect_temperatures: tuple[float, ...] = option(PROTECT_TEMPERATURES, type=str, help=(
        f"protect: comma-separated τ of stage 1 (default {_floats(PROTECT_TEMPERATURES)})"))
    sanitize_docs: int = option(10, help="sanitize: TAB documents (gold spans)")
    sanitize_chars: int = option(1200, help="sanitize: characters kept per document (at a paragraph break)")
    sanitize_tokens: int = option(64, help="sanitize: T_max of each release")
    sanitize_epsilons: tuple[float, ...] = option(SANITIZE_EPSILONS, type=str, help=(
        f"sanitize: comma-separated ε of the dp-fusion rows (default {_floats(SANITIZE_EPSILONS)})"))
    sanitize_min_p: str = option("default", help="sanitize: min-p of the dp-fusion rows' public support: a number, "
                                                 f"'none' or 'default' ({SANITIZE.min_p}; the floor keeps the default)")
    sanitize_baselines: bool = option(True, help="sanitize: run the ceiling (original) and the floor (ner-scrub) rows "
                                                 "too (--no-sanitize-baselines: a run that adds ε, see --merge)")
    seed: int = option(0, help="seed of the benchmark's noise (default 0)")
    model: str | None = option(None, type=str, help="model name or local folder (default: the embedded SmolLM2)")
    rag_baselines: bool = option(True, help="rag: run the ceiling (none) and the floor (public) rows too (default; "
                                            "--no-rag-baselines for a run that adds ε to another, see --merge)")
    merge: tuple[str, ...] = option((), type=str, help="comma-separated bench_utility.json files of one bench split "
                                                       "across processes: their rag rows on the questions every run "
                                                       "asked, one table; runs no model")
    protect_from: str | None = option(None, type=str, help="protect: a `dpinfer bench gtr` JSON (e.g. "
                                                           "docs/gtr_bench/csqa200_stage3_ban5.json) to tabulate and "
                                                           "plot instead of protecting questions again")
    support_of: str | None = option(None, type=str, help="rag: a bench_utility.json of an earlier run: add the "
                                                         "public-support diagnostic of its ceiling answers (runs no "
                                                         "generation)")
    out: str | None = option(None, type=str, help="folder for bench_utility.json, bench_utility.md and the plots")

    @property
    def support_min_p(self) -> float | None:
        """PAD's min-p for the pad rows (``--pad-min-p``)."""
        if self.pad_min_p == "default":
            return RAG.support_min_p
        return None if self.pad_min_p == "none" else float(self.pad_min_p)

    @property
    def dp_fusion_min_p(self) -> float | None:
        """min-p of the dp-fusion rows (``--sanitize-min-p``)."""
        if self.sanitize_min_p == "default":
            return SANITIZE.min_p
        return None if self.sanitize_min_p == "none" else float(self.sanitize_min_p)

    def __post_init__(self) -> None:
        for t in self.tasks:
            if t not in TASKS:
                raise ConfigurationError(f"--tasks: unknown task {t!r}; tasks: {', '.join(TASKS)}")
        for name in ("questions", "docs", "rag_tokens", "synth_per_class", "synth_test", "synth_tokens",
                     "protect_questions", "sanitize_docs", "sanitize_chars", "sanitize_tokens"):
            int_at_least(getattr(self, name), "--" + name.replace("_", "-"), 1)
        for name in ("epsilons", "synth_epsilons", "protect_temperatures", "sanitize_epsilons"):
            for e in getattr(self, name):
                if not (isinstance(e, float) and math.isfinite(e) and e > 0):
                    raise ConfigurationError(f"--{name.replace('_', '-')}: every value must be a positive number")
        if self.sanitize_min_p not in ("default", "none"):
            try:
                ok = 0 < float(self.sanitize_min_p) <= 1
            except ValueError:
                ok = False
            if not ok:
                raise ConfigurationError("--sanitize-min-p: give a number in (0, 1], 'none' or 'default'")
        if self.pad_min_p not in ("default", "none"):
            try:
                ok = 0 < float(self.pad_min_p) <= 1
            except ValueError:
                ok = False
            if not ok:
                raise ConfigurationError("--pad-min-p: give a number in (0, 1], 'none' or 'default'")
        for path in self.merge:
            if not Path(path).is_file():
                raise ConfigurationError(f"--merge: no such file: {path} (give the bench_utility.json of each run)")
        if self.protect_from is not None and not Path(self.protect_from).is_file():
            raise ConfigurationError(f"--protect-from: no such file: {self.protect_from}")
        if self.support_of is not None and not Path(self.support_of).is_file():
            raise ConfigurationError(f"--support-of: no such file: {self.support_of}")
        if self.questions > self.docs:
            raise ConfigurationError("--questions cannot exceed --docs (the questions are held-in: stored dialogues)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_options(p, UtilityBenchConfig)


def config_from_args(args: argparse.Namespace) -> UtilityBenchConfig:
    """The config of parsed ``dpinfer bench utility`` options (checked when built, before any model loads)."""
    lists: dict[str, Any] = {}
    if getattr(args, "merge", None) not in (None, ()):
        lists["merge"] = tuple(parse_list(args.merge, str, "--merge"))
    if getattr(args, "tasks", None) not in (None, ()):
        lists["tasks"] = tuple(parse_list(args.tasks, str, "--tasks"))
    for name in ("epsilons", "synth_epsilons", "protect_temperatures", "sanitize_epsilons"):
        if getattr(args, name, None) not in (None, ()):
            lists[name] = tuple(parse_list(getattr(args, name), float, "--" + name.replace("_", "-")))
    return UtilityBenchConfig.from_args(args, **lists)


# ------------------------------------------------------------------------------------------------ run
def run(config: UtilityBenchConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    from dpinfer._json import plain
    from dpinfer.bench.utility_rag import run_rag
    from dpinfer.bench.utility_sanitize import run_sanitize
    from dpinfer.bench.utility_synth import run_protect, run_synth
    from dpinfer.eval.embeddings import load_embedder
    from dpinfer.generation import resolve_lm

    if config.merge:
        return _merge(config)
    prog = ProgressLine(progress)
    if config.protect_from and config.tasks == ("protect",):  # tabulates a finished bench gtr run: no model
        from dpinfer.bench.utility_synth import protect_from_file

        part = protect_from_file(config.protect_from)
        res = {"model": part["gtr"]["settings"].get("model", "?"), "protect": part, "seconds": 0.0}
        res["markdown"] = markdown(res)
        if config.out:
            write_json(Path(config.out) / "bench_utility.json", {k: v for k, v in res.items() if k != "markdown"})
            write_text(Path(config.out) / "bench_utility.md", res["markdown"] + "\n")
            FIGURES["protect"](part, Path(config.out) / "utility_protect.png")
        return res
    lm = resolve_lm(config.model)
    t0 = time.perf_counter()
    if config.support_of:
        import json

        from dpinfer.bench.utility_rag import support_of_run

        res = json.loads(Path(config.support_of).read_text(encoding="utf-8"))
        res["rag"]["rows"] = [{**r, "epsilon": float(r["epsilon"])} for r in res["rag"]["rows"]]
        prog("rag: the public support at the ceiling's facts")
        res["rag"]["support"] = support_of_run(lm, res["rag"], config.epsilons)
        from dpinfer.bench.utility_rag import emission_screen

        prog("rag: the chance of each PAD setting to release the fact's first token")
        res["rag"]["screen"] = emission_screen(lm, load_embedder(), res["rag"], config.epsilons, seed=config.seed)
        res["markdown"] = markdown(res)
        if config.out:
            write_json(Path(config.out) / "bench_utility.json", {k: v for k, v in res.items() if k != "markdown"})
            write_text(Path(config.out) / "bench_utility.md", res["markdown"] + "\n")
        return res
    emb = load_embedder()
    res: dict[str, Any] = {"model": lm.name, "settings": plain(config.to_kwargs())}

    def save() -> None:
        res["seconds"] = time.perf_counter() - t0
        res["markdown"] = markdown(res)
        if config.out:  # after every row and task: a long run keeps what it measured
            out = Path(config.out)
            write_json(out / "bench_utility.json", {k: v for k, v in res.items() if k != "markdown"})
            write_text(out / "bench_utility.md", res["markdown"] + "\n")

    def checkpoint(task: str) -> Callable[[dict[str, Any]], None]:
        def put(partial: dict[str, Any]) -> None:
            res[task] = {**partial, "partial": True}
            save()
        return put

    runners: dict[str, Callable[[], dict[str, Any]]] = {
        "rag": lambda: run_rag(lm, emb, config, prog, checkpoint("rag")),
        "synth": lambda: run_synth(lm, emb, config, prog, checkpoint("synth")),
        "protect": lambda: run_protect(lm, config, prog),
        "sanitize": lambda: run_sanitize(lm, config, prog, checkpoint("sanitize")),
    }

    for task in (t for t in TASKS if t in config.tasks):
        try:
            res[task] = runners[task]()
        except Exception as exc:  # one task's failure is reported in its section; the others still run
            res[task] = {**res.get(task, {}), "failed": f"{type(exc).__name__}: {' '.join(str(exc).split())}"}
        save()
        if config.out and (res[task].get("rows") or res[task].get("gtr")):
            FIGURES[task](res[task], Path(config.out) / f"utility_{task}.png")
    return res


def _figure(name: str) -> Callable[[dict[str, Any], Path], Path | None]:
    def draw(part: dict[str, Any], path: Path) -> Path | None:
        from dpinfer.bench import plots

        if name == "protect":
            return plots.gtr_leakage_accuracy(part["gtr"], path, PROTECT_LABELS)
        return getattr(plots, f"utility_{name}")(part, path)  # type: ignore[no-any-return]
    return draw


FIGURES = {name: _figure(name) for name in TASKS}
"""Each task's plot (:mod:`dpinfer.bench.plots`), drawn into ``--out`` as ``utility_TASK.png``."""


def _merge(config: UtilityBenchConfig) -> dict[str, Any]:
    """``--merge``: the rag rows of several runs as one result (:func:`~dpinfer.bench.utility_rag.merge_rag`);
    the other tasks as the first run that has them measured them."""
    import json

    from dpinfer.bench.utility_rag import merge_rag

    def floats(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: floats(v) for k, v in x.items()}
        if isinstance(x, list):
            return [floats(v) for v in x]
        return float(x) if x in ("inf", "-inf", "nan") else x

    parts = [floats(json.loads(Path(p).read_text(encoding="utf-8"))) for p in config.merge]
    res: dict[str, Any] = {"model": parts[0]["model"], "merged": list(config.merge),
                           "seconds": max(float(p.get("seconds", 0.0)) for p in parts)}
    rag = [p["rag"] for p in parts if p.get("rag", {}).get("rows")]
    if rag:
        res["rag"] = merge_rag(rag)
    san = [p["sanitize"] for p in parts if p.get("sanitize", {}).get("rows")]
    if san:
        from dpinfer.bench.utility_sanitize import merge_sanitize

        res["sanitize"] = merge_sanitize(san)
    for task in ("synth", "protect"):
        found = [p[task] for p in parts if task in p]
        if found:
            res[task] = found[0]
    if res.get("synth", {}).get("rows"):  # a run stopped early has no paired difference for its ceiling yet
        from dpinfer.bench.utility_tasks import paired

        floor = next((r for r in res["synth"]["rows"] if r["method"] == "public"), None)
        for r in res["synth"]["rows"]:
            if floor is not None and r is not floor:
                r["vs_floor"] = paired(r["correct"], floor["correct"])
    res["markdown"] = markdown(res)
    if config.out:
        out = Path(config.out)
        write_json(out / "bench_utility.json", {k: v for k, v in res.items() if k != "markdown"})
        write_text(out / "bench_utility.md", res["markdown"] + "\n")
        for task, part in res.items():
            if task in FIGURES and isinstance(part, dict) and (part.get("rows") or part.get("gtr")):
                FIGURES[task](part, out / f"utility_{task}.png")
    return res


# ------------------------------------------------------------------------------------------------ report
def _pct(d: dict[str, Any] | None) -> str:
    if not d or not d.get("n"):
        return "–"
    lo, hi = d["wilson95"]
    return f"{d['count']}/{d['n']} ({100 * d['share']:.0f}% [{100 * lo:.0f}, {100 * hi:.0f}])"


def _ci(d: dict[str, Any] | None, scale: float = 100.0, signed: bool = False) -> str:
    if not d or d.get("mean") is None or not math.isfinite(d["mean"]):
        return "–"
    lo, hi = d["ci95"]
    sign = "+" if signed else ""

    def n(x: float) -> str:  # whole numbers, never "-0"
        return f"{round(scale * x):{sign}d}"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return n(d["mean"])
    return f"{n(d['mean'])} [{n(lo)}, {n(hi)}]"


def _eps(x: Any) -> str:
    if x is None:
        return "–"
    return "∞ (no privacy)" if math.isinf(x) else ("0" if x == 0 else f"{x:.3g}")


def _label(method: str) -> str:
    return {"none": "none (ceiling)", "public": "public (floor)"}.get(method, method)


def markdown(res: dict[str, Any]) -> str:
    out = [f"Model: {res['model']}; total {res.get('seconds', 0):.0f} s."]
    r = res.get("rag")
    if r:
        out.append("")
        if "skipped" in r:
            out.append(f"rag: skipped ({r['skipped']})")
        else:
            out += [
                f"**rag** ({r['questions']} held-in GenMedGPT questions whose doctor's reply names a drug or test "
                f"the question does not ({r['targets_per_item']:.1f} such facts per question; {r['items_with_drug']} "
                f"name a drug), {r['docs']} dialogues stored, T_max {r['T_max']}; vocabulary: "
                f"{r['vocabulary']['drugs']} drugs, {r['vocabulary']['tests']} tests, computed from the replies)", "",
                f"PAD's public support: Top-{RAG.support_top_k}⁺"
                + (f" ∩ min-p {mp:g}" if (mp := r.get("pad_min_p", RAG.support_min_p)) else " alone (no min-p)")
                + (" (the default)" if mp == RAG.support_min_p else ""), "",
                *md_table(["method", "ε", "answers naming ≥ 1 of the reply's facts (95% CI)",
                           "same, questions whose reply names a drug", "share of the reply's facts named, % (95% CI)",
                           "vs floor, points (paired 95% CI)", "tokens", "s / answer"], "llllllrr",
                          ([_label(x["method"]), _eps(x["epsilon"]), _pct(x["hit"]), _pct(x["drug_hit"]),
                            _ci(x["recall"]), _ci(x.get("vs_floor"), signed=True), f"{x['tokens']:.0f}",
                            f"{x['seconds']:.1f}"] for x in r["rows"]))]
            sup = r.get("support")
            if sup and sup["n"]:
                top = ", ".join(f"ε = {e}: {_pct(v)}" for e, v in sup["in_top1_plus"].items())
                out += ["", f"Why (a diagnostic of the ceiling's answers, not a release): of the {sup['n']} questions "
                        "whose `none` answer names a fact of the reply, the first token of that name is, under the "
                        f"public row (the question and `none`'s answer so far), at median rank {sup['median_rank']:g} "
                        f"and {sup['median_gap']:.2f} logits below the public maximum. In PAD's support with min-p "
                        f"{sup['min_p']:g} (within ln 2 of the maximum): {_pct(sup['in_min_p'])}; in Top-1⁺ alone "
                        f"(within 2C of the maximum): {top}."]
            _screen(out, r.get("screen"))
            if r.get("partial"):
                out.append(f"(partial: {len(r['rows'])} rows so far)")
            if r.get("failed"):
                out.append(f"(failed: {r['failed']})")
    _synth(out, res.get("synth"))
    _protect(out, res.get("protect"))
    _sanitize(out, res.get("sanitize"))
    return "\n".join(out)


def _screen(out: list[str], sc: dict[str, Any] | None) -> None:
    """The emission screen of PAD's settings (:func:`~dpinfer.bench.utility_rag.emission_screen`) as a table."""
    if not sc or not sc["n"]:
        return
    eps = list(next(iter(sc["mean"].values())))
    out += ["", f"Which support could release it (teacher-forced at the same {sc['n']} points; the private row's own "
            f"argmax is that token at {sc['private_argmax']} of them): mean probability, over the {sc['n']}, that "
            f"PAD releases the fact's first token there, % ({sc['draws']} noise draws each; C solved from ε and σ):",
            "", *md_table(["PAD's public support", *(f"ε = {e}" for e in eps)], "l" + "r" * len(eps),
                          ([lab, *(f"{100 * by[e]:.1f}" for e in eps)] for lab, by in sc["mean"].items()))]


def _head(out: list[str], name: str, part: dict[str, Any] | None) -> bool:
    """A task's heading lines when it was skipped; True when its table should follow."""
    if not part:
        return False
    out.append("")
    if "skipped" in part:
        out.append(f"{name}: skipped ({part['skipped']})")
        return False
    if "failed" in part and not part.get("rows"):
        out.append(f"{name}: failed ({part['failed']})")
        return False
    return True


def _tail(out: list[str], part: dict[str, Any]) -> None:
    if part.get("partial"):
        out.append(f"(partial: {len(part.get('rows', []))} rows so far)")
    if part.get("failed"):
        out.append(f"(failed: {part['failed']})")


def _mauve(x: dict[str, Any]) -> str:
    if x.get("mauve") is None or not math.isfinite(x["mauve"]):
        return "–"
    return f"{x['mauve']:.2f} [{x['mauve_low']:.2f}, {x['mauve_high']:.2f}]"


def _synth(out: list[str], y: dict[str, Any] | None) -> None:
    if not _head(out, "synth", y):
        return
    assert y is not None
    out += [f"**synth** (Yelp sentiment: 1–2 stars negative, 4–5 positive; MiniLM + logistic regression trained on "
            f"{y['per_class']} texts per star rating ({', '.join(y['stars'])}), tested on {y['test']} held-out real "
            f"reviews, half of each class (chance 0.50); T_max {y['T_max']}, B = {y['B']})", "",
            *md_table(["training texts", "ε", "accuracy on real reviews (95% CI)", "vs public, points (paired 95% CI)",
                       "MAUVE to the test reviews [interval]"], "lllll",
                      ([x["method"], _eps(x["epsilon"]), _pct(x["accuracy"]), _ci(x.get("vs_floor"), signed=True),
                        _mauve(x)] for x in y["rows"]))]
    _tail(out, y)


def _protect(out: list[str], p: dict[str, Any] | None) -> None:
    if not _head(out, "protect", p):
        return
    assert p is not None
    g, a = p["gtr"], p["answerer"]
    orig = g["original"][a]
    out += [f"**protect-prompt** ({p['questions']} CSQA dev questions, {a} answerer; chance 0.20; the original "
            f"question: {orig['accuracy']:.2f} [{orig['low']:.2f}, {orig['high']:.2f}], ROUGE-1 1.00)", "",
            *md_table(["method", "τ", "ε", "accuracy (95% CI)", "ROUGE-1 leakage (95% CI)"], "lllll",
                      ([PROTECT_LABELS.get(r["method"], r["method"]), f"{r['tau']:g}", _eps(r["epsilon"]),
                        f"{r['accuracy'][a]['accuracy']:.2f} [{r['accuracy'][a]['low']:.2f}, "
                        f"{r['accuracy'][a]['high']:.2f}]",
                        f"{r['rouge1']:.2f} [{r['rouge1_low']:.2f}, {r['rouge1_high']:.2f}]"]
                       for r in g["rows"] if r["method"] in PROTECT_LABELS))]


def _sanitize(out: list[str], s: dict[str, Any] | None) -> None:
    if not _head(out, "sanitize", s):
        return
    assert s is not None
    out += [f"**sanitize** ({s['docs']} TAB-ECHR documents, gold spans, first {s['chars']} characters, T_max "
            f"{s['T_max']}; {s.get('questions', 0)} fact questions with {s.get('choices', 4)} choices (chance "
            f"{1 / s.get('choices', 4):.2f}) about the document's {', '.join(s['types'])} values, answered from the "
            "release alone by the MiniLM answerer; roles: the document's "
            f"{', '.join(s.get('role_types', []))} slots the release reaches, still that type; kept = a value named "
            "verbatim)", "",
            *md_table(["method", "ε", "fact questions answered (95% CI)", "vs ner-scrub, points (paired 95% CI)",
                       "slots keeping their type's role (95% CI)", "values kept verbatim, pooled (95% CI)",
                       "years kept (95% CI)", "PPL (geometric mean, 95% CI)", "tokens"], "lllllllll",
                      ([_label_s(x), _eps(x["epsilon"]), _pct(x.get("facts")),
                        _ci(x.get("facts_vs_floor"), signed=True), _pct(x.get("roles")), _pct(x["values"]),
                        _pct(x["years"]), _ci(x["ppl"], scale=1.0), f"{x['tokens']:.0f}"] for x in s["rows"]))]
    _tail(out, s)


def _label_s(row: dict[str, Any]) -> str:
    method = row["method"]
    if method == "dp-fusion" and row.get("min_p", SANITIZE.min_p) != SANITIZE.min_p:
        return f"dp-fusion, min-p {row['min_p'] if row['min_p'] is not None else 'none'}"
    return {"original": "original (ceiling)", "ner-scrub": "ner-scrub (floor)"}.get(method, method)


def render(res: dict[str, Any]) -> str:
    return res["markdown"]
