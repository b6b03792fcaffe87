"""The measures and tasks of ``dpinfer bench utility`` (:mod:`dpinfer.bench.utility`): what only the private input can
raise, per task, beside the public floor and the no-privacy ceiling.

RAG's measure: the GenMedGPT doctor's reply names drugs and tests (from a vocabulary computed deterministically from
the dialogues by :func:`medical_vocabulary`); an answer *recovers* a fact when it names a drug or test of the reply
that the patient's message does not already name. Only the retrieved record (the reply) can teach the model those
names; the public row (the message alone) can only guess them.

``cfg`` is the bench's :class:`~dpinfer.bench.utility.UtilityBenchConfig`.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpinfer.eval.intervals import mean_interval, share

# ------------------------------------------------------------------------------------------------ vocabulary
_DRUG_SENTENCE = re.compile(r"medicat|prescri|\bdrugs?\b")
_TEST_SENTENCE = re.compile(r"\btests?\b|procedure|exam|imaging|scan|screen|measurement|panel")
_LIST_START = re.compile(r"(?::|such as|includ(?:e|es|ing)|like)\s+(.*)$", re.S)
_ITEM_SPLIT = re.compile(r",\s*(?:and\s+|or\s+)?|\s+and\s+|\s+or\s+")
_TEST_HEADS = ("test", "panel", "count", "exam", "examination", "imaging", "imaging procedure", "x-ray", "x ray",
               "ultrasound", "ultrasonography", "echocardiography", "electrocardiogram", "mri", "ct", "scan",
               "biopsy", "urinalysis", "measurement", "screen", "screening", "culture", "smear", "colonoscopy",
               "endoscopy", "mammography", "tomography", "puncture", "electromyography", "electroencephalogram",
               "angiography", "laparoscopy", "cystoscopy", "bronchoscopy", "arthroscopy", "sigmoidoscopy", "cbc",
               "a1c")
_NOT_A_NAME = re.compile(r"\b(?:your|you|symptoms?|condition|may|will|should|can|this|abuse|medications?|treatments?|"
                         r"therap(?:y|ies)|intravenous)$|\b(?:your|you|symptoms?|condition|may|will|should|this)\b")
_STOP_FIRST = frozenset("based yes additionally however finally lastly inflammation okay alright well sure first also "
                        "then other air actually lifestyle on intravenous".split())


@dataclass(frozen=True)
class Term:
    """One drug or test: its canonical name, every written form (the name and its parenthesised alias), its kind."""

    name: str
    forms: tuple[str, ...]
    kind: str  # "drug" or "test"


def _items(part: str) -> Iterable[str]:
    for it in _ITEM_SPLIT.split(part):
        it = re.sub(r"^(?:a|an|the|some|also|other|and|or)\s+", "", it.strip().rstrip(".;:").strip()).lower()
        if len(it) >= 3 and 1 <= len(it.split()) <= 6:
            yield it


def _forms(item: str) -> list[str]:
    """The written forms of an enumerated item: ``"complete blood count (cbc)"`` → the name and ``cbc``."""
    base = re.sub(r"\s*\(.*?\)\s*", " ", item).strip()
    forms = [base, *(a.strip() for a in re.findall(r"\((.*?)\)", item))]
    return [f for f in forms if len(f) >= 2 and f.split()[0] not in _STOP_FIRST]


def medical_vocabulary(replies: Iterable[str], min_count: int = 2) -> list[Term]:
    """The drugs and tests the GenMedGPT doctors enumerate, computed deterministically from ``replies``: the items of
    every enumeration (after ``:``, "such as", "include", "like") of a sentence about medication (drugs) or about
    tests, procedures, exams, imaging (tests: an item whose name ends in a test word such as "panel", "x-ray",
    "biopsy"), kept when seen at least ``min_count`` times; forms that share a name or an alias are one term.
    Sorted by name."""
    counts: dict[str, Counter[str]] = {"drug": Counter(), "test": Counter()}
    aliases: dict[str, dict[str, set[str]]] = {"drug": {}, "test": {}}
    for reply in replies:
        for sentence in re.split(r"(?<=[.!?])\s+", reply):
            low = sentence.lower()
            m = _LIST_START.search(sentence)
            if not m or ("," not in m.group(1) and " and " not in m.group(1)):
                continue
            kind = "drug" if _DRUG_SENTENCE.search(low) else "test" if _TEST_SENTENCE.search(low) else None
            if kind is None:
                continue
            for it in _items(m.group(1)):
                if it.split()[0] in _STOP_FIRST or _NOT_A_NAME.search(it):
                    continue
                base = re.sub(r"\s*\(.*?\)\s*", "", it).strip()
                is_test = any(f" {base}".endswith((f" {h}", f" {h}s")) for h in _TEST_HEADS)
                if is_test != (kind == "test"):  # a test in a sentence about medication is not a drug
                    continue
                forms = [_singular(f) for f in _forms(it)]
                if not forms:
                    continue
                counts[kind][forms[0]] += 1  # counted by its name, whether or not an alias follows it
                aliases[kind].setdefault(forms[0], set()).update(forms[1:])
    # names that share a written form (an alias, or another name) are one term, per kind
    terms: list[Term] = []
    for kind in ("drug", "test"):
        parent: dict[str, str] = {}

        def find(x: str, parent: dict[str, str] = parent) -> str:
            while parent.setdefault(x, x) != x:
                x = parent[x]
            return x

        for name in sorted(n for n, c in counts[kind].items() if c >= min_count):
            find(name)
            for alias in sorted(aliases[kind][name]):
                parent[find(alias)] = find(name)
        groups: dict[str, set[str]] = {}
        for f in list(parent):
            groups.setdefault(find(f), set()).add(f)
        for forms in groups.values():
            name = max(forms, key=lambda f: (len(f), f))
            terms.append(Term(name, tuple(sorted(forms)), kind))
    return sorted(terms, key=lambda t: (t.kind, t.name))


def _singular(form: str) -> str:
    """``form`` with hyphens as spaces and each word's plural s dropped (one key for "x-ray"/"x rays")."""
    return " ".join(w[:-1] if w.endswith("s") and not w.endswith(("ss", "is", "us")) and len(w) > 3 else w
                    for w in form.replace("-", " ").split())


def _pattern(form: str) -> re.Pattern[str]:
    words = [re.escape(w) for w in re.split(r"[\s-]+", form) if w]
    return re.compile(r"(?<![\w-])" + r"[\s-]+".join(words) + r"(?:s|es)?(?![\w-])", re.I)


class TermMatcher:
    """Which terms of a vocabulary a text names (any written form, case-insensitive, whole words, a plural s allowed).

    >>> m = TermMatcher([Term("complete blood count", ("cbc", "complete blood count"), "test"),
    ...                  Term("ondansetron", ("ondansetron", "zofran"), "drug")])
    >>> sorted(m.named("A CBC and Zofran."))
    ['complete blood count', 'ondansetron']
    """

    def __init__(self, terms: Sequence[Term]) -> None:
        self.terms = list(terms)
        self._patterns = [(t, [_pattern(f) for f in t.forms]) for t in self.terms]
        self.kind = {t.name: t.kind for t in self.terms}

    def named(self, text: str) -> set[str]:
        return {t.name for t, pats in self._patterns if any(p.search(text) for p in pats)}


def recovered(answer: str, targets: set[str], matcher: TermMatcher) -> set[str]:
    """The target terms (those of the reply that the question lacks) that ``answer`` names."""
    return matcher.named(answer) & targets


# ------------------------------------------------------------------------------------------------ summaries
def _mean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if math.isfinite(x)]
    return statistics.fmean(xs) if xs else math.nan


def paired(values: Sequence[float], floor: Sequence[float]) -> dict[str, Any]:
    """The mean per-item difference ``values − floor`` over the same items, with its 95% t interval."""
    diffs = [a - b for a, b in zip(values, floor, strict=True)]
    m, lo, hi = mean_interval(diffs, method="t", digits=None) if len(diffs) > 1 else (
        _mean(diffs), math.nan, math.nan)
    return {"mean": m, "ci95": [lo, hi], "n": len(diffs)}


def summarise_rag_row(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with its figures from its per-item ``items`` (hit: at least one target named; recall: the share of
    the targets named; drug figures on the items whose targets include a drug)."""
    items = row["items"]
    hits = [1.0 if x["found"] else 0.0 for x in items]
    recall = [len(x["found"]) / len(x["targets"]) for x in items]
    drug_items = [x for x in items if x["drug_targets"]]
    drug_hits = [1.0 if set(x["found"]) & set(x["drug_targets"]) else 0.0 for x in drug_items]
    m, lo, hi = mean_interval(recall, digits=None) if len(recall) > 1 else (_mean(recall), math.nan, math.nan)
    row.update({
        "hit": share(int(sum(hits)), len(hits)), "recall": {"mean": m, "ci95": [lo, hi]},
        "drug_hit": share(int(sum(drug_hits)), len(drug_hits)),
        "named_any": _mean([float(x["named"]) for x in items]),
        "tokens": _mean([x["tokens"] for x in items]),
    })
    return row


def compare_to_floor(rows: list[dict[str, Any]], floor_method: str = "public") -> None:
    """Each row's paired difference of the hit rate to the floor row's, over the same items (in place)."""
    floor = next((r for r in rows if r["method"] == floor_method), None)
    if floor is None:
        return
    base = [1.0 if x["found"] else 0.0 for x in floor["items"]]
    for r in rows:
        if r is floor or len(r["items"]) != len(base):
            continue
        r["vs_floor"] = paired([1.0 if x["found"] else 0.0 for x in r["items"]], base)


# ------------------------------------------------------------------------------------------------ rag
def rag_items(records: Sequence[Mapping[str, str]], matcher: TermMatcher, n: int) -> list[dict[str, Any]]:
    """The first ``n`` records whose reply names at least one vocabulary term that the question does not:
    ``{index, question, targets, drug_targets}``."""
    out = []
    for i, r in enumerate(records):
        targets = matcher.named(r["output"]) - matcher.named(r["input"])
        if targets:
            out.append({"index": i, "question": r["input"], "targets": sorted(targets),
                        "drug_targets": sorted(t for t in targets if matcher.kind[t] == "drug")})
            if len(out) == n:
                break
    return out


def rag_methods(epsilons: Sequence[float], default_epsilon: float,
                baselines: bool = True) -> list[tuple[str, float | None]]:
    """The rows in the order they run: the ceiling, the floor (unless not ``baselines``), ``pad`` at the default ε,
    then the other ε."""
    rest = [e for e in epsilons if e != default_epsilon]
    pads = ([default_epsilon] if default_epsilon in epsilons else []) + rest
    return [*([("none", None), ("public", None)] if baselines else []), *(("pad", e) for e in pads)]


def merge_rag(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One RAG result of several runs (e.g. one with the baselines and ``pad`` at the default ε, one with the other
    ε and ``--no-rag-baselines``): every row restricted to the questions that every run asked (the same first
    questions of the same data), its figures and paired differences recomputed; a method and ε measured twice is
    kept from the first run that has it."""
    common = set.intersection(*({x["index"] for x in p["rows"][0]["items"]} for p in parts if p.get("rows")))
    rows: list[dict[str, Any]] = []
    seen: set[tuple[str, Any]] = set()
    for p in parts:
        for r in p.get("rows", []):
            key = (r["method"], r.get("target_epsilon"))
            if key in seen:
                continue
            seen.add(key)
            items = [x for x in r["items"] if x["index"] in common]
            rows.append(summarise_rag_row({k: v for k, v in r.items() if k != "vs_floor"} | {"items": items}))
    order = {"none": 0, "public": 1, "pad": 2}
    rows.sort(key=lambda r: (order.get(r["method"], 3), r.get("target_epsilon") or 0))
    compare_to_floor(rows)
    first = next(p for p in parts if p.get("rows"))
    items0 = rows[0]["items"] if rows else []
    out = {k: v for k, v in first.items() if k not in ("rows", "partial", "support")}
    out.update({"rows": rows, "questions": len(common), "merged": len(parts),
                "targets_per_item": _mean([len(x["targets"]) for x in items0]),
                "items_with_drug": sum(bool(x["drug_targets"]) for x in items0)})
    support = next((p["support"] for p in parts if p.get("support")), None)
    if support is not None:
        out["support"] = support
    return out


def run_rag(lm: Any, emb: Any, cfg: Any, progress: Callable[[str], None],
            checkpoint: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The RAG rows: ``none`` (ceiling), ``public`` (floor), ``pad`` at each ε of ``cfg.epsilons``, on the same
    held-in GenMedGPT questions; ``checkpoint(partial)`` after every row."""
    from dpinfer.defaults import RAG
    from dpinfer.errors import DataNotFoundError, DPInferError
    from dpinfer.paths import data_file
    from dpinfer.pipelines.rag import PrivateRAG

    try:
        path = data_file("medical", "genmedgpt_dialogues.jsonl")
    except DataNotFoundError as exc:
        return {"skipped": str(exc)}
    with path.open(encoding="utf-8") as f:
        every = [json.loads(line) for line in f if line.strip()]
    matcher = TermMatcher(medical_vocabulary(r["output"] for r in every))
    stored = every[:cfg.docs]
    items = rag_items(stored, matcher, cfg.questions)
    about: dict[str, Any] = {
        "docs": len(stored), "questions": len(items), "T_max": cfg.rag_tokens,
        "vocabulary": {"drugs": sum(t.kind == "drug" for t in matcher.terms),
                       "tests": sum(t.kind == "test" for t in matcher.terms)},
        "targets_per_item": _mean([len(x["targets"]) for x in items]),
        "items_with_drug": sum(bool(x["drug_targets"]) for x in items), "pad_min_p": cfg.support_min_p,
    }
    rows: list[dict[str, Any]] = []
    questions = [x["question"] for x in items]
    with tempfile.TemporaryDirectory(prefix="dpinfer-utility-") as tmp:
        rag = PrivateRAG(Path(tmp) / "store", lm=lm, embedder=emb, ledger=None)  # a measurement, not a release
        progress(f"rag: storing {len(stored)} dialogues")
        rag.add([f"Patient: {r['input']}\nDoctor: {r['output']}" for r in stored])
        for method, eps in rag_methods(cfg.epsilons, RAG.epsilon, cfg.rag_baselines):
            label = method if eps is None else f"{method} ε={eps:g}"
            progress(f"rag {label} ({len(questions)} questions)")
            t0 = time.perf_counter()
            extra: dict[str, Any] = {"epsilon": eps, "support_min_p": cfg.support_min_p} if eps is not None else {}
            answers: list[Any] = [None] * len(questions)
            for i, ans, error in rag.ask_many(questions, mechanism=method, seed=cfg.seed,
                                              max_new_tokens=cfg.rag_tokens, **extra):
                if error is not None:
                    raise DPInferError(f"rag {method}: question {i} failed ({error})")
                answers[i] = ans
            seconds = time.perf_counter() - t0
            row_items = []
            for x, a in zip(items, answers, strict=True):
                named = matcher.named(a.text)
                row_items.append({"index": x["index"], "targets": x["targets"], "drug_targets": x["drug_targets"],
                                  "found": sorted(named & set(x["targets"])), "named": len(named),
                                  "tokens": a.tokens, "text": a.text})
            rows.append(summarise_rag_row({
                "method": method, "epsilon": answers[0].guarantee.epsilon if answers else math.nan,
                "target_epsilon": eps, "items": row_items, "seconds": seconds / max(1, len(questions))}))
            if method == "none":
                progress("rag: the public support at the ceiling's facts")
                norms = clip_norms(cfg.epsilons, cfg.rag_tokens)
                about["support"] = support_reach(lm, [rag.public_ids(q) for q in questions], row_items, matcher,
                                                 norms)
            compare_to_floor(rows)
            if checkpoint is not None:
                checkpoint({**about, "rows": rows})
    return {**about, "rows": rows}


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
def run_protect(lm: Any, cfg: Any, progress: Callable[[str], None]) -> dict[str, Any]:
    """``dpinfer bench gtr``'s measurement (called, not copied) over ``cfg.protect_temperatures``: the MiniLM
    answerer's accuracy on each method's protected question against its ROUGE-1 leakage, the original question
    (ceiling) and chance (floor) beside them."""
    from dpinfer.bench.gtr import MiniLMAnswerer, load_csqa
    from dpinfer.bench.gtr import run_quality as gtr_quality
    from dpinfer.defaults import PROTECT
    from dpinfer.errors import DataNotFoundError

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
    from dpinfer.pipelines.sanitize import sanitize
    from dpinfer.pipelines.sanitize_contexts import DEFAULT_INSTRUCTION, build_prompt

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


# ------------------------------------------------------------------------------------------------ rag: why
def clip_norms(epsilons: Iterable[float], max_new_tokens: int) -> dict[float, float]:
    """PAD's clip norm C at each ε (δ, σ, T_max: the defaults and ``max_new_tokens``), from the parameters alone."""
    from dpinfer.pipelines.rag import ask_guarantee

    return {e: float(ask_guarantee("pad", epsilon=e, max_new_tokens=max_new_tokens).parameters["clip_norm"])
            for e in sorted(epsilons)}


def support_of_run(lm: Any, result: Mapping[str, Any], epsilons: Sequence[float]) -> dict[str, Any]:
    """:func:`support_reach` for a finished run's ``rag`` result (its ``none`` row's answers, its questions read
    again from the data by index): the diagnostic of a run made before it existed."""
    from dpinfer.defaults import RAG
    from dpinfer.paths import data_file
    from dpinfer.rag.prompts import RagRows, RagTemplate

    with data_file("medical", "genmedgpt_dialogues.jsonl").open(encoding="utf-8") as f:
        every = [json.loads(line) for line in f if line.strip()]
    matcher = TermMatcher(medical_vocabulary(r["output"] for r in every))
    none = next(r for r in result["rows"] if r["method"] == "none")
    rows = RagRows(lm, RagTemplate(), RAG.top_n, RAG.max_doc_tokens)
    prompts = [rows.public_ids(every[x["index"]]["input"]) for x in none["items"]]
    return support_reach(lm, prompts, none["items"], matcher, clip_norms(epsilons, result["T_max"]))


def first_target_token(lm: Any, ids: Sequence[int], text: str, targets: Sequence[str],
                       matcher: TermMatcher) -> int | None:
    """The index in ``ids`` of the token where the first mention of a target term starts in the decoded ``text``
    (None when no target is named)."""
    starts = [m.start() for t, pats in matcher._patterns if t.name in targets for p in pats
              for m in [p.search(text)] if m]
    if not starts:
        return None
    start = min(starts)
    for j in range(len(ids)):
        if len(lm.decode(list(ids[:j + 1])).strip()) > start:
            return j
    return None


def support_reach(lm: Any, public_prompts: Sequence[Sequence[int]], items: Sequence[Mapping[str, Any]],
                  matcher: TermMatcher, clip_norms: Mapping[float, float]) -> dict[str, Any]:
    """Why ``pad`` can or cannot name what the retrieved record holds: for each question whose ceiling (``none``)
    answer (``item["text"]``, tokenised again) names a target, the first token of that name, and the PUBLIC row's
    logits at that point of the ceiling's answer (the question alone, then the ceiling's answer so far). PAD can
    only emit a token of its public support: within ln(1/min-p) of the public maximum (min-p) and within 2C of it
    (Top-1⁺). Returns the gaps (public maximum − the token's public logit), their ranks, and the share of tokens
    inside each support. A diagnostic of the benchmark (it reads the private answer), never part of a release."""
    import torch

    from dpinfer.defaults import RAG

    gaps: list[float] = []
    ranks: list[int] = []
    for prompt, item in zip(public_prompts, items, strict=True):
        ids = list(lm.encode(item["text"])) if item["found"] else []
        j = first_target_token(lm, ids, item["text"], item["found"], matcher) if ids else None
        if j is None:
            continue
        row = torch.as_tensor([list(prompt) + ids[:j]], dtype=torch.long, device=lm.device)
        with torch.inference_mode():
            z = lm.model(input_ids=row, use_cache=False).logits[0, -1].to(torch.float64).cpu()
        tok = ids[j]
        gaps.append(float(z.max() - z[tok]))
        ranks.append(int((z > z[tok]).sum()) + 1)
    n = len(gaps)
    min_p = RAG.support_min_p or 1.0
    return {
        "n": n, "gaps": gaps, "ranks": ranks,
        "median_gap": statistics.median(gaps) if gaps else math.nan,
        "median_rank": statistics.median(ranks) if ranks else math.nan,
        "in_min_p": share(sum(g <= -math.log(min_p) + 1e-12 for g in gaps), n), "min_p": RAG.support_min_p,
        "in_top1_plus": {f"{e:g}": share(sum(g <= 2 * c for g in gaps), n) for e, c in clip_norms.items()},
        "clip_norms": {f"{e:g}": c for e, c in clip_norms.items()},
    }
