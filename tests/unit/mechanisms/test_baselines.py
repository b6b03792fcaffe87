"""The two shared baselines: DP-Decoding (Majmudar et al. 2022) and DP-Prompt (Utpala et al. 2023)."""

from __future__ import annotations

import math

import pytest
import torch

from dpinfer.accounting import PureDp
from dpinfer.accounting.calibration import Budget, Spec
from dpinfer.accounting.events import LAMBDA_MAX, lambda_for_epsilon
from dpinfer.errors import ConfigurationError, InfeasibleBudgetError
from dpinfer.mechanisms import get_mechanism
from dpinfer.mechanisms.base import StepInfo
from dpinfer.mechanisms.dp_decoding import DPDecoding, epsilon_per_token, mixture_log_probs
from dpinfer.mechanisms.dp_prompt import DPPrompt, clipped_log_probs, clipped_weights
from dpinfer.mechanisms.dp_prompt import epsilon_per_token as prompt_epsilon_per_token

INFO = StepInfo(step=0, max_new_tokens=1, num_contexts=1)
SMOLLM_V = 49152


def random_logit_pairs(vocab: int, n: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Pairs of (1, V) float64 logits: Gaussian at several scales, near one-hot extremes, and rows with -inf."""
    g = torch.Generator().manual_seed(seed)
    pairs = []
    for i in range(n):
        scale = [0.1, 1.0, 10.0, 100.0, 1000.0][i % 5]
        z = torch.randn(1, vocab, generator=g, dtype=torch.float64) * scale
        z2 = torch.randn(1, vocab, generator=g, dtype=torch.float64) * scale
        if i % 7 == 0:
            z[0, torch.randint(vocab, (1,), generator=g)] = -torch.inf
        pairs.append((z, z2))
    extreme = torch.full((1, vocab), -1e4, dtype=torch.float64)
    a, b = extreme.clone(), extreme.clone()
    a[0, 0], b[0, 1] = 1e4, 1e4
    pairs.append((a, b))
    return pairs


# ------------------------------------------------------------------------------------------------ DP-Decoding
@pytest.mark.parametrize(("lam", "vocab"), [(0.0, 10), (0.1, 2), (0.5, 4), (0.9, 100), (1e-6, SMOLLM_V)])
def test_dp_decoding_epsilon_per_token_is_the_closed_form(lam: float, vocab: int) -> None:
    by_hand = math.log((1 + (vocab - 1) * lam) / (1 - lam))
    assert epsilon_per_token(lam, vocab) == pytest.approx(by_hand, rel=1e-12, abs=1e-15)
    assert DPDecoding(lam, vocab_size=vocab).epsilon_per_token == pytest.approx(by_hand, rel=1e-12, abs=1e-15)
    assert lambda_for_epsilon(by_hand, vocab) == pytest.approx(lam, rel=1e-9, abs=1e-15)


def test_dp_decoding_per_token_epsilon_by_hand() -> None:
    # V = 4, λ = 0.5: q ∈ [0.5/4, 0.5 + 0.5/4] = [0.125, 0.625], ratio 5
    assert epsilon_per_token(0.5, 4) == pytest.approx(math.log(5.0))
    # the temperature does not enter the bound
    assert DPDecoding(0.5, vocab_size=4, temperature=0.1).epsilon_per_token == pytest.approx(math.log(5.0))
    # two tokens at ε_tok = log 5 ≥ 1: basic composition, 2·log 5, is the reported ε
    g = DPDecoding(0.5, vocab_size=4).guarantee(2)
    assert g.epsilon == pytest.approx(2 * math.log(5.0))
    assert g.parameters["composition"].startswith("basic")
    assert g.loss == PureDp(math.log1p(3 * 0.5) - math.log1p(-0.5)).times(2)


@pytest.mark.parametrize("vocab", [3, 50])
@pytest.mark.parametrize("lam", [0.01, 0.3, 0.9])
@pytest.mark.parametrize("temperature", [0.5, 1.0, 3.0])
def test_dp_decoding_log_ratio_is_bounded_by_epsilon_per_token(vocab: int, lam: float, temperature: float) -> None:
    eps = epsilon_per_token(lam, vocab)
    worst = 0.0
    for z, z2 in random_logit_pairs(vocab, 60, seed=vocab):
        q, q2 = mixture_log_probs(z, lam, temperature), mixture_log_probs(z2, lam, temperature)
        assert torch.allclose(q.exp().sum(-1), torch.ones(1, dtype=torch.float64))
        worst = max(worst, float((q - q2).abs().max()))
    assert worst <= eps + 1e-12
    assert worst >= eps - 1e-9  # the one-hot pair attains the bound: ε_tok is tight


def test_dp_decoding_full_vocabulary_and_undefined_rows() -> None:
    lam, vocab = 0.3, 6
    floor = math.log((1 - lam) / vocab)
    z = torch.tensor([[0.0, -torch.inf, 3.0, -torch.inf, 1.0, 2.0]], dtype=torch.float64)
    assert bool((mixture_log_probs(z, lam) >= floor - 1e-12).all())
    for bad in (
        torch.full((1, vocab), -torch.inf),
        torch.full((1, vocab), torch.nan),
        torch.tensor([[torch.inf, 0.0, 0.0, 0.0, 0.0, 0.0]]),
    ):
        q = mixture_log_probs(bad.to(torch.float64), lam)
        assert torch.allclose(q, torch.full_like(q, -math.log(vocab)))  # any p keeps the bound; uniform is used


def test_dp_decoding_samples_from_q() -> None:
    lam, vocab, n = 0.6, 4, 40000
    mech = DPDecoding(lam, vocab_size=vocab, mode="independent", num_sequences=n)
    z = torch.tensor([[2.0, 0.0, -1.0, -torch.inf]], dtype=torch.float64).expand(n, vocab)
    tokens = mech.step(z, StepInfo(0, 1, n), torch.Generator().manual_seed(1)).tokens
    freq = torch.bincount(tokens, minlength=vocab).double() / n
    assert torch.allclose(freq, mixture_log_probs(z[:1], lam)[0].exp(), atol=0.01)


@pytest.mark.parametrize("max_new_tokens", [1, 16, 256])
@pytest.mark.parametrize("epsilon", [0.5, 10.0, 50.0, 100.0, 500.0])
def test_dp_decoding_calibration_round_trip(epsilon: float, max_new_tokens: int) -> None:
    mech = DPDecoding.calibrated(Budget(epsilon, 1e-5), Spec(max_new_tokens, vocab_size=SMOLLM_V))
    reached = mech.guarantee(max_new_tokens).epsilon
    assert reached <= epsilon
    if mech.lam < LAMBDA_MAX:
        assert reached >= epsilon * (1 - 1e-6)
        # λ is the largest that meets the target
        bigger = DPDecoding(min(mech.lam * (1 + 1e-5), LAMBDA_MAX), vocab_size=SMOLLM_V)
        assert bigger.guarantee(max_new_tokens).epsilon > epsilon
    else:  # the target needs λ closer to 1 than a float holds: λ → 1 and ε_tok ≈ 36.7 + log V per token
        assert max_new_tokens * mech.epsilon_per_token < epsilon


def test_dp_decoding_calibration_uses_the_accountants_composition() -> None:
    # small ε_tok: the RDP route beats basic composition; large ε_tok: basic composition
    small = DPDecoding.calibrated(Budget(10.0, 1e-5), Spec(256, vocab_size=SMOLLM_V))
    assert 256 * small.epsilon_per_token > 10.0
    assert small.guarantee(256).parameters["composition"].startswith("rdp")
    large = DPDecoding.calibrated(Budget(500.0, 1e-5), Spec(256, vocab_size=SMOLLM_V))
    assert large.epsilon_per_token == pytest.approx(500.0 / 256, rel=1e-6)
    assert large.guarantee(256).parameters["composition"].startswith("basic")


def test_dp_decoding_calibration_passes_options_and_scales_with_sequences() -> None:
    mech = DPDecoding.calibrated(Budget(20.0, 1e-6),
                                 Spec(8, vocab_size=100, temperature=0.7, mode="joint", num_sequences=4))
    assert (mech.temperature, mech.delta, mech.num_sequences) == (0.7, 1e-6, 4)
    assert mech.guarantee(8).epsilon == pytest.approx(
        DPDecoding(mech.lam, vocab_size=100, delta=1e-6).guarantee(32).epsilon
    )
    assert mech.guarantee(8).epsilon <= 20.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"lam": 1.0, "vocab_size": 10}, r"\[0, 1\).*calibrated"),
        ({"lam": -0.1, "vocab_size": 10}, r"\[0, 1\)"),
        ({"lam": 0.1, "vocab_size": 1}, "vocab_size"),
        ({"lam": 0.1, "vocab_size": 10.5}, "vocab_size"),
        ({"lam": 0.1, "vocab_size": 10, "temperature": 0.0}, "temperature"),
        ({"lam": 0.1, "vocab_size": 10, "mode": "both"}, "mode"),
        ({"lam": 0.1, "vocab_size": 10, "delta": 0.0}, "δ"),
        ({"lam": 0.1, "vocab_size": 10, "num_sequences": 0}, "num_sequences"),
    ],
)
def test_dp_decoding_rejects_invalid_parameters(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        DPDecoding(**kwargs)


@pytest.mark.parametrize(
    ("epsilon", "kwargs", "match"),
    [
        (0.0, {}, "target ε"),
        (math.inf, {}, "target ε"),
        (10.0, {"delta": 1.0}, "δ"),
        (10.0, {"max_new_tokens": 0}, "max_new_tokens"),
        (10.0, {"vocab_size": 0}, "vocab_size"),
    ],
)
def test_dp_decoding_calibration_rejects_invalid_targets(epsilon: float, kwargs: dict, match: str) -> None:
    args = {"delta": 1e-5, "max_new_tokens": 16, "vocab_size": 100, **kwargs}
    with pytest.raises(ConfigurationError, match=match):
        t = args.pop("max_new_tokens")
        DPDecoding.calibrated(Budget(epsilon, args.pop("delta")), Spec(t, **args))


@pytest.mark.parametrize("cls", ["dp-decoding", "dp-prompt"])
def test_targets_in_the_gap_above_zero_are_infeasible(cls: str) -> None:
    # The accountant converts a loss whose every ε(α) is below about δ² to ε = 0 and calls a target met only there
    # infeasible, naming the smallest positive ε reachable (dpinfer.accounting.calibrate).
    with pytest.raises(InfeasibleBudgetError, match=r"smallest positive ε reachable is .*ask for ε ≥"):
        if cls == "dp-decoding":
            DPDecoding.calibrated(Budget(1e-6, 1e-5), Spec(1000, vocab_size=SMOLLM_V))
        else:
            DPPrompt.calibrated(Budget(1e-6, 1e-5), Spec(1000, clip_min=0.0, clip_max=3.0))
    # small but reachable targets are met (λ → 0 is uniform noise, τ → ∞ too)
    small = DPDecoding.calibrated(Budget(1e-3, 1e-5), Spec(1000, vocab_size=SMOLLM_V))
    assert 0.0 < small.lam < 1e-9 and 1e-3 * (1 - 1e-6) <= small.guarantee(1000).epsilon <= 1e-3


def test_dp_decoding_start_checks_the_layout() -> None:
    mech = DPDecoding(0.1, vocab_size=10)
    with pytest.raises(ConfigurationError, match=r"vocab_size=lm\.vocab_size"):
        mech.start(1, 11)
    with pytest.raises(ConfigurationError, match="row 2 out of range"):
        DPDecoding(0.1, vocab_size=10, row=2).start(2, 10)
    with pytest.raises(ConfigurationError, match="num_sequences ≥ 3"):
        DPDecoding(0.1, vocab_size=10, mode="independent").start(3, 10)
    with pytest.raises(ConfigurationError, match="width"):
        mech.step(torch.zeros(1, 11, dtype=torch.float64), INFO, torch.Generator())
    mech.start(1, 10)


def test_dp_decoding_joint_mode_reads_only_its_row() -> None:
    z = torch.tensor([[0.0, 0.0, 0.0], [1e4, 0.0, 0.0]], dtype=torch.float64)
    mech = DPDecoding(0.999, vocab_size=3, row=1)
    tokens = [int(mech.step(z, StepInfo(0, 1, 2), torch.Generator().manual_seed(s)).tokens) for s in range(50)]
    assert tokens.count(0) >= 45  # q(0) = 0.999 + 0.001/3 from row 1


# ------------------------------------------------------------------------------------------------ DP-Prompt
@pytest.mark.parametrize(("lo", "hi", "tau"), [(0.0, 1.0, 1.0), (-3.0, 5.0, 0.25), (4.15, 28.93, 2.0)])
def test_dp_prompt_epsilon_per_token_is_the_closed_form(lo: float, hi: float, tau: float) -> None:
    assert prompt_epsilon_per_token(lo, hi, tau) == pytest.approx(2 * (hi - lo) / tau, rel=1e-15)
    assert DPPrompt(lo, hi, tau).epsilon_per_token == pytest.approx(2 * (hi - lo) / tau, rel=1e-15)


def test_dp_prompt_guarantee_is_bounded_range_pure_dp() -> None:
    mech = DPPrompt(0.0, 2.0, 40.0, num_rewrites=10)  # ε_tok = 0.1
    g = mech.guarantee(100)
    assert g.loss == PureDp(0.1, bounded_range=True).times(1000)
    assert g.epsilon == pytest.approx(PureDp(0.1, bounded_range=True).times(1000).to_epsilon(1e-5))
    assert g.epsilon < 1000 * 0.1 and g.parameters["composition"].startswith("rdp")
    assert g.parameters["num_rewrites"] == 10
    # n rewrites of L tokens = one rewrite of n·L tokens
    assert g.epsilon == pytest.approx(DPPrompt(0.0, 2.0, 40.0).guarantee(1000).epsilon)


@pytest.mark.parametrize("vocab", [3, 50])
@pytest.mark.parametrize(("lo", "hi", "tau"), [(0.0, 1.0, 1.0), (-2.0, 5.0, 0.5), (4.0, 29.0, 3.0)])
def test_dp_prompt_exponential_mechanism_ratio_is_bounded(vocab: int, lo: float, hi: float, tau: float) -> None:
    eps = prompt_epsilon_per_token(lo, hi, tau)
    for z, z2 in random_logit_pairs(vocab, 60, seed=vocab + 1):
        z, z2 = z + (lo + hi) / 2, z2 + (lo + hi) / 2
        loss = clipped_log_probs(z, lo, hi, tau) - clipped_log_probs(z2, lo, hi, tau)
        assert float(loss.abs().max()) <= eps + 1e-12
        assert float(loss.max() - loss.min()) <= eps + 1e-12  # bounded range: the loss spans at most ε_tok
    # the extreme pair, u = b_max at v only and u′ = b_max everywhere but v, attains
    # d + log((1 + (V − 1)e^d)/(e^d + V − 1)) with d = Δ/τ, which tends to 2Δ/τ = ε_tok as V grows
    big, d = 10**5, (hi - lo) / tau
    u = torch.full((1, big), lo, dtype=torch.float64)
    u2 = torch.full((1, big), hi, dtype=torch.float64)
    u[0, 0], u2[0, 0] = hi, lo
    worst = float((clipped_log_probs(u, lo, hi, tau) - clipped_log_probs(u2, lo, hi, tau))[0, 0])
    assert worst == pytest.approx(d + math.log((1 + (big - 1) * math.exp(d)) / (math.exp(d) + big - 1)), rel=1e-9)
    assert worst <= eps


def test_dp_prompt_full_vocabulary() -> None:
    z = torch.tensor([[100.0, -torch.inf, torch.nan, 0.5]], dtype=torch.float64)
    logp = clipped_log_probs(z, 0.0, 1.0, 0.5)
    assert bool(logp.isfinite().all())  # -inf and NaN logits still get the b_min share
    assert torch.allclose(logp.exp(), torch.tensor([[math.e**2, 1.0, 1.0, math.e]]).double() / (math.e**2 + 2 + math.e))
    for knob, value in (("top_k", 50), ("top_k", 1), ("top_p", 0.9)):
        with pytest.raises(ConfigurationError, match=f"full vocabulary: {knob}={value}.*voids the guarantee"):
            DPPrompt(0.0, 1.0, **{knob: value})
    DPPrompt(0.0, 1.0, top_p=1.0, top_k=None)  # no truncation: accepted


def test_dp_prompt_samples_from_the_clipped_softmax() -> None:
    n = 40000
    mech = DPPrompt(-1.0, 1.0, 0.8, num_rewrites=n)
    z = torch.tensor([[5.0, 0.3, -0.2, -9.0]], dtype=torch.float64).expand(n, 4)
    tokens = mech.step(z, StepInfo(0, 1, n), torch.Generator().manual_seed(2)).tokens
    assert tokens.shape == (n,)
    freq = torch.bincount(tokens, minlength=4).double() / n
    assert torch.allclose(freq, clipped_log_probs(z[:1], -1.0, 1.0, 0.8)[0].exp(), atol=0.01)


@pytest.mark.parametrize(("lo", "hi", "tau"), [(-1.0, 1.0, 0.8), (0.0, 22.0, 0.025), (3.0, 4.0, 50.0)])
def test_dp_prompt_weights_match_the_clipped_softmax(lo: float, hi: float, tau: float) -> None:
    # the step's unnormalised weights give exactly the distribution of clipped_log_probs, also at a τ so small that
    # (b_max − b_min)/τ > 745 (the far tokens underflow, the top token keeps weight 1; a regression: weights taken
    # relative to b_max instead of the row's top utility were all 0 when no logit reached b_max)
    z = torch.tensor([[5.0, 0.3, -0.2, -9.0, torch.nan, -torch.inf], [0.5, 0.4, 0.2, 0.1, 0.0, -1.0]],
                     dtype=torch.float64) + lo
    w = clipped_weights(z, lo, hi, tau)
    assert torch.allclose(w / w.sum(dim=-1, keepdim=True), clipped_log_probs(z, lo, hi, tau).exp(), rtol=1e-12,
                          atol=1e-300)
    assert bool((w.amax(dim=-1) == 1.0).all())
    assert torch.equal(z.isnan(), torch.tensor([[False] * 4 + [True, False], [False] * 6]))  # input not modified
    tokens = DPPrompt(lo, hi, tau, num_rewrites=2).step(z, StepInfo(0, 1, 2), torch.Generator().manual_seed(0))
    assert tokens.tokens.shape == (2,)


@pytest.mark.parametrize("num_rewrites", [1, 10])
@pytest.mark.parametrize("max_new_tokens", [1, 64, 256])
@pytest.mark.parametrize("epsilon", [0.5, 10.0, 100.0, 500.0])
def test_dp_prompt_calibration_round_trip(epsilon: float, max_new_tokens: int, num_rewrites: int) -> None:
    mech = DPPrompt.calibrated(Budget(epsilon, 1e-5),
                               Spec(max_new_tokens, clip_min=4.15, clip_max=28.93, num_rewrites=num_rewrites))
    reached = mech.guarantee(max_new_tokens).epsilon
    assert epsilon * (1 - 1e-6) <= reached <= epsilon
    colder = DPPrompt(4.15, 28.93, mech.temperature * (1 - 1e-5), num_rewrites=num_rewrites)
    assert colder.guarantee(max_new_tokens).epsilon > epsilon  # τ is the smallest that meets the target


def test_dp_prompt_calibration_passes_options() -> None:
    mech = DPPrompt.calibrated(Budget(50.0, 1e-6), Spec(16, clip_min=0.0, clip_max=3.0, mode="joint", row=1))
    assert (mech.mode, mech.row, mech.delta) == ("joint", 1, 1e-6)
    assert DPPrompt.calibrated(Budget(1e-3, 1e-5), Spec(16, clip_min=0.0, clip_max=3.0)).temperature > 1e4


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((1.0, 1.0), {}, "b_min < b_max.*clip_bounds"),
        ((2.0, 1.0), {}, "b_min < b_max"),
        ((math.nan, 1.0), {}, "clip_min"),
        ((0.0, math.inf), {}, "clip_max"),
        ((0.0, 1.0, 0.0), {}, "temperature.*calibrated"),
        ((0.0, 1.0, -1.0), {}, "temperature"),
        ((0.0, 1.0), {"mode": "both"}, "mode"),
        ((0.0, 1.0), {"num_rewrites": 0}, "num_rewrites"),
        ((0.0, 1.0), {"delta": 1.5}, "δ"),
        ((0.0, 1.0), {"row": -1}, "row"),
    ],
)
def test_dp_prompt_rejects_invalid_parameters(args: tuple, kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        DPPrompt(*args, **kwargs)


@pytest.mark.parametrize(
    ("epsilon", "kwargs", "match"),
    [
        (-1.0, {}, "target ε"),
        (10.0, {"clip_min": 3.0}, "b_min < b_max"),
        (10.0, {"max_new_tokens": 0}, "max_new_tokens"),
        (10.0, {"num_rewrites": 0}, "num_rewrites"),
        (10.0, {"delta": 0.0}, "δ"),
        (10.0, {"top_k": 50}, "full vocabulary"),
    ],
)
def test_dp_prompt_calibration_rejects_invalid_targets(epsilon: float, kwargs: dict, match: str) -> None:
    args = {"delta": 1e-5, "max_new_tokens": 16, "clip_min": 0.0, "clip_max": 3.0, **kwargs}
    with pytest.raises(ConfigurationError, match=match):
        t = args.pop("max_new_tokens")
        DPPrompt.calibrated(Budget(epsilon, args.pop("delta")), Spec(t, **args))


def test_dp_prompt_start_checks_the_layout() -> None:
    with pytest.raises(ConfigurationError, match="num_rewrites ≥ 4"):
        DPPrompt(0.0, 1.0).start(4, 10)
    with pytest.raises(ConfigurationError, match="row 1 out of range"):
        DPPrompt(0.0, 1.0, mode="joint", row=1).start(1, 10)
    DPPrompt(0.0, 1.0, num_rewrites=4).start(4, 10)


def test_registry_builds_both() -> None:
    assert isinstance(get_mechanism("dp-decoding", lam=0.1, vocab_size=10), DPDecoding)
    assert isinstance(get_mechanism("dp-prompt", clip_min=0.0, clip_max=1.0), DPPrompt)


# ------------------------------------------------------------------------------------------------ on a model
@pytest.mark.parametrize("which", ["dp-decoding", "dp-prompt"])
def test_baselines_run_on_the_engine(tiny_lm, which: str) -> None:
    from dpinfer.engine import Engine

    ids = tiny_lm.encode(tiny_lm.instruction_prompt("The applicant was born in 1970."))
    if which == "dp-decoding":
        joint = DPDecoding.calibrated(Budget(50.0, 1e-5), Spec(6, vocab_size=tiny_lm.vocab_size))
        independent = DPDecoding(joint.lam, vocab_size=tiny_lm.vocab_size, mode="independent", num_sequences=3)
    else:
        joint = DPPrompt.calibrated(Budget(50.0, 1e-5), Spec(6, clip_min=0.0, clip_max=5.0, mode="joint"))
        independent = DPPrompt(0.0, 5.0, joint.temperature, num_rewrites=3)
    out = Engine(tiny_lm).generate([ids], joint, max_new_tokens=6, seed=0, stop_on_eos=False)
    assert len(out.sequences[0]) == 6
    out = Engine(tiny_lm).generate([ids] * 3, independent, max_new_tokens=6, seed=0, stop_on_eos=False)
    assert [len(s) for s in out.sequences] == [6, 6, 6]
    if which == "dp-decoding":
        with pytest.raises(ConfigurationError, match="vocab_size"):
            Engine(tiny_lm).generate([ids], DPDecoding(0.1, vocab_size=tiny_lm.vocab_size + 1), max_new_tokens=2)
