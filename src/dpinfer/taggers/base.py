"""Spans, the tagger protocol, validation and overlap resolution.

A tagger finds the private parts of a document and returns them as character spans with one of the eight TAB entity
types (:data:`TAB_LABELS`). DP-Fusion turns each type into one privacy group, so a span the tagger misses is not
protected at all: taggers fail closed (:class:`~dpinfer.errors.TaggingError`) instead of returning a partial result.

Nothing in this module ever puts document text into a message: errors name offsets, lengths and labels only.

Overlap resolution (:func:`merge_overlaps`, applied by :meth:`Tagger.tag`):

* spans that overlap (share at least one character; spans that merely touch, ``a.end == b.start``, do not overlap)
  are grouped transitively into clusters;
* each cluster becomes ONE span covering the union of its members, so no character any recogniser flagged is lost;
* the label, score and source of the merged span are those of the cluster's *winner*: the longest member, then the
  highest score, then the earliest start, then the smallest label and source (alphabetical), so the result is
  deterministic and independent of input order.

``merge_overlaps(spans, mode="drop")`` instead keeps the winners only and drops every span that overlaps a better one
(the classic "longest span wins" rule); it may uncover characters and is not used by the taggers.

>>> merge_overlaps([Span(0, 5, "PERSON", 0.9), Span(3, 12, "ORG", 0.5), Span(20, 24, "LOC")])
[Span(start=0, end=12, label='ORG', score=0.5, source=''), Span(start=20, end=24, label='LOC', score=1.0, source='')]
"""

from __future__ import annotations

import itertools
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

from dpinfer.errors import DPInferError, InvalidInputError, TaggingError

TAB_LABELS: tuple[str, ...] = ("PERSON", "CODE", "LOC", "ORG", "DEM", "DATETIME", "QUANTITY", "MISC")
"""The eight entity types of the Text Anonymization Benchmark, one DP-Fusion privacy group each."""


@dataclass(frozen=True)
class Span:
    """A labelled character span ``text[start:end]`` (``end`` exclusive, never empty).

    ``score`` is the recogniser's confidence in [0, 1]; ``source`` names the recogniser (for diagnostics; it never
    contains document text).
    """

    start: int
    end: int
    label: str
    score: float = 1.0
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("start", "end"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise InvalidInputError(f"span {name} must be an int, got {type(v).__name__}")
        if self.start < 0:
            raise InvalidInputError(f"span start must be >= 0, got {self.start}")
        if self.end <= self.start:
            raise InvalidInputError(f"span end must be > start, got start={self.start} end={self.end}")
        if not isinstance(self.label, str) or not self.label:
            raise InvalidInputError(f"span label must be a non-empty str (span {self.start}:{self.end})")
        score = self.score
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
            raise InvalidInputError(f"span score must be a finite number (span {self.start}:{self.end})")
        if not 0.0 <= score <= 1.0:
            raise InvalidInputError(f"span score must be in [0, 1], got {score} (span {self.start}:{self.end})")
        if not isinstance(self.source, str):
            raise InvalidInputError(f"span source must be a str (span {self.start}:{self.end})")
        object.__setattr__(self, "score", float(score))

    @property
    def length(self) -> int:
        """Number of characters covered."""
        return self.end - self.start

    def overlaps(self, other: Span) -> bool:
        """Whether the two spans share at least one character (touching spans do not overlap)."""
        return self.start < other.end and other.start < self.end

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (offsets, label, score, source; no text)."""
        return {"start": self.start, "end": self.end, "label": self.label, "score": self.score, "source": self.source}


def _winner_key(s: Span) -> tuple[int, float, int, str, str]:
    # Smaller key = better span: longest, then highest score, then earliest start, then label/source alphabetical.
    return (-s.length, -s.score, s.start, s.label, s.source)


def _clusters(spans: Iterable[Span]) -> list[list[Span]]:
    ordered = sorted(spans, key=lambda s: (s.start, s.end, s.label, -s.score, s.source))
    clusters: list[list[Span]] = []
    cluster_end = -1
    for s in ordered:
        if clusters and s.start < cluster_end:
            clusters[-1].append(s)
            cluster_end = max(cluster_end, s.end)
        else:
            clusters.append([s])
            cluster_end = s.end
    return clusters


def merge_overlaps(spans: Iterable[Span], mode: Literal["union", "drop"] = "union") -> list[Span]:
    """Resolve overlapping spans into a sorted list of pairwise non-overlapping spans (rule: module docstring).

    ``mode="union"`` (default) merges each cluster of overlapping spans into one span covering their union, labelled
    by the cluster's winner; ``mode="drop"`` keeps only spans that do not overlap a better one.

    >>> [(s.start, s.end, s.label) for s in merge_overlaps([Span(4, 8, "LOC"), Span(0, 4, "PERSON")])]  # touching
    [(0, 4, 'PERSON'), (4, 8, 'LOC')]
    >>> merge_overlaps([Span(0, 5, "PERSON", 0.9), Span(3, 12, "ORG", 0.5)], mode="drop")
    [Span(start=3, end=12, label='ORG', score=0.5, source='')]
    """
    if mode not in ("union", "drop"):
        raise InvalidInputError(f"merge mode must be 'union' or 'drop', got {mode!r}")
    spans = list(spans)
    for s in spans:
        if not isinstance(s, Span):
            raise InvalidInputError(f"expected Span objects, got {type(s).__name__}")
    out: list[Span] = []
    for cluster in _clusters(spans):
        if len(cluster) == 1:
            out.append(cluster[0])
            continue
        if mode == "union":
            w = min(cluster, key=_winner_key)
            start = min(s.start for s in cluster)
            end = max(s.end for s in cluster)
            out.append(Span(start, end, w.label, w.score, w.source))
        else:
            kept: list[Span] = []
            for s in sorted(cluster, key=_winner_key):
                if not any(s.overlaps(k) for k in kept):
                    kept.append(s)
            out.extend(kept)
    out.sort(key=lambda s: (s.start, s.end))
    return out


def validate_spans(
    spans: Iterable[Span],
    text_length: int,
    allowed_labels: Iterable[str] | None = TAB_LABELS,
    *,
    allow_overlaps: bool = True,
) -> list[Span]:
    """Check spans against a text of ``text_length`` characters; return them sorted by (start, end).

    Raises :class:`~dpinfer.errors.InvalidInputError` naming the offending offsets (never the text) if a span is not a
    :class:`Span`, ends beyond the text, has a label outside ``allowed_labels`` (``None``: any label), or, with
    ``allow_overlaps=False``, overlaps another span.

    >>> [(s.start, s.end, s.label) for s in validate_spans([Span(3, 9, "LOC"), Span(0, 2, "PERSON")], 10)]
    [(0, 2, 'PERSON'), (3, 9, 'LOC')]
    """
    if isinstance(text_length, bool) or not isinstance(text_length, int) or text_length < 0:
        raise InvalidInputError(f"text_length must be a non-negative int, got {text_length!r}")
    allowed = None if allowed_labels is None else frozenset(allowed_labels)
    out: list[Span] = []
    for i, s in enumerate(spans):
        if not isinstance(s, Span):
            raise InvalidInputError(f"span #{i} is a {type(s).__name__}, expected Span")
        if s.end > text_length:
            raise InvalidInputError(f"span #{i} ({s.start}:{s.end}) ends beyond the text (length {text_length})")
        if allowed is not None and s.label not in allowed:  # the label is not echoed: it may be a private string
            allowed_text = ", ".join(sorted(allowed))
            raise InvalidInputError(
                f"span #{i} ({s.start}:{s.end}) has an unknown label (not one of the allowed labels: {allowed_text})"
            )
        out.append(s)
    out.sort(key=lambda s: (s.start, s.end, s.label))
    if not allow_overlaps:
        for a, b in itertools.pairwise(out):
            if b.start < a.end:
                raise InvalidInputError(f"spans {a.start}:{a.end} and {b.start}:{b.end} overlap")
    return out


class Tagger(ABC):
    """Finds private spans in a text. Subclasses implement :meth:`_tag`; callers use :meth:`tag`.

    :meth:`tag` checks the input, runs :meth:`_tag`, checks every returned span against the text and
    :attr:`labels`, and resolves overlaps with :func:`merge_overlaps`. Any failure inside :meth:`_tag` other than a
    deliberate dpinfer error becomes a :class:`~dpinfer.errors.TaggingError` whose message names the tagger and the
    exception type only (the original exception, which might quote the text, is not chained).
    """

    name: ClassVar[str] = "base"
    labels: tuple[str, ...] = TAB_LABELS

    @abstractmethod
    def _tag(self, text: str) -> Sequence[Span]:
        """Return the spans found in ``text`` (any order, overlaps allowed, labels in :attr:`labels`)."""

    def tag(self, text: str) -> list[Span]:
        """Tagged spans of ``text``: sorted by start, pairwise non-overlapping, labels in :attr:`labels`."""
        if not isinstance(text, str):
            raise InvalidInputError(f"text must be a str, got {type(text).__name__}")
        if not text:
            return []
        try:
            raw = self._tag(text)
        except DPInferError:
            raise
        except Exception as e:  # fail closed; do not chain: the cause's message might quote the text
            raise TaggingError(f"{self.name} tagger failed ({type(e).__name__}); nothing was tagged") from None
        try:
            spans = validate_spans(raw, len(text), self.labels)
        except InvalidInputError as e:
            raise TaggingError(f"{self.name} tagger returned an invalid span: {e}") from None
        return merge_overlaps(spans)

    def tag_many(self, texts: Iterable[str]) -> list[list[Span]]:
        """:meth:`tag` applied to each text."""
        return [self.tag(t) for t in texts]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
