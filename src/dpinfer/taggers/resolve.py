"""The private spans of one document and its privacy groups, resolved before any model loads (fail closed).

:func:`resolve_span_source` takes the user's spans (checked against THIS document) or tags the document, and refuses a
document with nothing to protect; :func:`resolve_groups` turns the labels present into privacy groups. Errors name
indices, offsets and labels, never text.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from dpinfer import taggers
from dpinfer.checks import is_number
from dpinfer.defaults import SANITIZE
from dpinfer.errors import ConfigurationError, InvalidInputError
from dpinfer.taggers.base import TAB_LABELS, Span, Tagger, merge_overlaps, validate_spans
from dpinfer.taggers.spans import ResolvedSpans, fill_uncovered, load_spans


def resolve_span_source(
    text: str,
    *,
    spans: Any = None,
    tagger: Any = SANITIZE.tagger,
    label_map: Mapping[str, str | None] | None = None,
    require_spans: bool = True,
    allow_untagged: bool = False,
    tag_uncovered: bool = False,
) -> ResolvedSpans:
    """The private spans of ``text``: the user's ``spans`` checked against THIS document, or the tagger's.

    Needs no model, so callers (the CLI) run it before loading one. User spans must fit the document; a spans file
    that carries the document's ``text`` must carry exactly this text, and each span's ``span_text`` (when present)
    must equal the text at its offsets, so spans made for another document are refused. Overlapping spans are MERGED
    (one span covering their union, labelled by the longest member, as the taggers do: :func:`merge_overlaps`), never
    dropped. With no span at all, a method that protects spans (``require_spans``) would release the document without
    protecting anything, so it is refused unless ``allow_untagged``. With ``tag_uncovered`` (and a ``tagger``), given
    spans that leave some entity types uncovered are completed by the tagger for those types
    (:func:`~dpinfer.taggers.spans.fill_uncovered`). A :class:`ResolvedSpans` passed as ``spans`` (resolved earlier,
    e.g. by the command line before the model loads) is returned as it is.
    """
    if not isinstance(text, str) or not text.strip():
        raise InvalidInputError("the document is empty")
    if isinstance(spans, ResolvedSpans):
        validate_spans(spans.spans, len(text))
        return spans

    def build_tagger() -> Tagger:
        kw = {"label_map": label_map} if label_map else {}
        return tagger if isinstance(tagger, Tagger) else taggers.get_tagger(tagger, **kw)  # looked up when built

    if spans is not None:
        if isinstance(spans, Sequence) and not isinstance(spans, str) and all(isinstance(s, Span) for s in spans):
            loaded = list(spans)
        else:
            loaded = load_spans(spans, text=text, label_map=label_map)
        given = merge_overlaps(validate_spans(loaded, len(text)))
        if tag_uncovered and tagger is not None:
            resolved = fill_uncovered(text, given, build_tagger())  # fail closed: a tagging error propagates
            source = f"the spans given are empty and the {resolved.tagger} tagger found nothing"
        else:
            resolved = ResolvedSpans(given, "given")
            source = "the spans given are empty"
    else:
        if tagger is None:
            raise ConfigurationError("give spans= or a tagger (e.g. tagger='presidio' or 'regex')")
        tg = build_tagger()
        resolved = ResolvedSpans(tg.tag(text), "tagger", tagger=getattr(tg, "name", "given"))  # errors propagate
        source = f"the {resolved.tagger} tagger found nothing"
    if not resolved.spans and require_spans and not allow_untagged:
        raise InvalidInputError(
            f"no private span to protect ({source}): the rewrite would read the whole document and protect nothing; "
            "give spans (--spans FILE) or another tagger, or pass --allow-untagged (API: allow_untagged=True) to "
            "rewrite it without protection"
        )
    return resolved


def resolve_groups(spans: Sequence[Span], groups: Mapping[str, Sequence[str]] | None) -> dict[str, list[str]]:
    """Group name → labels, restricted to labels present in ``spans``; default one group per label present. Labels
    the user did not group keep a group of their own."""
    present = sorted({s.label for s in spans}, key=TAB_LABELS.index)
    if groups is None:
        return {label: [label] for label in present}
    check_group_labels(groups)
    out: dict[str, list[str]] = {name: [lab for lab in labels if lab in present] for name, labels in groups.items()}
    out = {name: members for name, members in out.items() if members}
    grouped = {label for labels in groups.values() for label in labels}
    for lab in present:
        if lab in grouped:
            continue
        if lab in out:
            raise InvalidInputError(f"group name {lab!r} clashes with an ungrouped label of the same name")
        out[lab] = [lab]
    return out


def check_group_labels(groups: Mapping[str, Sequence[str]]) -> None:
    """Every label of ``groups`` is a TAB label, and no label is in two groups (names and the mapping's shape are
    :class:`~dpinfer.configs.sanitize.SanitizeConfig`'s checks)."""
    if not isinstance(groups, Mapping):
        raise InvalidInputError("groups must map group names to lists of labels")
    seen: dict[str, str] = {}
    for gname, labels in groups.items():
        for label in labels:
            if label not in TAB_LABELS:
                raise InvalidInputError(f"unknown label in a group; labels: {', '.join(TAB_LABELS)}")
            if label in seen:
                raise InvalidInputError("a label is in two groups; give each label to one group only")
            seen[label] = gname


def resolve_group_epsilon(group_names: Sequence[str], groups: Mapping[str, Sequence[str]], epsilon: float | None,
                          group_epsilon: Mapping[str, float] | None) -> dict[str, float]:
    """Target ε per group: ``group_epsilon`` by group name (or by a label of the group, the smallest), else
    ``epsilon`` (else the default)."""
    targets: dict[str, float] = {}
    given = dict(group_epsilon or {})
    for key in given:
        if key not in TAB_LABELS and key not in group_names and key not in groups:
            raise InvalidInputError(
                f"--group-epsilon names a key that is neither a group nor a label; labels: {', '.join(TAB_LABELS)}"
            )
    for name in group_names:
        value = given.get(name)
        if value is None:
            hits = [given[lab] for lab in groups[name] if lab in given]
            value = min(hits) if hits else epsilon
        if value is None:
            value = SANITIZE.epsilon
        if not (is_number(value) and math.isfinite(value) and value > 0):
            raise ConfigurationError(f"ε for group {name} must be a finite number > 0, got {value!r}")
        targets[name] = float(value)
    return targets
