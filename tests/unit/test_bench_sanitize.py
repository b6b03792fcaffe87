"""The sanitisation benchmark's pieces on the tiny model and a real TAB document (skipped without the data)."""

from __future__ import annotations

import math
import random

import pytest

from dpinfer.bench.sanitize import format_quality, load_tab, mention_pool, run_quality
from dpinfer.eval.metrics import loss_attack, perplexity, replace_mentions, verbatim_leak_rate, wilson_interval
from dpinfer.taggers import Span


def test_wilson_interval_and_leaks():
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and 0.2 < hi < 0.35
    lo, hi = wilson_interval(5, 10)
    assert lo < 0.5 < hi
    assert verbatim_leak_rate("Mr Smith went to Paris", ["Smith", "Paris", "Rome", "Al"]) == (2, 3)


def test_replace_mentions_is_consistent():
    text = "Anna met Bob. Anna left."
    spans = [Span(0, 4, "PERSON"), Span(9, 12, "PERSON"), Span(14, 18, "PERSON")]
    out = replace_mentions(text, spans, "PERSON", {"Anna": "Eve", "Bob": "Dan"})
    assert out == "Eve met Dan. Eve left."


def test_loss_attack_favours_the_true_document_when_output_copies_it(tiny_lm):
    text = "The applicant Smith lodged application 36244/06 on 20 May 1998."
    spans = [Span(14, 19, "PERSON"), Span(39, 47, "CODE"), Span(51, 62, "DATETIME")]
    pool = {"PERSON": ["Jones", "Brown", "Green", "White"], "CODE": ["11111/01", "22222/02", "33333/03", "44444/04"],
            "DATETIME": ["1 May 2001", "2 June 2002", "3 July 2003", "4 August 2004"]}

    def ctx(t):
        return tiny_lm.encode("Rewrite: " + t)

    games = loss_attack(tiny_lm, ctx, text, spans, tiny_lm.encode(text), pool, rng=random.Random(0))
    assert {g.label for g in games} == {"PERSON", "CODE", "DATETIME"}
    assert all(0.0 <= g.win <= 1.0 for g in games)
    ppl = perplexity(tiny_lm, ctx(text), tiny_lm.encode(text))
    assert math.isfinite(ppl) and ppl > 1.0


def test_run_quality_on_a_tab_document(tiny_lm, shared_data):
    docs = load_tab(shared_data / "tab" / "tab_echr_docs.jsonl", 1, 300)
    pool_docs = load_tab(shared_data / "tab" / "tab_echr_docs.jsonl", 5, 10**9)
    assert len(docs[0].text) <= 300 and all(s.end <= len(docs[0].text) for s in docs[0].spans)
    assert "PERSON" in mention_pool(pool_docs, docs[0].doc_id)
    res = run_quality(tiny_lm, docs, pool_docs, epsilons=(30.0,), methods=("original", "ner-scrub", "dp-fusion"),
                      max_new_tokens=6, seed=0)
    rows = {r["method"]: r for r in res["rows"]}
    assert rows["ner-scrub"]["guarantee_epsilon"] == 0 and rows["original"]["guarantee_epsilon"] is None
    assert rows["dp-fusion"]["guarantee_epsilon"] == pytest.approx(30.0, rel=1e-3)
    res["settings"] = {"model": "tiny", "docs": 1, "max_chars": 300, "max_new_tokens": 6, "delta": 1e-5, "seed": 0,
                       "decoding": {}}
    assert "| dp-fusion | 30 |" in format_quality(res)
