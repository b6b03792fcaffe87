"""``dpinfer bench gtr`` on the tiny model: every row, the table, the check, the plot, --perf; argument errors."""

from __future__ import annotations

import argparse
import json
import math
import statistics

import pytest

from dpinfer.bench import gtr

RECORDS = [
    {"question": "Where would you put a kettle after using it?", "choices": ["stove", "moon", "sea", "bank", "car"],
     "answer": 0},
    {"question": "What do people use to cut paper?", "choices": ["spoon", "scissors", "sky", "dog", "water"],
     "answer": 1},
]


class FirstChoice:
    name = "first-choice"

    def answer(self, questions, choices):
        return [0 for _ in questions]


@pytest.fixture(scope="module", autouse=True)
def _own_cache(tmp_path_factory: pytest.TempPathFactory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DPINFER_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


def test_privacy_scores() -> None:
    same = gtr.privacy_scores("Where is the cat?", "Where is the cat?")
    assert same == pytest.approx({"rouge1": 1.0, "rougeL": 1.0, "bleu": 1.0})
    other = gtr.privacy_scores("Where is the cat?", "Dogs bark loudly today.")
    assert other["rouge1"] == 0.0 and other["bleu"] < 0.1
    assert gtr.privacy_scores("Where is the cat?", "")["bleu"] == 0.0


def test_quality_run_on_the_tiny_model(tiny_lm, tmp_path) -> None:
    res = gtr.run_quality(tiny_lm, RECORDS, temperatures=[0.5, 1.0], repeats=2, n_rewrites=3, n_keywords=2,
                          jem_epsilon=5.0, max_new_tokens=4, delta=1e-5, batch_questions=2, seed=0,
                          answerers=[FirstChoice()])
    rows = {(r["method"], r["tau"]): r for r in res["rows"]}
    assert set(rows) == {(m, t) for m in gtr.METHODS for t in (0.5, 1.0)}
    for (method, tau), r in rows.items():
        assert r["n"] == 4  # 2 questions × 2 repeats
        assert r["accuracy"]["first-choice"]["accuracy"] == 0.5
        if method.startswith("dp-gtr"):
            assert r["rewrites"] == 3 and r["epsilon"] > rows[("dp-prompt", tau)]["epsilon"]
        if method == "dp-prompt-equal-eps":
            assert r["epsilon"] == pytest.approx(rows[("dp-gtr-ndp", tau)]["epsilon"], rel=1e-5)
            assert r["stage1_tau"] < tau  # one rewrite at the same total ε: colder
    assert res["original"]["first-choice"]["accuracy"] == 0.5
    settings = {"n": 2, "repeats": 2, "model": "tiny", "max_new_tokens": 4, "n_rewrites": 3, "n_keywords": 2,
                "jem_epsilon": 5.0, "delta": 1e-5}
    md = gtr.format_markdown(res, settings)
    assert "| DP-GTR (NDP) | 0.5 |" in md and "| chance |" in md and "Issue check" in md
    checks = gtr.issue_check(res, "first-choice")
    assert {c["tau"] for c in checks} == {0.5}  # τ ≤ 0.75 only
    assert all(len(r["rouge1_items"]) == 4 for r in res["rows"])
    for c in checks:  # the paired bootstrap interval of the ROUGE-1 ratio comes with every check
        assert {"rouge1_ratio_low", "rouge1_ratio_high"} <= set(c)
        if math.isfinite(c["rouge1_ratio"]):
            assert c["rouge1_ratio_low"] <= c["rouge1_ratio"] + 1e-12 or math.isnan(c["rouge1_ratio_low"])
    assert gtr.plot(res, tmp_path / "gtr.png").stat().st_size > 1000


def test_perf_on_the_tiny_model(tiny_lm) -> None:
    perf = gtr.run_perf(tiny_lm, RECORDS[0]["question"], n_rewrites=3, max_new_tokens=3, repeats=2, seed=0,
                        n_exemplars=1)
    assert len(perf["runs"]) == 2 and perf["ratio"] > 0 and perf["stage1_ratio"] > 0
    assert perf["best_one"] == min(r["one"] for r in perf["runs"])
    assert perf["cpu_ratio"] == perf["best_gtr_cpu"] / perf["best_one_cpu"] > 0
    assert perf["pair_ratios"] == [r["gtr"] / r["one"] for r in perf["runs"]]
    assert perf["median_pair_ratio"] == statistics.median(perf["pair_ratios"])
    assert {"loading", "stage1", "ranking", "stage2", "stage3", "total"} <= set(perf["stages"])
    assert all(len(r["rewrite_tokens"]) == 3 for r in perf["runs"])
    md = gtr.perf_markdown(perf)
    for line in ("one DP-Prompt rewrite", "stage 1 alone", "whole DP-GTR release", "in CPU time", "per stage",
                 "per pair"):
        assert line in md


def test_perf_over_several_questions(tiny_lm, tmp_path, monkeypatch) -> None:
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"question": r["question"], "answerKey": "A", "choices": {
        "label": list("ABCDE"), "text": r["choices"]}}) + "\n" for r in RECORDS[:2]))
    monkeypatch.setattr(gtr, "speed_model", lambda name: tiny_lm)
    config = gtr.GtrBenchConfig(dataset=str(data), perf=True, perf_questions=2, repeats=1, n_rewrites=2,
                                max_new_tokens=3, n_exemplars=2, stage3_quorum=1)
    res = gtr.run(config)
    assert [p["prompt_tokens"] for p in res["perf_questions"]] == [
        len(gtr_pp_ids(tiny_lm, r["question"])) for r in RECORDS[:2]]
    assert res["perf"] is res["perf_questions"][0] and res["settings"]["stage3_quorum"] == 1
    ratios = [p["ratio"] for p in res["perf_questions"]]
    assert f"median ratio **{statistics.median(ratios):.2f}×**" in res["markdown"]
    assert "question 2 (" in res["markdown"]


def gtr_pp_ids(lm, question):
    from dpinfer.protect.stage1 import paraphrase_ids

    return paraphrase_ids(lm, question)


def test_csqa_loader(shared_data) -> None:
    records = gtr.load_csqa("csqa", 3)
    assert len(records) == 3 and all(len(r["choices"]) == 5 and 0 <= r["answer"] < 5 for r in records)


def test_bench_arguments_are_checked_before_the_model_loads(tmp_path, capsys) -> None:
    from dpinfer.cli import main

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q"}) + "\n")
    for argv, msg in ((["bench", "gtr", "--temperatures", "0,1"], "temperatures"),
                      (["bench", "gtr", "--n", "0"], "--n"),
                      (["bench", "gtr", "--perf", "--perf-questions", "0"], "--perf-questions"),
                      (["bench", "gtr", "--perf-questions", "3"], "give it with --perf"),
                      (["bench", "gtr", "--stage3-quorum", "0"], "--stage3-quorum"),
                      (["bench", "gtr", "--data", str(bad)], "not a CSQA record")):
        assert main(argv) == 2
        assert msg in capsys.readouterr().err
    args = argparse.Namespace(temperatures="x")
    with pytest.raises(Exception, match="comma-separated"):
        gtr.parse_temperatures(args.temperatures)


def test_ratio_interval_is_paired() -> None:
    # the numerator tracks the denominator item by item: the paired interval is tight around 0.5
    den = [0.2, 0.9, 0.4, 0.7, 0.1, 0.8, 0.3, 0.6]
    lo, hi = gtr.ratio_interval([0.5 * d + 0.01 * (-1) ** i for i, d in enumerate(den)], den)
    assert 0.45 < lo <= hi < 0.55
    assert all(math.isnan(x) for x in gtr.ratio_interval([0.5], [1.0]))  # one item: no interval
