"""Batched decisions (:meth:`Mechanism.step_batch`): DP-Fusion with a top-k support and the sampler.

* a job's release (token and statistics) is bit for bit the same whatever jobs sit beside it (other logits, other
  parameters, other batch sizes, other positions), and equal to the per-job ``step`` for the same seed;
* a support that reaches beyond the gathered columns (ties at the k-th logit) is redone on the whole vocabulary, on
  both paths alike; a job with NaN logits is refused alone;
* float32 logits (what the engine hands over) give the tokens of their float64 conversion (what ``step`` is given);
* through the engine, batched and per-job decisions release the same tokens and statistics for the same seeds.
"""

from __future__ import annotations

import math

import pytest
import torch

from dpinfer.engine import Engine, Job
from dpinfer.errors import InvalidInputError
from dpinfer.mechanisms import get_mechanism
from dpinfer.mechanisms.base import Mechanism, StepInfo, StepResult
from dpinfer.mechanisms.dp_decoding import DPDecoding
from dpinfer.mechanisms.dp_fusion import DPFusion
from dpinfer.mechanisms.dp_prompt import DPPrompt, clipped_weights
from dpinfer.mechanisms.invisibleink import InvisibleInk
from dpinfer.mechanisms.pad import Pad
from dpinfer.mechanisms.sampler import Sampler
from dpinfer.mechanisms.transforms import NoRepeatNGram

V = 300


def fusion(bounds=(0.05, 0.2), temperature=0.7, top_k=20, min_p=None, margin=0.0) -> DPFusion:
    mech = DPFusion(bounds=list(bounds), group_names=["A", "B"], temperature=temperature, top_k=top_k, min_p=min_p,
                    support_margin=margin)
    mech.start(3, V)
    return mech


def logits(seed: int, k: int = 3, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(k, V, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) * scale


def info(k: int = 3, joint: bool = True) -> StepInfo:
    return StepInfo(step=0, max_new_tokens=10, num_contexts=k,
                    finished=None if joint else torch.zeros(k, dtype=torch.bool))


def alone(mech: Mechanism, z: torch.Tensor, seed: int) -> StepResult:
    return mech.step(z, info(z.shape[0], mech.mode == "joint"), torch.Generator().manual_seed(seed))


def batch(mechs: list[Mechanism], zs: list[torch.Tensor], seeds: list[int]) -> list[StepResult | Exception]:
    infos = [info(z.shape[0], m.mode == "joint") for m, z in zip(mechs, zs, strict=True)]
    return type(mechs[0]).step_batch(mechs, zs, infos, [torch.Generator().manual_seed(s) for s in seeds])


def same(a: StepResult, b: StepResult) -> bool:
    return torch.equal(a.tokens, b.tokens) and a.stats == b.stats


@pytest.mark.parametrize("kwargs", [{}, {"min_p": 0.1}, {"top_k": 3, "margin": 0.5}, {"temperature": 1.0}])
def test_fusion_release_does_not_depend_on_its_neighbours(kwargs) -> None:
    mine = logits(0)
    ref = alone(fusion(**kwargs), mine, seed=5)
    assert len(ref.stats["lambda"]) == 2 and 0 <= int(ref.tokens) < V
    for n, pos in ((1, 0), (2, 1), (6, 3)):
        zs = [logits(100 + i, scale=1.0 + i) for i in range(n)]
        mechs = [fusion(**{**kwargs, "bounds": (0.01 * (i + 1), 1.0), "temperature": 0.5 + 0.2 * i})
                 for i in range(n)]
        zs.insert(pos, mine)
        mechs.insert(pos, fusion(**kwargs))
        seeds = [1000 + i for i in range(n)]
        seeds.insert(pos, 5)
        got = batch(mechs, zs, seeds)
        assert same(got[pos], ref), (n, pos)
        for i, (m, z, s) in enumerate(zip(mechs, zs, seeds, strict=True)):  # every job: its per-job step's token
            assert same(got[i], alone(m, z, s))


def test_fusion_batch_of_one_and_of_two_agree_on_a_tiny_vocabulary() -> None:
    """A case the property suite found: V = 2, where a batch of one and of two once took different SIMD paths."""
    mechs = [DPFusion(bounds=[1.0, 0.03125], group_names=["A", "B"], alpha=1.5, temperature=0.5, top_k=2,
                      adjacency="replace-one") for _ in range(2)]
    for mech in mechs:
        mech.start(3, 2)
    z = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    beside = torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    ref = mechs[0].step(z, info(), torch.Generator().manual_seed(0))
    for order in ((0, 1), (1, 0)):
        zs = [(z, beside)[i] for i in order]
        got = type(mechs[0]).step_batch(mechs, zs, [info(), info()], [torch.Generator().manual_seed(0)] * 2)
        assert same(got[order.index(0)], ref)


def test_fusion_float32_logits_release_what_their_float64_conversion_does() -> None:
    zs = [logits(i).to(torch.float32) for i in range(4)]
    mechs = [fusion() for _ in zs]
    got = batch(mechs, zs, [7, 8, 9, 10])
    for m, z, s, r in zip(mechs, zs, [7, 8, 9, 10], got, strict=True):
        assert same(r, alone(m, z.to(torch.float64), s))


def test_fusion_ties_beyond_the_gathered_columns_take_the_whole_vocabulary() -> None:
    z = logits(3)
    z[0, :40] = 50.0  # 40 public ties at the top: top-k = 20 keeps them all, more than 20 + SUPPORT_SLACK columns
    mech = fusion()
    cols = mech.private_columns(z[0])
    assert cols.tolist() == list(range(40))
    probs, _lam, _ = mech.distribution(z)
    assert bool((probs[:40] > 0).all()) and float(probs[40:].sum()) == 0.0
    assert abs(float(probs.sum()) - 1.0) < 1e-12
    ref = alone(mech, z, seed=3)
    assert int(ref.tokens) < 40
    got = batch([fusion(), fusion()], [logits(4), z], [1, 3])
    assert same(got[1], ref)


def test_fusion_bound_holds_on_the_released_distribution() -> None:
    from dpinfer.mechanisms.divergences import mix, symmetric_renyi

    mech = fusion(bounds=(0.02, 0.5), min_p=0.05)
    z = logits(11)
    _probs, lam, _div = mech.distribution(z)
    idx = mech.private_columns(z[0])
    lp = torch.log_softmax(z[:, idx] / 0.7, dim=-1)
    q = mix(lp[0], lp[1:], lam)
    d = symmetric_renyi(q, lp[0].expand_as(q), 2.0)
    assert bool((d <= torch.tensor([0.02, 0.5], dtype=torch.float64)).all())
    assert bool((lam < 1).all()) and bool((lam > 0).all())  # both groups were solved, not at an end point
    # bisection: λ + tol violates the bound
    worse = symmetric_renyi(mix(lp[0], lp[1:], lam + mech.tol), lp[0].expand_as(q), 2.0)
    assert bool((worse > torch.tensor([0.02, 0.5], dtype=torch.float64)).all())


def test_a_job_with_nan_logits_is_refused_alone() -> None:
    bad = logits(1)
    bad[2, int(bad[0].argmax())] = math.nan  # on the support (a NaN where the mechanism reads nothing is not read)
    good = logits(2)
    got = batch([fusion(), fusion()], [bad, good], [1, 2])
    assert isinstance(got[0], InvalidInputError) and "NaN" in str(got[0])
    assert same(got[1], alone(fusion(), good, 2))
    with pytest.raises(InvalidInputError, match="NaN"):
        alone(fusion(), bad, 1)


@pytest.mark.parametrize("mode", ["independent", "joint"])
@pytest.mark.parametrize("top_k", [None, 5, 40])
def test_sampler_release_does_not_depend_on_its_neighbours(mode: str, top_k: int | None) -> None:
    def sampler(t: float = 0.8) -> Sampler:
        return Sampler(temperature=t, top_k=top_k, mode=mode)

    mine = logits(0, k=3)
    if top_k == 5:
        mine[1, :12] = 9.0  # ties beyond top-k + slack in one row: that row on the whole vocabulary
    ref = alone(sampler(), mine, seed=4)
    zs = [logits(50 + i, k=1 + i) for i in range(3)]
    mechs = [sampler(0.5 + i) for i in range(3)]
    zs.insert(1, mine)
    mechs.insert(1, sampler())
    got = batch(mechs, zs, [1, 4, 2, 3])
    assert same(got[1], ref)
    for m, z, s, r in zip(mechs, zs, [1, 4, 2, 3], got, strict=True):
        assert same(r, alone(m, z, s))
    if top_k == 5:
        assert int(ref.tokens.reshape(-1)[1 if mode == "independent" else 0]) in (range(12) if mode == "independent"
                                                                                  else range(V))


def test_sampler_without_top_k_keeps_the_former_per_row_draws() -> None:
    """Without top-k the batched sampler is ``sample_rows(softmax(z/τ))`` as before (same draws for a seed)."""
    from dpinfer.mechanisms.sampler import sample_rows

    z = logits(9, k=4)
    got = alone(Sampler(temperature=0.6), z, seed=2)
    assert torch.equal(got.tokens, sample_rows(z / 0.6, torch.Generator().manual_seed(2)))


def test_greedy_and_top_p_stay_on_the_per_job_path() -> None:
    assert Sampler(temperature=0.0).batch_key() is None
    assert Sampler(temperature=1.0, top_p=0.9).batch_key() is None
    assert DPFusion(bounds=[0.1], group_names=["A"]).batch_key() is None  # no top-k: the full-vocabulary solver
    # without a top-k InvisibleInk and PAD decide in batches on the whole vocabulary (their support: every finite
    # public entry, min-p computed on the device)
    assert get_mechanism("invisibleink", clip_norm=1.0, batch_size=2, top_k=None).batch_key() is not None
    assert Pad(clip_norm=1.0, top_k=None, min_p=0.1).batch_key() is not None


# ------------------------------------------------------------------------------------------------------ InvisibleInk
def ink(clip: float = 0.8, b: int = 2, temperature: float = 1.0, top_k: int | None = 20) -> InvisibleInk:
    mech = InvisibleInk(clip_norm=clip, batch_size=b, temperature=temperature, top_k=top_k)
    mech.start(b + 1, V)
    return mech


@pytest.mark.parametrize("kwargs", [{}, {"top_k": 3, "clip": 4.0}, {"temperature": 1.2, "b": 4},
                                    {"top_k": None}, {"top_k": None, "b": 3, "temperature": 0.7}])
def test_invisibleink_release_does_not_depend_on_its_neighbours(kwargs) -> None:
    k = kwargs.get("b", 2) + 1
    mine = logits(0, k=k)
    ref = alone(ink(**kwargs), mine, seed=5)
    assert 0 <= int(ref.tokens) < V and ref.stats is not None
    assert ref.stats["support"] >= (kwargs.get("top_k", 20) or V)
    for n, pos in ((1, 0), (2, 1), (6, 3)):
        zs = [logits(100 + i, k=k, scale=1.0 + i) for i in range(n)]
        mechs = [ink(**{**kwargs, "clip": 0.1 * (i + 1), "temperature": 0.5 + 0.2 * i}) for i in range(n)]
        zs.insert(pos, mine)
        mechs.insert(pos, ink(**kwargs))
        seeds = [1000 + i for i in range(n)]
        seeds.insert(pos, 5)
        got = batch(mechs, zs, seeds)
        assert same(got[pos], ref), (n, pos)
        for m, z, s, r in zip(mechs, zs, seeds, got, strict=True):
            assert same(r, alone(m, z, s))


def test_invisibleink_batched_distribution_is_the_former_one() -> None:
    """The batched computation releases ``softmax(ℓ̄[V⁺]/τ)`` as the per-job formula does (DClip, mean, Top-k⁺)."""
    from dpinfer.mechanisms.invisibleink import dclip_aggregate, topk_plus

    mech = ink(clip=0.5, b=3, temperature=1.1, top_k=10)
    z = logits(21, k=4)
    z[2, 5] = -math.inf  # a private −inf clips to −C
    probs, support = mech.distribution(z)
    mask, _ = topk_plus(z[0], 10, 0.5, 3)
    assert torch.equal(support, mask)
    idx = mask.nonzero().squeeze(-1)
    want = torch.softmax(dclip_aggregate(z[:, idx], 0.5) / 1.1, dim=-1)
    assert torch.allclose(probs[idx], want, rtol=1e-12, atol=0.0) and float(probs[~mask].sum()) == 0.0
    assert torch.equal(mech.private_columns(z[0]), idx)
    whole = ink(clip=0.5, b=3, temperature=1.1, top_k=None)  # no top-k: every finite public entry
    z[0, 7] = -math.inf
    probs, support = whole.distribution(z)
    idx = torch.isfinite(z[0]).nonzero().squeeze(-1)
    want = torch.softmax(dclip_aggregate(z[:, idx], 0.5) / 1.1, dim=-1)
    assert torch.equal(support, torch.isfinite(z[0])) and float(probs[7]) == 0.0
    assert torch.allclose(probs[idx], want, rtol=1e-12, atol=0.0)


def test_invisibleink_wide_support_takes_the_whole_vocabulary_and_nan_is_refused_alone() -> None:
    z = logits(3)
    z[0, :40] = 50.0  # 40 public ties: V⁺ reaches beyond top_k + SUPPORT_SLACK columns
    ref = alone(ink(), z, seed=3)
    assert int(ref.tokens) < 40 and ref.stats["support"] == 40.0
    got = batch([ink(), ink()], [logits(4), z], [1, 3])
    assert same(got[1], ref)
    bad = logits(1)
    bad[2, int(bad[0].argmax())] = math.nan
    got = batch([ink(), ink()], [bad, logits(2)], [1, 2])
    assert isinstance(got[0], InvalidInputError) and "NaN" in str(got[0])
    assert same(got[1], alone(ink(), logits(2), 2))
    zs = [logits(i).to(torch.float32) for i in range(3)]  # float32: the tokens of the float64 conversion
    for x, s, r in zip(zs, [7, 8, 9], batch([ink() for _ in zs], zs, [7, 8, 9]), strict=True):
        assert same(r, alone(ink(), x.to(torch.float64), s))


# --------------------------------------------------------------------------------------------------------------- PAD
def pad(clip: float = 1.0, sigma: float = 1.5, top_k: int | None = 20, temperature: float = 0.0,
        min_p: float | None = None) -> Pad:
    mech = Pad(clip_norm=clip, sigma=sigma, top_k=top_k, temperature=temperature, min_p=min_p)
    mech.start(2, V)
    return mech


@pytest.mark.parametrize("kwargs", [{}, {"temperature": 0.7}, {"top_k": 3, "clip": 3.0, "min_p": 0.05},
                                    {"sigma": 0.2, "temperature": 1.3}, {"top_k": None},
                                    {"top_k": None, "min_p": 0.05, "temperature": 0.9}])
def test_pad_release_does_not_depend_on_its_neighbours(kwargs) -> None:
    mine = logits(0, k=2)
    ref = alone(pad(**kwargs), mine, seed=5)
    assert 0 <= int(ref.tokens) < V and ref.stats["clipped"] in (0.0, 1.0)
    for n, pos in ((1, 0), (2, 1), (6, 3)):
        zs = [logits(100 + i, k=2, scale=1.0 + i) for i in range(n)]
        mechs = [pad(**{**kwargs, "clip": 0.1 * (i + 1), "sigma": 0.5 + 0.3 * i,
                        **({"temperature": 0.5 + 0.2 * i} if kwargs.get("temperature") else {})}) for i in range(n)]
        zs.insert(pos, mine)
        mechs.insert(pos, pad(**kwargs))
        seeds = [1000 + i for i in range(n)]
        seeds.insert(pos, 5)
        got = batch(mechs, zs, seeds)
        assert same(got[pos], ref), (n, pos)
        for m, z, s, r in zip(mechs, zs, seeds, got, strict=True):
            assert same(r, alone(m, z, s))


def test_pad_batched_release_is_the_gaussian_mechanism_on_the_former_support() -> None:
    """The token is the argmax of ``pre_noise_logits + σ·(the job's first |W| normals)`` on V⁺, as defined per job."""
    from dpinfer.mechanisms.batch import support_width
    from dpinfer.mechanisms.randomness import as_random_source

    wide = 0
    for seed in range(20):
        mech = pad(clip=0.3 + 0.05 * seed, sigma=0.8, top_k=6)
        z = logits(30 + seed, k=2)
        idx, _pub, pre = mech.pre_noise_logits(z)
        assert torch.equal(mech.private_columns(z[0]), idx)
        src = as_random_source(torch.Generator().manual_seed(seed))
        noise = src.normal((support_width(6, V),))
        if idx.numel() >= support_width(6, V):  # beyond the gathered columns: redone on |V⁺| columns, fresh normals
            noise, wide = src.normal((idx.numel(),)), wide + 1
        # V⁺ (ascending ids) takes the first |V⁺| normals
        want = idx[torch.argmax(pre + 0.8 * noise[: idx.numel()])]
        got = alone(mech, z, seed)
        assert int(got.tokens) == int(want) and got.stats["support"] == float(idx.numel())
    assert 0 < wide < 20


def test_pad_wide_support_takes_the_whole_vocabulary_nan_is_refused_alone_and_float32() -> None:
    z = logits(3, k=2)
    z[0, :40] = 50.0  # 40 public ties: V⁺ reaches beyond top_k + SUPPORT_SLACK columns
    ref = alone(pad(), z, seed=3)
    assert int(ref.tokens) < 40 and ref.stats["support"] == 40.0
    assert same(batch([pad(), pad()], [logits(4, k=2), z], [1, 3])[1], ref)
    bad = logits(1, k=2)
    bad[0, 7] = math.nan  # the public row is checked whole; a private NaN is no shift (not a refusal)
    priv = logits(2, k=2)
    priv[1, int(priv[0].argmax())] = math.nan
    got = batch([pad(), pad()], [bad, priv], [1, 2])
    assert isinstance(got[0], InvalidInputError) and "NaN" in str(got[0])
    assert same(got[1], alone(pad(), priv, 2))
    zs = [logits(i, k=2).to(torch.float32) for i in range(3)]
    for x, s, r in zip(zs, [7, 8, 9], batch([pad(temperature=0.9) for _ in zs], zs, [7, 8, 9]), strict=True):
        assert same(r, alone(pad(temperature=0.9), x.to(torch.float64), s))


# ------------------------------------------------------------------------------------------ DP-Prompt / DP-Decoding
def prompt(mode: str = "independent", tau: float = 1.0, hi: float = 4.0) -> DPPrompt:
    return DPPrompt(0.0, hi, tau, mode=mode)


def decoding(mode: str = "joint", lam: float = 0.7, tau: float = 1.0) -> DPDecoding:
    return DPDecoding(lam, vocab_size=V, temperature=tau, mode=mode)


@pytest.mark.parametrize("make", [prompt, decoding])
@pytest.mark.parametrize("mode", ["independent", "joint"])
def test_full_vocabulary_mechanisms_release_does_not_depend_on_their_neighbours(make, mode: str) -> None:
    from dpinfer.mechanisms.sampler import sample_probs

    mine = logits(0, k=3)
    mine[1, 4] = math.nan  # DP-Prompt reads NaN as b_min, DP-Decoding's row is then uniform: no refusal
    ref = alone(make(mode=mode), mine, seed=4)
    # the former per-job draw: sample_probs on the same weights with the same seed
    mech = make(mode=mode)
    rows = mine[:1] if mode == "joint" else mine
    w = (mech._weights(mine) if isinstance(mech, DPDecoding)
         else clipped_weights(rows, mech.clip_min, mech.clip_max, mech.temperature))
    former = sample_probs(w, torch.Generator().manual_seed(4))
    assert torch.equal(ref.tokens, former[0] if mode == "joint" else former)
    for n, pos in ((1, 0), (3, 2)):
        zs = [logits(60 + i, k=1 + i) for i in range(n)]
        mechs = [make(mode=mode, tau=0.5 + 0.4 * i) for i in range(n)]
        zs.insert(pos, mine)
        mechs.insert(pos, make(mode=mode))
        seeds = [10 + i for i in range(n)]
        seeds.insert(pos, 4)
        got = batch(mechs, zs, seeds)
        assert same(got[pos], ref), (n, pos)
        for m, z, s, r in zip(mechs, zs, seeds, got, strict=True):
            assert same(r, alone(m, z, s))


def test_dp_decoding_wrong_width_is_refused_alone_and_float32_logits() -> None:
    from dpinfer.errors import ConfigurationError

    narrow = torch.zeros(1, V - 1, dtype=torch.float64)
    got = batch([decoding(), decoding()], [narrow, logits(2, k=1)], [1, 2])
    assert isinstance(got[0], ConfigurationError)
    assert same(got[1], alone(decoding(), logits(2, k=1), 2))
    zs = [logits(i, k=2).to(torch.float32) for i in range(3)]
    for make in (prompt, decoding):
        for x, s, r in zip(zs, [7, 8, 9], batch([make(mode="independent") for _ in zs], zs, [7, 8, 9]), strict=True):
            assert same(r, alone(make(mode="independent"), x.to(torch.float64), s))


def test_whole_vocabulary_batches_do_not_depend_on_their_neighbours_on_rows_longer_than_a_thread_chunk() -> None:
    """Without a top-k, InvisibleInk and PAD decide on whole vocabularies: rows longer than torch's intra-op grain
    size (32,768), whose sums a single row would split across threads, still release the same tokens and statistics
    alone as beside other jobs (exact element-wise operations, row-wise kernels, sums by cumsum)."""
    big = 70_001

    def z(seed: int, k: int) -> torch.Tensor:
        return torch.randn(k, big, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) * 2.0

    for make, k in ((lambda i: InvisibleInk(clip_norm=0.3 + 0.2 * i, batch_size=2, top_k=None), 3),
                    (lambda i: Pad(clip_norm=0.5 + i, sigma=0.7, top_k=None, temperature=0.8), 2),
                    (lambda i: Pad(clip_norm=2.0 + i, top_k=None, min_p=0.001), 2)):
        mechs = [make(i) for i in range(3)]
        zs = [z(i, k).to(torch.float32) for i in range(3)]
        got = batch(mechs, zs, [5, 6, 7])
        for m, x, s, r in zip(mechs, zs, [5, 6, 7], got, strict=True):
            assert same(r, alone(m, x.to(torch.float64), s))


def test_statistics_are_fetched_only_when_asked() -> None:
    """``StepInfo.debug_stats`` False: the same tokens, no statistics (left on the device); a batch may mix both."""
    for mechs, k in (([fusion(), fusion(bounds=(0.3, 0.1))], 3), ([ink(), ink(clip=2.0)], 3), ([pad(), pad()], 2)):
        zs = [logits(40 + i, k=k) for i in range(2)]
        infos = [info(k), StepInfo(step=0, max_new_tokens=10, num_contexts=k, debug_stats=False)]
        got = type(mechs[0]).step_batch(mechs, zs, infos, [torch.Generator().manual_seed(s) for s in (1, 2)])
        assert same(got[0], alone(mechs[0], zs[0], 1)) and got[0].stats
        ref = alone(mechs[1], zs[1], 2)
        assert torch.equal(got[1].tokens, ref.tokens) and ref.stats and got[1].stats is None


# ------------------------------------------------------------------------------------------------ through the engine
def _jobs(lm, debug_stats: bool = True) -> list[Job]:
    pub = lm.encode("The applicant, Mr ____, was born in ____.")
    a = lm.encode("The applicant, Mr Smith, was born in 1970.")
    b = lm.encode("The applicant, Mr Jones, was born in Ankara.")
    width = max(map(len, (pub, a, b)))

    def f(bounds):
        return get_mechanism("dp-fusion", bounds=bounds, group_names=["A", "B"], temperature=0.8, top_k=10,
                             min_p=0.05)

    jobs = [
        Job([pub, a, b], f([0.05, 0.3]), max_new_tokens=6, min_new_tokens=3, seed=1, pad_width=width,
                  processors=[NoRepeatNGram(2)]),
        Job([pub, b, a], f([0.5, 0.1]), max_new_tokens=5, seed=2, pad_width=width),
        Job([a, b], Sampler(temperature=0.9, top_k=8), max_new_tokens=6, seed=3, pad_width=width),
        Job([pub], Sampler(temperature=0.7, mode="joint"), max_new_tokens=4, seed=4, pad_width=width),
        Job([pub, a, b], f([0.2, 0.2]), max_new_tokens=4, seed=5, pad_width=width,
                  processors=[NoRepeatNGram(2), lambda g, z: z]),  # a processor that is not a ban: decides alone
        Job([pub, a, b], InvisibleInk(clip_norm=0.5, batch_size=2, top_k=10), max_new_tokens=5, seed=6,
                  pad_width=width),
        Job([pub, b, a], InvisibleInk(clip_norm=2.0, batch_size=2, top_k=10, temperature=0.8),
                  max_new_tokens=4, min_new_tokens=2, seed=7, pad_width=width, processors=[NoRepeatNGram(2)]),
        Job([pub, a], Pad(clip_norm=0.5, top_k=10), max_new_tokens=5, seed=8, pad_width=width),
        Job([pub, b], Pad(clip_norm=2.0, sigma=0.5, top_k=10), max_new_tokens=4, seed=9, pad_width=width),
        Job([pub, a], Pad(clip_norm=1.0, top_k=10, temperature=0.8, min_p=0.01), max_new_tokens=4, seed=10,
                  pad_width=width),
        Job([a, b], DPPrompt(0.0, 4.0, 1.5, num_rewrites=2), max_new_tokens=5, seed=11, pad_width=width),
        Job([b], DPPrompt(-1.0, 3.0, 1.0, mode="joint"), max_new_tokens=4, seed=12, pad_width=width),
        Job([a], DPDecoding(0.8, vocab_size=lm.vocab_size), max_new_tokens=4, seed=13, pad_width=width),
        Job([a, b], DPDecoding(0.5, vocab_size=lm.vocab_size, mode="independent", num_sequences=2),
                  max_new_tokens=4, seed=14, pad_width=width),
        Job([pub, a, b], InvisibleInk(clip_norm=0.7, batch_size=2, top_k=None), max_new_tokens=4, seed=15,
                  pad_width=width),
        Job([pub, b], Pad(clip_norm=1.0, top_k=None, min_p=0.02), max_new_tokens=4, seed=16, pad_width=width),
    ]
    for j, job in enumerate(jobs):
        job.debug_stats = debug_stats and j % 2 == 0  # a batch of jobs that ask and jobs that do not
    return jobs


def test_engine_batched_decisions_release_the_per_job_tokens(tiny_lm) -> None:
    engine = Engine(tiny_lm)
    out = {}
    for batched in (True, False):
        engine.batched_decisions = batched
        out[batched] = dict(engine.run_jobs(_jobs(tiny_lm)))
    for i in range(len(_jobs(tiny_lm))):
        assert out[True][i].sequences == out[False][i].sequences, i
        assert out[True][i].steps == out[False][i].steps, i
        assert out[True][i].finish_reasons == out[False][i].finish_reasons
    assert len(out[True][0].steps) == len(out[True][0].sequences[0]) and all(s["lambda"] for s in out[True][0].steps)
    assert out[True][1].steps == [] and out[True][5].steps == [] and out[True][14].steps  # asked: 0, 14; not: 1, 5
    quiet = dict(engine.run_jobs(_jobs(tiny_lm, debug_stats=False)))  # no statistics fetched: the same tokens
    assert all(quiet[i].sequences == out[False][i].sequences for i in quiet)


def test_a_subclass_that_overrides_step_decides_alone_through_the_engine(tiny_lm) -> None:
    """The batched call would bypass an overridden ``step`` (a spy, a forced token): such a job decides alone."""

    class Counting(Pad):
        calls = 0

        def step(self, logits, info, generator):
            Counting.calls += 1
            return super().step(logits, info, generator)

    pub, a = tiny_lm.encode("The patient, ____, has ____."), tiny_lm.encode("The patient, Ann, has asthma.")
    width = max(len(pub), len(a))
    jobs = [Job([pub, a], Counting(clip_norm=0.5, top_k=10), max_new_tokens=4, min_new_tokens=4, seed=1,
                      pad_width=width),
            Job([pub, a], Pad(clip_norm=0.5, top_k=10), max_new_tokens=4, min_new_tokens=4, seed=1,
                      pad_width=width)]
    out = dict(Engine(tiny_lm).run_jobs(jobs))
    assert Counting.calls == 4
    assert out[0].sequences == out[1].sequences  # the same computation either way, for the same seed


def test_the_split_head_chooses_every_jobs_columns_with_one_transfer(tiny_lm, monkeypatch) -> None:
    """The slot runner's split head: the column choices of all split jobs (DP-Fusion, InvisibleInk, PAD with a top-k)
    in ONE host transfer per forward (``head.split_logits_many``), the same tokens as without a split head."""
    from dpinfer.engine import head, runner

    jobs = [j for j in _jobs(tiny_lm) if getattr(j.mechanism, "top_k", None) is not None
            and j.mechanism.restricts_private_columns and len(j.contexts) > 1]
    assert len(jobs) >= 6
    fetches, forwards, alone_calls, chosen = [], [], [], []
    fetch, forward, split_logits = head.fetch, runner.SlotRunner.forward, head.split_logits
    on_columns = head._on_columns
    monkeypatch.setattr(head, "fetch", lambda *a: fetches.append(1) or fetch(*a))
    monkeypatch.setattr(head, "split_logits", lambda *a: alone_calls.append(1) or split_logits(*a))
    monkeypatch.setattr(head, "_on_columns", lambda *a: chosen.append(1) or on_columns(*a))
    monkeypatch.setattr(runner.SlotRunner, "forward", lambda self, going: forwards.append(1) or forward(self, going))
    split = dict(Engine(tiny_lm).run_jobs(jobs))
    assert forwards and 0 < len(fetches) <= len(forwards)
    # a job's columns are chosen alone (split_logits, then _on_columns) only where its support reaches beyond the
    # gathered columns (on this tiny model's flat rows, often): the other choices came from the one transfer
    assert len(chosen) > len(alone_calls) > 0
    monkeypatch.undo()
    whole = dict(Engine(tiny_lm, split_head=False).run_jobs(jobs))
    assert all(split[i].sequences == whole[i].sequences for i in range(len(jobs)))
