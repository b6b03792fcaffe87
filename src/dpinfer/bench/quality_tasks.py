"""The four tasks of ``dpinfer bench quality`` (:mod:`dpinfer.bench.quality`): each runs its DP method beside the
ceiling and the floor on the same model and returns its rows; the thresholds they judge releases by.

``cfg`` is the bench's :class:`~dpinfer.bench.quality.QualityBenchConfig`.
"""

from __future__ import annotations

import math
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dpinfer.accounting.calibration import Budget, Spec
from dpinfer.defaults import SANITIZE
from dpinfer.eval.intervals import share

TASKS = ("sanitize", "rag", "protect", "synth")
SETTINGS = ("previous", "current")
BASELINES = ("original", "ner-scrub")
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


# ------------------------------------------------------------------------------------------------ settings
def sanitize_options(setting: str) -> dict[str, Any]:
    """The sanitize settings of a setting (``previous``: no min-p support, T_max without cap, no public opening)."""
    if setting == "previous":
        return {"min_p": None, "cap": None, "opening": None}
    return {"min_p": SANITIZE.min_p, "cap": SANITIZE.max_new_tokens_cap, "opening": SANITIZE.opening_tokens}


def rag_template(setting: str) -> Any:
    from dpinfer.rag.prompts import RagTemplate

    return RagTemplate.completion() if setting == "previous" else RagTemplate()


def _mean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if math.isfinite(x)]
    return statistics.fmean(xs) if xs else math.nan


# ------------------------------------------------------------------------------------------------ sanitize
def summarise_row(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with its summary figures computed from its ``releases`` (derailed share, means, median PPL)."""
    rel = row["releases"]
    row.update({
        "derailed": share(sum(x["derailed"] for x in rel), len(rel)),
        "english": _mean([x["english"] for x in rel]), "similarity": _mean([x["similarity"] for x in rel]),
        "ppl": statistics.median(x["ppl"] for x in rel), "loops": _mean([x["loops"] for x in rel]),
        "tokens": _mean([x["tokens"] for x in rel]), "seconds": _mean([x["seconds"] for x in rel]),
    })
    return row


def run_sanitize(lm: Any, emb: Any, cfg: Any, progress: Callable[[str], None],
                 checkpoint: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The sanitize rows; ``checkpoint(partial)`` is called after every release with the rows so far (the row in
    progress summarised over its releases so far), so that a long run that is stopped keeps what it measured."""
    from dpinfer.eval.metrics import perplexity, repeated_ngram_share
    from dpinfer.paths import repo_root
    from dpinfer.pipelines.sanitize import sanitize
    from dpinfer.pipelines.sanitize_contexts import (
        DEFAULT_INSTRUCTION,
        build_prompt,
        default_max_new_tokens,
        prepare_contexts,
    )
    from dpinfer.pipelines.sanitize_plan import resolve_spans
    from dpinfer.taggers.resolve import resolve_groups

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
    rows: list[dict[str, Any]] = []
    about = {"document_tokens": prep.document_tokens, "spans": len(spans), "groups": len(prep.group_names)}
    for setting in cfg.settings:
        opts = sanitize_options(setting)
        t_max = default_max_new_tokens(prep.document_tokens, cap=opts["cap"])
        if cfg.max_new_tokens is not None:
            t_max = min(t_max, cfg.max_new_tokens)
        for method in ("dp-fusion", *BASELINES):
            if setting == "previous" and method != "dp-fusion" and "current" in cfg.settings:
                continue  # the baselines' decoding changed only by min-p: measured under the current setting
            row: dict[str, Any] = {"task": "sanitize", "setting": setting, "method": method, "T_max": t_max,
                                   "min_p": opts["min_p"], "opening": opts["opening"], "releases": []}
            n_runs = cfg.runs if method == "dp-fusion" or cfg.baseline_runs is None else cfg.baseline_runs
            if method != "dp-fusion" and method not in cfg.baselines:
                n_runs = 0
            if n_runs == 0:
                continue
            for r in range(n_runs):
                progress(f"sanitize {setting} {method} {r + 1}/{n_runs}")
                res = sanitize(text, lm=lm, method=method, spans=spans, max_new_tokens=t_max, seed=cfg.seed + r,
                               min_p=opts["min_p"], opening_tokens=opts["opening"])
                sim = float(emb.encode([res.text if res.text.strip() else "."])[0] @ ref)
                eng = english_share(res.text)
                words = word_count(res.text)
                row["releases"].append({
                    "seed": cfg.seed + r, "tokens": res.generated_tokens, "seconds": res.seconds,
                    "english": eng, "similarity": sim, "words": words,
                    "derailed": words < MIN_WORDS or eng < ENGLISH_THRESHOLD or sim < TOPIC_THRESHOLD,
                    "ppl": perplexity(lm, original_ctx, res.token_ids),
                    "loops": repeated_ngram_share(res.token_ids, 4), "text": res.text,
                })
                row["epsilon"] = res.guarantee.epsilon
                if checkpoint is not None:
                    checkpoint({**about, "rows": [*rows, summarise_row(dict(row))]})
            rows.append(summarise_row(row))
    return {**about, "rows": rows}


def run_privacy_checks(lm: Any, cfg: Any, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    """The audit of DP-Fusion with each setting's support and the LOSS attack of each setting (same table)."""
    import dataclasses

    from dpinfer.audit.runner import run_audit
    from dpinfer.audit.scenarios import DELTA, EPSILON, scenario
    from dpinfer.mechanisms.dp_fusion import DPFusion

    out = []
    for setting in cfg.settings:
        opts = sanitize_options(setting)
        row: dict[str, Any] = {"setting": setting, "min_p": opts["min_p"], "opening": opts["opening"]}
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


def _loss(lm: Any, cfg: Any, opts: dict[str, Any], progress: Callable[[str], None],
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
                      decoding={"min_p": opts["min_p"], "opening_tokens": opts["opening"]})
    r = res["rows"][0]
    return {"asr": r.get("asr"), "asr_ci95": r.get("asr_ci95"), "games": r.get("games"), "docs": len(docs),
            "T_max": t_max, "chance": 0.2}


# ------------------------------------------------------------------------------------------------ rag
def run_rag(lm: Any, emb: Any, cfg: Any, progress: Callable[[str], None]) -> dict[str, Any]:
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
        rag = PrivateRAG(Path(tmp) / "store", lm=lm, embedder=emb, max_doc_tokens=cfg.max_doc_tokens,
                         ledger=None)  # a measurement, not a release: none and public are asked too
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
                extra = {"support_min_p": pad_support(setting)["min_p"]} if method == "pad" else {}
                for i, ans, error in rag.ask_many(questions, mechanism=method, seed=cfg.seed, **extra):
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
    return {"rows": rows, "docs": len(recs), "questions": cfg.questions, "checks": rag_audit(cfg, progress)}


RAG_AUDIT_LEAD = 0.5
"""The public row's lead of A over X in the RAG audit pair: below ln 2, so X is in the min-p 0.5 support too."""


def pad_support(setting: str) -> dict[str, Any]:
    """PAD's public support under a setting (``previous``: Top-k⁺ alone)."""
    from dpinfer.defaults import RAG

    return {"top_k": RAG.support_top_k, "min_p": None if setting == "previous" else RAG.support_min_p}


def rag_audit(cfg: Any, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    """The audit of PAD with each setting's support (``dpinfer audit pad``'s stand-in, on a public row where A leads
    X by :data:`RAG_AUDIT_LEAD`, so both tokens are in every support): one row per setting, [] without trials."""
    import dataclasses

    import torch

    from dpinfer.audit.runner import run_audit
    from dpinfer.audit.scenarios import DELTA, EPSILON, FAR, TOKEN_A, TOKEN_X, VOCAB, InputPair, scenario
    from dpinfer.mechanisms.pad import Pad

    if not cfg.audit_trials:
        return []
    pub = torch.full((VOCAB,), -math.inf, dtype=torch.float64)
    pub[TOKEN_A], pub[TOKEN_X] = RAG_AUDIT_LEAD, 0.0
    private = pub.clone()
    private[TOKEN_A], private[TOKEN_X] = -FAR, FAR
    pairs = (InputPair("shift", torch.stack([pub, private]), torch.stack([pub, pub])),)
    out = []
    for setting in cfg.settings:
        support = pad_support(setting)
        progress(f"audit pad ({setting} support)")
        sc = scenario("pad")

        def build(support: dict[str, Any] = support, t: int = sc.max_new_tokens) -> Pad:
            return Pad.calibrated(Budget(EPSILON, DELTA), Spec(t, **support))

        res = run_audit(dataclasses.replace(sc, build=build, pairs=pairs), trials=cfg.audit_trials, seed=cfg.seed)
        out.append({"setting": setting, **support, "audit": {
            "claimed_epsilon": res.claimed_epsilon, "epsilon_lb": res.epsilon_lb, "trials": res.trials,
            "exceeds": res.exceeds}})
    return out


# ------------------------------------------------------------------------------------------------ protect
def run_protect(lm: Any, cfg: Any, progress: Callable[[str], None]) -> dict[str, Any]:
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
def run_synth(lm: Any, emb: Any, cfg: Any, progress: Callable[[str], None]) -> dict[str, Any]:
    from dpinfer.bench.synth import mauve_with_interval
    from dpinfer.defaults import SYNTH
    from dpinfer.errors import DataNotFoundError
    from dpinfer.paths import data_file
    from dpinfer.pipelines.synthesize import synthesize
    from dpinfer.references import load_references

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
