"""RAG's measure in ``dpinfer bench utility``: the GenMedGPT doctor's reply names drugs and tests (from a vocabulary
computed deterministically from the dialogues by :func:`medical_vocabulary`); an answer *recovers* a fact when it
names a drug or test of the reply that the patient's message does not already name. Only the retrieved record (the
reply) can teach the model those names; the public row (the message alone) can only guess them.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

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

