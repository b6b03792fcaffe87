"""The sanitize task of ``dpinfer bench utility`` (:mod:`dpinfer.bench.utility`): what a release keeps of a TAB
document beyond its scrubbed form.

``cfg`` is the bench's :class:`~dpinfer.bench.utility.UtilityBenchConfig`.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dpinfer.bench.utility_tasks import mean_finite as _mean
from dpinfer.bench.utility_tasks import paired
from dpinfer.defaults import SANITIZE
from dpinfer.eval.intervals import mean_interval, share

# ------------------------------------------------------------------------------------------------ sanitize
KEPT_TYPES = ("DATETIME", "QUANTITY", "LOC", "ORG", "DEM", "MISC")
"""TAB entity types whose values the sanitize task asks the release to keep (not PERSON or CODE: direct
identifiers)."""
_YEAR = re.compile(r"\b(?:1[89]\d\d|20\d\d)\b")


def value_recall(release: str, doc_text: str, spans: Sequence[Any]) -> tuple[int, int]:
    """(how many distinct values of the document's :data:`KEPT_TYPES` spans the release names verbatim, how many)."""
    values = sorted({doc_text[s.start:s.end].strip() for s in spans if s.label in KEPT_TYPES
                     and len(doc_text[s.start:s.end].strip()) >= 3})
    low = release.lower()
    return sum(v.lower() in low for v in values), len(values)


def years_of(text: str) -> set[str]:
    return set(_YEAR.findall(text))


# ------------------------------------------------------------------------------------------------ fact questions
CHOICES = 4
"""Choices per fact question: the document's value and 3 values of the same type from other TAB documents."""


def fact_questions(doc_text: str, spans: Sequence[Any], pool: Mapping[str, Sequence[str]],
                   key: str) -> list[dict[str, Any]]:
    """One multiple-choice question per distinct value (≥ 3 characters) of the document's :data:`KEPT_TYPES` spans:
    *which of these does the document say?*, the value against :data:`CHOICES` − 1 values of the same TAB type from
    OTHER documents (``pool``) that the document does not contain; the distractors and the order are a fixed
    function of ``key`` and the value (public to the benchmark, the same for every row)."""
    low = doc_text.lower()
    seen: set[str] = set()
    out = []
    for s in sorted(spans, key=lambda s: s.start):
        value = doc_text[s.start:s.end].strip()
        if s.label not in KEPT_TYPES or len(value) < 3 or value.lower() in seen:
            continue
        seen.add(value.lower())
        others = [v for v in pool.get(s.label, ()) if len(v) >= 3 and v.lower() not in low]
        if len(others) < CHOICES - 1:
            continue
        rng = random.Random(f"{key}:{value}")
        choices = [value, *rng.sample(others, CHOICES - 1)]
        rng.shuffle(choices)
        out.append({"type": s.label, "value": value, "choices": choices, "answer": choices.index(value)})
    return out


def answer_facts(answerer: Any, release: str, questions: Sequence[Mapping[str, Any]]) -> list[int]:
    """1 per question that ``answerer`` (:class:`~dpinfer.bench.gtr.MiniLMAnswerer`) answers right when shown the
    release alone (the release is the question's text: the choice closest to it in MiniLM space)."""
    if not questions:
        return []
    picks = answerer.answer([release] * len(questions), [list(q["choices"]) for q in questions])
    return [int(p == q["answer"]) for p, q in zip(picks, questions, strict=True)]


# ------------------------------------------------------------------------------------------------ roles
ROLE_TYPES = ("DATETIME", "ORG")
"""The :data:`KEPT_TYPES` whose role is checked: those the regex tagger finds where the TAB annotators put them."""
_CONTEXT_WORDS = 3


def role_slots(release: str, doc_text: str, spans: Sequence[Any], tagger: Any) -> tuple[int, int]:
    """(kept, released): a *slot* is a :data:`ROLE_TYPES` span of the document whose preceding
    ``_CONTEXT_WORDS`` words the release repeats (case and spacing aside): the release reaches the place where
    the document names it. It keeps its role when the tagger finds, in the release, a span of the same type
    starting right after those words (a date stays a date, an organisation an organisation; the value may differ).
    A placeholder or a paraphrase there does not keep it."""
    found = [(t.start, t.label) for t in tagger.tag(release)]
    kept = released = 0
    for s in spans:
        if s.label not in ROLE_TYPES:
            continue
        words = re.findall(r"\S+", doc_text[:s.start])[-_CONTEXT_WORDS:]
        if len(words) < _CONTEXT_WORDS:
            continue
        m = re.search(r"\s+".join(re.escape(w) for w in words), release, re.I)
        if m is None:
            continue
        released += 1
        after = m.end() + len(release[m.end():]) - len(release[m.end():].lstrip(" \t\n(“\"'"))
        kept += any(start == after and label == s.label for start, label in found)
    return kept, released


def run_sanitize(lm: Any, cfg: Any, progress: Callable[[str], None],
                 checkpoint: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The sanitize rows on ``cfg.sanitize_docs`` TAB documents (gold spans, cut to ``cfg.sanitize_chars``):
    ``original`` (ceiling), ``ner-scrub`` (floor), ``dp-fusion`` at each ε of ``cfg.sanitize_epsilons``. Per
    release: the share of the document's non-direct-identifier values (:data:`KEPT_TYPES`) it names verbatim, the
    share of the document's years it names (a date kept as the date), its perplexity under the rewriting prompt with
    the original document."""
    from dpinfer.bench.data import load_tab, mention_pool
    from dpinfer.bench.gtr import MiniLMAnswerer
    from dpinfer.errors import DataNotFoundError
    from dpinfer.eval.metrics import perplexity
    from dpinfer.pipelines.sanitize import sanitize
    from dpinfer.pipelines.sanitize_contexts import DEFAULT_INSTRUCTION, build_prompt
    from dpinfer.taggers.regex_tagger import RegexTagger

    try:
        docs = load_tab(None, cfg.sanitize_docs, cfg.sanitize_chars)
    except DataNotFoundError as exc:
        return {"skipped": str(exc)}
    every = load_tab(None, 10**6, 10**9)  # the distractors: values of the same type from the other documents
    questions = [fact_questions(d.text, d.spans, mention_pool(every, d.doc_id), f"{cfg.seed}:{d.doc_id}")
                 for d in docs]
    answerer, tagger = MiniLMAnswerer(), RegexTagger()
    about = {"docs": len(docs), "chars": cfg.sanitize_chars, "T_max": cfg.sanitize_tokens, "types": list(KEPT_TYPES),
             "questions": sum(map(len, questions)), "choices": CHOICES, "role_types": list(ROLE_TYPES),
             "dp_fusion_min_p": cfg.dp_fusion_min_p}
    methods = [*([("original", None), ("ner-scrub", None)] if cfg.sanitize_baselines else []),
               *(("dp-fusion", e) for e in cfg.sanitize_epsilons)]
    ctx = [lm.encode(build_prompt(lm, d.text, DEFAULT_INSTRUCTION)[0]) for d in docs]
    items: list[list[dict[str, Any]]] = [[] for _ in methods]
    eps_seen = [math.nan] * len(methods)
    rows: list[dict[str, Any]] = []
    for j, d in enumerate(docs):  # document by document, every row: a run stopped early keeps whole documents
        for m, (method, eps) in enumerate(methods):
            progress(f"sanitize doc {j + 1}/{len(docs)} {method}" + (f" ε={eps:g}" if eps else ""))
            extra = {"epsilon": eps, "min_p": cfg.dp_fusion_min_p} if eps is not None else {}
            res = sanitize(d.text, lm=lm, method=method, spans=d.spans, max_new_tokens=cfg.sanitize_tokens,
                           seed=cfg.seed + j, **extra)
            kept, total = value_recall(res.text, d.text, d.spans)
            role_kept, role_released = role_slots(res.text, d.text, d.spans, tagger)
            years = years_of(" ".join(d.text[s.start:s.end] for s in d.spans if s.label == "DATETIME"))
            items[m].append({"doc": d.doc_id, "kept": kept, "values": total,
                             "years": len(years), "years_kept": len(years & years_of(res.text)),
                             "answered": answer_facts(answerer, res.text, questions[j]),
                             "role_kept": role_kept, "role_released": role_released,
                             "ppl": perplexity(lm, ctx[j], res.token_ids), "tokens": res.generated_tokens,
                             "seconds": res.seconds, "text": res.text})
            eps_seen[m] = res.guarantee.epsilon
        rows = [summarise_sanitize_row({"method": method, "epsilon": eps_seen[m], "target_epsilon": eps,
                                        **({"min_p": cfg.dp_fusion_min_p} if eps is not None else {}),
                                        "items": list(items[m])}) for m, (method, eps) in enumerate(methods)]
        compare_sanitize(rows)
        if checkpoint is not None:
            checkpoint({**about, "docs": j + 1, "questions": sum(map(len, questions[:j + 1])), "rows": rows})
    return {**about, "rows": rows, "top_k": SANITIZE.top_k}


def _recall(x: Mapping[str, Any]) -> float:
    return x["kept"] / x["values"] if x["values"] else 0.0


def summarise_sanitize_row(row: dict[str, Any]) -> dict[str, Any]:
    items = row["items"]
    rec = [_recall(x) for x in items]
    m, lo, hi = mean_interval(rec, digits=None) if len(rec) > 1 else (_mean(rec), math.nan, math.nan)
    kept, total = sum(x["kept"] for x in items), sum(x["values"] for x in items)
    ykept, ytotal = sum(x["years_kept"] for x in items), sum(x["years"] for x in items)
    logppl = [math.log(x["ppl"]) for x in items if x["ppl"] and math.isfinite(x["ppl"])]
    pm, plo, phi = mean_interval(logppl, digits=None) if len(logppl) > 1 else (_mean(logppl), math.nan, math.nan)
    answered = [a for x in items for a in x.get("answered", [])]
    rkept, rrel = sum(x.get("role_kept", 0) for x in items), sum(x.get("role_released", 0) for x in items)
    row.update({"facts": share(sum(answered), len(answered)), "roles": share(rkept, rrel)})
    row.update({"recall": {"mean": m, "ci95": [lo, hi]}, "values": share(kept, total), "years": share(ykept, ytotal),
                "ppl": {"mean": math.exp(pm) if math.isfinite(pm) else math.nan,
                        "ci95": [math.exp(plo) if math.isfinite(plo) else math.nan,
                                 math.exp(phi) if math.isfinite(phi) else math.nan]},
                "tokens": _mean([x["tokens"] for x in items]), "seconds": _mean([x["seconds"] for x in items])})
    return row


def _answered(row: Mapping[str, Any]) -> list[float]:
    return [float(a) for x in row["items"] for a in x.get("answered", [])]


def compare_sanitize(rows: list[dict[str, Any]]) -> None:
    """Each row's paired differences to ``ner-scrub``'s (in place): per document, of value recall
    (``vs_floor``); per fact question, of being answered right (``facts_vs_floor``)."""
    floor = next((r for r in rows if r["method"] == "ner-scrub"), None)
    if floor is None:
        return
    base, base_facts = [_recall(x) for x in floor["items"]], _answered(floor)
    for r in rows:
        if r is not floor and len(r["items"]) == len(base):
            r["vs_floor"] = paired([_recall(x) for x in r["items"]], base)
            if len(_answered(r)) == len(base_facts):
                r["facts_vs_floor"] = paired(_answered(r), base_facts)


def merge_sanitize(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One sanitize result of runs on the same documents (e.g. the baselines and one ε in one process, another ε
    with ``--no-sanitize-baselines`` in another): every row on the documents every run finished, the first run's of
    a method and ε measured twice."""
    common = set.intersection(*({x["doc"] for x in p["rows"][0]["items"]} for p in parts if p.get("rows")))
    rows: list[dict[str, Any]] = []
    seen: set[tuple[str, Any]] = set()
    for p in parts:
        for r in p.get("rows", []):
            if r["method"] == "dp-fusion":  # a run before --sanitize-min-p: its task's setting, or the default
                r = {**r, "min_p": r.get("min_p", p.get("dp_fusion_min_p", SANITIZE.min_p))}
            key = (r["method"], r.get("target_epsilon"), r.get("min_p"))
            if key not in seen:
                seen.add(key)
                kept = [x for x in r["items"] if x["doc"] in common]
                rows.append(summarise_sanitize_row({k: v for k, v in r.items() if not k.endswith("vs_floor")}
                                                   | {"items": kept}))
    order = {"original": 0, "ner-scrub": 1}
    rows.sort(key=lambda r: (order.get(r["method"], 2), r.get("min_p") != SANITIZE.min_p,
                             r.get("target_epsilon") or 0))
    compare_sanitize(rows)
    first = next(p for p in parts if p.get("rows"))
    n_questions = sum(len(x.get("answered", [])) for x in rows[0]["items"]) if rows else 0
    return {**{k: v for k, v in first.items() if k not in ("rows", "partial")}, "rows": rows, "merged": len(parts),
            "docs": len(common), "questions": n_questions}
