"""InvisibleInk and its baselines (Amin et al., AdaPMixED): ALGORITHMS §2 properties."""

from __future__ import annotations

import math

import pytest
import torch
from dp_accounting.rdp import compute_epsilon

from dpinfer.accounting import DEFAULT_ORDERS, Zcdp, zcdp_rho_for_target
from dpinfer.accounting.calibration import Budget, Spec
from dpinfer.errors import ConfigurationError, InvalidInputError
from dpinfer.mechanisms import get_mechanism
from dpinfer.mechanisms.adapmixed import AdaPMixED
from dpinfer.mechanisms.amin import AminSVT, recenter_clip, rho_per_private_token, sensitivity
from dpinfer.mechanisms.base import StepInfo
from dpinfer.mechanisms.dp_fusion import renyi_divergence
from dpinfer.mechanisms.invisibleink import (
    InvisibleInk,
    clip_norm_for_rho,
    dclip_aggregate,
    rho_for_clip_norm,
    topk_plus_mask,
)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _logits(b: int, v: int, seed: int, scale: float = 4.0) -> torch.Tensor:
    return torch.randn(b + 1, v, dtype=torch.float64, generator=_gen(seed)) * scale


# ------------------------------------------------------------------------------------------------ InvisibleInk
def test_replacing_one_reference_by_null_moves_the_aggregate_by_at_most_c_over_b() -> None:
    """ALGORITHMS §2: the ℓ∞ sensitivity of ℓ̄ under replace-by-null is C/B (2,000 random adjacent pairs)."""
    worst = 0.0
    for trial in range(2000):
        g = _gen(trial)
        b = int(torch.randint(1, 10, (1,), generator=g))
        v = int(torch.randint(2, 60, (1,), generator=g))
        c = float(torch.rand(1, generator=g, dtype=torch.float64)) * 3 + 1e-3
        z = torch.randn(b + 1, v, dtype=torch.float64, generator=g) * float(torch.rand(1, generator=g) * 20 + 0.1)
        j = int(torch.randint(1, b + 1, (1,), generator=g))
        z_null = z.clone()
        z_null[j] = z[0]  # the null reference's context is the public prompt
        moved = (dclip_aggregate(z, c) - dclip_aggregate(z_null, c)).abs().max().item()
        assert moved <= c / b * (1 + 1e-12) + 1e-12
        worst = max(worst, moved / (c / b))
    assert worst > 0.99  # the bound is attained: it is the sensitivity, not a loose bound


def test_released_distributions_of_adjacent_batches_are_within_the_per_token_rdp() -> None:
    """Each token is ½(C/(Bτ))²-zCDP: D_α between adjacent released distributions ≤ ρ₀·α at every order."""
    for trial in range(500):
        g = _gen(10_000 + trial)
        b = int(torch.randint(1, 8, (1,), generator=g))
        c = float(torch.rand(1, generator=g, dtype=torch.float64)) * 2 + 0.05
        tau = float(torch.rand(1, generator=g, dtype=torch.float64)) + 0.5
        top_k = [None, 3, 10][trial % 3]
        mech = InvisibleInk(clip_norm=c, batch_size=b, temperature=tau, top_k=top_k)
        z = _logits(b, 40, 20_000 + trial, scale=3.0)
        z_null = z.clone()
        z_null[1 + trial % b] = z[0]
        p, _ = mech.distribution(z)
        q, _ = mech.distribution(z_null)
        rho0 = 0.5 * (c / (b * tau)) ** 2
        for alpha in (1.5, 2.0, 4.0, 16.0):
            for a, bb in ((p, q), (q, p)):
                d = float(renyi_divergence(a.log(), bb.log(), alpha))
                assert d <= rho0 * alpha + 1e-10


def test_topk_plus_contains_the_top_k_of_every_standalone_contribution() -> None:
    for trial in range(1000):
        g = _gen(30_000 + trial)
        b = int(torch.randint(1, 9, (1,), generator=g))
        v = int(torch.randint(5, 80, (1,), generator=g))
        k = int(torch.randint(1, v, (1,), generator=g))
        c = float(torch.rand(1, generator=g, dtype=torch.float64)) * 4 + 1e-3
        z = _logits(b, v, 40_000 + trial, scale=2.0)
        support = topk_plus_mask(z[0], k, c, b)
        for i in range(1, b + 1):
            standalone = z[0] + (z[i] - z[0]).clamp(-c, c) / b
            top = torch.topk(standalone, k).indices
            assert bool(support[top].all())
        assert int(support.sum()) >= k


def test_topk_plus_is_public_only() -> None:
    z = _logits(4, 30, 1)
    z2 = z.clone()
    z2[1:] = torch.randn(4, 30, dtype=torch.float64, generator=_gen(2)) * 9
    mech = InvisibleInk(clip_norm=0.5, batch_size=4, top_k=5)
    assert torch.equal(mech.distribution(z)[1], mech.distribution(z2)[1])


def test_calibration_reproduces_the_papers_worked_example_and_dp_accounting() -> None:
    mech = InvisibleInk.calibrated(Budget(10.0, 1e-6), Spec(500, batch_size=7, temperature=1.1))
    assert mech.clip_norm == pytest.approx(0.604, abs=5e-4)
    assert mech.rho(500) == pytest.approx(1.539, abs=5e-4)
    g = mech.guarantee(500)
    reference = compute_epsilon(list(DEFAULT_ORDERS), [mech.rho(500) * a for a in DEFAULT_ORDERS], 1e-6)[0]
    assert g.epsilon == pytest.approx(reference, rel=1e-9)
    assert g.epsilon <= 10.0 + 1e-9 and g.epsilon == pytest.approx(10.0, abs=1e-3)
    assert "replace-by-null" in g.adjacency and g.ex_ante


@pytest.mark.parametrize("b,tau,t", [(1, 1.0, 10), (8, 1.2, 200), (32, 0.9, 1000)])
def test_rho_and_clip_norm_are_inverse(b: int, tau: float, t: int) -> None:
    c = clip_norm_for_rho(0.7, batch_size=b, temperature=tau, max_new_tokens=t)
    assert rho_for_clip_norm(c, batch_size=b, temperature=tau, max_new_tokens=t) == pytest.approx(0.7)
    assert c == pytest.approx(b * tau * math.sqrt(2 * 0.7 / t))


def test_guarantee_grows_with_t_max_and_needs_no_data() -> None:
    mech = InvisibleInk(clip_norm=0.6, batch_size=8)
    eps = [mech.guarantee(t).epsilon for t in (10, 100, 1000)]
    assert eps == sorted(eps) and eps[0] < eps[-1]
    assert mech.guarantee(100).loss == Zcdp(100 * 0.36 / (2 * 64))


def test_sampling_is_reproducible_and_on_the_support() -> None:
    mech = InvisibleInk(clip_norm=0.3, batch_size=3, top_k=4)
    mech.start(4, 50)
    z = _logits(3, 50, 7)
    info = StepInfo(step=0, max_new_tokens=10, num_contexts=4)
    toks = [int(mech.step(z, info, _gen(s)).tokens) for s in range(200)]
    support = topk_plus_mask(z[0], 4, 0.3, 3)
    assert all(bool(support[t]) for t in toks)
    assert toks == [int(mech.step(z, info, _gen(s)).tokens) for s in range(200)]


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"clip_norm": 0.0, "batch_size": 2}, "clip_norm"),
        ({"clip_norm": -1.0, "batch_size": 2}, "clip_norm"),
        ({"clip_norm": 1.0, "batch_size": 0}, "batch_size"),
        ({"clip_norm": 1.0, "batch_size": 2, "temperature": 0}, "temperature"),
        ({"clip_norm": 1.0, "batch_size": 2, "top_k": 0}, "top_k"),
        ({"clip_norm": 1.0, "batch_size": 2, "delta": 1.0}, "δ"),
    ],
)
def test_invisibleink_rejects_bad_parameters(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        InvisibleInk(**kwargs)


def test_invisibleink_rejects_bad_targets_and_layouts() -> None:
    with pytest.raises(ConfigurationError, match="ε"):
        InvisibleInk.calibrated(Budget(0.0, 1e-6), Spec(10, batch_size=4))
    mech = InvisibleInk(clip_norm=1.0, batch_size=4)
    with pytest.raises(ConfigurationError, match="B \\+ 1 = 5"):
        mech.start(3, 10)
    with pytest.raises(InvalidInputError):
        mech.distribution(torch.zeros(3, 10, dtype=torch.float64))
    bad = torch.zeros(5, 10, dtype=torch.float64)
    bad[2, 3] = math.nan
    with pytest.raises(InvalidInputError, match="NaN"):
        mech.distribution(bad)


# ------------------------------------------------------------------------------------------------ Amin et al.
def test_recenter_clip_and_sensitivity() -> None:
    for trial in range(500):
        g = _gen(50_000 + trial)
        b = int(torch.randint(1, 9, (1,), generator=g))
        c = float(torch.rand(1, generator=g, dtype=torch.float64)) * 3 + 0.01
        z = torch.randn(b, 30, dtype=torch.float64, generator=g) * 5
        rc = recenter_clip(z, c)
        assert float(rc.max()) <= c + 1e-12 and float(rc.min()) >= -c - 1e-12
        assert torch.allclose(rc.max(dim=-1).values, torch.full((b,), c, dtype=torch.float64))
        z2 = z.clone()
        z2[trial % b] = torch.randn(30, dtype=torch.float64, generator=g) * 5  # replace one reference
        moved = (recenter_clip(z, c).mean(0) - recenter_clip(z2, c).mean(0)).abs().max().item()
        assert moved <= sensitivity(c, b) + 1e-12
    assert sensitivity(1.0, 4, as_published=True) == 0.25 and sensitivity(1.0, 4) == 0.5


def test_amin_rho_formula_and_calibration() -> None:
    c, b, tau, sigma = 0.4, 8, 1.0, 0.3
    d = 2 * c / b / tau
    expected = 0.5 * d * d + 0.5 * (2 * min(2.0, math.expm1(2 * d)) / sigma) ** 2
    assert rho_per_private_token(c, batch_size=b, temperature=tau, svt_noise=sigma) == pytest.approx(expected)
    mech = AminSVT(clip_norm=c, batch_size=b, max_private_tokens=100)
    assert mech.rho(500) == pytest.approx(100 * expected)
    assert mech.rho(50) == pytest.approx(50 * expected)  # at most T_max private tokens
    published = AminSVT(clip_norm=c, batch_size=b, svt=False, as_published=True)
    assert published.rho(500) == pytest.approx(500 * 0.5 * (c / (b * tau)) ** 2)  # ALGORITHMS §2's ½(C/(Bτ))²
    assert published.guarantee(500).accounting == "as_published"
    cal = AminSVT.calibrated(Budget(10.0, 1e-6), Spec(200, batch_size=8))
    target = zcdp_rho_for_target(10.0, 1e-6)
    assert cal.rho(200) <= target * (1 + 1e-6) and cal.rho(200) == pytest.approx(target, rel=1e-4)
    assert cal.guarantee(200).epsilon <= 10.0 + 1e-9


def test_amin_stops_after_the_private_token_cap() -> None:
    mech = AminSVT(clip_norm=2.0, batch_size=2, max_private_tokens=3, svt_threshold=0.0, svt_noise=1e-6)
    mech.start(3, 20)
    g = _gen(0)
    private, stopped = 0, False
    for t in range(50):
        z = _logits(2, 20, 60_000 + t)
        res = mech.step(z, StepInfo(step=t, max_new_tokens=50, num_contexts=3), g)
        if res.stop:
            stopped = True
            break
        private += int(res.stats["private"])
    assert stopped and private == 3


def test_amin_public_tokens_when_private_and_public_agree() -> None:
    mech = AminSVT(clip_norm=50.0, batch_size=2, svt_threshold=1.5, svt_noise=1e-3, max_private_tokens=5)
    mech.start(3, 10)
    z = torch.zeros(3, 10, dtype=torch.float64)
    z[:, 4] = 30.0  # everyone agrees on token 4
    for t in range(20):
        res = mech.step(z, StepInfo(step=t, max_new_tokens=20, num_contexts=3), _gen(t))
        assert not res.stop and res.stats["private"] == 0.0 and int(res.tokens) == 4


def test_amin_rejects_bad_parameters() -> None:
    with pytest.raises(ConfigurationError, match="svt_threshold"):
        AminSVT(clip_norm=1.0, batch_size=2, svt_threshold=3.0)
    with pytest.raises(ConfigurationError, match="max_private_tokens"):
        AminSVT(clip_norm=1.0, batch_size=2, max_private_tokens=0)
    with pytest.raises(ConfigurationError, match="svt_noise"):
        AminSVT(clip_norm=1.0, batch_size=2, svt_noise=0.0)


# ------------------------------------------------------------------------------------------------ AdaPMixED
def test_adapmixed_has_no_ex_ante_guarantee_and_reports_a_data_dependent_spend() -> None:
    mech = AdaPMixED(batch_size=3, epsilon=5.0, top_k=None)
    mech.start(4, 12)
    for t in range(5):
        mech.step(_logits(3, 12, 70_000 + t), StepInfo(step=t, max_new_tokens=5, num_contexts=4), _gen(t))
    assert math.isinf(mech.guarantee(5).epsilon)
    spend = mech.spend()
    assert "data-dependent" in str(spend) and "ε" not in spend.quantity and spend.value > 0


def test_adapmixed_stops_when_the_realised_loss_reaches_the_budget() -> None:
    mech = AdaPMixED(batch_size=2, epsilon=1.0, bound=2.0, top_k=None, screening_noise=1.0, screening_threshold=0.0)
    mech.start(3, 10)
    steps = 0
    for t in range(500):
        res = mech.step(_logits(2, 10, 80_000 + t, scale=6.0), StepInfo(step=t, max_new_tokens=500, num_contexts=3),
                        _gen(t))
        if res.stop:
            break
        steps += 1
        assert res.stats["spent"] <= 1.0
    assert steps < 500
    assert mech.spend().value <= 1.0 + 1e-9 or steps == 0


def test_adapmixed_mixtures_respect_the_bound() -> None:
    """Every released private distribution is a mixture of q_i each within b of p_pub (the mixing constraint)."""
    from dpinfer.mechanisms.dp_fusion import mix, mollify_with_divergence, symmetric_renyi

    z = torch.log_softmax(_logits(4, 30, 3), dim=-1)
    lam, _ = mollify_with_divergence(z[0], z[1:], torch.full((4,), 0.05, dtype=torch.float64), 2.0, 1e-6)
    q = mix(z[0], z[1:], lam)
    assert bool((symmetric_renyi(q, z[0].expand_as(q), 2.0) <= 0.05 + 1e-9).all())


def test_registry_has_the_synthesis_mechanisms() -> None:
    assert get_mechanism("invisibleink", clip_norm=1.0, batch_size=2).name == "invisibleink"
    assert get_mechanism("amin", clip_norm=1.0, batch_size=2).name == "amin"
    assert get_mechanism("adapmixed", batch_size=2, epsilon=3.0).name == "adapmixed"
