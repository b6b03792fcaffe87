"""Span, validation, overlap resolution, label map, registry, and the base tagger's fail-closed wrapper."""

from __future__ import annotations

import pytest

from dpinfer.errors import InvalidInputError, TaggingError
from dpinfer.taggers import (
    TAB_LABELS,
    Span,
    Tagger,
    available_taggers,
    default_label_map,
    get_tagger,
    map_label,
    merge_overlaps,
    register_tagger,
    validate_label_map,
    validate_spans,
)
from dpinfer.taggers import registry as registry_module

SECRET = "Zyxwvut Qponmlk"


# ------------------------------------------------------------------------------------------------------ Span


def test_span_fields_and_defaults():
    s = Span(2, 7, "PERSON")
    assert (s.start, s.end, s.label, s.score, s.source, s.length) == (2, 7, "PERSON", 1.0, "", 5)
    assert s.to_dict() == {"start": 2, "end": 7, "label": "PERSON", "score": 1.0, "source": ""}
    with pytest.raises(AttributeError):
        s.start = 3  # frozen


@pytest.mark.parametrize(
    "kwargs",
    [
        {"start": -1, "end": 3, "label": "PERSON"},
        {"start": 3, "end": 3, "label": "PERSON"},
        {"start": 5, "end": 3, "label": "PERSON"},
        {"start": 1.0, "end": 3, "label": "PERSON"},
        {"start": True, "end": 3, "label": "PERSON"},
        {"start": 0, "end": 3, "label": ""},
        {"start": 0, "end": 3, "label": "PERSON", "score": 1.5},
        {"start": 0, "end": 3, "label": "PERSON", "score": float("nan")},
        {"start": 0, "end": 3, "label": "PERSON", "source": 3},
    ],
)
def test_span_rejects_bad_values(kwargs):
    with pytest.raises(InvalidInputError):
        Span(**kwargs)


def test_overlaps_and_touching():
    assert Span(0, 5, "LOC").overlaps(Span(4, 6, "LOC"))
    assert not Span(0, 5, "LOC").overlaps(Span(5, 6, "LOC"))


# ---------------------------------------------------------------------------------------------- merge_overlaps


def test_merge_union_takes_longest_label_and_covers_union():
    spans = [Span(0, 5, "PERSON", 0.9, "a"), Span(3, 12, "ORG", 0.5, "b"), Span(11, 14, "LOC", 1.0, "c")]
    assert merge_overlaps(spans) == [Span(0, 14, "ORG", 0.5, "b")]


def test_merge_ties_broken_by_score_then_start_then_label():
    assert merge_overlaps([Span(0, 4, "LOC", 0.5), Span(0, 4, "ORG", 0.9)]) == [Span(0, 4, "ORG", 0.9)]
    assert merge_overlaps([Span(2, 6, "LOC", 0.5), Span(0, 4, "ORG", 0.5)])[0].label == "ORG"
    assert merge_overlaps([Span(0, 4, "ORG"), Span(0, 4, "LOC")])[0].label == "LOC"


def test_merge_is_order_independent_and_keeps_touching_spans_apart():
    spans = [Span(10, 15, "DATETIME"), Span(0, 4, "PERSON"), Span(4, 8, "LOC"), Span(12, 20, "CODE", 0.2)]
    expected = merge_overlaps(spans)
    assert merge_overlaps(list(reversed(spans))) == expected
    assert expected == [Span(0, 4, "PERSON"), Span(4, 8, "LOC"), Span(10, 20, "CODE", 0.2)]


def test_merge_drop_mode():
    spans = [Span(0, 5, "PERSON"), Span(3, 12, "ORG"), Span(11, 14, "LOC")]
    assert merge_overlaps(spans, mode="drop") == [Span(3, 12, "ORG")]
    with pytest.raises(InvalidInputError):
        merge_overlaps(spans, mode="nope")


# --------------------------------------------------------------------------------------------- validate_spans


def test_validate_spans_sorts_and_accepts():
    out = validate_spans([Span(5, 9, "LOC"), Span(0, 3, "PERSON")], 9)
    assert [s.start for s in out] == [0, 5]


def test_validate_spans_out_of_range_names_offsets_only():
    with pytest.raises(InvalidInputError) as e:
        validate_spans([Span(3, 40, "PERSON")], len(SECRET))
    msg = str(e.value)
    assert "3:40" in msg and str(len(SECRET)) in msg
    assert SECRET not in msg and "Zyx" not in msg


def test_validate_spans_unknown_label_lists_allowed_and_never_echoes_the_label():
    with pytest.raises(InvalidInputError) as e:
        validate_spans([Span(0, 3, "John Smith")], 10)  # a label value may be a private string
    assert "John" not in str(e.value) and "0:3" in str(e.value) and "unknown label" in str(e.value)
    for label in TAB_LABELS:
        assert label in str(e.value)


def test_validate_spans_overlap_check_and_type_check():
    with pytest.raises(InvalidInputError, match="overlap"):
        validate_spans([Span(0, 3, "LOC"), Span(2, 5, "LOC")], 10, allow_overlaps=False)
    with pytest.raises(InvalidInputError):
        validate_spans([(0, 3, "LOC")], 10)
    assert validate_spans([Span(0, 3, "ANY")], 10, allowed_labels=None)[0].label == "ANY"


# ----------------------------------------------------------------------------------------------- label map


def test_label_map_values_are_tab_types_or_null():
    m = default_label_map()
    assert set(v for v in m.values() if v is not None) <= set(TAB_LABELS)
    for label in TAB_LABELS:
        assert m[label] == label
    assert m["ECHR_APPLICATION_NO"] == "CODE"
    assert m["DATE_TIME"] == m["DATE"] == "DATETIME"
    assert map_label("ORDINAL") is None
    default_label_map()["PERSON"] = "LOC"  # a copy: the bundled map is unchanged
    assert map_label("PERSON") == "PERSON"


def test_validate_label_map_rejects_unknown_targets():
    with pytest.raises(InvalidInputError, match="unknown type"):
        validate_label_map({"X": "NAME"})
    with pytest.raises(InvalidInputError):
        validate_label_map(["PERSON"])


# ------------------------------------------------------------------------------------------------ registry


def test_registry_lists_and_builds():
    assert {"presidio", "regex", "spans"} <= set(available_taggers())
    assert get_tagger("regex").name == "regex"
    assert get_tagger("spans", spans=[Span(0, 2, "LOC")]).tag("abc") == [Span(0, 2, "LOC")]
    with pytest.raises(InvalidInputError, match="available"):
        get_tagger("no-such-tagger")


def test_register_tagger_refuses_duplicates():
    with pytest.raises(InvalidInputError):
        register_tagger("regex", lambda **kw: None)
    register_tagger("_test_tmp", lambda **kw: _Fixed([]))
    try:
        assert get_tagger("_test_tmp").tag("x") == []
    finally:
        registry_module._FACTORIES.pop("_test_tmp", None)


# -------------------------------------------------------------------------------------------- fail closed


class _Fixed(Tagger):
    name = "fixed"

    def __init__(self, spans):
        self.spans = spans

    def _tag(self, text):
        return self.spans


class _Exploding(Tagger):
    name = "exploding"

    def _tag(self, text):
        raise RuntimeError(f"failed on {text}")


def test_tagger_wraps_errors_without_text():
    with pytest.raises(TaggingError) as e:
        _Exploding().tag(f"Mr {SECRET} lives here")
    assert SECRET not in str(e.value)
    assert "RuntimeError" in str(e.value)
    assert e.value.__cause__ is None and e.value.__suppress_context__


def test_tagger_rejects_invalid_output_as_tagging_error():
    with pytest.raises(TaggingError, match="invalid span"):
        _Fixed([Span(0, 50, "PERSON")]).tag("short")
    with pytest.raises(TaggingError):
        _Fixed([Span(0, 2, "NAME")]).tag("short")


def test_tagger_checks_input_and_merges():
    with pytest.raises(InvalidInputError):
        _Fixed([]).tag(b"bytes")
    assert _Fixed([Span(0, 1, "LOC")]).tag("") == []
    assert _Fixed([Span(0, 3, "LOC"), Span(2, 5, "PERSON", 0.5)]).tag("abcdef") == [Span(0, 5, "LOC")]
