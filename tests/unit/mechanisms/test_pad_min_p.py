"""PAD's min-p support: a function of the public row only, inside Top-k⁺, and ε unchanged."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dpinfer.accounting.calibration import Budget, Spec
from dpinfer.errors import ConfigurationError
from dpinfer.mechanisms.base import StepInfo
from dpinfer.mechanisms.pad import Pad
from dpinfer.mechanisms.randomness import SeededRandom

finite = st.floats(-60.0, 60.0, allow_nan=False)
private_value = st.one_of(finite, st.sampled_from([math.inf, -math.inf, math.nan]))


@settings(max_examples=200, deadline=None)
@given(st.lists(finite, min_size=10, max_size=10), st.lists(private_value, min_size=10, max_size=10),
       st.lists(private_value, min_size=10, max_size=10), st.floats(0.01, 1.0), st.floats(0.05, 3.0),
       st.sampled_from([None, 1, 3]))
def test_min_p_support_is_the_public_min_p_set_whatever_the_private_row(pub, ctx_a, ctx_b, min_p, clip, top_k):
    mech = Pad(clip_norm=clip, top_k=top_k, min_p=min_p)
    z_pub = torch.tensor(pub, dtype=torch.float64)
    idx_a, p_a, pre_a = mech.pre_noise_logits(torch.stack([z_pub, torch.tensor(ctx_a, dtype=torch.float64)]))
    idx_b, _, pre_b = mech.pre_noise_logits(torch.stack([z_pub, torch.tensor(ctx_b, dtype=torch.float64)]))
    # the support is read from the public row only: the same for any two private rows, and for the null context
    idx_null, _, pre_null = mech.pre_noise_logits(torch.stack([z_pub, z_pub]))
    assert idx_a.tolist() == idx_b.tolist() == idx_null.tolist()
    # it is the Top-k⁺ set intersected with {v : p_pub[v] ≥ min_p · max p_pub}, and holds the public argmax
    wide, _, _ = Pad(clip_norm=clip, top_k=top_k).pre_noise_logits(torch.stack([z_pub, z_pub]))
    expected = [v for v in wide.tolist() if pub[v] >= max(pub) + math.log(min_p)]
    assert idx_a.tolist() == expected
    assert int(torch.argmax(z_pub)) in idx_a.tolist()
    # the release before noise stays within C of the public logits: the sensitivity is unchanged
    for pre in (pre_a, pre_b):
        assert float((pre - p_a).norm()) <= clip * (1 + 1e-9)
    assert torch.equal(pre_null, p_a)
    cols = mech.private_columns(z_pub)  # None: every token (the engine then reads the whole private row)
    assert (list(range(len(pub))) if cols is None else cols.tolist()) == idx_a.tolist()


def test_min_p_keeps_many_tokens_on_a_flat_public_step_and_few_on_a_peaked_one():
    mech = Pad(clip_norm=1.43, top_k=1, min_p=0.2)
    flat = torch.tensor([1.0, 0.9, 0.5, 0.2, -0.3, -5.0], dtype=torch.float64)
    peaked = torch.tensor([6.0, 4.0, 3.5, 0.0, -1.0, -5.0], dtype=torch.float64)
    assert mech.private_columns(flat).tolist() == [0, 1, 2, 3, 4]  # ln 0.2 ≈ −1.61 below the public maximum
    assert mech.private_columns(peaked).tolist() == [0]
    # Top-1⁺ alone (max − 2C ≈ max − 2.86) keeps three tokens of the peaked step
    assert Pad(clip_norm=1.43, top_k=1).private_columns(peaked).tolist() == [0, 1, 2]


@pytest.mark.parametrize("adjacency", ["replace-by-null", "replace-one"])
def test_min_p_leaves_the_calibration_and_the_guarantee_unchanged(adjacency):
    spec = dict(adjacency=adjacency, top_k=1)
    plain = Pad.calibrated(Budget(64.0, 1e-5), Spec(64, **spec))
    narrow = Pad.calibrated(Budget(64.0, 1e-5), Spec(64, min_p=0.2, **spec))
    assert narrow.min_p == 0.2 and narrow.clip_norm == plain.clip_norm and narrow.sigma == plain.sigma
    g0, g1 = plain.guarantee(64), narrow.guarantee(64)
    assert g1.epsilon == g0.epsilon and g1.delta == g0.delta and g1.ex_ante
    assert g1.parameters["rho"] == g0.parameters["rho"] and g1.parameters["min_p"] == 0.2


def test_a_step_releases_a_token_of_the_min_p_support():
    mech = Pad(clip_norm=1.43, top_k=1, min_p=0.2)
    mech.start(2, 6)
    z = torch.tensor([[1.0, 0.9, -1.5, -3.0, 0.5, -9.0], [-9.0, -9.0, 9.0, 9.0, -9.0, -9.0]], dtype=torch.float64)
    src = SeededRandom(0)
    seen = {int(mech.step(z, StepInfo(0, 8, 2), src).tokens) for _ in range(300)}
    assert seen <= {0, 1, 4} and len(seen) > 1  # the private row's favourites lie outside the public min-p set


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5, math.nan, "0.2", True])
def test_bad_min_p_is_refused(bad):
    with pytest.raises(ConfigurationError, match="min_p"):
        Pad(clip_norm=1.0, min_p=bad)
