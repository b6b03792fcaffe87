"""MAUVE between two sets of text embeddings (Pillutla et al., NeurIPS 2021; JMLR 2023), on precomputed features.

MAUVE compares a set P of generated texts with a set Q of reference texts through their embeddings:

1. the rows of P and Q together are L2-normalised, projected by PCA onto the leading components that keep 90% of the
   variance, and quantised by k-means (faiss, ``num_buckets`` clusters, best of ``kmeans_num_redo`` restarts);
2. each set becomes a histogram over the clusters, ``p`` and ``q``;
3. for mixtures ``r = w p + (1 - w) q`` (25 values of ``w`` in (0, 1)) the divergence curve is the set of points
   ``(exp(-c KL(q ‖ r)), exp(-c KL(p ‖ r)))`` with scaling constant ``c = 5``;
4. MAUVE is the area under that curve: 1 when the histograms are equal, towards 0 as they separate.

``MauveResult`` also carries MAUVE* and the frontier integral (both with Krichevsky–Trofimov smoothing of the
histograms for the starred variants, Pillutla et al. 2023). The randomness is in the PCA solver and k-means
initialisation, both driven by ``seed``; :func:`mauve_interval` repeats the computation over several seeds.

The computation is the PyPI package ``mauve-text`` (GPL-3.0), an optional extra of dpinfer: it is imported only inside
these functions, and its absence raises :class:`~dpinfer.errors.MissingDependencyError` naming
the command that installs it. Only precomputed features are passed to it, so it never loads a featurising model
and never touches the network. Features typically come from :mod:`dpinfer.eval.embeddings` (all-MiniLM-L6-v2), as in
the InvisibleInk evaluation; MAUVE values are only comparable between runs that use the same embedder and the same
``num_buckets``.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpinfer.errors import ConfigurationError, InvalidInputError, MissingDependencyError, install_hint
from dpinfer.eval.intervals import mean_interval

MAUVE_INSTALL = install_hint("mauve")
# faiss prints this (from C++, straight to file descriptor 2) whenever there are < 39 points per centroid, which is
# always the case with MAUVE's default of n/10 buckets; it is expected and harmless.
_FAISS_FEW_POINTS = re.compile(r"^WARNING clustering \d+ points to \d+ centroids: please provide at least \d+ training")


@dataclass(frozen=True, eq=False)
class MauveResult:
    """One MAUVE computation.

    Attributes:
        score: MAUVE in [0, 1]; higher means P is closer to Q (1 for identical histograms).
        mauve_star: MAUVE* (histograms smoothed by adding 1/2 to every bucket count, Pillutla et al. 2023).
        frontier_integral: the frontier integral in [0, 1]; lower means closer.
        frontier_integral_star: the same on the smoothed histograms.
        num_buckets: the number of k-means clusters used.
        seed: the seed of the PCA solver and k-means initialisation.
        n_p, n_q: the numbers of rows of P and Q.
        p_hist, q_hist: the cluster histograms of P and Q (each sums to 1).
        divergence_curve: the ``(m + 2, 2)`` divergence-curve points, extremes included.
    """

    score: float
    mauve_star: float
    frontier_integral: float
    frontier_integral_star: float
    num_buckets: int
    seed: int
    n_p: int
    n_q: int
    p_hist: np.ndarray
    q_hist: np.ndarray
    divergence_curve: np.ndarray


@dataclass(frozen=True)
class MauveInterval:
    """MAUVE repeated over k-means seeds for FIXED feature sets.

    ``low``/``high`` is the Student-t ``confidence`` interval of the mean score over the seeds (clipped to [0, 1]). It
    covers only the quantisation randomness (PCA solver and k-means initialisation); it does NOT cover the sampling
    variability of the texts themselves, for which the texts must be generated again (other seeds, other prompts).

    Attributes:
        mean, std: mean and sample standard deviation (ddof=1) of the per-seed scores.
        low, high: the interval bounds.
        confidence: the interval's nominal coverage.
        scores: the per-seed MAUVE scores, in the order of ``seeds``.
        seeds: the seeds used.
    """

    mean: float
    std: float
    low: float
    high: float
    confidence: float
    scores: tuple[float, ...]
    seeds: tuple[int, ...]


def _import_mauve():
    try:
        from mauve.compute_mauve import compute_mauve
    except ImportError as exc:
        missing = f" (missing module: {exc.name})" if exc.name else ""
        raise MissingDependencyError(
            f"MAUVE needs the optional package mauve-text (GPL-3.0){missing}; install it with: {MAUVE_INSTALL}"
        ) from None
    return compute_mauve


@contextlib.contextmanager
def _without_faiss_warning() -> Iterator[None]:
    """Capture file descriptor 2 for the duration and write back everything except faiss's few-points warning.

    Output of other threads to stderr meanwhile is delayed until the block ends, not lost.
    """
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no usable fd 2 (embedded interpreter): nothing to filter
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode("utf-8", errors="replace")
            kept = "".join(line for line in text.splitlines(keepends=True) if not _FAISS_FEW_POINTS.match(line))
            if kept:
                sys.stderr.write(kept)
                sys.stderr.flush()


def _features(x: Any, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise InvalidInputError(f"{name} must be a non-empty 2-D array (n, dim), got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise InvalidInputError(f"{name} contains NaN or infinite values")
    return arr


def mauve_score(
    p_features: Any,
    q_features: Any,
    *,
    seed: int = 0,
    num_buckets: int | str = "auto",
    scaling_factor: float = 5.0,
    explained_variance: float = 0.9,
    kmeans_num_redo: int = 5,
    kmeans_max_iter: int = 500,
    discretization_size: int = 25,
    threads: int | None = None,
    quiet: bool = True,
) -> MauveResult:
    """MAUVE of P (``p_features``, e.g. generated texts) against Q (``q_features``, e.g. reference texts).

    Args:
        p_features, q_features: ``(n_p, d)`` and ``(n_q, d)`` arrays of embeddings (same ``d``); rows are L2-normalised
            inside, so raw or normalised embeddings give the same result.
        seed: seed of the PCA solver and the k-means initialisation.
        num_buckets: number of k-means clusters; ``"auto"`` is ``max(2, round(min(n_p, n_q) / 10))`` (mauve-text's
            default). At most ``n_p + n_q``.
        scaling_factor: the constant ``c`` of the divergence curve (5 in the paper).
        explained_variance: PCA keeps the leading components explaining this fraction of the variance.
        kmeans_num_redo, kmeans_max_iter: k-means restarts (the best objective is kept) and iterations per restart.
        discretization_size: number of mixture weights on the divergence curve.
        threads: if set, cap the BLAS (PCA) and OpenMP (faiss k-means) thread pools at this many threads during the
            call (via threadpoolctl). On a loaded machine ``threads=1`` avoids thread oversubscription, which can
            make the PCA ~50x slower; ``None`` leaves the libraries' defaults (one thread per core).
        quiet: hide faiss's (expected) "please provide at least ... training points" warning.

    Raises:
        MissingDependencyError: mauve-text (or its faiss / scikit-learn dependencies) is not installed.
        InvalidInputError: the feature arrays are malformed.
        ConfigurationError: a parameter is out of range.
    """
    p = _features(p_features, "p_features")
    q = _features(q_features, "q_features")
    if p.shape[1] != q.shape[1]:
        raise InvalidInputError(f"p_features and q_features differ in width: {p.shape[1]} vs {q.shape[1]}")
    if num_buckets == "auto":
        buckets = max(2, round(min(len(p), len(q)) / 10))
    elif isinstance(num_buckets, (int, np.integer)) and not isinstance(num_buckets, bool):
        buckets = int(num_buckets)
    else:
        raise ConfigurationError(f"num_buckets must be 'auto' or an integer, got {num_buckets!r}")
    if not 2 <= buckets <= len(p) + len(q):
        raise ConfigurationError(f"num_buckets must be in [2, n_p + n_q = {len(p) + len(q)}], got {buckets}")
    if not 0.0 < explained_variance < 1.0:
        raise ConfigurationError(f"explained_variance must be in (0, 1), got {explained_variance}")
    if not (scaling_factor > 0 and math.isfinite(scaling_factor)):
        raise ConfigurationError(f"scaling_factor must be positive, got {scaling_factor}")
    if kmeans_num_redo < 1 or kmeans_max_iter < 1 or discretization_size < 2:
        raise ConfigurationError("kmeans_num_redo and kmeans_max_iter must be >= 1, discretization_size >= 2")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigurationError(f"seed must be a non-negative integer, got {seed!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ConfigurationError(f"threads must be None or a positive integer, got {threads!r}")
    compute_mauve = _import_mauve()
    with contextlib.ExitStack() as stack:
        if threads is not None:
            from threadpoolctl import threadpool_limits  # a dependency of scikit-learn, itself one of mauve-text

            stack.enter_context(threadpool_limits(limits=threads))
        if quiet:
            stack.enter_context(_without_faiss_warning())
        out = compute_mauve(
            p_features=p, q_features=q, num_buckets=buckets, pca_max_data=-1,
            kmeans_explained_var=explained_variance, kmeans_num_redo=int(kmeans_num_redo),
            kmeans_max_iter=int(kmeans_max_iter), divergence_curve_discretization_size=int(discretization_size),
            mauve_scaling_factor=float(scaling_factor), verbose=False, seed=int(seed), device_id=-1,
        )
    return MauveResult(
        score=float(out.mauve), mauve_star=float(out.mauve_star), frontier_integral=float(out.frontier_integral),
        frontier_integral_star=float(out.frontier_integral_star), num_buckets=int(out.num_buckets), seed=int(seed),
        n_p=len(p), n_q=len(q), p_hist=np.asarray(out.p_hist), q_hist=np.asarray(out.q_hist),
        divergence_curve=np.asarray(out.divergence_curve),
    )


def mauve_interval(
    p_features: Any,
    q_features: Any,
    *,
    seeds: int | Sequence[int] = 5,
    confidence: float = 0.95,
    subsample: float | None = None,
    **options: Any,
) -> MauveInterval:
    """MAUVE over several k-means seeds: mean, standard deviation and a ``confidence`` interval of the mean.

    ``seeds`` is a number k >= 2 (seeds ``0 .. k-1``) or an explicit sequence of at least two seeds; ``options`` are
    passed to :func:`mauve_score` (``num_buckets``, ``scaling_factor``, ...). The interval is
    ``mean ± t_{(1+confidence)/2, k-1} · std / sqrt(k)``, clipped to [0, 1]: it covers the quantisation randomness only,
    not the sampling variability of the texts (see :class:`MauveInterval`). Costs k MAUVE computations.

    ``subsample`` (a fraction in (0, 1]) scores each repeat on a random share of both sets, drawn without replacement
    with that repeat's seed: the interval then also reflects part of the sampling variability (not a fresh draw of
    texts). Duplicated rows would bias MAUVE, so there is no bootstrap with replacement.
    """
    if "seed" in options:
        raise ConfigurationError("pass seeds=..., not seed=..., to mauve_interval")
    if isinstance(seeds, bool):
        raise ConfigurationError(f"seeds must be an integer >= 2 or a sequence of seeds, got {seeds!r}")
    seed_list = tuple(range(int(seeds))) if isinstance(seeds, (int, np.integer)) else tuple(int(s) for s in seeds)
    if len(seed_list) < 2 or len(set(seed_list)) != len(seed_list):
        raise ConfigurationError(f"mauve_interval needs at least two distinct seeds, got {seed_list}")
    if not 0.0 < confidence < 1.0:
        raise ConfigurationError(f"confidence must be in (0, 1), got {confidence}")
    _import_mauve()  # fail fast, before any work (scipy, for the t quantile, comes with mauve-text's scikit-learn)

    if subsample is not None and not 0.0 < subsample <= 1.0:
        raise ConfigurationError(f"subsample must be a fraction in (0, 1], got {subsample}")

    def score(s: int) -> float:
        p, q = _features(p_features, "p_features"), _features(q_features, "q_features")
        if subsample is not None and subsample < 1.0:
            rng = np.random.default_rng(s)
            p = p[rng.choice(len(p), size=max(2, int(subsample * len(p))), replace=False)]
            q = q[rng.choice(len(q), size=max(2, int(subsample * len(q))), replace=False)]
        return mauve_score(p, q, seed=s, **options).score

    scores = tuple(score(s) for s in seed_list)
    mean, low, high = mean_interval(scores, method="t", confidence=confidence, digits=None)
    std = float(np.std(scores, ddof=1))
    return MauveInterval(mean=mean, std=std, low=max(0.0, low), high=min(1.0, high),
                         confidence=confidence, scores=scores, seeds=seed_list)
