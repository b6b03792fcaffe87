"""``dpinfer bench sanitize --corpus N``: N TAB documents one by one vs through one ``Engine.run_jobs`` call.

Both in the same run, on the same model and documents (the first N TAB-ECHR documents cut to ``--max-chars``, default
1,200 characters, at a paragraph boundary; gold spans; DP-Fusion, one group per entity type, ε = the first of
``--epsilons``, default 12; ``--max-new-tokens`` tokens, default 128, EOS masked so every document makes exactly that
many):

* **one by one**: :func:`~dpinfer.pipelines.sanitize.sanitize` per document, in a loop;
* **corpus**: :func:`~dpinfer.pipelines.sanitize_many.sanitize_many` (plan every document, one ``Engine.run_jobs`` call,
  finish each as it completes), what ``dpinfer sanitize --corpus`` runs.

Each document gets the same seed on both paths (:func:`~dpinfer.pipelines.sanitize_many.record_seed`), so the bench also
reports whether the two paths released the same tokens (with the reference ``run_jobs``, which runs the jobs one after
another, they must; a batching engine may differ where batched kernels round differently). A short warm-up run comes
first; with ``--repeats R`` the two paths run R times each, the order alternating between rounds (one by one first in
even rounds, the corpus path first in odd ones) so that a drifting machine load does not favour either, and the
median is reported. On a shared machine use ``--repeats 2`` or more: a single round measures the load as much as the
code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dpinfer.bench.harness import Progress, Timings, md_table, quiet, rounds


def run_corpus(lm: Any, docs: Sequence[Any], *, epsilon: float, max_new_tokens: int, seed: int, repeats: int = 1,
               progress: Progress = quiet, groups: Mapping[str, Sequence[str]] | None = None,
               engine: Any = None, one_by_one: bool = True) -> dict[str, Any]:
    """Time ``docs`` (``dpinfer.bench.sanitize.Doc``) one by one and through ``sanitize_many``; the measurements.

    ``groups``: the privacy groups of every document (:func:`~dpinfer.pipelines.sanitize.sanitize`'s ``groups``;
    default one per entity type). ``engine``: the :class:`~dpinfer.engine.Engine` that ``sanitize_many`` runs on
    (default a new one per call; pass one to reuse its slot pool, and so its compiled decode step, across rounds).
    ``one_by_one=False`` times the corpus path alone (its speed ratio and ``same_tokens`` are then ``None``)."""
    from dpinfer.pipelines.sanitize import sanitize
    from dpinfer.pipelines.sanitize_many import Record, record_seed, sanitize_many
    from dpinfer.taggers.resolve import resolve_groups

    opts: dict[str, Any] = {"epsilon": epsilon, "max_new_tokens": max_new_tokens, "min_new_tokens": max_new_tokens}
    if groups is not None:
        opts["groups"] = groups
    progress("warm-up")
    sanitize(docs[0].text, lm=lm, spans=docs[0].spans, seed=seed, epsilon=epsilon, max_new_tokens=4)
    timings = Timings()
    single: dict[str, list[int]] = {}
    many: dict[str, list[int]] = {}
    generated: dict[str, int] = {}  # decoded tokens per document (a forced public opening is released, not decoded)
    errors: list[str] = []

    def run_one_by_one() -> None:
        for d in docs:
            res = sanitize(d.text, lm=lm, spans=d.spans, seed=record_seed(seed, d.doc_id), **opts)
            single[d.doc_id] = res.token_ids
            generated[d.doc_id] = res.generated_tokens

    def corpus() -> None:
        records = [Record(d.doc_id, d.text, d.spans) for d in docs]
        for outcome in sanitize_many(records, lm=lm, seed=seed, engine=engine, **opts):
            if outcome.result is None:
                errors.append(f"{outcome.id}: {outcome.error}")
            else:
                many[str(outcome.id)] = outcome.result.token_ids
                generated[str(outcome.id)] = outcome.result.generated_tokens

    paths = [("one by one", run_one_by_one)] if one_by_one else []
    for r, order in rounds(repeats, [*paths, ("corpus (sanitize_many)", corpus)]):
        for name, path in order:
            progress(f"round {r + 1}/{repeats}: {name.split(' (')[0]}")
            timings.time(name, path)
    tokens = sum(generated.values())
    rows = []
    for name in timings.runs:
        t = timings.median(name)
        rows.append({"path": name, "seconds": round(t, 2), "seconds_range": timings.spread(name, 2),
                     "released_tokens_per_s": round(tokens / t, 2),
                     "speed_vs_one_by_one": round(timings.ratio("one by one", name), 3) if one_by_one else None})
    return {"settings": {"model": lm.name, "docs": len(docs), "doc_ids": [d.doc_id for d in docs],
                         "max_new_tokens": max_new_tokens, "epsilon": epsilon, "repeats": repeats, "seed": seed,
                         "released_tokens": tokens,
                         "groups_per_doc": [len(resolve_groups(d.spans, groups)) for d in docs]},
            "rows": rows, "same_tokens": single == many if one_by_one else None, "errors": errors,
            "runs": timings.runs}


def format_corpus(res: dict[str, Any]) -> str:
    s = res["settings"]
    lines = [f"Corpus throughput: {s['model']}, {s['docs']} TAB-ECHR documents, DP-Fusion ε = {s['epsilon']:g} per "
             f"group ({_span(s['groups_per_doc'])} groups), {s['max_new_tokens']} new tokens "
             f"each (EOS masked), median of {s['repeats']} round(s), measured in this run", "",
             *md_table(["path", "seconds", "released tokens/s", "speed vs one by one"], "lrrr",
                       ([r["path"], f"{r['seconds']:.2f}", f"{r['released_tokens_per_s']:.2f}",
                         "" if r["speed_vs_one_by_one"] is None else f"{r['speed_vs_one_by_one']:.2f}×"]
                        for r in res["rows"]))]
    if res["same_tokens"] is not None:
        lines.append("")
        lines.append("same released tokens on both paths: " + ("yes" if res["same_tokens"] else "NO (batched "
                                                                "kernels round differently; each path is a valid "
                                                                "release)"))
    if res["errors"]:
        lines.append(f"records refused: {len(res['errors'])}: " + "; ".join(res["errors"]))
    return "\n".join(lines)


def _span(values: Sequence[int]) -> str:
    """``"6"`` or ``"3–6"``.

    >>> _span([6, 6]), _span([3, 6, 4])
    ('6', '3–6')
    """
    lo, hi = min(values), max(values)
    return str(lo) if lo == hi else f"{lo}–{hi}"
