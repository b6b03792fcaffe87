"""load_spans (both formats, files, strings) and the spans tagger."""

from __future__ import annotations

import json

import pytest

from dpinfer.errors import InvalidInputError
from dpinfer.taggers import Span, SpansTagger, load_spans

TEXT = "Mr Zyxwvut Qponmlk lodged application no. 36244/06 on 10 March 2003."
NAME = "Zyxwvut Qponmlk"


def _mention(start, end, etype, **extra):
    return {"start_offset": start, "end_offset": end, "entity_type": etype, **extra}


def test_simple_list_format():
    spans = load_spans([{"start": 42, "end": 50, "label": "CODE"}, {"start": 0, "end": 18, "label": "PERSON"}])
    assert spans == [Span(0, 18, "PERSON", 1.0, "user"), Span(42, 50, "CODE", 1.0, "user")]


def test_tab_document_format_checks_span_text():
    doc = {
        "doc_id": "x",
        "text": TEXT,
        "entity_mentions": [_mention(0, 18, "PERSON", span_text=TEXT[0:18]), _mention(42, 50, "CODE")],
    }
    spans = load_spans(doc)
    assert [(s.start, s.end, s.label) for s in spans] == [(0, 18, "PERSON"), (42, 50, "CODE")]
    bad = dict(doc, entity_mentions=[_mention(0, 18, "PERSON", span_text="Mr Somebody Else..")])
    with pytest.raises(InvalidInputError) as e:
        load_spans(bad)
    assert "0:18" in str(e.value) and NAME not in str(e.value)


def test_original_tab_annotations_union_or_one_annotator():
    doc = {
        "text": TEXT,
        "annotations": {
            "annotator1": {"entity_mentions": [_mention(0, 18, "PERSON")]},
            "annotator2": {"entity_mentions": [_mention(54, 67, "DATETIME")]},
        },
    }
    assert len(load_spans(doc)) == 2
    assert [s.label for s in load_spans(doc, annotator="annotator2")] == ["DATETIME"]
    with pytest.raises(InvalidInputError):
        load_spans(doc, annotator="nobody")


def test_json_string_and_file(tmp_path):
    payload = {"spans": [{"start": 3, "end": 18, "label": "PERSON", "score": 0.7}]}
    assert load_spans(json.dumps(payload))[0].score == 0.7
    f = tmp_path / "spans.json"
    f.write_text(json.dumps([_mention(0, 2, "PERSON")]), encoding="utf-8")
    assert load_spans(f) == load_spans(str(f))
    with pytest.raises(InvalidInputError, match="not found"):
        load_spans(tmp_path / "missing.json")
    with pytest.raises(InvalidInputError, match="not valid JSON"):
        load_spans("[{not json")


def test_unknown_label_lists_allowed_labels():
    with pytest.raises(InvalidInputError) as e:
        load_spans([{"start": 0, "end": 2, "label": "NAME"}])
    msg = str(e.value)
    assert "unknown label" in msg and "PERSON" in msg and "QUANTITY" in msg


def test_label_map_translates_and_drops():
    spans = load_spans(
        [{"start": 0, "end": 2, "label": "EMAIL_ADDRESS"}, {"start": 3, "end": 5, "label": "ORDINAL"}],
        label_map={"EMAIL_ADDRESS": "CODE", "ORDINAL": None},
    )
    assert spans == [Span(0, 2, "CODE", 1.0, "user")]


def test_out_of_range_checked_against_text():
    with pytest.raises(InvalidInputError) as e:
        load_spans([{"start": 0, "end": 500, "label": "PERSON"}], text=TEXT)
    assert "0:500" in str(e.value) and NAME not in str(e.value)
    tagger = SpansTagger([{"start": 60, "end": 90, "label": "DATETIME"}])
    with pytest.raises(InvalidInputError) as e:
        tagger.tag(TEXT)
    assert "60:90" in str(e.value) and NAME not in str(e.value)


@pytest.mark.parametrize(
    "bad",
    [
        [{"end": 2, "label": "PERSON"}],
        [{"start": 0, "end": 2}],
        [{"start": "0", "end": 2, "label": "PERSON"}],
        [{"start": 2, "end": 1, "label": "PERSON"}],
        [[0, 2, "PERSON"]],
        {"no_spans": []},
        [{"text": "a", "entity_mentions": []}],
        42,
    ],
)
def test_malformed_inputs(bad):
    with pytest.raises(InvalidInputError):
        load_spans(bad)


def test_spans_tagger_resolves_overlaps_and_sorts():
    tagger = SpansTagger([Span(42, 50, "CODE"), Span(0, 18, "PERSON"), Span(3, 10, "PERSON", 0.4)])
    assert tagger.tag(TEXT) == [Span(0, 18, "PERSON"), Span(42, 50, "CODE")]


def test_spans_tagger_accepts_dicts_and_paths(tmp_path):
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"text": TEXT, "entity_mentions": [_mention(0, 18, "PERSON")]}), encoding="utf-8")
    assert [s.label for s in SpansTagger(f).tag(TEXT)] == ["PERSON"]
    assert [s.label for s in SpansTagger([{"start": 0, "end": 2, "label": "LOC"}]).tag(TEXT)] == ["LOC"]


# --------------------------------------------------------------------------------------------------------------------
# fuzz: hostile spans files (issue 10). Every string in the input carries the marker "Zq"; no message may contain it.

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from dpinfer.taggers.base import TAB_LABELS  # noqa: E402

_SECRET = st.text("abcxyz John", min_size=1, max_size=6).map(lambda s: "Zq" + s)
_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.integers(-3, 120),
                    st.floats(allow_nan=True, allow_infinity=True), _SECRET)
_KEYS = st.one_of(st.sampled_from(["start", "end", "label", "start_offset", "end_offset", "entity_type",
                                   "span_text", "score", "source", "start_position", "end_position"]), _SECRET)
_VALUE = st.recursive(_SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(_KEYS, inner, max_size=4)), max_leaves=8)
_SPAN = st.one_of(
    st.fixed_dictionaries({"start": st.integers(-2, 120), "end": st.integers(-2, 120),
                           "label": st.one_of(st.sampled_from(TAB_LABELS), _SECRET)},
                          optional={"span_text": _SECRET, "score": _SCALAR, "source": _SCALAR}),
    st.dictionaries(_KEYS, _VALUE, max_size=5),
    _VALUE,
)
_LIST = st.lists(_SPAN, max_size=5)
_SOURCE = st.one_of(
    _LIST,
    st.fixed_dictionaries({"spans": st.one_of(_LIST, _VALUE)}),
    st.fixed_dictionaries({"entity_mentions": st.one_of(_LIST, _VALUE)}, optional={"text": _SECRET}),
    st.fixed_dictionaries({"annotations": st.one_of(st.dictionaries(_SECRET, st.fixed_dictionaries(
        {"entity_mentions": _LIST}), max_size=2), _VALUE)}, optional={"text": _SECRET}),
    _VALUE,
)
_DOCUMENT = "Zq John Smith lived in Zq London from 1970 to 1998, Zq case 36244/06, Zq judge Brown, Zq Oslo."


@settings(max_examples=400, deadline=None, derandomize=True)
@given(_SOURCE, st.booleans(), st.booleans())
def test_fuzz_span_parser_never_crashes_and_never_echoes_input(source, as_json, with_text):
    if as_json:
        source = json.dumps(source)
        if not source.lstrip().startswith(("[", "{")):
            return  # a bare scalar string is read as a path (paths may be named in messages)
    elif isinstance(source, str):
        return
    try:
        spans = load_spans(source, text=_DOCUMENT if with_text else None)
    except InvalidInputError as e:
        assert "Zq" not in str(e) and "John" not in str(e), str(e)
    else:
        assert all(isinstance(s, Span) for s in spans)
    from dpinfer.pipelines.sanitize_plan import resolve_spans

    try:
        resolve_spans(_DOCUMENT, spans=source, method="ner-scrub")
    except InvalidInputError as e:
        assert "Zq" not in str(e) and "John" not in str(e) and "\n" not in str(e), str(e)


def test_malformed_span_holding_a_name_is_not_echoed():
    for bad in ([{"start": "John Smith", "end": 4, "label": "PERSON"}],
                [{"start": 0, "end": 4, "label": "John Smith"}],
                [{"start": "John", "end": "Smith", "label": "John Smith"}],
                [{"start": 0, "end": 4, "label": "PERSON", "score": "John Smith"}]):
        with pytest.raises(InvalidInputError) as e:
            load_spans(bad)
        assert "John" not in str(e.value) and "Smith" not in str(e.value) and "#0" in str(e.value)


def test_spans_file_of_another_document_is_refused_even_when_offsets_fit():
    mine, theirs = "Anna went home.", "Bert went away."
    tab = {"text": theirs, "entity_mentions": [{"start_offset": 0, "end_offset": 4, "entity_type": "PERSON"}]}
    with pytest.raises(InvalidInputError, match="another document"):
        load_spans(tab, text=mine)
    tab = [{"start": 0, "end": 4, "label": "PERSON", "span_text": "Bert"}]
    with pytest.raises(InvalidInputError, match="does not match") as e:
        load_spans(tab, text=mine)
    assert "Bert" not in str(e.value) and "Anna" not in str(e.value)
    assert load_spans([{"start": 0, "end": 4, "label": "PERSON", "span_text": "Anna"}], text=mine)[0].end == 4
