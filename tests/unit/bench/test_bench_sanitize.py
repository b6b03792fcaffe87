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
    md = format_quality(res)
    assert "| dp-fusion | 30 |" in md
    # one record per document and method, and every method paired with ner-scrub on the same games
    assert len(res["per_document"]) == 3 and {r["method"] for r in res["per_document"]} == set(rows)
    paired = {r["method"]: r for r in res["paired"]}
    assert set(paired) == {"original", "dp-fusion"} and paired["dp-fusion"]["docs"] == 1
    games = {r["method"]: r for r in res["per_document"]}
    assert paired["dp-fusion"]["asr_diff"] == pytest.approx(
        (games["dp-fusion"]["wins"] - games["ner-scrub"]["wins"]) / games["dp-fusion"]["games"], abs=1e-3)
    assert paired["dp-fusion"]["ppl_diff_mean"] == pytest.approx(
        games["dp-fusion"]["ppl"] - games["ner-scrub"]["ppl"], abs=1e-3)
    assert "Paired with ner-scrub" in md


def test_paired_comparison_counts_identical_releases():
    from dpinfer.bench.sanitize import _paired

    per_doc = [{"doc_id": d, "method": m, "target_epsilon": e, "ppl": p, "wins": w, "games": 3}
               for d, m, e, p, w in [("a", "ner-scrub", None, 5.0, 1), ("a", "dp-fusion", 12.0, 5.0, 1),
                                     ("b", "ner-scrub", None, 4.0, 0), ("b", "dp-fusion", 12.0, 6.0, 3)]]
    releases = {("ner-scrub", None, 0): [1, 2, 3], ("dp-fusion", 12.0, 0): [1, 2, 3],
                ("ner-scrub", None, 1): [1, 2, 3, 4], ("dp-fusion", 12.0, 1): [1, 9, 9, 9]}
    (row,) = _paired(per_doc, releases, 2)
    assert row["identical_releases"] == 1 and row["shared_prefix_share"] == pytest.approx((1.0 + 0.25) / 2)
    assert row["ppl_diff_mean"] == 1.0 and row["asr_diff"] == 0.5
    lo, hi = row["ppl_diff_ci95"]
    assert lo < 1.0 < hi


def test_run_corpus_times_both_paths_and_compares_their_tokens(tiny_lm, shared_data):
    from dpinfer.bench.corpus import format_corpus, run_corpus

    docs = load_tab(shared_data / "tab" / "tab_echr_docs.jsonl", 2, 250)
    res = run_corpus(tiny_lm, docs, epsilon=12.0, max_new_tokens=3, seed=0)
    paths = {r["path"]: r for r in res["rows"]}
    assert set(paths) == {"one by one", "corpus (sanitize_many)"}
    assert paths["one by one"]["speed_vs_one_by_one"] == 1.0 and all(r["seconds"] > 0 for r in res["rows"])
    assert res["settings"]["released_tokens"] == 2 * 3 and not res["errors"]
    assert res["same_tokens"]  # the reference run_jobs runs the same jobs one after another
    md = format_corpus(res)
    assert "| corpus (sanitize_many) |" in md and "same released tokens on both paths: yes" in md


def test_run_perf_times_hf_generate_beside_dp_fusion(tiny_lm, tiny_hf_lm, shared_data,
                                                    monkeypatch: pytest.MonkeyPatch):
    """--perf prints HF generate (eager and static+compile) in the same run as DP-Fusion and `original`. The compiled
    baseline is timed through the same function with compilation switched off here (inductor takes minutes on CPU)."""
    import dpinfer.bench.speed as bench_engine
    from dpinfer.bench.sanitize import format_perf, run_perf

    real = bench_engine.time_hf
    calls: list[bool] = []

    def eager_only(lm, ids, n, *, compiled=False):
        calls.append(compiled)
        return real(lm, ids, n, compiled=False)

    monkeypatch.setattr(bench_engine, "time_hf", eager_only)
    doc = load_tab(shared_data / "tab" / "tab_echr_docs.jsonl", 1, 300)[0]
    res = run_perf(tiny_lm, doc, max_new_tokens=3, seed=0, hf_lm=tiny_hf_lm)
    names = [r["config"] for r in res["rows"]]
    assert names == ["original", "original (former path)", "original [hf forward]", "dp-fusion m=1",
                     "dp-fusion m=1 (former path)", "dp-fusion m=1 [hf forward]", "dp-fusion m=4",
                     "dp-fusion m=4 (former path)", "dp-fusion m=4 [hf forward]", "hf generate eager",
                     "hf generate static+compile"]
    assert res["rows"][0]["ratio_vs_hf_forward"] > 0 and res["settings"]["backend"] == "own"
    assert calls == [True, False, True] and all(r["seconds"] > 0 for r in res["rows"])
    rows = {r["config"]: r for r in res["rows"]}
    assert rows["dp-fusion m=4"]["path"] == "engine (sanitize, Engine.step)"
    assert rows["dp-fusion m=4"]["ratio_vs_former"] > 0
    assert rows["dp-fusion m=4 (former path)"]["path"] == "former one-job path (dynamic-cache runner)"
    configs = ("original", "dp-fusion m=1", "dp-fusion m=4")  # first calls apart on both forwards
    assert set(res["settings"]["first_call_seconds"]) == {*configs, *(f"{c} [hf forward]" for c in configs)}
    assert rows["dp-fusion m=4"]["cpu_ratio_vs_hf_forward"] > 0 and "| vs hf forward (CPU) |" in format_perf(res)
    assert "| hf generate eager |" in format_perf(res) and res["settings"]["device"] == "cpu"


@pytest.mark.parametrize("argv, message", [
    (["--shape", "qwen2.5-7b"], "apply to the speed runs"),
    (["--perf", "--shape", "nope"], "unknown --shape"),
    (["--perf", "--shape", "qwen2.5-7b", "--model", "m"], "names the tokenizer"),
    (["--perf", "--shape", "qwen2.5-7b", "--quantize", "int8"], "drop --quantize"),
    (["--corpus", "2", "--dtype", "float77"], "dtype"),
])
def test_speed_options_are_checked_before_any_model_loads(argv, message, capsys):
    from dpinfer.cli import main

    assert main(["bench", "sanitize", *argv]) == 2
    assert message in capsys.readouterr().err


def test_bench_synth_speed_options_need_perf(capsys):
    from dpinfer.cli import main

    assert main(["bench", "synth", "--shape", "qwen2.5-7b"]) == 2
    assert "apply to the speed runs: add --perf" in capsys.readouterr().err
