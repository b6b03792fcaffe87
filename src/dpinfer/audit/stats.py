"""Clopper–Pearson intervals and the (ε, δ) lower bound they give from a test's error rates.

A test that tells the neighbouring inputs D and D′ apart from one output has a false-positive rate FPR (says "D" on
an output of D′) and a false-negative rate FNR (says "D′" on an output of D). Any (ε, δ)-DP mechanism satisfies
``1 − δ − FNR ≤ e^ε·FPR`` and ``1 − δ − FPR ≤ e^ε·FNR`` (Kairouz et al. 2015), so with upper confidence bounds on
both rates

    ε_lb = max(log((1 − δ − FNR_hi)/FPR_hi), log((1 − δ − FPR_hi)/FNR_hi))

is a lower bound on ε at the joint confidence of the two intervals. scipy's beta quantile is used where installed
(the dev/eval extras); otherwise a bisection on the binomial CDF, in pure Python, gives the same interval.

>>> lo, hi = clopper_pearson(0, 1000)
>>> lo, round(hi, 5)
(0.0, 0.00368)
>>> round(epsilon_lower_bound(0, 1000, 0, 1000, delta=1e-5), 2)
5.6
"""

from __future__ import annotations

import math

from dpinfer.errors import ConfigurationError


def _log_binom_cdf(k: int, n: int, p: float) -> float:
    """``log P(Bin(n, p) ≤ k)`` by a log-sum-exp over the k + 1 terms (0 < p < 1)."""
    lp, lq = math.log(p), math.log1p(-p)
    lg = math.lgamma(n + 1)
    terms = [lg - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq for i in range(k + 1)]
    top = max(terms)
    return top + math.log(sum(math.exp(t - top) for t in terms))


def _upper_bisect(k: int, n: int, tail: float) -> float:
    """The p with ``P(Bin(n, p) ≤ k) = tail`` (k < n): the Clopper–Pearson upper end."""
    lo, hi, target = 0.0, 1.0, math.log(tail)
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if mid <= 0.0 or mid >= 1.0:
            break
        if _log_binom_cdf(k, n, mid) > target:
            lo = mid
        else:
            hi = mid
    return hi


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The two-sided Clopper–Pearson interval for ``k`` successes in ``n`` trials (each end at (1 − confidence)/2).

    >>> [round(x, 4) for x in clopper_pearson(5, 10)]
    [0.1871, 0.8129]
    """
    if isinstance(k, bool) or isinstance(n, bool) or not 0 <= k <= n or n < 1:
        raise ConfigurationError(f"need 0 ≤ k ≤ n and n ≥ 1 for a binomial interval, got k={k!r}, n={n!r}")
    if not 0.0 < confidence < 1.0:
        raise ConfigurationError(f"confidence must lie in (0, 1), got {confidence!r}")
    tail = (1.0 - confidence) / 2.0
    try:
        from scipy.stats import beta
    except ImportError:  # the core install: no scipy
        hi = 1.0 if k == n else _upper_bisect(k, n, tail)
        lo = 0.0 if k == 0 else 1.0 - _upper_bisect(n - k, n, tail)
        return lo, hi
    lo = 0.0 if k == 0 else float(beta.ppf(tail, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1.0 - tail, k + 1, n - k))
    return lo, hi


def _log_ratio(num: float, den: float) -> float:
    if num <= 0.0:
        return 0.0
    return math.inf if den <= 0.0 else math.log(num / den)


def epsilon_from_rates(fpr: float, fnr: float, delta: float) -> float:
    """``max(log((1 − δ − FNR)/FPR), log((1 − δ − FPR)/FNR), 0)``: the ε that these error rates force."""
    return max(0.0, _log_ratio(1.0 - delta - fnr, fpr), _log_ratio(1.0 - delta - fpr, fnr))


def epsilon_lower_bound(false_pos: int, negatives: int, false_neg: int, positives: int, *, delta: float,
                        confidence: float = 0.95) -> float:
    """ε_lb from ``false_pos`` of ``negatives`` runs on D′ and ``false_neg`` of ``positives`` runs on D, with the
    upper ends of the Clopper–Pearson intervals at ``confidence`` (0 when the test shows nothing)."""
    fpr_hi = clopper_pearson(false_pos, negatives, confidence)[1]
    fnr_hi = clopper_pearson(false_neg, positives, confidence)[1]
    return epsilon_from_rates(fpr_hi, fnr_hi, delta)
