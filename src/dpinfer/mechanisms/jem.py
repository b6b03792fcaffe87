"""The Joint Exponential Mechanism for differentially private top-k (Gillenwater, Joseph, Medina, Ribero 2022).

Gillenwater et al., "A Joint Exponential Mechanism for Differentially Private Top-k", ICML 2022. Given item counts
``c ∈ ℕ^d`` over a FIXED universe of d items (zero counts allowed) and ``k ≤ d``, JEM releases a whole sequence
``s = (s_1, …, s_k)`` of distinct items at once, with probability

    P(s) ∝ exp(−ε · E(s) / (2Δ)),   E(s) = max_i (c_(i) − c_{s_i}),

where ``c_(1) ≥ c_(2) ≥ …`` are the counts sorted in decreasing order: ``E(s)`` is the ℓ∞ error of the released
counts against the true top-k counts (E ≥ 0 for every s: some position of k distinct items holds a count no larger
than the matching order statistic). This is the exponential mechanism with utility ``−E``. When each count moves by
at most 1 between neighbouring inputs, an order statistic moves by at most 1 too, so E moves by at most 2 (counts
may move in opposite directions: Gillenwater's "swap" convention, Δ = 2) or by at most 1 when all counts move the
same way (add/remove one user, Δ = 1). The mechanism is then ε-DP, and, as an exponential mechanism, ε-bounded-range.

Exact sampling without enumerating the ``d!/(d−k)!`` sequences. Counts are integers, so E takes integer values
``e ∈ {0, …, c_(1) − min c}``. Split the sequences with ``E(s) = e`` by the FIRST position ``i*`` where the error is
exactly e: positions ``i < i*`` have error ≤ e − 1, position ``i*`` error e, positions ``i > i*`` error ≤ e. With
``m_i(t) = #{j : c_j ≥ c_(i) − t}`` (non-decreasing in i) and ``B_i(e) = #{j : c_j = c_(i) − e}``, choosing the
positions in order 1, 2, … every earlier choice lies inside the current position's admissible set (prefixes of the
sorted items grow with i, and the band of ``i*`` lies in every later prefix but in no earlier one), so the class
holds exactly

    N(e, i*) = Π_{i<i*} (m_i(e−1) − i + 1) · B_{i*}(e) · Π_{i>i*} (m_i(e) − i + 1)

sequences (0 when a factor is ≤ 0), and a uniform member is drawn position by position, uniformly among the
admissible items not yet used. The mechanism draws a class with probability ∝ ``N(e, i*) · exp(−ε e/(2Δ))`` (at
most ``(c_(1) + 1)·k`` classes), then a uniform member: exactly ``P(s)`` above. All randomness comes from a
:class:`~dpinfer.mechanisms.randomness.RandomSource` (secure by default), with exact discrete draws (the exact CDF
sampler for the class, rejection-free-of-bias 64-bit draws for uniform integers). The test suite compares the
distribution with brute-force enumeration on small inputs.

>>> from dpinfer.mechanisms.randomness import SeededRandom
>>> jem = JointExponentialTopK(k=2, epsilon=40.0)
>>> jem.sample([0, 9, 1, 8], SeededRandom(0))  # with ε = 40 the true top 2 (items 1 and 3) nearly always
[1, 3]
>>> round(math.exp(jem.log_probability([0, 9, 1, 8], [1, 3])), 6)
0.999955
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dpinfer.accounting import PureDp
from dpinfer.checks import positive_int
from dpinfer.errors import ConfigurationError, InvalidInputError
from dpinfer.mechanisms.randomness import Randomness, RandomSource, as_random_source, random_source
from dpinfer.mechanisms.sampler import sample_rows

SENSITIVITY_SWAP = 2.0
"""Δ of E when one record is replaced and every count may move by ±1 independently (DP-GTR: one rewrite replaced)."""
SENSITIVITY_ADD_REMOVE = 1.0
"""Δ of E when one record is added or removed and every count moves by at most 1 in the same direction."""


def uniform_below(source: RandomSource, m: int) -> int:
    """An integer uniform on ``[0, m)``, exactly: 64-bit words, rejecting the top ``2⁶⁴ mod m`` of them.

    >>> from dpinfer.mechanisms.randomness import SeededRandom
    >>> 0 <= uniform_below(SeededRandom(1), 7) < 7
    True
    """
    if m < 1:
        raise InvalidInputError(f"cannot draw from an empty range (m = {m})")
    if m == 1:
        return 0
    limit = (2**64 // m) * m
    while True:
        w = int(source.words(1)[0])
        if w < limit:
            return w % m


def _check_counts(counts: Sequence[int] | np.ndarray, k: int) -> np.ndarray:
    arr = np.asarray(counts)
    if arr.ndim != 1:
        raise InvalidInputError("JEM counts must be a flat sequence (one count per item of the universe)")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not (np.issubdtype(arr.dtype, np.floating) and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr))):
            raise InvalidInputError("JEM counts must be integers (numbers of records holding each item)")
    arr = arr.astype(np.int64)
    if arr.size < k:
        raise InvalidInputError(f"the universe has {arr.size} items, fewer than k = {k}; use a larger universe")
    if arr.size and arr.min() < 0:
        raise InvalidInputError("JEM counts must be ≥ 0")
    return arr


@dataclass(frozen=True)
class _Classes:
    order: np.ndarray  # item indices, counts decreasing (ties: lower index first, a data-independent rule)
    ascending: np.ndarray  # the counts sorted in increasing order (for the "how many ≥ x" look-ups)
    top: np.ndarray  # c_(1..k)
    errors: np.ndarray  # (C,) e of each class
    first: np.ndarray  # (C,) i* (0-based) of each class
    log_count: np.ndarray  # (C,) log N(e, i*) (−inf when empty)

    def at_least(self, x: int) -> int:
        """``#{j : c_j ≥ x}``."""
        return int(self.ascending.size - np.searchsorted(self.ascending, x, side="left"))


class JointExponentialTopK:
    """JEM: ``k`` distinct items of a fixed universe, jointly, with probability ∝ ``exp(−ε·E(s)/(2Δ))``.

    Args:
        k: how many items to release.
        epsilon: ε of the release (pure DP against neighbours whose counts differ by at most 1 each).
        sensitivity: Δ of the error E: 2 (default; one record replaced, counts move independently) or 1 (one record
            added or removed, counts move the same way).

    >>> JointExponentialTopK(k=3, epsilon=1.0).loss().to_epsilon(1e-5)
    1.0
    >>> JointExponentialTopK(k=0, epsilon=1.0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dpinfer.errors.ConfigurationError: k must be an integer ≥ 1, got 0
    """

    name = "jem"

    def __init__(self, k: int, epsilon: float, *, sensitivity: float = SENSITIVITY_SWAP) -> None:
        self.k = positive_int(k, "k")
        if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not (
            math.isfinite(epsilon) and epsilon > 0
        ):
            raise ConfigurationError(f"the JEM ε must be a finite number > 0, got {epsilon!r}")
        if sensitivity not in (SENSITIVITY_SWAP, SENSITIVITY_ADD_REMOVE):
            raise ConfigurationError(f"sensitivity must be 2 (replace one record) or 1 (add/remove), got "
                                     f"{sensitivity!r}")
        self.epsilon = float(epsilon)
        self.sensitivity = float(sensitivity)

    @property
    def scale(self) -> float:
        """``ε / (2Δ)``: the log-weight lost per unit of error."""
        return self.epsilon / (2.0 * self.sensitivity)

    def loss(self) -> PureDp:
        """ε-DP, and ε-bounded-range as every exponential mechanism (RDP ``min(ε, α·ε²/8)``)."""
        return PureDp(self.epsilon, bounded_range=True)

    # ------------------------------------------------------------------------------------------------ the classes
    def _classes(self, counts: np.ndarray) -> _Classes:
        k = self.k
        order = np.argsort(-counts, kind="stable")
        ascending = np.sort(counts)
        top = counts[order[:k]]
        probe = _Classes(order, ascending, top, np.empty(0), np.empty(0), np.empty(0))
        max_error = int(top[0] - ascending[0])
        errors, first, log_count = [], [], []
        for e in range(max_error + 1):
            below = [probe.at_least(int(top[i]) - (e - 1)) - i for i in range(k)]  # m_i(e−1) − (i−1), 0-based i
            upto = [probe.at_least(int(top[i]) - e) - i for i in range(k)]  # m_i(e) − (i−1)
            for star in range(k):
                x = int(top[star]) - e
                band = probe.at_least(x) - probe.at_least(x + 1)
                factors = [*below[:star], band, *upto[star + 1:]]
                errors.append(e)
                first.append(star)
                log_count.append(-math.inf if min(factors) <= 0 else float(sum(math.log(f) for f in factors)))
        return _Classes(order, ascending, top, np.asarray(errors), np.asarray(first), np.asarray(log_count))

    def _log_weights(self, classes: _Classes) -> np.ndarray:
        return classes.log_count - self.scale * classes.errors

    def error(self, counts: Sequence[int] | np.ndarray, sequence: Sequence[int]) -> int:
        """``E(s) = max_i (c_(i) − c_{s_i})`` of a sequence of distinct item indices."""
        arr = _check_counts(counts, self.k)
        seq = [int(j) for j in sequence]
        if len(seq) != self.k or len(set(seq)) != self.k or not all(0 <= j < arr.size for j in seq):
            raise InvalidInputError(f"a JEM output is {self.k} distinct item indices in [0, {arr.size})")
        top = np.sort(arr)[::-1][: self.k]
        return int(max(int(top[i]) - int(arr[j]) for i, j in enumerate(seq)))

    def log_probability(self, counts: Sequence[int] | np.ndarray, sequence: Sequence[int]) -> float:
        """The exact log-probability that :meth:`sample` releases ``sequence`` (from the class counts)."""
        arr = _check_counts(counts, self.k)
        e = self.error(arr, sequence)
        log_z = float(torch.logsumexp(torch.from_numpy(self._log_weights(self._classes(arr))), dim=0))
        return -self.scale * e - log_z

    def error_counts(self, counts: Sequence[int] | np.ndarray) -> dict[int, int]:
        """How many sequences have each error e (from the class counts; for tests against enumeration)."""
        classes = self._classes(_check_counts(counts, self.k))
        out: dict[int, int] = {}
        for e, lc in zip(classes.errors.tolist(), classes.log_count.tolist(), strict=True):
            if math.isfinite(lc):
                out[int(e)] = out.get(int(e), 0) + round(math.exp(lc))
        return out

    # ------------------------------------------------------------------------------------------------ sampling
    def sample(self, counts: Sequence[int] | np.ndarray, generator: Randomness | None = None) -> list[int]:
        """Draw the released sequence: ``k`` distinct item indices (into ``counts``), best first by construction.

        ``generator``: a :class:`~dpinfer.mechanisms.randomness.RandomSource` (default: a new secure source).
        """
        source = random_source(None) if generator is None else as_random_source(generator)
        arr = _check_counts(counts, self.k)
        classes = self._classes(arr)
        weights = torch.from_numpy(self._log_weights(classes))
        chosen = int(sample_rows(weights.unsqueeze(0), source)[0])
        e, star = int(classes.errors[chosen]), int(classes.first[chosen])
        used: list[int] = []  # positions in the sorted order, kept sorted
        picks: list[int] = []
        for i in range(self.k):
            if i == star:
                x = int(classes.top[i]) - e
                lo, hi = classes.at_least(x + 1), classes.at_least(x)  # the band: sorted positions [lo, hi)
                pos = lo + uniform_below(source, hi - lo)
            else:
                limit = classes.at_least(int(classes.top[i]) - (e - 1 if i < star else e))
                pos = uniform_below(source, limit - len(used))
                for u in used:  # the pos-th unused sorted position below the limit (every used one lies below it)
                    if u <= pos:
                        pos += 1
            used.append(pos)
            used.sort()
            picks.append(pos)
        return [int(classes.order[p]) for p in picks]


__all__ = ["SENSITIVITY_ADD_REMOVE", "SENSITIVITY_SWAP", "JointExponentialTopK", "uniform_below"]
