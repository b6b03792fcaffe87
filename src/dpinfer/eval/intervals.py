"""The confidence intervals of every benchmark and evaluation figure, in one place.

* :func:`wilson`: a proportion (attack success rates, leak shares, accuracies), the Wilson score interval;
  successes may be fractional (a LOSS-attack game tied t ways counts 1/t);
* :func:`mean_interval`: a mean (per-document differences, ROUGE/BLEU over questions), ``mean ± q·sd/√n`` with q the
  Student-t quantile (``"t"``, scipy) or the normal one (``"normal"``);
* :func:`ratio_interval`: a ratio of two means over the same items, the paired percentile bootstrap;
* :func:`share`: a count out of n with its Wilson interval, as benchmarks write it into their JSON.

Every interval is two-sided at 95%, with the normal quantile written 1.96 (the figures published in the docs were
computed with it). The audit's Clopper–Pearson intervals (:mod:`dpinfer.audit.stats`) and MAUVE's interval over k-means
seeds (:func:`dpinfer.eval.mauve.mauve_interval`) belong to those measurements and stay with them.

>>> [round(x, 4) for x in wilson(5, 10)]
[0.2366, 0.7634]
>>> mean_interval([1.0, 2.0, 3.0], method="normal")
(2.0, 0.8684, 3.1316)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any, Literal

Z95 = 1.96
"""The two-sided 95% normal quantile, as the published figures used it."""


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of ``successes / n`` (defined at 0 and at n successes); ``(nan, nan)`` for n = 0."""
    if n <= 0:
        return (math.nan, math.nan)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def share(k: int, n: int) -> dict[str, Any]:
    """``{"count", "n", "share", "wilson95"}`` of k out of n (the share is nan for n = 0).

    >>> share(0, 4)["share"], share(0, 4)["wilson95"][0]
    (0.0, 0.0)
    """
    lo, hi = wilson(k, n)
    return {"count": k, "n": n, "share": k / n if n else math.nan, "wilson95": [lo, hi]}


def mean_interval(values: Sequence[float], *, method: Literal["t", "normal"] = "t", confidence: float = 0.95,
                  digits: int | None = 4) -> tuple[float, float, float]:
    """``(mean, low, high)``: the two-sided ``confidence`` interval ``mean ± q·sd/√n`` of the mean of ``values``, q
    the Student-t quantile with n − 1 degrees of freedom (``"t"``, needs scipy) or the normal one (``"normal"``;
    :data:`Z95` at 95%), rounded to ``digits`` (None: not rounded). Without values: three nans; one value: its mean
    and an unbounded interval."""
    if not values:
        return (math.nan, math.nan, math.nan)
    m = statistics.fmean(values)
    n = len(values)
    if n < 2:
        half = math.inf
    else:
        if method == "t":
            from scipy.stats import t as student_t

            q = float(student_t.ppf((1 + confidence) / 2, n - 1))
        else:
            q = Z95 if confidence == 0.95 else statistics.NormalDist().inv_cdf((1 + confidence) / 2)
        half = q * statistics.stdev(values) / math.sqrt(n)
    out = (m, m - half, m + half)
    return out if digits is None else (round(out[0], digits), round(out[1], digits), round(out[2], digits))


def ratio_interval(num: Sequence[float], den: Sequence[float], *, resamples: int = 2000, seed: int = 0
                   ) -> tuple[float, float]:
    """95% paired-bootstrap percentile interval of ``mean(num) / mean(den)`` (the same items resampled in both;
    the bootstrap's own seed, a statistic of the benchmark, not privacy noise); ``(nan, nan)`` for fewer than two
    items.

    >>> lo, hi = ratio_interval([0.5, 0.4, 0.6, 0.5], [1.0, 0.8, 1.2, 1.0])
    >>> round(lo, 6), round(hi, 6)  # every item is exactly half: the ratio never moves
    (0.5, 0.5)
    """
    import numpy as np

    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    if a.shape != b.shape or a.size < 2:
        return (math.nan, math.nan)
    idx = np.random.default_rng(seed).integers(0, a.size, size=(resamples, a.size))
    sa, sb = a[idx].mean(axis=1), b[idx].mean(axis=1)
    ratios = np.divide(sa, sb, out=np.full_like(sa, np.inf), where=sb > 0)
    low, high = np.percentile(ratios, [2.5, 97.5])
    return (float(low), float(high))
