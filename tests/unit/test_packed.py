"""Packed-weight float32 linears on CPU (:mod:`dpinfer.packed`): the same layer, rows independent, falls back safely."""

from __future__ import annotations

import pytest
import torch

from dpinfer import models
from dpinfer.packed import PACKED_MAX_ROWS, pack_linears, pack_now, packed_linear_cls, packing_available

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN packed linear")


def _layers(out_features: int = 96, bias: bool = True) -> tuple[torch.nn.Linear, torch.nn.Linear]:
    torch.manual_seed(0)
    plain = torch.nn.Linear(64, out_features, bias=bias)
    packed = torch.nn.Linear(64, out_features, bias=bias)
    packed.load_state_dict(plain.state_dict())
    holder = torch.nn.Sequential(packed)
    assert pack_linears(holder) == 1
    return plain, holder[0]


@pytest.mark.parametrize("rows", [2, 5, 10, PACKED_MAX_ROWS])
def test_few_rows_match_f_linear(rows):
    plain, packed = _layers()
    assert isinstance(packed, torch.nn.Linear) and type(packed) is packed_linear_cls()
    x = torch.randn(rows, 1, 64)  # a decode step's shape
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), plain(x), rtol=1e-5, atol=1e-5)
        assert packed(x).shape == plain(x).shape


def test_one_row_and_long_inputs_are_f_linear_bit_for_bit():
    plain, packed = _layers()
    with torch.inference_mode():
        for x in (torch.randn(1, 1, 64), torch.randn(64), torch.randn(1, PACKED_MAX_ROWS + 1, 64)):
            assert torch.equal(packed(x), plain(x))


def test_a_row_never_depends_on_the_other_rows():
    _, packed = _layers(out_features=9000)  # the head rule: packed for any number of rows
    x = torch.randn(8, 64)
    y = x.clone()
    y[1:] = torch.randn(7, 64) * 100
    with torch.inference_mode():
        a, b = packed(x), packed(y)
        big = packed(torch.cat([x[:1], torch.randn(299, 64)]))
    assert torch.equal(a[0], b[0])
    assert torch.allclose(big[0], a[0], rtol=1e-5, atol=1e-5)


def test_changed_weights_fall_back_to_f_linear():
    plain, packed = _layers()
    with torch.no_grad():
        packed.weight.mul_(2.0)
        plain.weight.mul_(2.0)
    x = torch.randn(4, 64)
    with torch.inference_mode():
        assert torch.equal(packed(x), plain(x))


def test_the_packed_copy_is_made_at_first_use_and_kept():
    plain, packed = _layers()
    assert packed.__dict__["_dpinfer_packed"][0] is None  # pack_linears made no copy yet
    with torch.inference_mode():
        packed(torch.randn(1, 64))  # one row: F.linear, no copy
    assert packed.__dict__["_dpinfer_packed"][0] is None
    x = torch.randn(3, 64)
    with torch.inference_mode():  # the copy made under inference mode is a normal tensor, usable outside it
        first = packed(x)
    copy = packed.__dict__["_dpinfer_packed"][0]
    assert copy is not None and not copy.is_inference()
    with torch.no_grad():
        assert torch.equal(packed(x), first) and packed.__dict__["_dpinfer_packed"][0] is copy
    torch.testing.assert_close(first, plain(x).detach(), rtol=1e-5, atol=1e-5)
    holder = torch.nn.Sequential(torch.nn.Linear(64, 8))
    assert pack_linears(holder, eager=True) == 1 and holder[0].__dict__["_dpinfer_packed"][0] is not None
    assert pack_now(holder) == 0  # nothing left to make
    holder = torch.nn.Sequential(torch.nn.Linear(64, 8), torch.nn.Linear(8, 8))
    assert pack_linears(holder) == 2 and pack_now(holder) == 2 and pack_now(holder) == 0
    assert all(m.__dict__["_dpinfer_packed"][0] is not None for m in holder)


def test_gradients_use_f_linear():
    _, packed = _layers()
    x = torch.randn(4, 64, requires_grad=True)
    packed(x).sum().backward()
    assert packed.weight.grad is not None and x.grad is not None


def test_load_model_packs_cpu_float32_models(tiny_model_dir, tiny_lm):
    lm = tiny_lm
    assert lm.packed_linears == 15  # 2 layers x 7 projections + lm_head
    assert all(type(m) is packed_linear_cls() for m in lm.model.modules() if isinstance(m, torch.nn.Linear))
    ref = models.load_model(str(tiny_model_dir), device="cpu")
    for m in ref.model.modules():  # the same model with the packing switched off
        m.__dict__.pop("_dpinfer_packed", None)
    assert list(ref.model.state_dict()) == list(lm.model.state_dict())
    ids = torch.randint(3, lm.vocab_size, (5, 12))
    with torch.inference_mode():
        out = lm.model(input_ids=ids[:, :-1], use_cache=True)
        ref_out = ref.model(input_ids=ids[:, :-1], use_cache=True)
        assert torch.equal(out.logits, ref_out.logits)  # prompt processing: F.linear in both
        step = lm.model(input_ids=ids[:, -1:], past_key_values=out.past_key_values, use_cache=True).logits
        ref_step = ref.model(input_ids=ids[:, -1:], past_key_values=ref_out.past_key_values, use_cache=True).logits
    torch.testing.assert_close(step, ref_step, rtol=1e-4, atol=1e-4)
    assert models.load_model(str(tiny_model_dir), device="cpu", quantize="int8").packed_linears == 0


def test_a_model_over_the_size_limit_is_not_packed(monkeypatch):
    """The packed copy doubles the weights' memory: a model above PACK_MAX_BYTES keeps F.linear everywhere."""
    from dpinfer import packed

    holder = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 32))
    size = 64 * 96 * 4 + 96 * 32 * 4
    monkeypatch.setattr(packed, "PACK_MAX_BYTES", size - 1)
    assert pack_linears(holder) == 0 and all(type(m) is torch.nn.Linear for m in holder)
    monkeypatch.setattr(packed, "PACK_MAX_BYTES", size)
    assert pack_linears(holder) == 2
