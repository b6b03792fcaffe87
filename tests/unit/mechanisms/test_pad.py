"""PAD (rigorous), PAD as published, and static noise: clipping, accounting, the authors' hand-computed steps."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dpinfer.accounting import DataDependentSpend, Zcdp, zcdp_rho_for_target
from dpinfer.accounting.calibration import Budget, Spec
from dpinfer.errors import ConfigurationError, InvalidInputError
from dpinfer.mechanisms.base import StepInfo
from dpinfer.mechanisms.pad import Pad, PadAsPublished, centre_and_clip, published_step_parameters
from dpinfer.mechanisms.randomness import SeededRandom
from dpinfer.mechanisms.static_noise import StaticNoise

finite = st.floats(-60.0, 60.0, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(finite, min_size=12, max_size=12), st.lists(finite, min_size=12, max_size=12),
       st.floats(0.01, 5.0), st.sampled_from([None, 1, 3, 8]))
def test_released_logits_stay_within_c_of_the_public_logits(pub, ctx, clip, top_k):
    mech = Pad(clip_norm=clip, top_k=top_k)
    z = torch.tensor([pub, ctx], dtype=torch.float64)
    idx, p, pre = mech.pre_noise_logits(z)
    assert torch.equal(p, z[0, idx])
    assert float((pre - p).norm()) <= clip * (1 + 1e-9)
    # the shift is centred: softmax-equivalent to the private row when it fits inside C
    assert abs(float((pre - p).sum())) <= 1e-6 * max(1.0, float(p.abs().max()))


def test_support_is_public_and_keeps_every_possible_top_k():
    mech = Pad(clip_norm=0.5, top_k=2)
    pub = torch.tensor([5.0, 4.0, 3.2, 2.9, 0.0], dtype=torch.float64)
    cols = mech.private_columns(pub)
    assert cols.tolist() == [0, 1, 2]  # kth = 4, threshold 4 − 2C = 3
    for ctx in (torch.zeros(5), torch.tensor([-99.0, -99.0, 99.0, 99.0, 99.0])):
        idx, _, _ = mech.pre_noise_logits(torch.stack([pub, ctx.double()]))
        assert idx.tolist() == cols.tolist()  # the private row never changes the support
    assert Pad(clip_norm=0.5, top_k=None).private_columns(pub) is None


def test_private_minus_infinity_is_clipped_not_propagated():
    mech = Pad(clip_norm=1.0, top_k=None)
    z = torch.tensor([[1.0, 0.0, -1.0], [-math.inf, 0.0, 2.0]], dtype=torch.float64)
    _, p, pre = mech.pre_noise_logits(z)
    assert torch.isfinite(pre).all() and float((pre - p).norm()) <= 1.0 + 1e-12


def test_null_context_releases_the_public_logits_plus_noise_only():
    mech = Pad(clip_norm=2.0, top_k=None)
    pub = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    _, p, pre = mech.pre_noise_logits(torch.stack([pub, pub]))
    assert torch.equal(pre, p)
    # a constant shift (softmax-invisible) centres to zero as well
    _, _, pre2 = mech.pre_noise_logits(torch.stack([pub, pub + 7.0]))
    assert torch.allclose(pre2, p, atol=1e-12)


def test_argmax_frequency_matches_the_gaussian_release():
    # two tokens, no clipping effect (C large, shift 0): P(token 0) = Φ((a − b)/(σ√2))
    sigma, gap = 1.5, 1.0
    mech = Pad(clip_norm=10.0, sigma=sigma, top_k=None)
    mech.start(2, 2)
    z = torch.tensor([[gap, 0.0], [gap, 0.0]], dtype=torch.float64)
    src = SeededRandom(1)
    n = 20000
    wins = sum(int(mech.step(z, StepInfo(0, 1, 2), src).tokens) == 0 for _ in range(n))
    expected = 0.5 * (1 + math.erf(gap / (sigma * math.sqrt(2)) / math.sqrt(2)))
    assert abs(wins / n - expected) < 4 * math.sqrt(expected * (1 - expected) / n)


@pytest.mark.parametrize("adjacency,factor", [("replace-by-null", 1.0), ("replace-one", 2.0)])
def test_guarantee_is_the_zcdp_formula_over_t_max(adjacency, factor):
    mech = Pad(clip_norm=0.7, sigma=1.3, delta=1e-6, adjacency=adjacency)
    for t in (1, 48, 200):
        rho = t * (factor * 0.7) ** 2 / (2 * 1.3**2)
        g = mech.guarantee(t)
        assert g.parameters["rho"] == pytest.approx(rho, rel=1e-12)
        assert g.epsilon == Zcdp(rho).to_epsilon(1e-6)
        assert g.max_new_tokens == t and g.delta == 1e-6 and g.ex_ante
        assert adjacency in g.adjacency


@pytest.mark.parametrize("eps", [1.0, 8.0, 64.0])
@pytest.mark.parametrize("adjacency", ["replace-by-null", "replace-one"])
def test_calibration_meets_the_target_with_sigma_fixed(eps, adjacency):
    mech = Pad.calibrated(Budget(eps, 1e-5), Spec(64, adjacency=adjacency))
    assert mech.sigma == 1.5
    g = mech.guarantee(64)
    assert g.epsilon <= eps + 1e-9 and g.epsilon == pytest.approx(eps, rel=1e-6)
    assert g.parameters["rho"] == pytest.approx(zcdp_rho_for_target(eps, 1e-5), rel=1e-9)
    # replace-one pays twice the sensitivity: half the clip norm for the same ε
    other = "replace-one" if adjacency == "replace-by-null" else "replace-by-null"
    twin = Pad.calibrated(Budget(eps, 1e-5), Spec(64, adjacency=other))
    ratio = mech.clip_norm / twin.clip_norm
    assert ratio == pytest.approx(0.5 if adjacency == "replace-one" else 2.0)


def test_bad_parameters_are_refused():
    for kw in ({"clip_norm": 0}, {"clip_norm": 1, "sigma": -1}, {"clip_norm": 1, "adjacency": "add-one"},
               {"clip_norm": 1, "top_k": 0}, {"clip_norm": 1, "temperature": -0.5}, {"clip_norm": 1, "delta": 1}):
        with pytest.raises(ConfigurationError):
            Pad(**kw)
    with pytest.raises(ConfigurationError):
        Pad(clip_norm=1).start(3, 10)
    with pytest.raises(InvalidInputError):
        Pad(clip_norm=1).pre_noise_logits(torch.tensor([[0.0, math.nan], [0.0, 0.0]]))


def test_sampling_mode_draws_from_the_source():
    mech = Pad(clip_norm=0.5, top_k=None, temperature=1.0)
    mech.start(2, 6)
    z = torch.randn(2, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    a = [int(mech.step(z, StepInfo(t, 8, 2), SeededRandom(5)).tokens) for t in range(3)]
    b = [int(mech.step(z, StepInfo(t, 8, 2), SeededRandom(5)).tokens) for t in range(3)]
    assert a == b


# ------------------------------------------------------------------------------------------------ as published
def _by_hand(z: list[float], t: int, eps: float = 0.2) -> tuple[bool, float, float]:
    """The authors' formulas (ALGORITHMS §3) written out independently with math only."""
    m = max(z)
    ex = [math.exp(v - m) for v in z]
    total = sum(ex)
    p = [e / total for e in ex]
    p1 = max(p)
    srt = sorted(z, reverse=True)
    margin = srt[0] - srt[1]
    if p1 > 0.9 and margin > 2.0:
        return False, 0.01, 0.0
    delta_t = max(0.4, min(1.0, 1 / (1 + math.log(1 + margin))))
    h = -sum(q * math.log(q) for q in p if q > 0) / math.log(len(z))
    c = min(max(0.7 + 0.3 * h + 0.2 / (1 + 0.1 * t) + 0.3 * (1 - p1), 0.1), 2.0)
    sigma = min(max((0.01 / max(eps, 0.01)) * c * (delta_t / eps) * 3.0, 0.01), 10.0)
    return True, sigma, 10.0 * delta_t**2 / (2 * sigma**2)


@pytest.mark.parametrize("z,t", [
    ([0.0, 0.0, 0.0, 0.0], 0),             # flat: Δ = 1, c = 1.425
    ([2.0, 1.0, 0.0, -1.0, -3.0], 5),      # margin 1: Δ = 1/(1 + ln 2)
    ([3.0, 0.5, 0.0], 12),                 # margin 2.5 but p1 < 0.9: charged, Δ = max(0.4, 1/(1+ln 3.5))
    ([9.0, 0.0, 0.0, 0.0], 3),             # confident and wide margin: screened out, σ_min, no charge
    ([2.5, 0.0, 0.0], 1),                  # p1 < 0.9 although the margin is > 2: charged
])
def test_pad_as_published_reproduces_hand_computed_steps(z, t):
    charged, sigma, charge = _by_hand(z, t)
    got = published_step_parameters(torch.tensor(z, dtype=torch.float64), t)
    assert got[0] == charged
    assert got[2] == pytest.approx(sigma, rel=1e-12)
    assert got[3] == pytest.approx(charge, rel=1e-12)


def test_pad_as_published_hand_case_in_numbers():
    # flat 4-token logits at t = 0: c = 0.7 + 0.3·1 + 0.2 + 0.3·0.75 = 1.425, σ = (0.01/0.2)·1.425·(1/0.2)·3 = 1.06875,
    # charge = 10·1/(2·1.06875²) = 4.37732...
    _, _, sigma, charge = published_step_parameters(torch.zeros(4, dtype=torch.float64), 0)
    assert sigma == pytest.approx(1.06875)
    assert charge == pytest.approx(10 / (2 * 1.06875**2))
    # the noise knob (the authors' "ε") at 0.5 instead of 0.2: σ scales by (0.2/0.5)²
    _, _, sigma5, _ = published_step_parameters(torch.zeros(4, dtype=torch.float64), 0, noise_scale=0.5)
    assert sigma5 == pytest.approx(1.06875 * 0.16)
    with pytest.raises(ConfigurationError, match="unknown"):
        published_step_parameters(torch.zeros(4, dtype=torch.float64), 0, epsilon=0.5)


def test_pad_as_published_reports_a_data_dependent_figure_and_resets_per_answer():
    flat = torch.zeros(1, 4, dtype=torch.float64)
    sure = torch.tensor([[12.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    mech = PadAsPublished()
    g = torch.Generator().manual_seed(0)
    mech.start(1, 4)
    for t, z in enumerate((flat, sure, flat)):
        mech.step(z, StepInfo(t, 3, 1), g)
    expected = sum(_by_hand([0.0] * 4, t)[2] for t in (0, 2)) + math.log(1e5) / 9
    spend = mech.spend()
    assert isinstance(spend, DataDependentSpend) and spend.value == pytest.approx(expected)
    assert "ε" not in spend.quantity and mech.charged_share() == pytest.approx(2 / 3)
    mech.start(1, 4)  # a new answer: reset
    assert mech.spend().value == pytest.approx(math.log(1e5) / 9)
    carry = PadAsPublished(carry_over=True)
    for _ in range(2):
        carry.start(1, 4)
        carry.step(flat, StepInfo(0, 1, 1), g)
    assert carry.spend().value == pytest.approx(2 * _by_hand([0.0] * 4, 0)[2] + math.log(1e5) / 9)
    guarantee = mech.guarantee(48)
    assert math.isinf(guarantee.epsilon) and "heuristic" in guarantee.adjacency
    with pytest.raises(ConfigurationError):
        PadAsPublished(amplifcation=2.0)


def test_pad_as_published_greedy_under_screening_keeps_the_top_token():
    mech = PadAsPublished()
    mech.start(1, 3)
    z = torch.tensor([[20.0, 0.0, 0.0]], dtype=torch.float64)
    assert int(mech.step(z, StepInfo(0, 1, 1), SeededRandom(0)).tokens) == 0


def test_static_noise_has_no_guarantee_and_adds_noise():
    mech = StaticNoise(sigma=2.0)
    mech.start(1, 2)
    z = torch.tensor([[0.5, 0.0]], dtype=torch.float64)
    src = SeededRandom(3)
    toks = [int(mech.step(z, StepInfo(0, 1, 1), src).tokens) for _ in range(2000)]
    share = toks.count(0) / len(toks)
    expected = 0.5 * (1 + math.erf(0.5 / (2.0 * math.sqrt(2)) / math.sqrt(2)))
    assert abs(share - expected) < 0.05
    assert math.isinf(mech.guarantee(10).epsilon)
    with pytest.raises(ConfigurationError):
        StaticNoise(sigma=0)


def test_centre_and_clip_norm():
    s = centre_and_clip(torch.tensor([10.0, -10.0, 0.0, 4.0], dtype=torch.float64), 0.25)
    assert float(s.norm()) == pytest.approx(0.25) and float(s.sum()) == pytest.approx(0.0, abs=1e-12)
