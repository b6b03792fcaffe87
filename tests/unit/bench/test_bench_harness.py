"""The bench harness: the manifest, the atomic JSON every bench writes, and the one interval module (whose formulas
must reproduce the figures already published)."""

from __future__ import annotations

import json
import math
import os
import statistics

import pytest

from dpinfer.bench import harness
from dpinfer.errors import ConfigurationError
from dpinfer.eval import intervals


def test_manifest_names_are_unique_and_an_unknown_bench_is_refused() -> None:
    names = [e.name for e in harness.MANIFEST]
    assert len(names) == len(set(names))
    assert harness.entry("rag").module == "dpinfer.bench.rag"
    with pytest.raises(ConfigurationError, match="unknown benchmark 'nope'"):
        harness.entry("nope")


def test_write_json_is_atomic_and_keeps_the_previous_file_on_failure(tmp_path, monkeypatch) -> None:
    path = tmp_path / "out" / "r.json"
    harness.write_json(path, {"x": float("nan"), "rows": (1, 2)})
    assert json.loads(path.read_text()) == {"x": "nan", "rows": [1, 2]}  # strict JSON: no NaN literal

    def refuse(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError):
        harness.write_json(path, {"x": 2})
    assert json.loads(path.read_text())["rows"] == [1, 2]  # the earlier result is intact
    assert sorted(p.name for p in path.parent.iterdir()) == ["r.json"]  # and no temporary file is left


def test_parse_list_refuses_in_one_line() -> None:
    assert harness.parse_list("2, 4,8", int, "--batch-sizes") == [2, 4, 8]
    for bad in ("a,b", " , "):
        with pytest.raises(ConfigurationError, match="--batch-sizes"):
            harness.parse_list(bad, int, "--batch-sizes")


def test_wilson_is_the_published_formula() -> None:
    """z = 1.96, fractional successes allowed (LOSS-attack ties), defined at 0 and n."""
    z = 1.96
    for k, n in ((0, 10), (3.5, 10), (10, 10), (27, 120)):
        p = k / n
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        assert intervals.wilson(k, n) == pytest.approx((max(0.0, centre - half), min(1.0, centre + half)))
    assert all(math.isnan(x) for x in intervals.wilson(0, 0))
    assert intervals.share(3, 4) == {"count": 3, "n": 4, "share": 0.75, "wilson95": list(intervals.wilson(3, 4))}


def test_mean_interval_normal_and_t() -> None:
    xs = [0.3, -0.1, 0.25, 0.4, 0.05]
    m, sd, n = statistics.fmean(xs), statistics.stdev(xs), len(xs)
    # the paired differences of bench sanitize: mean ± 1.96·sd/√n, rounded to 3 digits (as published)
    assert intervals.mean_interval(xs, method="normal", digits=3) == (
        round(m, 3), round(m - 1.96 * sd / math.sqrt(n), 3), round(m + 1.96 * sd / math.sqrt(n), 3))
    scipy_stats = pytest.importorskip("scipy.stats")
    half = scipy_stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    assert intervals.mean_interval(xs, digits=None) == pytest.approx((m, m - half, m + half))
    assert intervals.mean_interval([2.0], digits=None) == (2.0, -math.inf, math.inf)
    assert all(math.isnan(x) for x in intervals.mean_interval([]))


def test_ratio_interval_needs_paired_items() -> None:
    lo, hi = intervals.ratio_interval([1.0, 2.0, 3.0], [2.0, 4.0, 6.0])
    assert lo == pytest.approx(0.5) and hi == pytest.approx(0.5)
    assert all(math.isnan(x) for x in intervals.ratio_interval([1.0, 2.0], [1.0]))
