"""The synth and protect-prompt tasks of ``dpinfer bench utility`` (:mod:`dpinfer.bench.utility`).

``cfg`` is the bench's :class:`~dpinfer.bench.utility.UtilityBenchConfig`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from dpinfer.bench.utility_tasks import paired
from dpinfer.eval.intervals import share

# ------------------------------------------------------------------------------------------------ synth
STARS = ("Review Stars: 1.0", "Review Stars: 2.0", "Review Stars: 4.0", "Review Stars: 5.0")
"""The star ratings (``label2``) the synth task generates and tests on; 3 stars is left out."""


def sentiment(stars: str) -> str:
    """The class of the synth task: ``negative`` for 1 or 2 stars, ``positive`` for 4 or 5.

    >>> sentiment("Review Stars: 2.0"), sentiment("Review Stars: 4.0")
    ('negative', 'positive')
    """
    return "negative" if float(stars.rsplit(" ", 1)[-1]) < 3 else "positive"


def classify(emb: Any, train: Sequence[str], labels: Sequence[str], test_x: Any, test_y: Sequence[str],
             seed: int = 0) -> list[float]:
    """Per test item, 1.0 when a logistic regression on MiniLM embeddings of ``train`` predicts its label, else 0."""
    from sklearn.linear_model import LogisticRegression

    x = emb.encode([t if t.strip() else "." for t in train])
    clf = LogisticRegression(max_iter=2000, random_state=seed).fit(x, list(labels))
    return [1.0 if p == y else 0.0 for p, y in zip(clf.predict(test_x), test_y, strict=True)]


def summarise_accuracy(row: dict[str, Any], floor: Sequence[float] | None) -> dict[str, Any]:
    c = row["correct"]
    row["accuracy"] = share(int(sum(c)), len(c))
    if floor is not None and row["correct"] is not floor:
        row["vs_floor"] = paired(c, floor)
    return row


def run_synth(lm: Any, emb: Any, cfg: Any, progress: Callable[[str], None],
              checkpoint: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The synth rows: a sentiment classifier (MiniLM + logistic regression; 1–2 stars negative, 4–5 positive)
    trained on ``cfg.synth_per_class`` texts per star rating (1, 2, 4, 5) from ``invisibleink`` at each ε, from
    ``public`` (the floor) and on the same number of real references cut to the same length (the ceiling), tested
    on held-out real reviews balanced over the two classes; MAUVE to them beside it."""
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
    b, k, t_max = SYNTH.batch_size, cfg.synth_per_class, cfg.synth_tokens
    pool_size = len(refs) // 2  # the private pool: the first half; the held-out test: balanced, from the second
    pool, rest = refs[:pool_size], refs[pool_size:]
    test = [r for s in STARS for r in [x for x in rest if x.labels["label2"] == s][:cfg.synth_test // len(STARS)]]
    cut = [lm.decode(lm.encode(r.text)[:t_max]) for r in test]
    test_x, test_y = emb.encode(cut), [sentiment(r.labels["label2"]) for r in test]
    by_star = {s: [r for r in pool if r.labels["label2"] == s] for s in STARS}
    about: dict[str, Any] = {"per_class": k, "stars": [s.rsplit(" ", 1)[-1] for s in STARS], "test": len(test),
                             "T_max": t_max, "B": b}
    rows: list[dict[str, Any]] = []
    floor: list[float] | None = None

    def add(row: dict[str, Any], texts: list[str]) -> None:
        try:
            row.update(mauve_with_interval(emb.encode([t if t.strip() else "." for t in texts]), test_x, 3, cfg.seed))
        except Exception as exc:  # mauve-text is an optional extra
            row["mauve_skipped"] = type(exc).__name__
        rows.append(summarise_accuracy(row, floor))
        if checkpoint is not None:
            checkpoint({**about, "rows": rows})

    real = [(lm.decode(lm.encode(r.text)[:t_max]), sentiment(s)) for s in STARS for r in by_star[s][:k]]
    progress("synth real references")
    add({"method": "real (ceiling)", "epsilon": math.inf, "n_train": len(real),
         "correct": classify(emb, [t for t, _ in real], [s for _, s in real], test_x, test_y, cfg.seed)},
        [t for t, _ in real])
    for method, eps in [("public", None), *(("invisibleink", e) for e in cfg.synth_epsilons)]:
        texts: list[str] = []
        labels: list[str] = []
        guarantee = None
        for s in STARS:
            progress(f"synth {method}" + (f" ε={eps:g}" if eps else "") + f" {s}")
            group = by_star[s][:4 * b * k]  # enough references for the first k batches of this class
            res = synthesize(group, lm=lm, method=method, epsilon=eps or 1.0, batch_size=b, max_new_tokens=t_max,
                             prompt_template="yelp", seed=cfg.seed, max_texts=k)
            texts += [t.text for t in res.texts]
            labels += [sentiment(t.labels["label2"]) for t in res.texts]
            guarantee = res.guarantee
        correct = classify(emb, texts, labels, test_x, test_y, cfg.seed)
        if method == "public":
            floor = correct
        add({"method": method, "epsilon": 0.0 if method == "public" else guarantee.epsilon, "target_epsilon": eps,
             "n_train": len(texts), "correct": correct, "examples": texts[:2]}, texts)
    for r in rows:  # the ceiling ran before the floor: its paired difference now
        if r["method"].startswith("real") and floor is not None:
            r["vs_floor"] = paired(r["correct"], floor)
    return {**about, "rows": rows}


# ------------------------------------------------------------------------------------------------ protect
def protect_from_file(path: str) -> dict[str, Any]:
    """The protect result of a finished ``dpinfer bench gtr`` run (its JSON): the same figures
    :func:`run_protect` measures, for the table and the plot."""
    import json
    from pathlib import Path

    res = json.loads(Path(path).read_text(encoding="utf-8"))
    for r in res["rows"]:
        r.pop("rouge1_items", None)
    return {"questions": int(res["settings"]["n"]), "answerer": res["answerers"][0], "gtr": res, "from": path}


def run_protect(lm: Any, cfg: Any, progress: Callable[[str], None]) -> dict[str, Any]:
    """``dpinfer bench gtr``'s measurement (called, not copied) over ``cfg.protect_temperatures``: the MiniLM
    answerer's accuracy on each method's protected question against its ROUGE-1 leakage, the original question
    (ceiling) and chance (floor) beside them."""
    from dpinfer.bench.gtr import MiniLMAnswerer, load_csqa
    from dpinfer.bench.gtr import run_quality as gtr_quality
    from dpinfer.defaults import PROTECT
    from dpinfer.errors import DataNotFoundError

    if cfg.protect_from:
        return protect_from_file(cfg.protect_from)
    try:
        records = load_csqa("csqa", cfg.protect_questions)
    except DataNotFoundError as exc:
        return {"skipped": str(exc)}
    answerer = MiniLMAnswerer()
    res = gtr_quality(lm, records, temperatures=list(cfg.protect_temperatures), repeats=1,
                      n_rewrites=PROTECT.n_rewrites, n_keywords=PROTECT.n_keywords, jem_epsilon=PROTECT.jem_epsilon,
                      max_new_tokens=PROTECT.max_new_tokens, delta=PROTECT.delta,
                      batch_questions=len(records), seed=cfg.seed, answerers=[answerer],
                      progress=lambda s: progress(f"protect {s}"))
    for r in res["rows"]:
        r.pop("rouge1_items", None)
    return {"questions": len(records), "answerer": answerer.name, "gtr": res}
