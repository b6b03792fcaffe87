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
* **protect** (CommonsenseQA dev, as ``dpinfer bench gtr``): DP-GTR's protected questions; the MiniLM answerer's
  accuracy on them beside the original questions (ceiling) and chance (floor), and ROUGE-1 leakage of the question.
* **synth** (Yelp reviews, as ``dpinfer bench synth``): InvisibleInk beside ``public`` (the floor; synthesis has no
  no-privacy method of its own): MAUVE to held-out reviews and the on-topic share (MiniLM cosine ≥ 0.30 to the
  nearest held-out review).

``--settings previous,current`` runs sanitize and rag under the defaults before the quality work (no min-p support,
a document-following T_max without cap; RAG's plain completion prompt) and under the current ones, in the same run;
sanitize's privacy checks (``dpinfer audit dp-fusion`` with the sanitisation support, and the LOSS attack of ``dpinfer
bench sanitize`` on ``--loss-docs`` TAB documents) are printed for both in the same table. ``--max-new-tokens``
caps every sanitize row's T_max (a measurement shortcut on slow machines; it is printed). Intervals: Wilson 95% for
shares (:func:`~dpinfer.eval.metrics.wilson_interval`). Data that is absent skips its task with the reason.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpinfer.accounting.calibration import Budget, Spec
from dpinfer.bench.harness import write_json, write_text
from dpinfer.defaults import RAG, SANITIZE
from dpinfer.eval.intervals import share

DESCRIPTION = __doc__

TASKS = ("sanitize", "rag", "protect", "synth")
SETTINGS = ("previous", "current")
MAIN_JOB = "examples/echr_case_001-66929.txt"
TOPIC_THRESHOLD = 0.30
"""MiniLM cosine below which a release is off topic (fixed before measuring)."""
ENGLISH_THRESHOLD = 0.25
"""English function-word share below which a release is off language (English prose: about 0.4-0.5)."""
MIN_WORDS = 5

FUNCTION_WORDS = frozenset("""
a about above after against all also an and any are as at be because been before being below between both but by
can could did do does during each few for from had has have having he her here hers him his how i if in into is it
its itself just may me more most must my no nor not of off on once only or other our out over own same she should
so some such than that the their them then there these they this those through to too under until up very was we
were what when where which while who whom why will with would you your
""".split())


def english_share(text: str) -> float:
    """Share of the words of ``text`` that are English function words (0 for no word).

    >>> english_share("The court held that the applicant was in prison.")
    0.5555555555555556
    >>> english_share("Ein Leben ist zu kurz, sie hatte mit den Kommunen")
    0.0
    """
    words = re.findall(r"[^\W\d_]+", text.lower())
    return sum(w in FUNCTION_WORDS for w in words) / len(words) if words else 0.0


def word_count(text: str) -> int:
    return len(re.findall(r"[^\W\d_]+", text))


@dataclass
class QualityBenchConfig:
    """Settings of ``dpinfer bench quality`` (one field per option)."""

    tasks: tuple[str, ...] = TASKS
    settings: tuple[str, ...] = SETTINGS
    runs: int = 20
    baseline_runs: int | None = None
    """Releases of the ceiling and floor rows (``original``, ``ner-scrub``); None: ``runs``."""
    document: str = MAIN_JOB
    max_new_tokens: int | None = None
    questions: int = 20
    docs: int = 100
    max_doc_tokens: int = RAG.max_doc_tokens
    protect_questions: int = 10
    synth_texts: int = 16
    synth_tokens: int = 48
    loss_docs: int = 3
    loss_chars: int = 1200
    audit_trials: int = 20000
    seed: int = 0
    model: str | None = None
    out: str | None = None


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = QualityBenchConfig()
    p.add_argument("--tasks", default=",".join(d.tasks), help=f"comma-separated subset of {','.join(TASKS)}")
    p.add_argument("--settings", default=",".join(d.settings),
                   help="previous (the defaults before the quality work), current, or both (default)")
    p.add_argument("--runs", type=int, default=d.runs, help="sanitize releases per row (seeds 0..N-1)")
    p.add_argument("--baseline-runs", type=int, default=None,
                   help="releases of the ceiling and floor rows (original, ner-scrub; default: --runs)")
    p.add_argument("--document", default=d.document, help="the sanitize document (default: the README's main job)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="cap every sanitize row's T_max (a measurement shortcut; default: each setting's own T_max)")
    p.add_argument("--questions", type=int, default=d.questions, help="held-in GenMedGPT questions asked per row")
    p.add_argument("--docs", type=int, default=d.docs, help="GenMedGPT dialogues in the RAG store")
    p.add_argument("--max-doc-tokens", type=int, default=d.max_doc_tokens, help="RAG: tokens kept per document")
    p.add_argument("--protect-questions", type=int, default=d.protect_questions, help="CSQA questions protected")
    p.add_argument("--synth-texts", type=int, default=d.synth_texts, help="synthetic texts per synth row")
    p.add_argument("--synth-tokens", type=int, default=d.synth_tokens, help="T_max of each synthetic text")
    p.add_argument("--loss-docs", type=int, default=d.loss_docs, help="TAB documents of the LOSS attack (0: skip)")
    p.add_argument("--audit-trials", type=int, default=d.audit_trials, help="audit trials per input (0: skip)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--model", default=None)
    p.add_argument("--out", default=None, help="folder for bench_quality.json and bench_quality.md")


def config_from_args(args: argparse.Namespace) -> QualityBenchConfig:
    from dpinfer.errors import ConfigurationError
    from dpinfer.validation import int_at_least

    tasks = tuple(t.strip() for t in args.tasks.split(",") if t.strip())
    settings = tuple(t.strip() for t in args.settings.split(",") if t.strip())
    for t in tasks:
        if t not in TASKS:
            raise ConfigurationError(f"--tasks: unknown task {t!r}; tasks: {', '.join(TASKS)}")
    for s in settings:
        if s not in SETTINGS:
            raise ConfigurationError(f"--settings: unknown setting {s!r}; settings: {', '.join(SETTINGS)}")
    if not tasks or not settings:
        raise ConfigurationError("--tasks and --settings need at least one entry")
    for name in ("runs", "questions", "docs", "max_doc_tokens", "protect_questions", "synth_texts", "synth_tokens"):
        int_at_least(getattr(args, name), "--" + name.replace("_", "-"), 1)
    if args.baseline_runs is not None:
        int_at_least(args.baseline_runs, "--baseline-runs", 1)
    for name in ("loss_docs", "audit_trials"):
        int_at_least(getattr(args, name), "--" + name.replace("_", "-"), 0)
    if args.questions > args.docs:
        raise ConfigurationError("--questions cannot exceed --docs (the questions are held-in: stored dialogues)")
    return QualityBenchConfig(
        tasks=tasks, settings=settings, runs=args.runs, baseline_runs=args.baseline_runs, document=args.document,
        max_new_tokens=args.max_new_tokens,
        questions=args.questions, docs=args.docs, max_doc_tokens=args.max_doc_tokens,
        protect_questions=args.protect_questions, synth_texts=args.synth_texts, synth_tokens=args.synth_tokens,
        loss_docs=args.loss_docs,
        audit_trials=args.audit_trials, seed=args.seed, model=args.model, out=args.out)


# ------------------------------------------------------------------------------------------------ settings
def sanitize_options(setting: str) -> dict[str, Any]:
    """The sanitize keyword arguments of a setting (``previous``: no min-p support, T_max without cap)."""
    if setting == "previous":
        return {"min_p": None, "cap": None}
    return {"min_p": SANITIZE.min_p, "cap": SANITIZE.max_new_tokens_cap}


def rag_template(setting: str) -> Any:
    from dpinfer.pipelines.rag import RagTemplate

    return RagTemplate.completion() if setting == "previous" else RagTemplate()


def _mean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if math.isfinite(x)]
    return statistics.fmean(xs) if xs else math.nan


# ------------------------------------------------------------------------------------------------ sanitize
def run_sanitize(lm: Any, emb: Any, cfg: QualityBenchConfig, progress: Callable[[str], None]) -> dict[str, Any]:
    from dpinfer.eval.metrics import perplexity, repeated_ngram_share
    from dpinfer.paths import repo_root
    from dpinfer.pipelines.sanitize import (
        DEFAULT_INSTRUCTION,
        build_prompt,
        default_max_new_tokens,
        prepare_contexts,
        resolve_groups,
        resolve_spans,
        sanitize,
    )

    path = Path(cfg.document)
    if not path.is_absolute() and not path.is_file() and repo_root() is not None:
        path = repo_root() / cfg.document  # type: ignore[operator]
    if not path.is_file():
        return {"skipped": f"document not found: {cfg.document}"}
    text = path.read_text(encoding="utf-8")
    progress("sanitize: tagging")
    spans = resolve_spans(text, tagger=SANITIZE.tagger)
    scrubbed = text
    for s in sorted(spans, key=lambda s: s.start, reverse=True):
        scrubbed = scrubbed[:s.start] + f"[{s.label}]" + scrubbed[s.end:]
    ref = emb.encode([scrubbed])[0]
    prep = prepare_contexts(lm, text, spans, resolve_groups(spans, None), DEFAULT_INSTRUCTION)
    original_ctx = lm.encode(build_prompt(lm, text, DEFAULT_INSTRUCTION)[0])
    rows = []
    for setting in cfg.settings:
        opts = sanitize_options(setting)
        t_max = default_max_new_tokens(prep.document_tokens, cap=opts["cap"])
        if cfg.max_new_tokens is not None:
            t_max = min(t_max, cfg.max_new_tokens)
        for method in ("dp-fusion", "original", "ner-scrub"):
            if setting == "previous" and method != "dp-fusion" and "current" in cfg.settings:
                continue  # the baselines' decoding changed only by min-p: measured under the current setting
            row: dict[str, Any] = {"task": "sanitize", "setting": setting, "method": method, "T_max": t_max,
                                   "min_p": opts["min_p"], "releases": []}
            n_runs = cfg.runs if method == "dp-fusion" or cfg.baseline_runs is None else cfg.baseline_runs
            for r in range(n_runs):
                progress(f"sanitize {setting} {method} {r + 1}/{n_runs}")
                res = sanitize(text, lm=lm, method=method, spans=spans, max_new_tokens=t_max, seed=cfg.seed + r,
                               min_p=opts["min_p"])
                sim = float(emb.encode([res.text if res.text.strip() else "."])[0] @ ref)
                eng = english_share(res.text)
                words = word_count(res.text)
                row["releases"].append({
                    "seed": cfg.seed + r, "tokens": res.generated_tokens, "seconds": res.seconds,
                    "english": eng, "similarity": sim, "words": words,
                    "derailed": words < MIN_WORDS or eng < ENGLISH_THRESHOLD or sim < TOPIC_THRESHOLD,
                    "ppl": perplexity(lm, original_ctx, res.token_ids),
                    "loops": repeated_ngram_share(res.token_ids, 4), "start": res.text[:80],
                })
                row["epsilon"] = res.guarantee.epsilon
            rel = row["releases"]
            row.update({
                "derailed": share(sum(x["derailed"] for x in rel), len(rel)),
                "english": _mean([x["english"] for x in rel]), "similarity": _mean([x["similarity"] for x in rel]),
                "ppl": statistics.median(x["ppl"] for x in rel), "loops": _mean([x["loops"] for x in rel]),
                "tokens": _mean([x["tokens"] for x in rel]), "seconds": _mean([x["seconds"] for x in rel]),
            })
            rows.append(row)
    return {"rows": rows, "document_tokens": prep.document_tokens, "spans": len(spans),
            "groups": len(prep.group_names)}


def run_privacy_checks(lm: Any, cfg: QualityBenchConfig, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    """The audit of DP-Fusion with each setting's support and the LOSS attack of each setting (same table)."""
    import dataclasses

    from dpinfer.audit.runner import run_audit
    from dpinfer.audit.scenarios import DELTA, EPSILON, scenario
    from dpinfer.mechanisms.dp_fusion import DPFusion

    out = []
    for setting in cfg.settings:
        opts = sanitize_options(setting)
        row: dict[str, Any] = {"setting": setting, "min_p": opts["min_p"]}
        if cfg.audit_trials:
            progress(f"audit dp-fusion ({setting} support)")
            sc = scenario("dp-fusion")

            def build(min_p: float | None = opts["min_p"], t: int = sc.max_new_tokens) -> DPFusion:
                return DPFusion.calibrated(Budget({"GROUP": EPSILON}, DELTA),
                                           Spec(t, alpha=8.0, temperature=SANITIZE.temperature,
                                                top_k=SANITIZE.top_k, min_p=min_p))

            res = run_audit(dataclasses.replace(sc, build=build), trials=cfg.audit_trials, seed=cfg.seed)
            row["audit"] = {"claimed_epsilon": res.claimed_epsilon, "epsilon_lb": res.epsilon_lb,
                            "trials": res.trials, "exceeds": res.exceeds}
        if cfg.loss_docs:
            row["loss"] = _loss(lm, cfg, opts, progress, setting)
        out.append(row)
    return out


def _loss(lm: Any, cfg: QualityBenchConfig, opts: dict[str, Any], progress: Callable[[str], None],
          setting: str) -> dict[str, Any]:
    from dpinfer.bench.sanitize import load_tab, run_quality
    from dpinfer.errors import DataNotFoundError

    try:
        docs = load_tab(None, cfg.loss_docs, cfg.loss_chars)
        pool = load_tab(None, 40, cfg.loss_chars, skip=cfg.loss_docs)
    except DataNotFoundError as exc:
        return {"skipped": str(exc)}
    t_max = cfg.max_new_tokens or 64
    res = run_quality(lm, docs, pool, epsilons=(SANITIZE.epsilon,), methods=("dp-fusion",), max_new_tokens=t_max,
                      seed=cfg.seed, progress=lambda s: progress(f"LOSS ({setting}) {s}"),
                      decoding={"min_p": opts["min_p"]})
    r = res["rows"][0]
    return {"asr": r.get("asr"), "asr_ci95": r.get("asr_ci95"), "games": r.get("games"), "docs": len(docs),
            "T_max": t_max, "chance": 0.2}


# ------------------------------------------------------------------------------------------------ rag
def run_rag(lm: Any, emb: Any, cfg: QualityBenchConfig, progress: Callable[[str], None]) -> dict[str, Any]:
    import json

    from dpinfer.errors import DataNotFoundError, DPInferError
    from dpinfer.eval.rag_metrics import RougeL
    from dpinfer.paths import data_file
    from dpinfer.pipelines.rag import PrivateRAG

    try:
        path = data_file("medical", "genmedgpt_dialogues.jsonl")
    except DataNotFoundError as exc:
        return {"skipped": str(exc)}
    with path.open(encoding="utf-8") as f:
        recs = [json.loads(line) for _, line in zip(range(cfg.docs), f, strict=False)]
    rouge = RougeL()
    rows = []
    with tempfile.TemporaryDirectory(prefix="dpinfer-quality-") as tmp:
        rag = PrivateRAG(Path(tmp) / "store", lm=lm, embedder=emb, max_doc_tokens=cfg.max_doc_tokens)
        progress("rag: storing dialogues")
        rag.add([f"Patient: {r['input']}\nDoctor: {r['output']}" for r in recs])
        questions = [r["input"] for r in recs[:cfg.questions]]
        refs = [r["output"] for r in recs[:cfg.questions]]
        ref_emb = emb.encode(refs)
        for setting in cfg.settings:
            rag.template = rag_template(setting)
            for method in ("pad", "none", "public"):
                progress(f"rag {setting} {method}")
                t0 = time.perf_counter()
                answers: list[Any] = [None] * len(questions)
                for i, ans, error in rag.ask_many(questions, mechanism=method, seed=cfg.seed):
                    if error is not None:
                        raise DPInferError(f"rag {method}: question {i} failed ({error})")
                    answers[i] = ans
                seconds = time.perf_counter() - t0
                texts = [a.text for a in answers]
                sims = (emb.encode([t if t.strip() else "." for t in texts]) * ref_emb).sum(-1).tolist()
                eps = answers[0].guarantee.epsilon
                rows.append({
                    "task": "rag", "setting": setting, "method": method, "epsilon": eps,
                    "rouge_l": _mean([rouge(t, r) for t, r in zip(texts, refs, strict=True)]),
                    "similarity": _mean(sims), "on_topic": share(sum(s >= TOPIC_THRESHOLD for s in sims), len(sims)),
                    "tokens": _mean([a.tokens for a in answers]), "seconds": seconds / len(questions),
                    "examples": texts[:2],
                })
    return {"rows": rows, "docs": len(recs), "questions": cfg.questions}


# ------------------------------------------------------------------------------------------------ protect
def run_protect(lm: Any, cfg: QualityBenchConfig, progress: Callable[[str], None]) -> dict[str, Any]:
    from dpinfer.bench.gtr import MiniLMAnswerer, load_csqa
    from dpinfer.bench.gtr import run_quality as gtr_quality
    from dpinfer.defaults import PROTECT
    from dpinfer.errors import DataNotFoundError

    try:
        records = load_csqa("csqa", cfg.protect_questions)
    except DataNotFoundError as exc:
        return {"skipped": str(exc)}
    answerer = MiniLMAnswerer()
    res = gtr_quality(lm, records, temperatures=[PROTECT.temperature], repeats=1, n_rewrites=PROTECT.n_rewrites,
                      n_keywords=PROTECT.n_keywords, jem_epsilon=PROTECT.jem_epsilon,
                      max_new_tokens=PROTECT.max_new_tokens, delta=PROTECT.delta, batch_questions=len(records),
                      seed=cfg.seed, answerers=[answerer], progress=lambda s: progress(f"protect {s}"))
    orig = res["original"][answerer.name]
    rows = [{"task": "protect", "method": "original question (ceiling)", "accuracy": orig["accuracy"],
             "accuracy_ci95": [orig["low"], orig["high"]], "rouge1": 1.0, "epsilon": math.inf}]
    for r in res["rows"]:
        if r["method"] in ("dp-gtr-ndp", "dp-prompt"):
            a = r["accuracy"][answerer.name]
            rows.append({"task": "protect", "method": r["method"], "accuracy": a["accuracy"],
                         "accuracy_ci95": [a["low"], a["high"]], "rouge1": r["rouge1"], "epsilon": r["epsilon"]})
    rows.append({"task": "protect", "method": "chance (floor)", "accuracy": res["chance"], "rouge1": 0.0,
                 "epsilon": 0.0})
    return {"rows": rows, "questions": len(records), "seconds": res["seconds"]}


# ------------------------------------------------------------------------------------------------ synth
def run_synth(lm: Any, emb: Any, cfg: QualityBenchConfig, progress: Callable[[str], None]) -> dict[str, Any]:
    from dpinfer.bench.synth import mauve_with_interval
    from dpinfer.defaults import SYNTH
    from dpinfer.errors import DataNotFoundError
    from dpinfer.paths import data_file
    from dpinfer.pipelines.synthesize import load_references, synthesize

    try:
        path = data_file("yelp", "yelp_reviews.csv")
    except DataNotFoundError as exc:
        return {"skipped": str(exc)}
    refs = load_references(str(path), text_field="text", label_fields=["label1", "label2"])
    b = SYNTH.batch_size
    n_private = max(400, 4 * b * cfg.synth_texts)  # enough references for every label group to fill a batch
    private, real = refs[:n_private], refs[n_private: n_private + 4 * cfg.synth_texts]
    real_texts = [lm.decode(lm.encode(r.text)[:cfg.synth_tokens]) for r in real]
    q = emb.encode(real_texts)
    rows = []
    for method, eps in (("invisibleink", 10.0), ("public", None)):
        progress(f"synth {method}")
        res = synthesize(private, lm=lm, method=method, epsilon=eps or 10.0, batch_size=b,
                         max_new_tokens=cfg.synth_tokens, prompt_template="yelp", seed=cfg.seed,
                         max_texts=cfg.synth_texts)
        texts = [t.text if t.text.strip() else "." for t in res.texts]
        p = emb.encode(texts)
        nearest = (p @ q.T).max(-1).tolist()
        try:
            mauve = mauve_with_interval(p, q, 3, cfg.seed)
        except Exception as exc:  # mauve-text is an optional extra
            mauve = {"mauve": math.nan, "mauve_skipped": f"{type(exc).__name__}"}
        rows.append({"task": "synth", "method": method, "epsilon": res.guarantee.epsilon, "B": b,
                     "on_topic": share(sum(s >= TOPIC_THRESHOLD for s in nearest), len(nearest)),
                     "similarity": _mean(nearest), "mauve": mauve.get("mauve"), "mauve_ci95": mauve.get("mauve_ci95"),
                     "examples": texts[:2]})
    return {"rows": rows, "real": len(real_texts)}


# ------------------------------------------------------------------------------------------------ run
@dataclass
class _Progress:
    update: Callable[[str], None] | None
    start: float = field(default_factory=time.perf_counter)

    def __call__(self, msg: str) -> None:
        if self.update:
            self.update(f"{msg} ({time.perf_counter() - self.start:.0f} s)")


def run(config: QualityBenchConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    from dpinfer.eval.embeddings import load_embedder
    from dpinfer.generation import resolve_lm

    prog = _Progress(progress)
    lm = resolve_lm(config.model)
    emb = load_embedder()
    res: dict[str, Any] = {"model": lm.name, "settings": dataclasses_dict(config)}
    t0 = time.perf_counter()
    runners: dict[str, Callable[[], dict[str, Any]]] = {
        "sanitize": lambda: run_sanitize(lm, emb, config, prog),
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


def dataclasses_dict(config: QualityBenchConfig) -> dict[str, Any]:
    import dataclasses

    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(config).items()}


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
    out = [f"Model: {res['model']}; total {res['seconds']:.0f} s."]
    s = res.get("sanitize")
    if s:
        out.append("")
        if "skipped" in s:
            out.append(f"sanitize: skipped ({s['skipped']})")
        else:
            out.append(f"**sanitize** (README main job: {s['document_tokens']} document tokens, {s['spans']} tagged "
                       f"spans in {s['groups']} groups; derailed = < {MIN_WORDS} words, English function-word share "
                       f"< {ENGLISH_THRESHOLD} or MiniLM cosine < {TOPIC_THRESHOLD} to the NER-scrubbed document)")
            out.append("")
            out.append("| setting | method | ε | T_max | min-p | derailed (95% CI) | English share | cosine | PPL | "
                       "4-gram loops | tokens | s / release |")
            out.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
            for r in s["rows"]:
                out.append(f"| {r['setting']} | {r['method']} | {_eps(r.get('epsilon'))} | {r['T_max']} | "
                           f"{r['min_p'] or '–'} | {_pct(r['derailed'])} | {_f(r['english'])} | "
                           f"{_f(r['similarity'])} | {_f(r['ppl'], 1)} | {_f(r['loops'])} | {_f(r['tokens'], 0)} | "
                           f"{_f(r['seconds'], 1)} |")
            if s.get("checks"):
                out.append("")
                out.append("| setting | DP-Fusion support | audit ε lower bound / claimed (trials) | LOSS ASR (games; "
                           "chance 0.20) |")
                out.append("|---|---|---|---|")
                for c in s["checks"]:
                    a = c.get("audit")
                    audit = (f"{a['epsilon_lb']:.3f} / {a['claimed_epsilon']:.3f} ({a['trials']})" if a else "–")
                    loss = c.get("loss") or {}
                    if "skipped" in loss:
                        lt = f"skipped ({loss['skipped']})"
                    elif loss:
                        ci = loss.get("asr_ci95") or [math.nan, math.nan]
                        lt = (f"{_f(loss.get('asr'))} [{_f(ci[0])}, {_f(ci[1])}] ({loss.get('games')} games, "
                              f"{loss['docs']} TAB docs, T_max {loss['T_max']})")
                    else:
                        lt = "–"
                    sup = f"top-k {SANITIZE.top_k}, τ {SANITIZE.temperature}" + (
                        f", min-p {c['min_p']}" if c["min_p"] else "")
                    out.append(f"| {c['setting']} | {sup} | {audit} | {lt} |")
    r = res.get("rag")
    if r:
        out.append("")
        if "skipped" in r:
            out.append(f"rag: skipped ({r['skipped']})")
        else:
            out.append(f"**rag** ({r['questions']} held-in GenMedGPT questions, {r['docs']} dialogues stored; "
                       f"on topic = MiniLM cosine ≥ {TOPIC_THRESHOLD} to the doctor's reply)")
            out.append("")
            out.append("| setting | method | ε | on topic (95% CI) | ROUGE-L | cosine | tokens | s / answer |")
            out.append("|---|---|---|---|---|---|---|---|")
            for x in r["rows"]:
                out.append(f"| {x['setting']} | {x['method']} | {_eps(x['epsilon'])} | {_pct(x['on_topic'])} | "
                           f"{_f(x['rouge_l'])} | {_f(x['similarity'])} | {_f(x['tokens'], 0)} | "
                           f"{_f(x['seconds'], 1)} |")
    p = res.get("protect")
    if p:
        out.append("")
        if "skipped" in p:
            out.append(f"protect: skipped ({p['skipped']})")
        else:
            out.append(f"**protect-prompt** ({p['questions']} CSQA dev questions, MiniLM answerer)")
            out.append("")
            out.append("| method | ε | accuracy (95% CI) | ROUGE-1 leakage |")
            out.append("|---|---|---|---|")
            for x in p["rows"]:
                ci = x.get("accuracy_ci95")
                acc = _f(x["accuracy"]) + (f" [{_f(ci[0])}, {_f(ci[1])}]" if ci else "")
                out.append(f"| {x['method']} | {_eps(x['epsilon'])} | {acc} | {_f(x['rouge1'])} |")
    y = res.get("synth")
    if y:
        out.append("")
        if "skipped" in y:
            out.append(f"synth: skipped ({y['skipped']})")
        else:
            out.append(f"**synth** (Yelp; {y['real']} held-out reviews; on topic = MiniLM cosine ≥ "
                       f"{TOPIC_THRESHOLD} to the nearest)")
            out.append("")
            out.append("| method | ε | B | MAUVE | on topic (95% CI) | cosine to nearest |")
            out.append("|---|---|---|---|---|---|")
            for x in y["rows"]:
                out.append(f"| {x['method']} | {_eps(x['epsilon'])} | {x['B']} | {_f(x['mauve'])} | "
                           f"{_pct(x['on_topic'])} | {_f(x['similarity'])} |")
    return "\n".join(out)


def render(res: dict[str, Any]) -> str:
    return res["markdown"]
