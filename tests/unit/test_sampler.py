"""The non-private sampler and the logit transforms."""

from __future__ import annotations

import math

import pytest
import torch

from dpinfer.errors import ConfigurationError
from dpinfer.mechanisms import available_mechanisms, get_mechanism
from dpinfer.mechanisms.base import StepInfo
from dpinfer.mechanisms.sampler import Sampler
from dpinfer.mechanisms.transforms import PublicSupport, Temperature, TopK, TopP

INFO = StepInfo(step=0, max_new_tokens=1, num_contexts=1)


def test_registry():
    assert "sampler" in available_mechanisms()
    with pytest.raises(ConfigurationError, match="unknown mechanism"):
        get_mechanism("no-such-mechanism")


@pytest.mark.parametrize("bad", [0, -1, math.inf, math.nan])
def test_temperature_validation(bad):
    with pytest.raises(ConfigurationError, match="temperature"):
        Temperature(bad)


def test_topk_topp_validation():
    with pytest.raises(ConfigurationError):
        TopK(0)
    with pytest.raises(ConfigurationError):
        TopP(0.0)
    with pytest.raises(ConfigurationError):
        Sampler(temperature=-0.1)
    with pytest.raises(ConfigurationError):
        Sampler(mode="both")  # type: ignore[arg-type]


def test_topp_keeps_smallest_set_reaching_p():
    p = torch.tensor([[0.5, 0.25, 0.15, 0.1]], dtype=torch.float64)
    kept = TopP(0.75)((), p.log()).isfinite()[0].tolist()
    assert kept == [True, True, False, False]
    kept = TopP(0.76)((), p.log()).isfinite()[0].tolist()
    assert kept == [True, True, True, False]


def test_public_support_uses_only_the_public_row():
    z = torch.randn(3, 50, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    out = PublicSupport(top_k=5, margin=0.3)((), z)
    keep = out[0].isfinite()
    assert torch.equal(out.isfinite(), keep.expand(3, -1))  # same support for every row
    assert keep.sum() >= 5
    kth = torch.topk(z[0], 5).values[-1]
    assert torch.equal(keep, z[0] >= kth - 0.3)
    # changing a private row never changes the support
    z2 = z.clone()
    z2[1] = 100 * torch.randn(50, dtype=torch.float64)
    assert torch.equal(PublicSupport(top_k=5, margin=0.3)((), z2)[0].isfinite(), keep)


def test_sampling_frequencies_follow_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    z = probs.log().expand(20000, -1).clone()
    g = torch.Generator().manual_seed(0)
    toks = Sampler(temperature=1.0).step(z, StepInfo(0, 1, 20000), g).tokens
    freq = torch.bincount(toks, minlength=3).double() / 20000
    assert torch.allclose(freq, probs, atol=0.015)


def test_greedy_ties_go_to_lowest_id_and_joint_row():
    z = torch.tensor([[1.0, 3.0, 3.0], [9.0, 0.0, 0.0]], dtype=torch.float64)
    g = torch.Generator()
    assert Sampler(temperature=0).step(z, StepInfo(0, 1, 2), g).tokens.tolist() == [1, 0]
    assert int(Sampler(temperature=0, mode="joint", row=1).step(z, StepInfo(0, 1, 2), g).tokens) == 0
