"""``dpinfer bench engine --jobs``: the slot-engine bench's CPU path on the tiny model, its options, and the
random-weight shape models (built from a config, nothing downloaded)."""

from __future__ import annotations

import pytest

from dpinfer.bench import engine as bench
from dpinfer.cli import build_parser
from dpinfer.errors import ConfigurationError


def parse(*argv: str):
    return bench.config_from_args(build_parser().parse_args(["bench", "engine", *argv]))


def test_jobs_options_are_checked_before_any_model():
    config = parse("--jobs", "4", "--compile", "--max-rows", "8", "--k", "1", "3")
    assert (config.jobs, config.compile, config.max_rows, config.ks) == (4, True, 8, (1, 3))
    assert (config.new_tokens, config.prompt_tokens) == (64, 300)  # the --jobs defaults
    assert parse() == bench.EngineBenchConfig()
    for bad, match in ((["--compile"], "--jobs"), (["--max-rows", "4"], "--jobs"),
                       (["--shape", "qwen2.5-7b", "--model", "x"], "names the tokenizer"),
                       (["--dtype", "int3"], "dtype")):
        with pytest.raises(ConfigurationError, match=match):
            parse(*bad)
    with pytest.raises(SystemExit):  # argparse refuses an unknown shape
        parse("--shape", "gpt-17")


def test_jobs_bench_times_one_by_one_and_run_jobs_in_one_run(tiny_lm, tiny_hf_lm, monkeypatch):
    from dpinfer.bench import speed

    monkeypatch.setattr(speed, "example_document", lambda name=bench.DEFAULT_DOC: "\n\n".join(
        ["The applicant was born in 1970 and lives in Izmir.", "On 20 May 1998 the Court decided.",
         "Mr Smith, a lawyer practising in London, represented the applicants."]))
    res = bench.run_jobs_bench(tiny_lm, n_jobs=3, ks=(1, 2), new_tokens=5, prompt_tokens=40, hf_lm=tiny_hf_lm)
    labels = [r["config"] for r in res["rows"]]
    assert labels == ["hf generate (1 prompt)", "one by one K=1", "run_jobs K=1 eager",
                      "run_jobs K=1 eager [hf forward]", "one by one K=2", "run_jobs K=2 eager",
                      "run_jobs K=2 eager [hf forward]"]
    rows = {r["config"]: r for r in res["rows"]}
    for k in (1, 2):
        r = rows[f"run_jobs K={k} eager"]
        assert r["tokens_per_s"] > 0 and r["ratio_vs_one_by_one"] > 0
        assert r["same_tokens_as_one_by_one"] == "3/3"  # greedy: the same tokens as one job at a time
        assert rows[f"run_jobs K={k} eager [hf forward]"]["same_tokens_as_one_by_one"] == "3/3"  # own = hf tokens
    assert res["settings"]["backend"] == "own"
    assert res["settings"]["jobs"] == 3 and len(res["settings"]["prompt_tokens"]) == 3
    table = bench.format_markdown(res)
    assert "run_jobs K=2 eager" in table and "ratio vs one by one" in table


def test_a_shape_model_is_built_from_its_config(tiny_lm, monkeypatch):
    monkeypatch.setitem(bench.SHAPES, "tiny-llama", dict(
        model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=tiny_lm.vocab_size + 16, tie_word_embeddings=False,
        max_position_embeddings=256, rope_theta=10000.0))
    lm = bench.shape_model("tiny-llama", device="cpu", dtype="float32", tokenizer_lm=tiny_lm)
    assert lm.vocab_size == tiny_lm.vocab_size + 16 and lm.model.config.num_hidden_layers == 2
    assert lm.eos_token_ids == tiny_lm.eos_token_ids
    res = bench.run_jobs_bench(lm, n_jobs=2, new_tokens=3, prompt_tokens=30)
    assert {r["config"] for r in res["rows"]} == {"hf generate (1 prompt)", "one by one K=1", "run_jobs K=1 eager"}
    with pytest.raises(ConfigurationError, match="unknown shape"):
        bench.shape_model("gpt-17", tokenizer_lm=tiny_lm)


def test_a_shape_model_takes_the_tokenizer_of_a_folder_without_weights(tiny_lm, tiny_hf_lm, tmp_path, monkeypatch):
    """``--model FOLDER --shape S``: only the folder's tokenizer and config files are read (no weights)."""
    tiny_hf_lm.tokenizer.save_pretrained(tmp_path)
    tiny_hf_lm.model.config.save_pretrained(tmp_path)
    assert not list(tmp_path.glob("*.safetensors"))
    monkeypatch.setitem(bench.SHAPES, "tiny-llama", dict(
        model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=tiny_lm.vocab_size, tie_word_embeddings=True,
        max_position_embeddings=256, rope_theta=10000.0))
    lm = bench.speed_model(str(tmp_path), device="cpu", dtype="float32", shape="tiny-llama")
    assert lm.name == "random tiny-llama" and lm.model.config.num_hidden_layers == 1
    assert lm.encode("The applicant was born in 1970.") == tiny_lm.encode("The applicant was born in 1970.")
    assert lm.eos_token_ids and lm.eos_token_ids <= tiny_lm.eos_token_ids | {tiny_lm.tokenizer.eos_token_id}
    monkeypatch.setitem(bench.SHAPES, "tiny-llama", dict(bench.SHAPES["tiny-llama"], vocab_size=8))
    with pytest.raises(ConfigurationError, match="more than the tiny-llama shape's vocabulary"):
        bench.speed_model(str(tmp_path), device="cpu", dtype="float32", shape="tiny-llama")


def test_engine_bench_times_the_own_model_code_beside_transformers(tiny_lm, tiny_hf_lm, monkeypatch):
    monkeypatch.setattr(bench, "example_document", lambda name=bench.DEFAULT_DOC: "\n\n".join(
        ["The applicant was born in 1970 and lives in Izmir.", "On 20 May 1998 the Court decided."]))
    res = bench.run_engine_bench(tiny_lm, ks=(1, 2), new_tokens=3, prompt_tokens=30, unshared=False,
                                 hf_lm=tiny_hf_lm)
    rows = {r["config"]: r for r in res["rows"]}
    assert list(rows) == ["hf generate", "engine K=1", "engine K=2", "engine K=1 [hf forward]",
                          "engine K=2 [hf forward]"]
    assert rows["engine K=2"]["backend"] == "own" and rows["engine K=2 [hf forward]"]["backend"] == "hf"
    assert rows["engine K=1"]["ratio_vs_hf_forward"] > 0 and rows["engine K=1"]["cpu_seconds"] > 0
    table = bench.format_markdown(res)
    assert "| engine K=2 [hf forward] |" in table and "vs hf forward (CPU)" in table


def test_mechanism_options_are_checked_before_any_model():
    config = parse("--jobs", "64", "--mechanism", "dp-fusion", "--shape", "qwen2.5-tiny")
    assert (config.jobs, config.mechanism, config.shape) == (64, "dp-fusion", "qwen2.5-tiny")
    assert (config.new_tokens, config.prompt_tokens) == (16, 300)  # the --mechanism defaults
    with pytest.raises(ConfigurationError, match="--jobs"):
        parse("--mechanism", "dp-fusion")
    with pytest.raises(ConfigurationError, match="--mechanism"):
        parse("--jobs", "2", "--mechanism", "dp-fusion", "--compile")
    with pytest.raises(SystemExit):
        parse("--jobs", "2", "--mechanism", "pad")
    assert bench.SHAPES["qwen2.5-tiny"]["vocab_size"] == 151936  # Qwen2.5's vocabulary, two small layers
    assert bench.SHAPES["qwen2.5-tiny"]["num_hidden_layers"] == 2


@pytest.mark.parametrize("mechanism", ["dp-fusion", "invisibleink"])
def test_mechanism_bench_times_each_phase_beside_plain_sampling(tiny_lm, monkeypatch, mechanism):
    from dpinfer.bench import engine_decisions, speed

    monkeypatch.setattr(speed, "example_document", lambda name=bench.DEFAULT_DOC: "\n\n".join(
        ["The applicant was born in 1970 and lives in Izmir.", "On 20 May 1998 the Court decided.",
         "Mr Smith, a lawyer practising in London, represented the applicants."]))
    res = engine_decisions.run_mechanism_bench(tiny_lm, n_jobs=3, mechanism=mechanism, new_tokens=4,
                                               prompt_tokens=30)
    rows = {r["config"]: r for r in res["rows"]}
    assert set(rows) == {f"{mechanism} per-job", f"{mechanism} batched", "plain sampling per-job",
                         "plain sampling batched"}
    for r in rows.values():
        assert r["rows"] == 15 and r["steps"] == 3  # 4 tokens: the first step admits (prefill), 3 decode steps
        assert r["forward_ms"] > 0 and r["decide_ms"] > 0 and r["step_ms"] >= r["forward_ms"]
        assert r["syncs"] > 0
    assert rows["plain sampling batched"]["ratio_vs_plain"] == 1.0
    # the batched path reads fewer values on the host than the per-job path (one transfer per step and kind)
    assert rows[f"{mechanism} batched"]["syncs"] < rows[f"{mechanism} per-job"]["syncs"]
    assert res["same_tokens_batched_vs_per_job"] == {mechanism: "3/3", "plain sampling": "3/3"}
    table = bench.format_markdown(res)
    assert "decisions ms" in table and "syncs/step" in table


def test_host_reads_are_counted_and_the_tensor_methods_restored():
    import torch

    from dpinfer.bench.speed import HostReads

    x = torch.arange(3.0)
    before = {name: torch.Tensor.__dict__.get(name) for name in ("item", "tolist", "__bool__")}
    with HostReads() as reads:
        x.tolist()
        bool(x[0])
        int(x[1])
        x.sum().item()
        x.cpu()  # already on the host: not a device read
    assert reads() == 4
    assert {name: torch.Tensor.__dict__.get(name) for name in before} == before
