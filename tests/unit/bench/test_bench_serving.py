"""``dpinfer bench serving``: the four serving figures of issue 14 with their baselines and targets, end to end on CPU
with the tiny random-weight model (a few tokens, 2 corpus documents), its options, and its files."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from dpinfer.bench import serving as bench
from dpinfer.cli import build_parser, main
from dpinfer.errors import ConfigurationError


def parse(*argv: str) -> bench.ServingBenchConfig:
    return bench.config_from_args(build_parser().parse_args(["bench", "serving", *argv]))


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record any attempt to load or build a model."""
    import dpinfer.bench.speed as bench_engine
    import dpinfer.models as models

    calls: list[str] = []

    def refuse(*args, **kwargs):
        calls.append("model")
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(bench_engine, "speed_model", refuse)
    monkeypatch.setattr(bench_engine, "shape_model", refuse)
    monkeypatch.setattr(models, "load_model", refuse)
    return calls


@pytest.mark.parametrize("argv, message", [
    (["--new-tokens", "0"], "--new-tokens must be an integer ≥ 1"),
    (["--prompt-tokens", "-5"], "--prompt-tokens must be an integer ≥ 1"),
    (["--corpus-docs", "0"], "--corpus-docs must be an integer ≥ 1"),
    (["--repeats", "0"], "--repeats must be an integer ≥ 1"),
    (["--shape", "gpt-17"], "unknown --shape"),
    (["--shape", "qwen2.5-7b", "--model", "m"], "names the tokenizer"),
    (["--dtype", "float77"], "unknown dtype"),
    (["--device", "tpu:9"], "unknown device"),
])
def test_bad_options_are_refused_in_one_line_before_any_model_loads(argv, message, no_model, capsys):
    assert main(["bench", "serving", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dpinfer: error: ") and message in err and err.count("\n") == 1
    assert no_model == []


def test_out_must_be_a_folder(tmp_path, no_model, capsys):
    afile = tmp_path / "a-file"
    afile.write_text("x")
    assert main(["bench", "serving", "--device", "cpu", "--out", str(afile)]) == 2
    assert "is a file; give a folder" in capsys.readouterr().err and no_model == []


def test_defaults_follow_the_device():
    config = parse("--device", "cpu")
    assert (config.new_tokens, config.prompt_tokens, config.corpus_docs, config.repeats) == (256, 600, 8, 1)
    assert config.hf_baselines and config.out is None
    assert parse("--device", "cpu", "--corpus-docs", "3", "--repeats", "2", "--no-hf") == bench.ServingBenchConfig(
        device="cpu", corpus_docs=3, repeats=2, hf_baselines=False)


def test_a_cut_without_four_entity_types_is_refused_with_the_length_that_works(tiny_lm):
    with pytest.raises(ConfigurationError, match=r"holds 0 entity types; DP-Fusion m = 4 needs 4; it needs "
                                                 r"--prompt-tokens \d+ or more"):
        bench.serving_document(tiny_lm, 50)
    doc = bench.serving_document(tiny_lm, 450)
    assert len({s.label for s in doc.spans}) >= 4 and all(s.end <= len(doc.text) for s in doc.spans)


def test_serving_measures_all_four_against_their_targets_in_one_run(tiny_model_dir, tmp_path, monkeypatch):
    """Every row of the four measures, with its baselines (HF generate eager and static+compile, original, plain) and
    target, from one run; ratios and verdicts follow from the measured seconds. HF's compiled baseline goes through
    the same function with compilation switched off here (inductor takes minutes on CPU)."""
    import dpinfer.bench.speed as bench_engine

    real = bench_engine.time_hf
    compiled_calls: list[bool] = []

    def eager_only(lm, ids, n, *, compiled=False):
        compiled_calls.append(compiled)
        return real(lm, ids, n, compiled=False)

    monkeypatch.setattr(bench_engine, "time_hf", eager_only)
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread, so a busy shared CPU does not stall every kernel
    out = tmp_path / "out"
    config = parse("--model", str(tiny_model_dir), "--device", "cpu", "--new-tokens", "3", "--prompt-tokens", "450",
                   "--corpus-docs", "2", "--out", str(out))
    try:
        res = bench.run(config)
    finally:
        torch.set_num_threads(threads)

    rows = res["rows"]
    by_path = {(r["number"], r["path"]): r for r in rows}
    assert sorted({r["number"] for r in rows}) == [1, 2, 3, 4]
    for path in ("hf generate eager", "hf generate static+compile", "engine (Engine.generate)",
                 "slot engine (run_jobs, 1 job)"):
        assert (1, path) in by_path
    assert True in compiled_calls  # the static+compile baseline was timed (its first call apart)
    for path in ("sanitize (engine)", "slot engine (run_jobs, 1 job)"):
        assert (2, f"original (plain), {path}") in by_path and (2, f"DP-Fusion m = 4, {path}") in by_path
    for path in ("engine (Engine.generate)", "slot engine (run_jobs, 1 job)"):
        assert (4, f"plain (public prompt), {path}") in by_path and (4, f"InvisibleInk B = 8, {path}") in by_path
    (corpus,) = [r for r in rows if r["number"] == 3]
    assert corpus["tokens"] == 2 * 3 and res["settings"]["corpus_groups_per_doc"] == [4, 4]

    assert {r["target"] for r in rows if r["target"]} == {"≥ 165 tok/s", "≥ 100 tok/s", "≥ 2,000 released tok/s",
                                                           "≥ 0.8 × plain"}
    for r in rows:
        assert r["seconds"] == statistics.median(r["runs"]) and r["seconds"] > 0
        assert r["tokens_per_s"] == pytest.approx(r["tokens"] / r["seconds"])
        if r["ratio"] is not None:
            assert math.isfinite(r["ratio"]) and r["ratio"] > 0
        if r["target_key"] is not None:
            target = bench.TARGETS[r["target_key"]]
            assert r["met"] == (r["value"] >= target.threshold)
    hf_eager = by_path[(1, "hf generate eager")]["seconds"]
    slot = by_path[(1, "slot engine (run_jobs, 1 job)")]
    assert slot["ratio"] == pytest.approx(hf_eager / slot["seconds"]) and slot["value"] == slot["tokens_per_s"]
    for path in ("engine (Engine.generate)", "slot engine (run_jobs, 1 job)"):
        ink, plain = by_path[(4, f"InvisibleInk B = 8, {path}")], by_path[(4, f"plain (public prompt), {path}")]
        assert ink["value"] == ink["ratio"] == pytest.approx(plain["seconds"] / ink["seconds"])
    fusion = by_path[(2, "DP-Fusion m = 4, sanitize (engine)")]
    assert corpus["ratio"] == pytest.approx(corpus["tokens_per_s"] / fusion["tokens_per_s"])
    assert set(res["summary"]) == set(bench.TARGETS)
    assert res["summary"]["corpus"]["met"] == corpus["met"]

    s = res["settings"]
    assert s["device_name"] == "CPU" and s["dtype"] == "float32" and not s["on_target_hardware"]
    assert {"torch_threads", "cpu_count", "load_average_1min"} <= set(s["machine_load_before"])
    table = bench.render(res)
    assert "**Not the target hardware** (targets are for an H100, 7B shape, bf16)" in table
    assert "| # | measure | path | decode step | seconds | tokens/s | vs baseline | target | result |" in table
    assert table.count("\n| ") == len(rows) + 1 and f"torch {s['torch']}" in table
    assert json.loads((out / "serving.json").read_text(encoding="utf-8"))["rows"][0]["path"] == rows[0]["path"]
    assert (out / "serving.md").read_text(encoding="utf-8") == res["markdown"] + "\n"
    assert str(out / "serving.json") in table
