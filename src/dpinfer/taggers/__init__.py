"""Local PII taggers: character spans labelled with the eight TAB entity types, one DP-Fusion privacy group each.

Taggers never touch the network and fail closed (:class:`~dpinfer.errors.TaggingError`, never a partial result).

* ``regex``: dpinfer's stdlib-regex patterns only (no dependency);
* ``presidio``: Microsoft Presidio on a local spaCy model plus the same patterns (the ``pii`` extra);
* ``spans``: spans the user gives (:func:`load_spans` formats).

>>> from dpinfer.taggers import get_tagger
>>> text = "On 10 March 2003 Mr J. Smith lodged application no. 36244/06."
>>> [(s.label, text[s.start:s.end]) for s in get_tagger("regex").tag(text)]
[('DATETIME', '10 March 2003'), ('PERSON', 'Mr J. Smith'), ('CODE', '36244/06')]
"""

from __future__ import annotations

from dpinfer.taggers.base import TAB_LABELS, Span, Tagger, merge_overlaps, validate_spans
from dpinfer.taggers.labels import default_label_map, map_label, validate_label_map
from dpinfer.taggers.regex_tagger import RegexTagger
from dpinfer.taggers.registry import available_taggers, get_tagger, register_tagger
from dpinfer.taggers.spans import SpansTagger, load_spans

__all__ = [
    "TAB_LABELS",
    "RegexTagger",
    "Span",
    "SpansTagger",
    "Tagger",
    "available_taggers",
    "default_label_map",
    "get_tagger",
    "load_spans",
    "map_label",
    "merge_overlaps",
    "register_tagger",
    "validate_label_map",
    "validate_spans",
]
