"""Issue 10, holes 5 and 6 (sampler): secure randomness by default, whole seeds, no seed next to a release, and a
sampler that draws EXACTLY from the float64 weights it is given."""

from __future__ import annotations

import json
import os
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dpinfer.accounting import Guarantee
from dpinfer.cli import main
from dpinfer.configs.synth import PromptTemplate
from dpinfer.engine import Engine
from dpinfer.errors import InvalidInputError
from dpinfer.mechanisms import get_mechanism, sampler
from dpinfer.mechanisms.randomness import (
    RandomSource,
    SecureRandom,
    SeededRandom,
    TorchGeneratorSource,
    as_random_source,
    random_source,
)
from dpinfer.mechanisms.sampler import Sampler, sample_probs
from dpinfer.pipelines.sanitize import sanitize
from dpinfer.pipelines.synthesize import synthesize
from dpinfer.references import Reference
from dpinfer.taggers import Span

DOC = "Mr Smith, a lawyer practising in London, lodged application no. 36244/06 on 20 May 1998."
SPANS = [Span(3, 8, "PERSON"), Span(33, 39, "LOC"), Span(64, 72, "CODE"), Span(76, 87, "DATETIME")]
SEED = 987_654_321_987_654_321  # distinctive digits: they must appear in no released output
TEMPLATE = PromptTemplate(private='Review ({cat}): "{reference}". Write another.', public="Write a review ({cat}).")
REVIEWS = ["The pasta was fresh.", "Slow service, cold fries.", "Lovely pizza.", "Best tacos in town."]


def _prompt(tiny_lm) -> list[int]:
    return tiny_lm.encode("The applicant was born in")


# ----------------------------------------------------------------------------------------------- the random sources
def test_default_runs_draw_from_os_urandom(tiny_lm, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a seed the engine's noise comes from os.urandom and nothing else: replaying urandom's bytes replays
    the run, and two runs on the real urandom differ."""
    ids, mech = _prompt(tiny_lm), Sampler(temperature=1.5)
    real = Engine(tiny_lm).generate([ids] * 4, mech, max_new_tokens=12).sequences
    assert real != Engine(tiny_lm).generate([ids] * 4, mech, max_new_tokens=12).sequences

    calls: list[int] = []

    def fake(n: int) -> bytes:
        calls.append(n)
        return np.random.default_rng(len(calls)).bytes(n)  # a replayable stand-in for the OS generator

    monkeypatch.setattr(os, "urandom", fake)
    first = Engine(tiny_lm).generate([ids] * 4, mech, max_new_tokens=12).sequences
    assert calls, "the default run did not read os.urandom"
    calls.clear()
    assert Engine(tiny_lm).generate([ids] * 4, mech, max_new_tokens=12).sequences == first


def test_random_source_defaults_to_secure() -> None:
    assert isinstance(random_source(None), SecureRandom) and random_source(None).secure
    assert isinstance(random_source(3), SeededRandom) and not random_source(3).secure
    g = torch.Generator().manual_seed(0)
    assert isinstance(as_random_source(g), TorchGeneratorSource)
    src = SeededRandom(1)
    assert as_random_source(src) is src
    assert "1" not in repr(SeededRandom(1)) and str(SEED) not in repr(SeededRandom(SEED))


@pytest.mark.parametrize("high_bit", [32, 40, 63, 64, 100, 127])
def test_a_seed_is_not_truncated(high_bit: int) -> None:
    base = 12345
    a, b = SeededRandom(base).words(4), SeededRandom(base + 2**high_bit).words(4)
    assert a.tolist() != b.tolist()
    assert SeededRandom(base).words(4).tolist() == a.tolist()  # reproducible
    assert SeededRandom(-base).words(4).tolist() != a.tolist()


@pytest.mark.parametrize("offset", [2**32, 2**40, 2**64, 2**100])
def test_engine_seeds_differing_above_bit_32_give_different_runs(tiny_lm, offset: int) -> None:
    """A CPU torch.Generator keeps 32 bits of its seed (seeds 7 and 7 + 2³² gave the same run); every bit counts now."""
    ids, mech = _prompt(tiny_lm), Sampler(temperature=1.5)
    runs = [Engine(tiny_lm).generate([ids] * 4, mech, max_new_tokens=12, seed=s).sequences for s in (7, 7 + offset, 7)]
    assert runs[0] == runs[2]
    assert runs[0] != runs[1]


def test_seeded_stream_is_the_same_on_every_device_and_moments_are_right() -> None:
    src = SeededRandom(11)
    u = src.uniform(200_000)
    assert u.dtype == torch.float64 and float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert torch.equal(u * 2.0**53, torch.floor(u * 2.0**53))  # 53-bit grid
    assert abs(float(u.mean()) - 0.5) < 0.005
    z = src.normal(200_000)
    assert abs(float(z.mean())) < 0.01 and abs(float(z.var()) - 1.0) < 0.02
    assert stats.kstest(z.numpy(), "norm").pvalue > 1e-4
    lap = src.laplace(2.0, 200_000)
    assert abs(float(lap.mean())) < 0.03 and abs(float(lap.var()) - 8.0) < 0.2
    assert stats.kstest(lap.numpy(), "laplace", args=(0.0, 2.0)).pvalue > 1e-4
    assert stats.kstest(SecureRandom().normal(50_000).numpy(), "norm").pvalue > 1e-6


def test_every_mechanism_draws_from_the_secure_source(monkeypatch: pytest.MonkeyPatch) -> None:
    """Amin's Laplace SVT and AdaPMixED's Gaussian screening draw from the source they are given."""
    from dpinfer.mechanisms.base import StepInfo

    counted: list[int] = []

    class Counting(SecureRandom):
        def words(self, n: int) -> np.ndarray:
            counted.append(n)
            return super().words(n)

    z = torch.randn(4, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    state = torch.get_rng_state()
    for name, kw in [("amin", {"clip_norm": 0.5, "batch_size": 3}),
                     ("adapmixed", {"batch_size": 3, "epsilon": 50.0, "top_k": None})]:
        mech = get_mechanism(name, **kw)
        mech.start(4, 12)
        counted.clear()
        res = mech.step(z, StepInfo(step=0, max_new_tokens=10, num_contexts=4), Counting())
        assert 0 <= int(res.tokens) < 12 and len(counted) >= 2, name  # the noise draw and the token draw
    assert torch.equal(state, torch.get_rng_state())


# ------------------------------------------------------------------------------------------------- exact sampling
class Scripted(RandomSource):
    """A source that hands out the given words, then zeros."""

    def __init__(self, words: list[int]) -> None:
        self.queue = list(words)
        self.used = 0

    def words(self, n: int) -> np.ndarray:
        out = [self.queue.pop(0) if self.queue else 0 for _ in range(n)]
        self.used += n
        return np.array(out, dtype=np.uint64)


def _reference(weights: list[float], k: int, more: list[int]) -> int:
    """The index an exact sampler must return when the uniform is the binary fraction 0.k more₁ more₂ … 000…
    (k: 53 bits, then 64 bits per word): the first i with C_i > U·W, in Fractions."""
    bits = 53 + 64 * len(more)
    num = k
    for w in more:
        num = (num << 64) | w
    x = Fraction(num, 2**bits) * sum(Fraction(w) for w in weights)
    c = Fraction(0)
    for i, w in enumerate(weights):
        c += Fraction(w)
        if c > x:
            return i
    raise AssertionError("unreachable")


def _source_for(k: int, more: list[int]) -> Scripted:
    return Scripted([k << 11, *more])  # integers53 keeps a word's top 53 bits


def test_tiny_weight_next_to_a_large_sum_keeps_its_exact_share(monkeypatch: pytest.MonkeyPatch) -> None:
    """[1, 1e-300]: token 1 must come out exactly when U ≥ 1/(1 + 1e-300), i.e. when the uniform's first ~1000 bits are
    all ones; a float CDF with one 53-bit uniform never draws it."""
    slow: list[int] = []
    real = sampler._exact_index
    monkeypatch.setattr(sampler, "_exact_index", lambda *a: slow.append(1) or real(*a))
    w = torch.tensor([1.0, 1e-300], dtype=torch.float64)
    top = 2**53 - 1
    ones = [2**64 - 1] * 20
    src = _source_for(top, ones)
    assert int(sample_probs(w, src)) == 1 == _reference([1.0, 1e-300], top, ones)
    assert slow == [1] and src.used > 10  # the slow path ran and drew the extra bits lazily
    almost = [2**64 - 1] * 14 + [2**63]  # 53 + 15·64 = 1013 bits: still below 1/(1 + 1e-300)
    assert int(sample_probs(w, _source_for(top, almost))) == 0 == _reference([1.0, 1e-300], top, almost)
    # the common case takes the fast path and one uniform only
    slow.clear()
    src = _source_for(2**52, [])
    assert int(sample_probs(w, src)) == 0 and slow == [] and src.used == 1


WEIGHTS = st.lists(
    st.one_of(st.sampled_from([0.0, 1.0, 0.5, 1e-300, 5e-324, 1e-17, 3.0, 2.0**-1000, 1e300]),
              st.floats(min_value=0.0, max_value=1e10, allow_nan=False, allow_infinity=False)),
    min_size=1, max_size=8,
).filter(lambda w: any(x > 0 for x in w))


@settings(max_examples=300, deadline=None)
@given(weights=WEIGHTS, k=st.one_of(st.integers(0, 2**53 - 1), st.sampled_from([0, 1, 2**52, 2**53 - 2, 2**53 - 1])),
       more=st.lists(st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 2**64 - 1])), max_size=20))
def test_sampler_is_exact_for_any_uniform(weights: list[float], k: int, more: list[int]) -> None:
    """Whatever the uniform's bits, the sampler returns the bucket of U·W in exact arithmetic (fast or slow path),
    and never a zero weight."""
    j = int(sample_probs(torch.tensor(weights, dtype=torch.float64), _source_for(k, more)))
    assert j == _reference(weights, k, more)
    assert weights[j] > 0


ROW3 = WEIGHTS.map(lambda w: [*w, 1.0, 1.0][:3]).filter(lambda w: any(x > 0 for x in w))


@settings(max_examples=100, deadline=None)
@given(rows=st.lists(ROW3, min_size=1, max_size=5),
       ks=st.lists(st.integers(0, 2**53 - 1), min_size=5, max_size=5))
def test_rows_are_vectorised_one_uniform_each(rows: list[list[float]], ks: list[int]) -> None:
    """Row r is decided by the r-th 53-bit uniform of the stream (common random numbers), exactly; extra bits, when a
    row needs them, come after every row's first uniform."""
    got = sample_probs(torch.tensor(rows, dtype=torch.float64), _source_for_rows(ks[: len(rows)])).tolist()
    assert got == [_reference(w, k, []) for w, k in zip(rows, ks, strict=False)]


def _source_for_rows(ks: list[int]) -> Scripted:
    return Scripted([k << 11 for k in ks])


@pytest.mark.parametrize("make", [lambda: SecureRandom(), lambda: SeededRandom(2**80 + 3),
                                  lambda: torch.Generator().manual_seed(5)])
@pytest.mark.parametrize("weights", [[0.5, 0.25, 0.0, 0.125, 0.125], [1.0, 1.0, 1.0], [3.0, 0.0, 1.0, 0.0, 2.0, 1e-3]])
def test_chi_square(make, weights: list[float]) -> None:
    n = 60_000
    w = torch.tensor(weights, dtype=torch.float64)
    toks = sample_probs(w.expand(n, -1), make())
    counts = np.bincount(toks.numpy(), minlength=len(weights))
    zero = [i for i, x in enumerate(weights) if x == 0]
    assert counts[zero].sum() == 0  # a zero weight is never drawn
    pos = [i for i, x in enumerate(weights) if x > 0]
    expected = np.array([weights[i] for i in pos]) / sum(weights) * n
    assert stats.chisquare(counts[pos], expected).pvalue > 1e-6


def test_sampler_refuses_bad_weights() -> None:
    src = SeededRandom(0)
    for bad in ([0.0, 0.0], [1.0, float("nan")], [1.0, -0.5], [1.0, float("inf")]):
        with pytest.raises(InvalidInputError):
            sample_probs(torch.tensor(bad, dtype=torch.float64), src)


def test_huge_and_subnormal_totals_are_exact() -> None:
    for weights in ([1e308, 1e308, 1e308], [5e-324, 1e-320, 0.0], [2.0**-1070, 2.0**-1074]):
        w = torch.tensor(weights, dtype=torch.float64)
        for k in (0, 2**52, 2**53 - 1):
            assert int(sample_probs(w, _source_for(k, []))) == _reference(weights, k, [])


# ---------------------------------------------------------------------------------------------- no seed in releases
def _keys(obj: object) -> set[str]:
    if isinstance(obj, dict):
        return set(obj) | {k for v in obj.values() for k in _keys(v)}
    if isinstance(obj, list):
        return {k for v in obj for k in _keys(v)}
    return set()


def test_guarantee_seeded_flag_is_shown() -> None:
    g = Guarantee(epsilon=2.0, delta=1e-6, mechanism="demo", adjacency="replace-one")
    assert not g.seeded and "seed" not in str(g) and g.to_dict()["seeded"] is False
    s = Guarantee(epsilon=2.0, delta=1e-6, mechanism="demo", adjacency="replace-one", seeded=True)
    assert "only while the seed stays secret" in str(s) and "tests and benchmarks" in str(s)
    assert s.to_dict()["seeded"] is True and Guarantee.from_dict(s.to_dict()) == s
    assert "seed stays secret" in s.to_dict()["statement"]


def test_sanitize_never_releases_the_seed(tiny_lm) -> None:
    res = sanitize(DOC, lm=tiny_lm, spans=SPANS, max_new_tokens=6, seed=SEED, epsilon=30.0)
    released = json.dumps(res.to_dict(), ensure_ascii=False)
    assert "seed" not in _keys(res.to_dict()) and str(SEED) not in released
    assert res.guarantee.seeded and "seed stays secret" in str(res.guarantee)
    plain = sanitize(DOC, lm=tiny_lm, spans=SPANS, max_new_tokens=6, epsilon=30.0)
    assert not plain.guarantee.seeded and "seed" not in str(plain.guarantee)


def test_synthesize_never_releases_the_seed(tiny_lm, tmp_path: Path) -> None:
    refs = [Reference(t, {"cat": "food"}) for t in REVIEWS]
    res = synthesize(refs, lm=tiny_lm, epsilon=8.0, batch_size=2, max_new_tokens=4, prompt_template=TEMPLATE,
                     seed=SEED)
    assert res.guarantee.seeded and "seed stays secret" in str(res.guarantee)
    out = tmp_path / "o.jsonl"
    res.write_jsonl(out)
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert records[0]["dpinfer"]["guarantee"]["seeded"] is True
    assert all("seed" not in _keys(r) for r in records) and str(SEED) not in out.read_text(encoding="utf-8")
    assert "seed" not in _keys(res.to_dict()) and "seed" not in _keys(res.header())
    unseeded = synthesize(refs, lm=tiny_lm, epsilon=8.0, batch_size=2, max_new_tokens=4, prompt_template=TEMPLATE)
    assert not unseeded.guarantee.seeded


def test_cli_json_never_prints_the_seed(tiny_model_dir: Path, tmp_path: Path, capsys) -> None:
    doc = tmp_path / "doc.txt"
    doc.write_text(DOC)
    spans = tmp_path / "spans.json"
    spans.write_text(json.dumps([s.to_dict() for s in SPANS]))
    assert main(["sanitize", str(doc), "--spans", str(spans), "--model", str(tiny_model_dir), "--max-new-tokens", "4",
                 "--seed", str(SEED), "--json"]) == 0
    text = capsys.readouterr().out
    assert str(SEED) not in text and "seed" not in _keys(json.loads(text))
    assert json.loads(text)["guarantee"]["seeded"] is True
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t, "cat": "food"}) + "\n" for t in REVIEWS), encoding="utf-8")
    tpl = tmp_path / "tpl.json"
    tpl.write_text(json.dumps({"private": TEMPLATE.private, "public": TEMPLATE.public}), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert main(["synth", str(corpus), "--text-field", "text", "--label-fields", "cat", "--epsilon", "6",
                 "--batch-size", "2", "--max-new-tokens", "3", "--template-file", str(tpl), "--out", str(out),
                 "--model", str(tiny_model_dir), "--seed", str(SEED), "--json"]) == 0
    text = capsys.readouterr().out
    assert str(SEED) not in text and "seed" not in _keys(json.loads(text))
    assert str(SEED) not in out.read_text(encoding="utf-8")


@pytest.mark.parametrize("bad", [1.5, "7", True])
def test_a_bad_seed_is_refused_before_the_model_loads(bad: object) -> None:
    from dpinfer.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="seed must be an integer"):
        sanitize(DOC, lm="/no/such/model", spans=SPANS, seed=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="seed must be an integer"):
        synthesize(REVIEWS, lm="/no/such/model", epsilon=1.0, batch_size=2, seed=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="seed must be an integer"):
        random_source(bad)  # type: ignore[arg-type]
