"""``dpinfer bench serve`` on the tiny model (2 TAB documents, 4 tokens): it runs both arms and reports what it
measured."""

from __future__ import annotations

import json

import pytest

from dpinfer.cli import main


def test_bench_serve_measures_both_arms_and_the_levels(tiny_model_dir, shared_data, capsys) -> None:
    rc = main(["bench", "serve", "--json", "--model", str(tiny_model_dir), "--docs", "2", "--clients", "1,2,3",
               "--max-new-tokens", "4", "--max-chars", "400"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["documents"] == 2 and out["max_new_tokens"] == 4
    assert out["sequential_s"] > 0 and out["concurrent_s"] > 0
    # the speed-up is computed from the unrounded totals; the printed seconds are rounded to 10 ms
    assert out["speedup"] == pytest.approx(out["sequential_s"] / out["concurrent_s"], rel=0.05, abs=0.01)
    assert [r["clients"] for r in out["levels"]] == [1, 2, 3]
    assert [r["requests"] for r in out["levels"]] == [2, 2, 3]
    for r in out["levels"]:
        assert 0 < r["p50_s"] <= r["p99_s"] and r["tokens_per_s"] > 0
    assert [r["tokens"] for r in out["levels"]] == [2 * 4, 2 * 4, 3 * 4]  # exactly 4 tokens each (EOS masked)
