"""MAUVE on precomputed features (dpinfer.eval.mauve), through the optional GPL package mauve-text."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from dpinfer.errors import ConfigurationError, InvalidInputError, MissingDependencyError
from dpinfer.eval.mauve import MauveInterval, MauveResult, mauve_interval, mauve_score

N, D = 150, 32
FAST = {"threads": 1, "kmeans_num_redo": 2, "kmeans_max_iter": 100}  # small and single-threaded: ~0.1 s per call


@pytest.fixture(scope="module")
def clouds():
    pytest.importorskip("mauve", reason="mauve-text is not installed (pip install 'dpinfer[mauve]')")
    rng = np.random.default_rng(0)
    p = rng.normal(size=(N, D))
    q = rng.normal(size=(N, D))  # same distribution, other sample
    return p, q


def _shifted(q: np.ndarray, amount: float) -> np.ndarray:
    direction = np.zeros(q.shape[1])
    direction[:4] = 1.0  # a mean shift along 4 of the D coordinates
    return q + amount * direction


def test_identical_sets_score_one(clouds):
    p, _ = clouds
    r = mauve_score(p, p, **FAST)
    assert isinstance(r, MauveResult)
    assert r.score > 0.99
    assert r.frontier_integral < 0.01
    np.testing.assert_allclose(r.p_hist, r.q_hist)


def test_same_distribution_scores_high_and_shifted_scores_low(clouds):
    p, q = clouds
    assert mauve_score(p, q, **FAST).score > 0.8
    far = mauve_score(p, _shifted(q, 3.0), **FAST)
    assert far.score < 0.5
    assert far.frontier_integral > 0.3


def test_score_decreases_with_the_shift(clouds):
    p, q = clouds
    scores = [mauve_score(p, _shifted(q, s), **FAST).score for s in (0.0, 1.0, 2.0)]
    assert scores[0] > scores[1] + 0.2 > scores[2] + 0.4


def test_result_fields_and_determinism(clouds):
    p, q = clouds
    a = mauve_score(p, q[:100], seed=3, **FAST)
    b = mauve_score(p, q[:100], seed=3, **FAST)
    assert a.score == pytest.approx(b.score, abs=1e-9)
    assert a.num_buckets == 10 == round(100 / 10)  # "auto": min(n_p, n_q) / 10
    assert (a.n_p, a.n_q, a.seed) == (N, 100, 3)
    assert a.p_hist.shape == a.q_hist.shape == (10,)
    assert a.p_hist.sum() == pytest.approx(1.0) and a.q_hist.sum() == pytest.approx(1.0)
    assert 0.0 <= a.score <= 1.0 and 0.0 <= a.mauve_star <= 1.0
    assert a.divergence_curve.shape == (25 + 2, 2)
    assert mauve_score(p, q, num_buckets=5, **FAST).num_buckets == 5


def test_quiet_hides_the_faiss_warning(clouds, capfd):
    p, q = clouds
    mauve_score(p, q, **FAST)
    assert "please provide at least" not in capfd.readouterr().err


def test_interval_over_seeds(clouds):
    p, q = clouds
    iv = mauve_interval(p, _shifted(q, 1.0), seeds=4, **FAST)
    assert isinstance(iv, MauveInterval)
    assert iv.seeds == (0, 1, 2, 3) and len(iv.scores) == 4
    assert iv.mean == pytest.approx(np.mean(iv.scores))
    assert 0.0 <= iv.low <= iv.mean <= iv.high <= 1.0
    assert iv.std == pytest.approx(np.std(iv.scores, ddof=1))
    single = mauve_score(p, _shifted(q, 1.0), seed=2, **FAST).score
    assert iv.scores[2] == pytest.approx(single, abs=1e-9)
    wide = mauve_interval(p, _shifted(q, 1.0), seeds=[0, 1, 2, 3], confidence=0.99, **FAST)
    assert wide.high - wide.low >= iv.high - iv.low - 1e-12
    sub = mauve_interval(p, _shifted(q, 1.0), seeds=4, subsample=0.8, **FAST)
    assert sub.scores != iv.scores and 0.0 <= sub.low <= sub.mean <= sub.high <= 1.0  # other rows each repeat
    assert sub.scores == mauve_interval(p, _shifted(q, 1.0), seeds=4, subsample=0.8, **FAST).scores


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"seeds": 1}, ConfigurationError),
        ({"seeds": [4, 4]}, ConfigurationError),
        ({"seed": 0}, ConfigurationError),
        ({"confidence": 1.0}, ConfigurationError),
        ({"subsample": 0.0}, ConfigurationError),
        ({"subsample": 1.5}, ConfigurationError),
    ],
)
def test_interval_rejects_bad_arguments(kwargs, error):
    x = np.zeros((20, 4))
    with pytest.raises(error):
        mauve_interval(x, x, **kwargs)


def test_rejects_malformed_features():
    x = np.random.default_rng(1).normal(size=(30, 8))
    with pytest.raises(InvalidInputError, match="width"):
        mauve_score(x, x[:, :4])
    with pytest.raises(InvalidInputError, match="2-D"):
        mauve_score(x[0], x)
    bad = x.copy()
    bad[3, 2] = np.nan
    with pytest.raises(InvalidInputError, match="NaN"):
        mauve_score(x, bad)
    with pytest.raises(ConfigurationError, match="num_buckets"):
        mauve_score(x, x, num_buckets=61)
    with pytest.raises(ConfigurationError, match="num_buckets"):
        mauve_score(x, x, num_buckets="many")
    with pytest.raises(ConfigurationError, match="threads"):
        mauve_score(x, x, threads=0)


def test_missing_mauve_text_names_the_extra(monkeypatch):
    for name in [m for m in sys.modules if m == "mauve" or m.startswith("mauve.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "mauve", None)  # makes "import mauve..." raise ImportError
    x = np.zeros((20, 4))
    with pytest.raises(MissingDependencyError) as info:
        mauve_score(x, x + 1.0)
    assert '.venv/bin/pip install -e ".[mauve]"' in str(info.value)
    assert "GPL" in str(info.value)
    with pytest.raises(MissingDependencyError):
        mauve_interval(x, x + 1.0)
