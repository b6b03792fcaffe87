"""The sanitize task of ``dpinfer bench utility`` (:mod:`dpinfer.bench.utility`): what a release keeps of a TAB
document beyond its scrubbed form.

``cfg`` is the bench's :class:`~dpinfer.bench.utility.UtilityBenchConfig`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dpinfer.bench.utility_tasks import mean_finite as _mean
from dpinfer.bench.utility_tasks import paired
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


def run_sanitize(lm: Any, cfg: Any, progress: Callable[[str], None],
                 checkpoint: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The sanitize rows on ``cfg.sanitize_docs`` TAB documents (gold spans, cut to ``cfg.sanitize_chars``):
    ``original`` (ceiling), ``ner-scrub`` (floor), ``dp-fusion`` at each ε of ``cfg.sanitize_epsilons``. Per
    release: the share of the document's non-direct-identifier values (:data:`KEPT_TYPES`) it names verbatim, the
    share of the document's years it names (a date kept as the date), its perplexity under the rewriting prompt with
    the original document."""
    from dpinfer.bench.data import load_tab
    from dpinfer.defaults import SANITIZE
    from dpinfer.errors import DataNotFoundError
    from dpinfer.eval.metrics import perplexity
    from dpinfer.pipelines.sanitize import DEFAULT_INSTRUCTION, build_prompt, sanitize

    try:
        docs = load_tab(None, cfg.sanitize_docs, cfg.sanitize_chars)
    except DataNotFoundError as exc:
        return {"skipped": str(exc)}
    about = {"docs": len(docs), "chars": cfg.sanitize_chars, "T_max": cfg.sanitize_tokens, "types": list(KEPT_TYPES)}
    methods = [("original", None), ("ner-scrub", None), *(("dp-fusion", e) for e in cfg.sanitize_epsilons)]
    rows: list[dict[str, Any]] = []
    ctx = [lm.encode(build_prompt(lm, d.text, DEFAULT_INSTRUCTION)[0]) for d in docs]
    for method, eps in methods:
        items = []
        eps_seen = math.nan
        for j, d in enumerate(docs):
            progress(f"sanitize {method}" + (f" ε={eps:g}" if eps else "") + f" doc {j + 1}/{len(docs)}")
            extra = {"epsilon": eps} if eps is not None else {}
            res = sanitize(d.text, lm=lm, method=method, spans=d.spans, max_new_tokens=cfg.sanitize_tokens,
                           seed=cfg.seed + j, **extra)
            kept, total = value_recall(res.text, d.text, d.spans)
            years = years_of(" ".join(d.text[s.start:s.end] for s in d.spans if s.label == "DATETIME"))
            items.append({"doc": d.doc_id, "kept": kept, "values": total,
                          "years": len(years), "years_kept": len(years & years_of(res.text)),
                          "ppl": perplexity(lm, ctx[j], res.token_ids), "tokens": res.generated_tokens,
                          "seconds": res.seconds, "text": res.text})
            eps_seen = res.guarantee.epsilon
        rows.append(summarise_sanitize_row({"method": method, "epsilon": eps_seen, "target_epsilon": eps,
                                            "items": items}))
        compare_sanitize(rows)
        if checkpoint is not None:
            checkpoint({**about, "rows": rows})
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
    row.update({"recall": {"mean": m, "ci95": [lo, hi]}, "values": share(kept, total), "years": share(ykept, ytotal),
                "ppl": {"mean": math.exp(pm) if math.isfinite(pm) else math.nan,
                        "ci95": [math.exp(plo) if math.isfinite(plo) else math.nan,
                                 math.exp(phi) if math.isfinite(phi) else math.nan]},
                "tokens": _mean([x["tokens"] for x in items]), "seconds": _mean([x["seconds"] for x in items])})
    return row


def compare_sanitize(rows: list[dict[str, Any]]) -> None:
    """Each row's paired per-document difference of value recall to ``ner-scrub``'s (in place)."""
    floor = next((r for r in rows if r["method"] == "ner-scrub"), None)
    if floor is None:
        return
    base = [_recall(x) for x in floor["items"]]
    for r in rows:
        if r is not floor and len(r["items"]) == len(base):
            r["vs_floor"] = paired([_recall(x) for x in r["items"]], base)
