"""The synthesis benchmark's pieces on the tiny model (MiniLM and mauve-text needed: skipped without them)."""

from __future__ import annotations

import math

import pytest

from dpinfer.bench.synth import format_perf, format_quality, run_perf, run_quality
from dpinfer.errors import MissingDependencyError
from dpinfer.references import Reference

WORDS = ["good", "bad", "tasty", "slow", "friendly", "cold", "fresh", "noisy", "clean", "cheap"]


def _records(n: int) -> list[Reference]:
    return [Reference(f"The food was {WORDS[i % 10]} and the staff {WORDS[(i * 3) % 10]}.",
                      {"label1": "Business Category: Restaurants", "label2": "Review Stars: 5.0"}) for i in range(n)]


@pytest.fixture(scope="module")
def _deps():
    pytest.importorskip("mauve", reason="mauve-text (optional GPL extra) is not installed")
    try:
        from dpinfer.eval.embeddings import minilm_path

        minilm_path()
    except MissingDependencyError as exc:
        pytest.skip(f"MiniLM not installed: {exc}")


def test_run_quality_reports_every_method_and_batch_size(tiny_lm, _deps) -> None:
    res = run_quality(tiny_lm, _records(24), _records(30)[12:], methods=("public", "invisibleink", "amin"),
                      batch_sizes=(2, 4), epsilon=8.0, delta=1e-6, n_texts=3, max_new_tokens=4, top_k=5,
                      temperature=1.0, template="yelp", seed=0, mauve_repeats=2, amin_sound=False)
    rows = res["rows"]
    assert [(r["method"], r["B"]) for r in rows] == [("public", 0), ("invisibleink", 2), ("invisibleink", 4),
                                                      ("amin", 2), ("amin", 4)]
    for r in rows:
        assert 0.0 <= r["mauve_low"] <= r["mauve"] <= r["mauve_high"] <= 1.0
        assert r["lm_calls_per_token"] == (1 if r["method"] == "public" else r["B"] + 1)
        assert math.isfinite(r["ppl"]) and r["texts"] == 3
        if r["method"] != "public":
            assert r["guarantee"]["epsilon"] <= 8.0 + 1e-9
    assert "private_token_share" in rows[-1]
    res["settings"] = {"epsilon": 8.0, "delta": 1e-6, "max_new_tokens": 4, "n_texts": 3, "model": "tiny"}
    table = format_quality(res)
    assert table.count("\n| ") == 6 and "invisibleink | 4 | 5 |" in table


def test_run_perf_measures_both_in_one_run(tiny_lm) -> None:
    res = run_perf(tiny_lm, _records(16), batch_size=4, max_new_tokens=6, template="yelp", seed=0, repeats=1,
                   epsilon=8.0, top_k=5)
    assert res["plain_tokens_per_second"] > 0 and res["invisibleink_tokens_per_second"] > 0
    assert res["ratio"] == pytest.approx(res["invisibleink_tokens_per_second"] / res["plain_tokens_per_second"])
    assert len(res["prompt_tokens"]) == 5 and "B = 4" in format_perf(res)
