"""``load_model(quantize="int8")``: decode-step dynamic int8 Linear layers on the tiny random-weight model."""

from __future__ import annotations

import warnings

import pytest
import torch

from dpinfer import models
from dpinfer.errors import ConfigurationError


@pytest.fixture(scope="module")
def int8_lm(tiny_model_dir):
    return models.load_model(str(tiny_model_dir), device="cpu", quantize="int8")


def _linears(model, cls):
    return [n for n, m in model.named_modules() if type(m) is cls]


def test_int8_replaces_every_linear(int8_lm, tiny_lm):
    from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear

    assert int8_lm.quantize == "int8" and tiny_lm.quantize is None
    # 2 layers x 7 projections + lm_head (packed twins on the float32 model: still nn.Linear)
    n_float = sum(isinstance(m, torch.nn.Linear) for m in tiny_lm.model.modules())
    assert n_float == 15
    wrapped = [m for m in int8_lm.model.modules() if type(m).__name__ == "DecodeInt8Linear"]
    assert len(wrapped) == n_float
    # q/k/v and gate/up share one fused int8 call per layer; o_proj, down_proj and lm_head keep their own twin
    fused = [m for m in wrapped if m.fused is not None]
    assert len(fused) == 2 * 5 and all(m.int8_linear is None for m in fused)
    assert len({id(m.fused[0]) for m in fused}) == 2 * 2
    assert len(_linears(int8_lm.model, DynamicInt8Linear)) == n_float - len(fused)
    # the quantised layer carries the two range pins (zero weight columns) and no bias
    head = int8_lm.model.lm_head
    assert head.int8_linear.in_features == head.in_features + 2
    assert torch.equal(head.int8_linear.weight().dequantize()[:, -2:], torch.zeros(head.out_features, 2))
    # the float32 layers stay (prompt processing) and the model still looks like an ordinary HF model
    assert int8_lm.vocab_size == tiny_lm.vocab_size and int8_lm.dtype == torch.float32


def _decode_logits(lm, ids, n_decode):
    """Prompt in one pass, then the last ``n_decode`` tokens one at a time (the engine's decode shape)."""
    with torch.inference_mode():
        out = lm.model(input_ids=ids[:, :-n_decode], use_cache=True)
        cache, rows = out.past_key_values, [out.logits[:, -1]]
        for t in range(ids.shape[1] - n_decode, ids.shape[1]):
            out = lm.model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            rows.append(out.logits[:, -1])
    return torch.stack(rows, 1).double()


def test_int8_logits_close_to_float32(int8_lm, tiny_lm):
    ids = torch.tensor([tiny_lm.encode("The applicant was born in 1970 and lives in Izmir. On 20 May 1998 the")] * 2)
    ref = _decode_logits(tiny_lm, ids, 8)
    got = _decode_logits(int8_lm, ids, 8)
    # the prompt pass has many positions per row: float32 layers, bit-identical logits
    assert torch.equal(got[:, 0], ref[:, 0])
    # decode steps: int8 weights (per output channel) and 8-bit activations give ~0.5-1% relative error per layer;
    # over 2 layers and lm_head this measures max |Δ| ≈ 1.5% of max |logit| and KL ≈ 3e-4 nats. The bounds leave a
    # 3x / 15x margin for other CPUs' kernels, while a wrong scale or layout would move the logits by O(1) of it.
    decode_ref, decode_got = ref[:, 1:], got[:, 1:]
    assert not torch.equal(decode_got, decode_ref)  # the int8 kernels really ran
    assert (decode_got - decode_ref).abs().max() <= 0.05 * decode_ref.abs().max()
    p = decode_ref.log_softmax(-1)
    kl = (p.exp() * (p - decode_got.log_softmax(-1))).sum(-1)
    assert kl.max() < 5e-3


def test_fused_siblings_give_exactly_the_unfused_outputs(int8_lm, tiny_model_dir):
    """One int8 call on the concatenated q/k/v (gate/up) weights: same input scale, same per-channel weight scales,
    exact int32 accumulation, so every decode-step logit equals the unfused model's."""
    unfused = models.load_model(str(tiny_model_dir), device="cpu")
    models.quantize_int8(unfused.model, fuse=False)
    assert all(m.fused is None for m in unfused.model.modules() if type(m).__name__ == "DecodeInt8Linear")
    ids = torch.tensor([unfused.encode("The applicant was born in 1970 and lives in Izmir. On 20 May 1998 the")] * 3)
    assert torch.equal(_decode_logits(int8_lm, ids, 8), _decode_logits(unfused, ids, 8))
    # a sibling called on its own (another tensor) recomputes instead of returning a stale slice
    attn = int8_lm.model.model.layers[0].self_attn
    x, y = torch.randn(2, 1, attn.q_proj.in_features), torch.randn(2, 1, attn.q_proj.in_features)
    with torch.inference_mode():
        k_y = attn.k_proj(y)
        attn.q_proj(x)
        assert torch.equal(attn.k_proj(y), k_y) and not torch.equal(attn.k_proj(x), k_y)


def test_multi_position_passes_are_exactly_float32(int8_lm, tiny_lm):
    """Scoring (PPL, LOSS attack) and prefill run whole sequences: identical to the float32 model."""
    from dpinfer.eval.metrics import continuation_nll

    ctx = [tiny_lm.encode("The applicant was born in 1970."), tiny_lm.encode("Mr Smith")]
    out = tiny_lm.encode(" and lives in Izmir.")
    assert continuation_nll(int8_lm, ctx, out) == continuation_nll(tiny_lm, ctx, out)


def test_int8_engine_generates(int8_lm):
    from dpinfer.engine import Engine
    from dpinfer.mechanisms.sampler import Sampler

    out = Engine(int8_lm).generate([int8_lm.encode("The applicant")] * 3, Sampler(temperature=1.0),
                                   max_new_tokens=6, min_new_tokens=6, seed=0)
    assert all(len(s) == 6 for s in out.sequences)


def test_no_quantisation_warnings(tiny_model_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        models.load_model(str(tiny_model_dir), device="cpu", quantize="int8")


def test_bad_quantize_values(tiny_model_dir, monkeypatch):
    with pytest.raises(ConfigurationError, match="accepted values: int8"):
        models.load_model(str(tiny_model_dir), device="cpu", quantize="int4")
    with pytest.raises(ConfigurationError, match="float32"):
        models.load_model(str(tiny_model_dir), device="cpu", dtype="bfloat16", quantize="int8")
    # on a GPU: refused before anything is loaded
    monkeypatch.setattr(models, "_pick_device", lambda device: torch.device("cuda"))
    with pytest.raises(ConfigurationError, match="CPU-only"):
        models.load_model(str(tiny_model_dir), device="cuda", dtype="float32", quantize="int8")


def test_cli_quantize_flag_parses():
    from dpinfer.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["sanitize", "doc.txt", "--quantize", "int8"]).quantize == "int8"
    assert parser.parse_args(["sanitize", "doc.txt"]).quantize is None
    assert parser.parse_args(["generate", "hi", "--quantize", "int8"]).quantize == "int8"
    assert parser.parse_args(["bench", "sanitize", "--perf", "--quantize", "int8"]).quantize == "int8"
    with pytest.raises(SystemExit):
        parser.parse_args(["sanitize", "doc.txt", "--quantize", "int4"])


def test_bench_sanitize_perf_records_quantize(tiny_model_dir, shared_data, tmp_path):
    from dpinfer.bench import sanitize as bench
    from dpinfer.cli import build_parser

    args = build_parser().parse_args(["bench", "sanitize", "--perf", "--quantize", "int8", "--model",
                                      str(tiny_model_dir), "--max-new-tokens", "4", "--max-chars", "600",
                                      "--no-hf", "--out", str(tmp_path)])
    res = bench.run(bench.config_from_args(args))
    assert res["settings"]["quantize"] == "int8"
    assert "int8 decode steps" in res["markdown"]
    assert [r["config"] for r in res["rows"]] == ["original", "original (former path)", "original [hf forward]",
                                                  "dp-fusion m=1", "dp-fusion m=1 (former path)",
                                                  "dp-fusion m=1 [hf forward]", "dp-fusion m=4",
                                                  "dp-fusion m=4 (former path)", "dp-fusion m=4 [hf forward]"]
    assert res["settings"]["backend"] == "own"  # and the [hf forward] rows: the same int8 engine on transformers


@pytest.mark.parametrize("fuse", [True, False])
def test_int8_rows_never_share_a_scale(tiny_model_dir, fuse):
    """Each row of an int8 decode call is quantised with its own scale: row 0's output is bit-identical whatever the
    other rows hold (values of any size, zeros, other row counts) and equals row 0 run alone (rule 2: a public row
    stepped with private rows). The original kernel call (one scale per call) fails this."""
    lm = models.load_model(str(tiny_model_dir), device="cpu")
    models.quantize_int8(lm.model, fuse=fuse)
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        layers = lm.model.model.layers
        for module in [lm.model.lm_head, layers[0].self_attn.k_proj, layers[1].mlp.up_proj]:
            x0 = torch.randn(1, 1, module.in_features, generator=gen)
            alone = module(x0)
            for others in (torch.zeros(2, 1, module.in_features), 1e3 * torch.randn(4, 1, module.in_features),
                           -1e-3 * torch.rand(1, 1, module.in_features)):
                assert torch.equal(module(torch.cat([x0.clone(), others]))[:1], alone)
            ref = module.float_linear(x0)
            assert (alone - ref).abs().max() <= 0.05 * ref.abs().max()  # still an accurate int8 product
            zero = module(torch.zeros(1, 1, module.in_features))
            expected = module.float_linear.bias if module.float_linear.bias is not None else torch.zeros(())
            assert torch.equal(zero[0, 0], expected.expand_as(zero[0, 0]))


def test_int8_bias_is_added_unscaled():
    lin = torch.nn.Linear(16, 8)
    torch.nn.init.normal_(lin.bias, std=3.0)
    holder = torch.nn.Sequential(lin)
    models.quantize_int8(holder)
    x = torch.randn(3, 1, 16)
    with torch.inference_mode():
        got, ref = holder(x), lin(x)
    assert (got - ref).abs().max() <= 0.05 * ref.abs().max()


# ---------------------------------------------------------------------------------------------- the int8 decode twin
def test_int8_twin_shares_weights_and_leaves_the_model_as_it_was(tiny_model_dir):
    from dpinfer.quantize import int8_decode_twin

    lm = models.load_model(str(tiny_model_dir), device="cpu")
    before = {n: type(m) for n, m in lm.model.named_modules()}
    ids = torch.tensor([lm.encode("The applicant was born in 1970 and lives in Izmir.")])
    ref = _decode_logits(lm, ids, 4)
    twin = int8_decode_twin(lm.model)
    # the original: the same modules, the same logits, bit for bit
    assert {n: type(m) for n, m in lm.model.named_modules()} == before
    assert torch.equal(_decode_logits(lm, ids, 4), ref)
    # the twin: every parameter is the original's own tensor (nothing copied but the containers)
    original = {id(p) for p in lm.model.parameters()}
    assert {id(p) for p in twin.parameters()} <= original
    wrapped = [m for m in twin.modules() if type(m).__name__ == "DecodeInt8Linear"]
    assert len(wrapped) == 15 and all(id(m.float_linear.weight) in original for m in wrapped)
    # its prompt processing is the original's float32 (bit for bit); its decode steps are int8 (close, not equal)
    tw = models.LM(**{**lm.__dict__, "model": twin, "quantize": "int8"})
    got = _decode_logits(tw, ids, 4)
    assert torch.equal(got[:, 0], ref[:, 0])
    assert not torch.equal(got[:, 1:], ref[:, 1:])
    assert torch.allclose(got.softmax(-1), ref.softmax(-1), atol=0.05)


def test_int8_twin_decodes_as_the_int8_model(tiny_model_dir, int8_lm):
    """The twin's decode steps are those of ``load_model(quantize="int8")`` on the same weights, bit for bit."""
    from dpinfer.quantize import int8_decode_twin

    lm = models.load_model(str(tiny_model_dir), device="cpu")
    lm.model.apply(lambda m: m.__dict__.pop("_dpinfer_packed", None))  # plain float32 layers, as the int8 model has
    tw = models.LM(**{**lm.__dict__, "model": int8_decode_twin(lm.model), "quantize": "int8"})
    ids = torch.tensor([lm.encode("On 20 May 1998 the court of Izmir found that the applicant")])
    assert torch.equal(_decode_logits(tw, ids, 5), _decode_logits(int8_lm, ids, 5))


def test_runtime_int8_engine(tiny_model_dir):
    from dpinfer.engine import Engine
    from dpinfer.quantize import shared_int8_twin
    from dpinfer.runtime import Runtime

    lm = models.load_model(str(tiny_model_dir), device="cpu")
    rt = Runtime(lm)
    eng = rt.int8_engine
    assert eng is not None and eng is rt.int8_engine and eng is not rt.engine
    assert eng.lm.quantize == "int8" and eng.lm.tokenizer is lm.tokenizer
    assert eng.lm.model is shared_int8_twin(lm.model)  # one twin per model, shared by every runtime
    assert Runtime(lm).int8_engine.lm.model is eng.lm.model
    # a runtime given its engine (a server's shared batch) keeps stage 3 there
    assert Runtime(lm, Engine(lm)).int8_engine is None
    # an int8 model is its own twin
    q = models.load_model(str(tiny_model_dir), device="cpu", quantize="int8")
    rq = Runtime(q)
    assert rq.int8_engine is rq.engine


def test_no_int8_twin_for_a_model_that_is_not_float32_on_cpu(tiny_model_dir):
    from dpinfer.runtime import Runtime

    bf16 = models.load_model(str(tiny_model_dir), device="cpu", dtype="bfloat16")
    assert models.int8_twin(bf16) is None and Runtime(bf16).int8_engine is None
