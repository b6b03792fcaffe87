"""The Joint Exponential Mechanism against brute-force enumeration of its output distribution."""

from __future__ import annotations

import collections
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from dpinfer.errors import ConfigurationError, InvalidInputError
from dpinfer.mechanisms.jem import JointExponentialTopK, uniform_below
from dpinfer.mechanisms.randomness import SecureRandom, SeededRandom


def brute_force(counts: list[int], k: int, epsilon: float, sensitivity: float = 2.0) -> dict[tuple[int, ...], float]:
    """P(s) ∝ exp(−ε·max_i(c_(i) − c_{s_i})/(2Δ)) over every sequence of k distinct items, by enumeration."""
    top = sorted(counts, reverse=True)[:k]
    weights = {}
    for s in itertools.permutations(range(len(counts)), k):
        error = max(top[i] - counts[j] for i, j in enumerate(s))
        weights[s] = math.exp(-epsilon * error / (2 * sensitivity))
    z = sum(weights.values())
    return {s: w / z for s, w in weights.items()}


@settings(max_examples=30, deadline=None)
@given(counts=st.lists(st.integers(0, 5), min_size=1, max_size=6), k=st.integers(1, 6),
       epsilon=st.floats(0.05, 20.0), sensitivity=st.sampled_from([1.0, 2.0]))
def test_exact_probabilities_match_enumeration(counts: list[int], k: int, epsilon: float, sensitivity: float) -> None:
    k = min(k, len(counts))
    jem = JointExponentialTopK(k, epsilon, sensitivity=sensitivity)
    expected = brute_force(counts, k, epsilon, sensitivity)
    for s, p in expected.items():
        assert math.exp(jem.log_probability(counts, s)) == pytest.approx(p, rel=1e-9, abs=1e-15)
    # the class counts are the number of sequences of each error
    by_error = collections.Counter(jem.error(counts, s) for s in expected)
    assert jem.error_counts(counts) == dict(by_error)


@pytest.mark.parametrize(("counts", "k", "epsilon"), [([3, 0, 2, 2, 1], 2, 2.0), ([0, 1, 4, 4], 3, 4.0)])
def test_samples_follow_the_enumerated_distribution(counts: list[int], k: int, epsilon: float) -> None:
    expected = brute_force(counts, k, epsilon)
    jem = JointExponentialTopK(k, epsilon)
    source = SeededRandom(11)
    n = 2500
    seen = collections.Counter(tuple(jem.sample(counts, source)) for _ in range(n))
    keys = list(expected)
    assert set(seen) <= set(keys)
    observed = [seen.get(s, 0) for s in keys]
    stat = chisquare(observed, [expected[s] * n for s in keys])
    assert stat.pvalue > 1e-3, stat


def test_dp_ratio_holds_for_every_neighbour() -> None:
    """Replacing one record (every count moves by −1, 0 or +1) changes no output's probability by more than e^ε."""
    counts, k, eps = [2, 1, 1, 0], 2, 1.5
    jem = JointExponentialTopK(k, eps)
    base = {s: jem.log_probability(counts, s) for s in itertools.permutations(range(4), k)}
    worst = 0.0
    for moves in itertools.product((-1, 0, 1), repeat=len(counts)):
        other = [c + m for c, m in zip(counts, moves, strict=True)]
        if min(other) < 0:
            continue
        for s, lp in base.items():
            worst = max(worst, abs(lp - jem.log_probability(other, s)))
    assert worst <= eps + 1e-9
    assert worst > eps / 3  # the bound is not vacuous on this input


def test_universe_sized_input_is_fast_and_distinct() -> None:
    counts = np.zeros(70_000, dtype=np.int64)
    counts[[5, 17, 900, 6000]] = [10, 9, 9, 3]
    picks = JointExponentialTopK(10, 200.0).sample(counts, SeededRandom(0))
    assert len(set(picks)) == 10 and all(0 <= p < 70_000 for p in picks)
    assert picks[:3] in ([5, 17, 900], [5, 900, 17])  # at ε = 200 the true top 3 lead
    assert len(JointExponentialTopK(3, 1.0).sample(counts)) == 3  # secure source by default


def test_uniform_below_is_uniform() -> None:
    source = SeededRandom(3)
    draws = [uniform_below(source, 6) for _ in range(6000)]
    assert chisquare(np.bincount(draws, minlength=6)).pvalue > 1e-3
    assert uniform_below(SecureRandom(), 1) == 0
    with pytest.raises(InvalidInputError):
        uniform_below(source, 0)


@pytest.mark.parametrize(("kwargs", "match"), [({"k": 0, "epsilon": 1.0}, "k must"),
                                               ({"k": 1, "epsilon": 0.0}, "ε must"),
                                               ({"k": 1, "epsilon": math.inf}, "ε must"),
                                               ({"k": 1, "epsilon": 1.0, "sensitivity": 3.0}, "sensitivity")])
def test_rejects_bad_parameters(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        JointExponentialTopK(**kwargs)


@pytest.mark.parametrize("counts", [[1, 2], [[1, 2], [3, 4]], [-1, 2, 3], [0.5, 1, 2]])
def test_rejects_bad_counts(counts: list) -> None:
    with pytest.raises(InvalidInputError):
        JointExponentialTopK(3, 1.0).sample(counts, SeededRandom(0))
