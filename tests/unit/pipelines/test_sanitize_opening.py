"""The public opening of a rewrite: read from the public context only, the same for every neighbouring document,
forced in every row, never used by the methods that protect the whole document, and free of privacy cost."""

from __future__ import annotations

import pytest

from dpinfer.pipelines.sanitize import DEFAULT_INSTRUCTION, prepare_contexts, resolve_groups, sanitize
from dpinfer.pipelines.sanitize_contexts import public_opening
from dpinfer.taggers import Span

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
