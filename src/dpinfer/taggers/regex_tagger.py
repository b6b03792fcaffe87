"""The ``regex`` tagger: dpinfer's patterns only (stdlib :mod:`re`, no model, no optional dependency).

>>> tagger = RegexTagger()
>>> text = "Application no. 36244/06 was lodged on 10 March 2003."
>>> [(s.label, text[s.start:s.end]) for s in tagger.tag(text)]
[('CODE', '36244/06'), ('DATETIME', '10 March 2003')]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from dpinfer.errors import ConfigurationError
from dpinfer.taggers.base import Span, Tagger
from dpinfer.taggers.labels import LabelMap, resolve_label_map
from dpinfer.taggers.patterns import PatternDef, default_patterns, find_matches, lexicon


class RegexTagger(Tagger):
    """Tags with :func:`dpinfer.taggers.patterns.find_matches`, mapping entity types through the label map.

    ``min_score`` drops pattern hits scored below it (default 0: keep every hit, favouring recall, which is what
    protects privacy). ``patterns`` replaces the built-in pattern list. ``stoplist``: hits whose text is exactly one of
    these strings are dropped (default: the generic court vocabulary of ``dpinfer/data/tagger_lexicon.json``, e.g.
    "Court", "European Court of Human Rights"; pass ``()`` to keep everything).
    """

    name = "regex"

    def __init__(
        self,
        label_map: LabelMap | None = None,
        min_score: float = 0.0,
        patterns: Sequence[PatternDef] | None = None,
        stoplist: Iterable[str] | None = None,
    ) -> None:
        if not 0.0 <= float(min_score) <= 1.0:
            raise ConfigurationError(f"min_score must be in [0, 1], got {min_score}")
        self.label_map = resolve_label_map(label_map)
        self.min_score = float(min_score)
        self.patterns = tuple(default_patterns() if patterns is None else patterns)
        self.stoplist = frozenset(lexicon()["ner_stoplist"] if stoplist is None else stoplist)

    def _tag(self, text: str) -> list[Span]:
        out: list[Span] = []
        for m in find_matches(text, self.patterns):
            label = self.label_map.get(m.entity)
            if label is None or m.score < self.min_score:
                continue
            if self.stoplist and text[m.start : m.end] in self.stoplist:
                continue
            out.append(Span(m.start, m.end, label, m.score, f"regex:{m.pattern}"))
        return out
