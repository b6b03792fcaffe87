"""User-given spans: the spans file format, :func:`load_spans`, and the ``spans`` tagger.

Accepted formats (a path to a JSON file, a JSON string, or the already-parsed object):

* a list of spans ``[{"start": 0, "end": 5, "label": "PERSON"}, ...]`` (optional ``score``, ``source``; the keys
  ``start_offset``/``end_offset``/``entity_type`` and ``start_position``/``end_position`` are accepted too);
* an object ``{"spans": [...]}`` with such a list;
* a TAB-style document ``{"text": ..., "entity_mentions": [{"start_offset", "end_offset", "entity_type", ...}]}``;
* an original TAB document ``{"text": ..., "annotations": {annotator: {"entity_mentions": [...]}}}``: the mentions
  of ``annotator``, or of every annotator (their union) when ``annotator`` is ``None``.

Offsets are character offsets, end exclusive. Labels must be TAB types (:data:`~dpinfer.taggers.base.TAB_LABELS`)
unless a ``label_map`` translates them. When the document carries its ``text`` (or ``text=`` is given), spans are
checked against it, and a mention's ``span_text`` must equal the text at its offsets; with both, the file's ``text``
must equal ``text`` (a spans file made for another document is refused even when its offsets happen to fit). Errors
name the span's index, offsets and the allowed labels, never a value or a string from the input (a malformed span
or a wrong label may hold private text).

>>> load_spans('[{"start": 0, "end": 4, "label": "PERSON"}]')
[Span(start=0, end=4, label='PERSON', score=1.0, source='user')]
>>> SpansTagger([Span(0, 4, "PERSON")]).tag("Anna went home.")
[Span(start=0, end=4, label='PERSON', score=1.0, source='')]
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpinfer.errors import InvalidInputError
from dpinfer.taggers.base import TAB_LABELS, Span, Tagger, merge_overlaps, validate_spans
from dpinfer.taggers.labels import LabelMap, validate_label_map

SpansSource = str | Path | Sequence[Any] | Mapping[str, Any]

_START_KEYS = ("start", "start_offset", "start_position")
_END_KEYS = ("end", "end_offset", "end_position")
_LABEL_KEYS = ("label", "entity_type")


def _parse_json(raw: str, where: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:  # its message quotes no content, but build our own to be sure
        raise InvalidInputError(f"{where} is not valid JSON (line {e.lineno}, column {e.colno})") from None


def _read_source(source: SpansSource) -> Any:
    if isinstance(source, Path) or (isinstance(source, str) and not source.lstrip().startswith(("[", "{"))):
        path = Path(source).expanduser()
        try:
            raw = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InvalidInputError(f"spans file not found: {path}") from None
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidInputError(f"cannot read spans file {path} ({type(e).__name__})") from None
        return _parse_json(raw, f"spans file {path}")
    if isinstance(source, str):
        return _parse_json(source, "spans string")
    if isinstance(source, (Mapping, Sequence)) and not isinstance(source, (bytes, bytearray)):
        return source
    raise InvalidInputError(
        f"spans source must be a path, a JSON string, a list or a dict, got {type(source).__name__}"
    )


def _span(i: int, start: Any, end: Any, label: str, score: Any, source: str) -> Span:
    try:
        return Span(start, end, label, score, source)
    except InvalidInputError as e:  # Span's messages name types and offsets only
        raise InvalidInputError(f"span #{i}: {e}") from None


def _pick(item: Mapping[str, Any], keys: tuple[str, ...], what: str, i: int) -> Any:
    for k in keys:
        if k in item:
            return item[k]
    raise InvalidInputError(f"span #{i} has no {what} (expected one of: {', '.join(keys)})")


def _mentions(doc: Any, annotator: str | None) -> tuple[list[Any], str | None]:
    """(list of span records, the document text if present)."""
    if isinstance(doc, Mapping):
        text = doc.get("text") if isinstance(doc.get("text"), str) else None
        if "entity_mentions" in doc:
            items = doc["entity_mentions"]
        elif "annotations" in doc:
            ann = doc["annotations"]
            if not isinstance(ann, Mapping) or not ann:
                raise InvalidInputError("'annotations' must be a non-empty object {annotator: {entity_mentions}}")
            names = [annotator] if annotator is not None else sorted(ann, key=str)
            items = []
            for k, name in enumerate(names):
                if name not in ann:
                    raise InvalidInputError(f"annotator {name!r} not in the document ({len(ann)} annotators)")
                block = ann[name]
                if not isinstance(block, Mapping) or not isinstance(block.get("entity_mentions"), list):
                    # the file's annotator names are not echoed (a hostile file may put text there)
                    raise InvalidInputError(f"annotator #{k} of the document has no 'entity_mentions' list")
                items.extend(block["entity_mentions"])
        elif "spans" in doc:
            items = doc["spans"]
        else:
            raise InvalidInputError("spans object must have 'entity_mentions', 'annotations' or 'spans'")
        if not isinstance(items, list):
            raise InvalidInputError("the span list must be a JSON array")
        return items, text
    if isinstance(doc, Sequence) and not isinstance(doc, (str, bytes, bytearray)):
        items = list(doc)
        if any(isinstance(x, Mapping) and ("entity_mentions" in x or "annotations" in x) for x in items):
            raise InvalidInputError("got a list of documents; pass one document (its dict) at a time")
        return items, None
    raise InvalidInputError(f"spans must be a list or an object, got {type(doc).__name__}")


def load_spans(
    source: SpansSource,
    *,
    text: str | None = None,
    allowed_labels: Iterable[str] = TAB_LABELS,
    label_map: LabelMap | None = None,
    annotator: str | None = None,
) -> list[Span]:
    """Parse user spans (formats: module docstring) into validated :class:`Span` objects sorted by position.

    Overlapping spans are kept (the ``spans`` tagger resolves them). Raises
    :class:`~dpinfer.errors.InvalidInputError` for malformed input, a label outside ``allowed_labels`` (after
    ``label_map``, if given; a label mapped to ``None`` is dropped), an offset beyond the text, or a ``span_text``
    that does not match the text. Messages carry offsets and labels, never text.
    """
    allowed = tuple(allowed_labels)
    lmap = validate_label_map(label_map, targets=allowed) if label_map is not None else None
    items, doc_text = _mentions(_read_source(source), annotator)
    if text is not None and not isinstance(text, str):
        raise InvalidInputError(f"text must be a str, got {type(text).__name__}")
    if text is not None and doc_text is not None and doc_text != text:
        raise InvalidInputError(
            f"the spans file carries the text of another document ({len(doc_text)} characters, this document has "
            f"{len(text)}, and the texts differ); give the spans made for this document"
        )
    check_text = text if text is not None else doc_text
    spans: list[Span] = []
    for i, item in enumerate(items):
        if isinstance(item, Span):
            spans.append(item)
            continue
        if not isinstance(item, Mapping):
            raise InvalidInputError(f"span #{i} must be an object, got {type(item).__name__}")
        start = _pick(item, _START_KEYS, "start offset", i)
        end = _pick(item, _END_KEYS, "end offset", i)
        label = _pick(item, _LABEL_KEYS, "label", i)
        if not isinstance(label, str) or not label:
            raise InvalidInputError(f"span #{i} label must be a non-empty string")
        source_name = item.get("source", "user")
        source_name = source_name if isinstance(source_name, str) else "user"
        span = _span(i, start, end, "MISC", item.get("score", 1.0), source_name)  # offsets and score checked first
        if label not in allowed and lmap is not None and label in lmap:
            mapped = lmap[label]
            if mapped is None:
                continue
            label = mapped
        if label not in allowed:  # the label itself is not echoed: it may be a private string
            raise InvalidInputError(
                f"span #{i} ({span.start}:{span.end}) has an unknown label (not a TAB type; allowed labels: "
                f"{', '.join(allowed)}; translate others with a label map)"
            )
        spans.append(Span(span.start, span.end, label, span.score, span.source))
        span_text = item.get("span_text")
        if span_text is not None and not isinstance(span_text, str):
            raise InvalidInputError(f"span #{i} ({span.start}:{span.end}): span_text must be a string")
        if check_text is not None and span_text is not None:
            if span.end > len(check_text) or check_text[span.start:span.end] != span_text:
                raise InvalidInputError(
                    f"span #{i} ({span.start}:{span.end}): span_text does not match this document's text at its "
                    "offsets; give the spans made for this document"
                )
    if check_text is not None:
        return validate_spans(spans, len(check_text), allowed)
    return sorted(spans, key=lambda s: (s.start, s.end, s.label))


class SpansTagger(Tagger):
    """Returns spans the user gave (a list of :class:`Span` or anything :func:`load_spans` accepts).

    :meth:`tag` checks them against the text (:class:`~dpinfer.errors.InvalidInputError` naming the offsets if one
    falls outside it) and resolves overlaps like every tagger.
    """

    name = "spans"

    def __init__(
        self,
        spans: SpansSource | Iterable[Span] = (),
        *,
        label_map: LabelMap | None = None,
        allowed_labels: Iterable[str] = TAB_LABELS,
        annotator: str | None = None,
    ) -> None:
        self.labels = tuple(allowed_labels)
        if isinstance(spans, (str, Path, Mapping)):
            self.spans = load_spans(spans, allowed_labels=self.labels, label_map=label_map, annotator=annotator)
        else:
            items = list(spans)
            if all(isinstance(s, Span) for s in items):
                self.spans = validate_spans(items, _UNBOUNDED, self.labels)
            else:
                self.spans = load_spans(items, allowed_labels=self.labels, label_map=label_map)

    def _tag(self, text: str) -> list[Span]:
        return validate_spans(self.spans, len(text), self.labels)


_UNBOUNDED = 2**62


@dataclass(frozen=True)
class ResolvedSpans:
    """The private spans of one document and where they came from (public facts about the run, no text).

    ``source`` is ``"given"`` (the user's spans alone), ``"tagger"`` (the tagger's) or ``"given+tagger"`` (the user's
    spans left some entity types uncovered: the tagger tagged the document for those types and its spans were merged
    in, :func:`fill_uncovered`); ``tagger`` names the tagger that ran, ``tagged_labels`` the types it was asked for and
    ``added`` how many spans it added (the number of spans is public under DP-Fusion's adjacency).

    >>> r = ResolvedSpans([Span(0, 4, "PERSON")], "given+tagger", tagger="regex", tagged_labels=("CODE",), added=0,
    ...                   given_labels=("PERSON",))
    >>> print(r.note())
    the spans given cover PERSON only: the regex tagger tagged the document for CODE too and added 0 spans \
(--spans-only: use the given spans alone)
    """

    spans: list[Span]
    source: str
    tagger: str | None = None
    tagged_labels: tuple[str, ...] = ()
    added: int = 0
    given_labels: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """What a release records about its spans (``settings["span_source"]``): the source, never the spans."""
        out: dict[str, Any] = {"from": self.source}
        if self.tagger:
            out["tagger"] = self.tagger
        if self.source == "given+tagger":
            out["tagged_for"] = list(self.tagged_labels)
            out["tagger_added"] = self.added
        return out

    def note(self) -> str | None:
        """One line for standard error when the tagger filled in types the given spans left out (else ``None``)."""
        if self.source != "given+tagger":
            return None
        covered = ", ".join(self.given_labels) if self.given_labels else "no type"
        return (f"the spans given cover {covered} only: the {self.tagger} tagger tagged the document for "
                f"{', '.join(self.tagged_labels)} too and added {self.added} spans (--spans-only: use the given spans "
                "alone)")


def uncovered_labels(given: Iterable[Span], labels: Iterable[str] = TAB_LABELS) -> tuple[str, ...]:
    """The entity types among ``labels`` that no given span has.

    >>> uncovered_labels([Span(0, 4, "PERSON")], ("PERSON", "LOC", "DATETIME"))
    ('LOC', 'DATETIME')
    """
    have = {s.label for s in given}
    return tuple(label for label in labels if label not in have)


def fill_uncovered(text: str, given: Sequence[Span], tagger: Tagger) -> ResolvedSpans:
    """Fail closed on partial spans: tag ``text`` for the entity types the ``given`` spans leave uncovered and merge
    the tagger's spans of those types with the given ones (overlaps merged, :func:`merge_overlaps`; a given span is
    never dropped or shrunk). With every type of the tagger covered, the given spans are returned alone (source
    ``"given"``) and the tagger does not run.

    >>> from dpinfer.taggers.regex_tagger import RegexTagger
    >>> r = fill_uncovered("Mr X, application no. 12345/06.", [Span(0, 4, "PERSON")], RegexTagger())
    >>> r.source, r.added, [s.label for s in r.spans]
    ('given+tagger', 1, ['PERSON', 'CODE'])
    """
    name = getattr(tagger, "name", "given")
    missing = uncovered_labels(given, tagger.labels)
    if not missing:
        return ResolvedSpans(list(given), "given")
    tagged = [s for s in tagger.tag(text) if s.label in missing]
    merged = merge_overlaps([*given, *(Span(s.start, s.end, s.label, s.score, f"tagger:{name}") for s in tagged)])
    given_labels = tuple(label for label in TAB_LABELS if any(s.label == label for s in given))
    return ResolvedSpans(merged, "given+tagger", tagger=name, tagged_labels=missing, added=len(tagged),
                         given_labels=given_labels)
