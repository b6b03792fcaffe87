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
