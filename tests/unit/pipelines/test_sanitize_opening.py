"""The public opening of a rewrite: read from the public context only, the same for every neighbouring document,
forced in every row, never used by the methods that protect the whole document, and free of privacy cost."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpinfer.pipelines.sanitize import sanitize
from dpinfer.pipelines.sanitize_contexts import DEFAULT_INSTRUCTION, prepare_contexts, public_opening
from dpinfer.taggers import Span
from dpinfer.taggers.resolve import resolve_groups

DOC = "The applicant, Mr Smith, a lawyer practising in London, lodged application no. 36244/06 on 20 May 1998."
SPANS = [Span(18, 23, "PERSON"), Span(48, 54, "LOC"), Span(79, 87, "CODE"), Span(91, 102, "DATETIME")]
NEIGHBOUR = DOC.replace("Smith", "Jones")  # replace-one neighbour of the PERSON group


def test_fixture_spans() -> None:
    assert [DOC[s.start:s.end] for s in SPANS] == ["Smith", "London", "36244/06", "20 May 1998"]


def test_opening_stops_before_the_first_placeholder_and_reads_the_public_context_only(tiny_lm) -> None:
    groups = resolve_groups(SPANS, None)
    prep = prepare_contexts(tiny_lm, DOC, SPANS, groups, "Rewrite:")
    op = prep.opening(64)
    assert op and op == prep.public[prep.document_start: prep.document_start + len(op)]
    assert prep.public[prep.document_start + len(op)] == prep.placeholder  # stopped at the first placeholder
    assert "Smith" not in tiny_lm.decode(op) and tiny_lm.decode(op).strip().startswith("The applicant")
    assert prep.opening(2) == op[:2] and prep.opening(None) == [] and prep.opening(0) == []
    other = prepare_contexts(tiny_lm, NEIGHBOUR, SPANS, groups, "Rewrite:")
    assert other.opening(64) == op  # every neighbouring document has the same opening
    assert public_opening([1, 2, 3], 0, 3, 0, 16) == [1, 2, 3]  # no placeholder: the document, up to the cap


def test_dp_fusion_release_starts_with_the_opening_and_epsilon_does_not_move(tiny_lm) -> None:
    kw = {"lm": tiny_lm, "spans": SPANS, "max_new_tokens": 6, "seed": 1}
    op = prepare_contexts(tiny_lm, DOC, SPANS, resolve_groups(SPANS, None), DEFAULT_INSTRUCTION).opening(16)
    with_op = sanitize(DOC, **kw)
    without = sanitize(DOC, **kw, opening_tokens=None)
    assert with_op.token_ids[: len(op)] == op and with_op.generated_tokens <= 6
    assert len(with_op.token_ids) == len(op) + with_op.generated_tokens
    assert with_op.settings["opening_tokens"] == 16 and without.settings["opening_tokens"] is None
    assert with_op.guarantee.epsilon == without.guarantee.epsilon  # the opening is public: ε is unchanged
    assert "starts with the document's opening" in with_op.release()["guarantee"]["details"]
    assert "opening" not in without.release()["guarantee"]["details"]


@pytest.mark.parametrize("method", ["dp-prompt", "dp-decoding"])
def test_whole_document_methods_never_use_an_opening(tiny_lm, method: str) -> None:
    res = sanitize(DOC, lm=tiny_lm, method=method, spans=SPANS, max_new_tokens=4, seed=0, epsilon=1000.0)
    assert res.settings["opening_tokens"] is None and len(res.token_ids) == res.generated_tokens


SPAN_CHARS = "0123456789 +-.,;:@/()[]{}<>'\"!?&#abcXYZ\n\t"
EDGES = [("Contact (", ")."), ("She lives at ", " now."), ("Call ", ""), ("", " wrote."), ("[", "]"), ("RE: ", ", hi"),
         ("x", "y"), ("Tel.:", "\n")]


def _collapsed(ids: list[int], placeholder: int) -> list[int]:
    """``ids`` with every run of placeholders written once (the runs' lengths are the spans' token lengths: public)."""
    return [t for i, t in enumerate(ids) if t != placeholder or i == 0 or ids[i - 1] != placeholder]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edge=st.sampled_from(EDGES), contents=st.lists(st.text(SPAN_CHARS, min_size=1, max_size=12), min_size=2,
                                                       max_size=2))
def test_public_context_and_opening_do_not_depend_on_a_spans_content(tiny_lm, edge, contents) -> None:
    """Two documents that differ only inside a span (digits, punctuation, spaces, brackets at its edges) give the same
    public context, up to the number of placeholders (the span's token length, public under the adjacency), and
    byte-identical openings."""
    prefix, suffix = edge
    preps = []
    for content in contents:
        doc = prefix + content + suffix
        spans = [Span(len(prefix), len(prefix) + len(content), "PERSON")]
        preps.append(prepare_contexts(tiny_lm, doc, spans, {"PERSON": ["PERSON"]}, "Rewrite:"))
    a, b = preps
    assert _collapsed(a.public, a.placeholder) == _collapsed(b.public, b.placeholder)
    assert a.opening(16) == b.opening(16) and a.document_start == b.document_start
    assert a.placeholder in a.public[a.document_start:] and b.placeholder in b.public[b.document_start:]
    ta = a.private_tokens["PERSON"]
    if ta == b.private_tokens["PERSON"]:  # same token length: byte-identical public contexts
        assert a.public == b.public


def test_the_issue_examples_give_one_opening(tiny_lm) -> None:
    """#32 finding 9: "… 14 Baker Street" vs "… Baker Street 14", "(jane@x.org)" vs "(+44 2079)"."""
    groups = {"LOC": ["LOC"]}
    for left, right, prefix in [("14 Baker Street", "Baker Street 14", "She lives at "),
                                ("jane@x.org", "+44 2079", "Contact (")]:
        ops = []
        for content in (left, right):
            doc = f"{prefix}{content}) today."
            prep = prepare_contexts(tiny_lm, doc, [Span(len(prefix), len(prefix) + len(content), "LOC")], groups,
                                    "Rewrite:")
            ops.append(tiny_lm.decode(prep.opening(16)))
        assert ops[0] == ops[1] == prefix.rstrip(" ")  # the space before a span is absorbed, whatever the span holds


def test_no_opening_flag_and_opening_tokens_zero_turn_it_off_and_the_sentence_says_which(tiny_model_dir, tmp_path,
                                                                                       capsys) -> None:
    """#32 finding 10: the sentence says the release starts with the document's first untagged words; ``--no-opening``
    (API ``opening_tokens=0``) turns the opening off."""
    import json

    from dpinfer.cli import main
    from dpinfer.configs.sanitize import SanitizeConfig

    doc = tmp_path / "doc.txt"
    doc.write_text(DOC, encoding="utf-8")
    spans = tmp_path / "spans.json"
    spans.write_text(json.dumps([s.to_dict() for s in SPANS]), encoding="utf-8")
    base = ["sanitize", str(doc), "--spans", str(spans), "--spans-only", "--model", str(tiny_model_dir),
            "--max-new-tokens", "3", "--seed", "1", "--json"]
    releases = []
    for extra in ([], ["--no-opening"]):
        assert main(base + extra) == 0
        releases.append(json.loads(capsys.readouterr().out))
    with_op, without = releases
    assert with_op["settings"]["opening_tokens"] == 16 and without["settings"]["opening_tokens"] is None
    assert "starts with the document's first untagged words" in with_op["guarantee"]["sentence"]
    assert "--no-opening" in with_op["guarantee"]["sentence"]
    assert "untagged words" not in without["guarantee"]["sentence"]
    assert with_op["guarantee"]["epsilon"] == without["guarantee"]["epsilon"]
    assert SanitizeConfig(opening_tokens=0).opening_tokens is None  # the API's spelling of --no-opening


def test_no_opening_applies_to_corpus_jobs(tiny_model_dir, tmp_path, capsys) -> None:
    import json

    from dpinfer.cli import main

    corpus = tmp_path / "in.jsonl"
    corpus.write_text(json.dumps({"id": "a", "text": DOC, "spans": [s.to_dict() for s in SPANS]}) + "\n",
                      encoding="utf-8")
    settings = []
    for extra in ([], ["--no-opening"]):
        out = tmp_path / f"out{len(extra)}.jsonl"
        assert main(["sanitize", "--corpus", str(corpus), "--out", str(out), "--spans-field", "spans", "--spans-only",
                     "--model", str(tiny_model_dir), "--max-new-tokens", "2", "--seed", "3", *extra]) == 0
        capsys.readouterr()
        settings.append(json.loads(out.read_text(encoding="utf-8").splitlines()[-1])["settings"]["opening_tokens"])
    assert settings == [16, None]
