"""Shared figures of ``dpinfer bench utility`` (:mod:`dpinfer.bench.utility`): the mean of the finite values and
the paired difference of a row to its floor over the same items. The tasks are in :mod:`~dpinfer.bench.utility_rag`,
:mod:`~dpinfer.bench.utility_synth` and :mod:`~dpinfer.bench.utility_sanitize`; RAG's vocabulary of drugs and tests
in :mod:`~dpinfer.bench.utility_vocab`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from dpinfer.eval.intervals import mean_interval


def mean_finite(xs: Sequence[float]) -> float:
    xs = [x for x in xs if math.isfinite(x)]
    return statistics.fmean(xs) if xs else math.nan


def paired(values: Sequence[float], floor: Sequence[float]) -> dict[str, Any]:
    """The mean per-item difference ``values − floor`` over the same items, with its 95% t interval."""
    diffs = [a - b for a, b in zip(values, floor, strict=True)]
    m, lo, hi = mean_interval(diffs, method="t", digits=None) if len(diffs) > 1 else (
        mean_finite(diffs), math.nan, math.nan)
    return {"mean": m, "ci95": [lo, hi], "n": len(diffs)}

