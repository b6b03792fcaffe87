"""Gaussian draws have no cap on their tails: inversion of a uniform on (0, ½) drawn with float64's full exponent
range (a 64-bit Box–Muller radius stopped at |z| ≈ 9.49)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special, stats

from dpinfer.mechanisms.randomness import RandomSource, SecureRandom, SeededRandom, _leading_zeros


class Scripted(RandomSource):
    """Hands out the given words in order, then zero words."""

    def __init__(self, words: list[int]) -> None:
        self.queue = list(words)

    def words(self, n: int) -> np.ndarray:
        out = [self.queue.pop(0) if self.queue else 0 for _ in range(n)]
        return np.array(out, dtype=np.uint64)


def test_leading_zeros_are_exact() -> None:
    words = np.array([0, 1, 2**63, 2**62 + 5, 2**64 - 1, 3 << 40, 2**53 + 1], dtype=np.uint64)
    assert _leading_zeros(words).tolist() == [64, 63, 0, 1, 0, 22, 10]


def test_the_smallest_uniforms_reach_far_beyond_the_old_cap() -> None:
    # all-zero words: the uniform is 2^-1022, the smallest normal float64; the old Box–Muller gave 9.49 here
    z = float(Scripted([]).normal(1)[0])
    assert z == pytest.approx(-special.ndtri(2.0**-1022), rel=1e-12) and z > 37.0
    # word 1: sign +, mantissa 0; then one zero word and a word with 36 leading zeros: G = 100, u = 2^-102
    z = float(Scripted([0, 0, 1 << 27]).normal(1)[0])
    assert z == pytest.approx(-special.ndtri(2.0**-102), rel=1e-12) and z > 11.5
    # the low bit of the first word is the sign
    assert float(Scripted([1, 0, 1 << 27]).normal(1)[0]) == pytest.approx(-z, rel=1e-12)


def test_every_normal_is_finite_and_nonzero_uniforms_only() -> None:
    src = Scripted([2**64 - 1, 2**64 - 2, 2**63, 2**63])  # largest mantissas, G = 0: u just below ½
    z = src.normal(2).numpy()
    assert np.isfinite(z).all() and abs(z).max() < 1e-10


@pytest.mark.parametrize("src", [SeededRandom(20260), SecureRandom()], ids=["seeded", "secure"])
def test_the_tail_has_the_normal_shape(src: RandomSource) -> None:
    z = src.normal(1_000_000).numpy()
    assert stats.kstest(z, "norm").pvalue > 1e-4
    beyond = np.abs(z) > 3.0  # about 2,700 draws: the conditional tail is a truncated normal
    assert stats.binomtest(int(beyond.sum()), z.size, 2 * stats.norm.sf(3.0)).pvalue > 1e-4
    tail = np.abs(z[beyond])
    assert stats.kstest(tail, stats.truncnorm(3.0, math.inf).cdf).pvalue > 1e-4
    assert stats.binomtest(int((z > 0).sum()), z.size, 0.5).pvalue > 1e-4  # symmetric
