"""The contract every registered mechanism must meet, parametrised over the registry (one entry per mechanism).

Plain checks (every run):

* ``step`` returns a valid token (joint: one id; independent: one per row) drawn with the given generator only:
  the same seed gives the same tokens, and the global torch RNG is untouched;
* ``guarantee(T_max)`` is ex ante: the same before and after any private logits are seen, non-decreasing in T_max,
  and it names its adjacency;
* ``start`` refuses a context layout its guarantee does not cover.

Property suite (hypothesis; ``DPINFER_PROPERTY_CASES`` cases per mechanism and property, 25 by default; the extended
run sets it to 10 000 or more: ``DPINFER_PROPERTY_CASES=10000 pytest -m extended tests/unit/mechanisms``) on
random logits that include extreme values (±1e4), ``-inf`` entries and tied rows, and random parameters:

* the released next-token distribution is a distribution, and the sampled token lies in its support;
* the per-step bound the guarantee is built from holds between adjacent inputs (pure-DP log-ratio bound, or the Rényi
  bound at the stated order), as declared by the mechanism's :class:`~dpinfer.accounting.LossEvent`;
* the guarantee is the same whatever the private text (same parameters → same ε), before and after stepping;
* calibration never exceeds the target (ε per group for DP-Fusion);
* the public row is unaffected by the private rows (the public support / columns are a function of row 0; the
  engine-level bit-for-bit check over the registry is tests/unit/test_public_row.py);
* at zero budget the output does not depend on the private rows (and equals the public output where there is one);
* a seed reproduces the token.

A new mechanism adds one :class:`Spec` here; :func:`test_a_toy_mechanism_defined_here_passes_the_contract` shows that a
mechanism defined in a test file (one class, one register call) passes the same checks without touching any other file.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from dpinfer.accounting import LossEvent, PrivacyLoss, PureDp, compose_steps, ex_ante_guarantee
from dpinfer.accounting.calibration import Budget
from dpinfer.accounting.calibration import Spec as Target
from dpinfer.accounting.dp_fusion import conversion_cost, per_step_rdp
from dpinfer.errors import ConfigurationError
from dpinfer.mechanisms import REGISTRY, Mechanism, MechanismRegistry, available_mechanisms, get_mechanism
from dpinfer.mechanisms.base import StepInfo, StepResult
from dpinfer.mechanisms.divergences import renyi_divergence
from dpinfer.mechanisms.dp_decoding import mixture_log_probs
from dpinfer.mechanisms.dp_prompt import clipped_log_probs
from dpinfer.mechanisms.randomness import Randomness
from dpinfer.mechanisms.sampler import sample_probs

V = 32
CASES = int(os.environ.get("DPINFER_PROPERTY_CASES", "25"))
"""Hypothesis cases per mechanism and property (25 by default; ≥ 10 000 in the extended run)."""
CALIBRATION_CASES = max(3, CASES // 50)
"""Calibrations are ~100 conversions each: a fiftieth of the cases (200 per mechanism in a 10 000-case run)."""
PROPERTY = settings(max_examples=CASES, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
REL, ABS = 1e-9, 1e-12
"""Slack of the numerical bound checks: float64 rounding of the divergence, never a budget."""
ZERO_TOL = 1e-7
"""How close the zero-budget output must be to the private-free one: DP-Fusion's solver tests feasibility in float64,
where ``S − 1`` below ~1e-16 rounds to 0, so at a bound of 1e-300 it may keep λ up to ~1e-8 (a divergence of ~1e-17
instead of 1e-300: below the resolution of the divergence, not a budget)."""

FACTORIES: dict[str, tuple[Callable[[], Mechanism], int, int]] = {
    # name: (factory, K it steps, a K it must refuse (0 = any K is fine))
    "sampler": (lambda: get_mechanism("sampler", temperature=1.0, mode="joint"), 1, 0),
    "dp-fusion": (lambda: get_mechanism("dp-fusion", bounds=[0.05, 0.1], group_names=["A", "B"]), 3, 2),
    "dp-decoding": (lambda: get_mechanism("dp-decoding", lam=0.5, vocab_size=V), 1, 0),
    "dp-prompt": (lambda: get_mechanism("dp-prompt", clip_min=-2.0, clip_max=2.0, num_rewrites=2), 2, 3),
    "invisibleink": (lambda: get_mechanism("invisibleink", clip_norm=0.5, batch_size=3, top_k=5), 4, 3),
    "amin": (lambda: get_mechanism("amin", clip_norm=0.5, batch_size=3), 4, 2),
    "adapmixed": (lambda: get_mechanism("adapmixed", batch_size=3, epsilon=50.0, top_k=None), 4, 5),
    "pad": (lambda: get_mechanism("pad", clip_norm=0.5, sigma=1.5, top_k=5), 2, 3),
    "pad-as-published": (lambda: get_mechanism("pad-as-published"), 1, 2),
    "static": (lambda: get_mechanism("static", sigma=1.0), 1, 2),
}


def test_every_registered_mechanism_has_a_contract_factory() -> None:
    assert sorted(FACTORIES) == available_mechanisms()


def _run(mech: Mechanism, k: int, seed: int, steps: int = 6) -> list[list[int]]:
    mech.start(k, V)
    g = torch.Generator().manual_seed(seed)
    data = torch.Generator().manual_seed(123)
    out = []
    for t in range(steps):
        z = torch.randn(k, V, dtype=torch.float64, generator=data) * 3
        res = mech.step(z, StepInfo(step=t, max_new_tokens=50, num_contexts=k,
                                    finished=None if mech.mode == "joint" else torch.zeros(k, dtype=torch.bool)), g)
        if res.stop:
            break
        toks = res.tokens.reshape(-1).tolist()
        assert len(toks) == (1 if mech.mode == "joint" else k)
        assert all(0 <= x < V for x in toks)
        out.append(toks)
    return out


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_tokens_come_from_the_generator_only(name: str) -> None:
    factory, k, _ = FACTORIES[name]
    state = torch.get_rng_state()
    first = _run(factory(), k, seed=7)
    assert torch.equal(state, torch.get_rng_state())  # the global RNG was not used
    assert first == _run(factory(), k, seed=7)
    assert len(first) > 0


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_one_calibration_signature_and_diagnostics(name: str) -> None:
    """Every mechanism has ``calibrated(budget, spec)`` (one signature: callers need no per-mechanism keywords) and
    ``diagnostics(steps)``: a JSON-able dict of data-dependent figures after a generation."""
    import inspect
    import json

    factory, k, _ = FACTORIES[name]
    cls = REGISTRY.get(name).cls
    assert list(inspect.signature(cls.calibrated).parameters) == ["budget", "spec"]
    mech = factory()
    mech.start(k, V)
    g = torch.Generator().manual_seed(3)
    steps = []
    for t in range(3):
        z = torch.randn(k, V, dtype=torch.float64, generator=g)
        res = mech.step(z, StepInfo(step=t, max_new_tokens=50, num_contexts=k,
                                    finished=None if mech.mode == "joint" else torch.zeros(k, dtype=torch.bool)), g)
        steps.append(dict(res.stats or {}))
    diag = mech.diagnostics(steps)
    assert isinstance(diag, dict) and "epsilon" not in diag
    json.dumps(diag)


def test_a_mechanism_without_a_calibration_says_so() -> None:
    with pytest.raises(ConfigurationError, match="no calibration"):
        REGISTRY.get("sampler").cls.calibrated(Budget(1.0, 1e-5), Target(10))


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_guarantee_is_ex_ante(name: str) -> None:
    factory, k, _ = FACTORIES[name]
    mech = factory()
    before = [mech.guarantee(t) for t in (1, 10, 100)]
    _run(mech, k, seed=1)
    after = [mech.guarantee(t) for t in (1, 10, 100)]
    assert [g.to_dict() for g in before] == [g.to_dict() for g in after]
    eps = [g.epsilon for g in before]
    assert all(a <= b or (math.isinf(a) and math.isinf(b)) for a, b in itertools.pairwise(eps))
    assert all(g.adjacency and g.mechanism == name for g in before)


@pytest.mark.parametrize("name", [n for n, (_, _, bad) in sorted(FACTORIES.items()) if bad])
def test_start_refuses_an_uncovered_layout(name: str) -> None:
    factory, _, bad = FACTORIES[name]
    with pytest.raises(ConfigurationError):
        factory().start(bad, V)


# ==================================================================================================== property suite
TARGET = st.floats(0.5, 200.0)


@dataclass(frozen=True)
class Spec:
    """What the property suite needs to know about one mechanism (all of it public API of the mechanism).

    ``build(V, params)`` builds it on a vocabulary of V tokens (K = ``k`` rows, row 0 public where there is one);
    ``released(mech, z)`` is the (V,) distribution its token is drawn from (for Amin: the private branch);
    ``bound(mech, i)`` the per-step bound for a change of private row ``i`` as ``(order, value)`` (order ``inf``:
    ``max |log p − log p′| ≤ value``; finite: ``D_α`` in both directions ≤ value), None without an ex-ante bound;
    ``adjacency`` how a neighbour is formed: ``"null"`` (private row i replaced by the public row 0) or ``"any"`` (row
    0 itself is private and replaced by any other row); ``zero(V, params)`` the mechanism at zero budget and
    ``public(z)`` the output it must then equal (None: only independence of the private rows is checked);
    ``calibrate(ε, T, params)`` a calibrated mechanism and the ε it reports per protected unit.
    """

    k: int
    params: st.SearchStrategy[dict[str, Any]]
    build: Callable[[int, dict[str, Any]], Mechanism]
    released: Callable[[Any, torch.Tensor], torch.Tensor] | None = None
    bound: Callable[[Any, int], tuple[float, float]] | None = None
    adjacency: str = "null"
    zero: Callable[[int, dict[str, Any]], Mechanism] | None = None
    public: Callable[[torch.Tensor, dict[str, Any]], torch.Tensor] | None = None
    calibrate: Callable[[float, int, dict[str, Any]], tuple[Mechanism, list[float]]] | None = None
    target: st.SearchStrategy[float] = TARGET


TINY = 1e-300
"""A budget knob so small that nothing of the private rows survives in float64 (the zero budget)."""
ARGMAX_FLOOR = 1e-250
"""PAD's argmax distribution is integrated numerically; probabilities below this floor (far Gaussian tails, which
underflow inconsistently) are raised to it on the public support before renormalising, so both neighbours keep the
support the public row gives them."""


def _gaussian_argmax_quad(mu: torch.Tensor, sigma: float) -> torch.Tensor:
    """``P(argmax_i (μ_i + σ·Z_i) = i)`` for independent standard normals Z, by adaptive quadrature (scipy, ~0.5 s
    for 32 entries): ``∫ φ((x − μ_i)/σ)/σ · Π_{j≠i} Φ((x − μ_j)/σ) dx``. The reference for :func:`_gaussian_argmax`."""
    import numpy as np
    from scipy import integrate, special, stats

    m = mu.tolist()
    out = []
    for i, mi in enumerate(m):
        others = np.array([mj for j, mj in enumerate(m) if j != i])

        def f(x: float, mi: float = mi, others: np.ndarray = others) -> float:
            return math.exp(stats.norm.logpdf(x, mi, sigma) + float(special.log_ndtr((x - others) / sigma).sum()))

        lo, hi = mi - 40.0 * sigma, mi + 40.0 * sigma
        value, _ = integrate.quad(f, lo, hi, points=[mi], limit=400, epsabs=0.0, epsrel=1e-12)
        out.append(value)
    p = torch.tensor(out, dtype=torch.float64).clamp(min=ARGMAX_FLOOR)
    return p / p.sum()


ARGMAX_GRID_STEP = 0.05
ARGMAX_GRID_HALF_WIDTH = 40.0


def _gaussian_argmax(mu: torch.Tensor, sigma: float) -> torch.Tensor:
    """The same probabilities as :func:`_gaussian_argmax_quad`, ~20× faster: substitute x = μ_i + σu, so
    ``P_i = ∫ φ(u) · Π_{j≠i} Φ(u + (μ_i − μ_j)/σ) du``, and sum it on one fixed grid u ∈ [−40, 40] (step 0.05) for
    every i at once, in log space (logsumexp).

    Why the grid is enough: the integrand is analytic and decays like φ(u), so the trapezoid rule converges
    geometrically in 1/step; the integrand is ≤ φ(u) < 1e-300 for |u| > 37, so the cut tails are below
    ``ARGMAX_FLOOR`` (every entry is clamped to it anyway). :func:`test_the_argmax_grid_matches_quadrature` checks
    it against quadrature to a relative 1e-10 on random, extreme and tied inputs.
    """
    mu = mu.to(torch.float64)
    k = mu.shape[0]
    u = torch.arange(-ARGMAX_GRID_HALF_WIDTH, ARGMAX_GRID_HALF_WIDTH + ARGMAX_GRID_STEP / 2, ARGMAX_GRID_STEP,
                     dtype=torch.float64)
    d = (mu[:, None] - mu[None, :]) / sigma  # (k, k): (μ_i − μ_j)/σ
    log_cdf = torch.special.log_ndtr(u[None, None, :] + d[:, :, None])  # (k, k, U)
    diagonal = torch.arange(k)
    log_cdf[diagonal, diagonal, :] = 0.0  # the product runs over j ≠ i
    log_integrand = -0.5 * u * u - 0.5 * math.log(2.0 * math.pi) + log_cdf.sum(dim=1)  # (k, U)
    p = (torch.logsumexp(log_integrand, dim=1) + math.log(ARGMAX_GRID_STEP)).exp().clamp(min=ARGMAX_FLOOR)
    return p / p.sum()


def _pad_released(mech: Any, z: torch.Tensor) -> torch.Tensor:
    """The (V,) distribution of PAD's token (τ = 0: the argmax of the noisy logits on the public support)."""
    idx, _, pre = mech.pre_noise_logits(z)
    p = torch.zeros(z.shape[1], dtype=torch.float64)
    p[idx] = _gaussian_argmax(pre, mech.sigma)
    return p


def _fusion_calibrated(eps: float, t: int, p: dict[str, Any]) -> tuple[Mechanism, list[float]]:
    floor = conversion_cost(p["alpha"], 1e-5)  # the smallest reachable ε at that α: targets start above it
    target = {"A": floor + eps, "B": floor + 1.5 * eps}
    mech = REGISTRY.get("dp-fusion").cls.calibrated(Budget(target, 1e-5),
                                                    Target(t, alpha=p["alpha"], adjacency=p["adjacency"]))
    return mech, [g.epsilon - target[g.name] for g in mech.guarantee(t).groups]


def _kwarg_calibrated(name: str, kw: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[..., Any]:
    def run(eps: float, t: int, p: dict[str, Any]) -> tuple[Mechanism, list[float]]:
        params = kw(p)
        mech = REGISTRY.get(name).cls.calibrated(Budget(eps, params.pop("delta", 1e-5)), Target(t, **params))
        return mech, [mech.guarantee(t).epsilon - eps]
    return run


def _positional_calibrated(name: str, kw: Callable[[dict[str, Any], int], dict[str, Any]]) -> Callable[..., Any]:
    def run(eps: float, t: int, p: dict[str, Any]) -> tuple[Mechanism, list[float]]:
        params = kw(p, t)
        mech = REGISTRY.get(name).cls.calibrated(Budget(eps, params.pop("delta")), Target(t, **params))
        return mech, [mech.guarantee(t).epsilon - eps]
    return run


def _softmax(z: torch.Tensor, tau: float) -> torch.Tensor:
    return torch.softmax(z.to(torch.float64) / tau, dim=-1)


SPECS: dict[str, Spec] = {
    "sampler": Spec(
        k=1,
        params=st.fixed_dictionaries({"temperature": st.floats(0.3, 3.0)}),
        build=lambda v, p: get_mechanism("sampler", temperature=p["temperature"], mode="joint"),
        released=lambda m, z: _softmax(z[0], m.temperature),
    ),
    "dp-fusion": Spec(
        k=3,
        params=st.fixed_dictionaries({
            "bounds": st.lists(st.floats(1e-3, 2.0), min_size=2, max_size=2),
            "alpha": st.sampled_from([1.5, 2.0, 4.0, 8.0]),
            "temperature": st.floats(0.3, 3.0),
            "top_k": st.one_of(st.none(), st.integers(1, 6)),
            "adjacency": st.sampled_from(["replace-by-null", "replace-one"]),
        }),
        build=lambda v, p: get_mechanism("dp-fusion", group_names=["A", "B"], **p),
        released=lambda m, z: m.distribution(z)[0],
        bound=lambda m, i: (m.alpha, per_step_rdp(m.bounds[i], m.num_groups, m.alpha, m.accounting, m.adjacency)),
        zero=lambda v, p: get_mechanism("dp-fusion", group_names=["A", "B"], **{**p, "bounds": [TINY, TINY]}),
        public=None,  # S and the temperature are DP-Fusion's: compared with its own public-only output below
        calibrate=_fusion_calibrated,
        target=st.floats(0.01, 300.0),
    ),
    "dp-decoding": Spec(
        k=1,
        params=st.fixed_dictionaries({"lam": st.floats(0.0, 0.999), "temperature": st.floats(0.3, 3.0)}),
        build=lambda v, p: get_mechanism("dp-decoding", vocab_size=v, **p),
        released=lambda m, z: mixture_log_probs(z[:1], m.lam, m.temperature)[0].exp(),
        bound=lambda m, i: (math.inf, m.epsilon_per_token),
        adjacency="any",
        zero=lambda v, p: get_mechanism("dp-decoding", vocab_size=v, **{**p, "lam": 0.0}),
        public=lambda z, p: torch.full((z.shape[1],), 1.0 / z.shape[1], dtype=torch.float64),
        calibrate=_positional_calibrated("dp-decoding", lambda p, t: {"delta": 1e-5, "vocab_size": 49152}),
        target=st.floats(0.01, 500.0),
    ),
    "dp-prompt": Spec(
        k=1,
        params=st.fixed_dictionaries({
            "clip_min": st.floats(-5.0, 0.0), "width": st.floats(0.01, 10.0), "temperature": st.floats(0.3, 5.0),
        }),
        build=lambda v, p: get_mechanism("dp-prompt", clip_min=p["clip_min"], clip_max=p["clip_min"] + p["width"],
                                         temperature=p["temperature"], mode="joint"),
        released=lambda m, z: clipped_log_probs(z[:1], m.clip_min, m.clip_max, m.temperature)[0].exp(),
        bound=lambda m, i: (math.inf, m.epsilon_per_token),
        adjacency="any",
        zero=lambda v, p: get_mechanism("dp-prompt", clip_min=p["clip_min"],
                                        clip_max=math.nextafter(p["clip_min"], math.inf),
                                        temperature=p["temperature"], mode="joint"),
        public=lambda z, p: torch.full((z.shape[1],), 1.0 / z.shape[1], dtype=torch.float64),
        calibrate=_positional_calibrated("dp-prompt", lambda p, t: {
            "delta": 1e-5, "clip_min": p["clip_min"], "clip_max": p["clip_min"] + p["width"]}),
        target=st.floats(0.05, 500.0),
    ),
    "invisibleink": Spec(
        k=4,
        params=st.fixed_dictionaries({
            "clip_norm": st.floats(1e-3, 10.0), "temperature": st.floats(0.3, 3.0),
            "top_k": st.one_of(st.none(), st.integers(1, 6)),
        }),
        build=lambda v, p: get_mechanism("invisibleink", batch_size=3, **p),
        released=lambda m, z: m.distribution(z)[0],
        bound=lambda m, i: (math.inf, 2.0 * m.clip_norm / (m.batch_size * m.temperature)),
        zero=lambda v, p: get_mechanism("invisibleink", batch_size=3, **{**p, "clip_norm": TINY}),
        public=None,  # softmax(ℓ_pub/τ) on the public top-k: compared with the mechanism's own output below
        calibrate=_kwarg_calibrated("invisibleink", lambda p: {"batch_size": 3, "delta": 1e-6,
                                                               "temperature": p["temperature"]}),
    ),
    "amin": Spec(
        k=4,
        params=st.fixed_dictionaries({
            "clip_norm": st.floats(1e-3, 10.0), "temperature": st.floats(0.3, 3.0), "svt": st.booleans(),
        }),  # as_published=True is the paper's (unsound) zero-out sensitivity, kept for comparison: not checked
        build=lambda v, p: get_mechanism("amin", batch_size=3, **p),
        released=lambda m, z: m.distributions(z)[0],  # the private branch (the public branch reads row 0 only)
        bound=lambda m, i: (math.inf, 2.0 * m.loss_event().sensitivity / m.temperature),
        zero=lambda v, p: get_mechanism("amin", batch_size=3, **{**p, "clip_norm": TINY}),
        calibrate=_kwarg_calibrated("amin", lambda p: {"batch_size": 3, "delta": 1e-6, "svt": p["svt"]}),
    ),
    "adapmixed": Spec(  # data-dependent: no ex-ante bound, no released distribution exposed, guarantee ε = ∞
        k=4,
        params=st.fixed_dictionaries({"bound": st.floats(1e-3, 1.0), "top_k": st.one_of(st.none(), st.integers(1, 6))}),
        build=lambda v, p: get_mechanism("adapmixed", batch_size=3, epsilon=1e6, **p),
    ),
    "pad": Spec(  # argmax of ℓ_pub + clip(s) + N(0, σ²I): the Gaussian bound α·Δ²/(2σ²) holds for the token too
        k=2,
        params=st.fixed_dictionaries({
            "clip_norm": st.floats(1e-3, 10.0), "sigma": st.floats(0.5, 5.0),
            "top_k": st.one_of(st.none(), st.integers(1, 6)),
            "adjacency": st.sampled_from(["replace-by-null", "replace-one"]),
            "min_p": st.one_of(st.none(), st.floats(0.01, 1.0)),  # the public min-p cut (RAG's default support)
        }),
        build=lambda v, p: get_mechanism("pad", **p),
        released=lambda m, z: _pad_released(m, z),
        bound=lambda m, i: (2.0, 2.0 * m.sensitivity**2 / (2.0 * m.sigma**2)),
        zero=lambda v, p: get_mechanism("pad", **{**p, "clip_norm": TINY}),
        calibrate=_kwarg_calibrated("pad", lambda p: {"delta": 1e-5, "sigma": p["sigma"],
                                                      "adjacency": p["adjacency"]}),
    ),
    "pad-as-published": Spec(  # reads the private logits without clipping: no ex-ante bound, guarantee ε = ∞
        k=1,
        params=st.fixed_dictionaries({"epsilon": st.floats(0.01, 5.0)}),
        build=lambda v, p: get_mechanism("pad-as-published", **p),
    ),
    "static": Spec(  # fixed noise on unclipped logits: no bound, guarantee ε = ∞
        k=1,
        params=st.fixed_dictionaries({"sigma": st.floats(0.01, 5.0)}),
        build=lambda v, p: get_mechanism("static", **p),
    ),
}


@pytest.mark.parametrize("scale", [0.1, 1.0, 5.0, 30.0, 1e3])
def test_the_argmax_grid_matches_quadrature(scale: float) -> None:
    """PAD's oracle (the Gaussian argmax on a fixed grid) agrees with adaptive quadrature to a relative 1e-10 on every
    probability above 1e-200, on random, extreme (±1e3·Z) and tied inputs."""
    g = torch.Generator().manual_seed(int(scale * 10))
    for trial in range(6):
        k = [1, 2, 5, 17, 32, 32][trial]
        mu = torch.randn(k, generator=g, dtype=torch.float64) * scale
        if trial == 5:
            mu[: k // 2] = mu[0]  # ties
        sigma = float(torch.empty(1, dtype=torch.float64).uniform_(0.3, 5.0, generator=g))
        quad, grid = _gaussian_argmax_quad(mu, sigma), _gaussian_argmax(mu, sigma)
        kept = quad > 1e-200
        assert kept.any()
        assert float(((quad - grid).abs() / quad)[kept].max()) <= 1e-10
        assert bool((grid[~kept] <= 1e-190).all())  # what quadrature puts below the floor, the grid does too


def test_every_registered_mechanism_has_a_property_spec() -> None:
    assert sorted(SPECS) == available_mechanisms()


# ------------------------------------------------------------------------------------------------------ strategies
_VALUE = st.one_of(
    st.floats(-30.0, 30.0, allow_nan=False),
    st.sampled_from([0.0, 1.0, 1e4, -1e4, -math.inf]),
)


@st.composite
def logits_cases(draw: st.DrawFn, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(z, other)``: (k, v) logits with extreme values, ``-inf`` entries and tied rows (every row with a finite
    entry), and one more row (the replacement of an ``"any"`` adjacency)."""
    v = draw(st.integers(2, 12))
    rows = []
    for _ in range(k + 1):
        kind = draw(st.sampled_from(["random", "random", "tied", "one-hot"]))
        if kind == "tied":
            row = [draw(st.sampled_from([0.0, 5.0, -1e4]))] * v
        elif kind == "one-hot":
            row = [-math.inf] * v
            row[draw(st.integers(0, v - 1))] = 0.0
        else:
            row = draw(st.lists(_VALUE, min_size=v, max_size=v))
        if not any(math.isfinite(x) for x in row):
            row[draw(st.integers(0, v - 1))] = draw(st.floats(-30.0, 30.0))
        rows.append(row)
    t = torch.tensor(rows, dtype=torch.float64)
    return t[:k], t[k:]


def _neighbour(spec: Spec, mech: Mechanism, z: torch.Tensor, other: torch.Tensor, i: int) -> torch.Tensor:
    """Adjacent logits: private row i + 1 replaced by the public row (``"null"``; by another row under DP-Fusion's
    replace-one adjacency), or row 0 replaced by any other row (``"any"``)."""
    out = z.clone()
    if spec.adjacency == "any":
        out[0] = other[0]
    elif getattr(mech, "adjacency", None) == "replace-one":
        out[i + 1] = other[0]
    else:
        out[i + 1] = z[0]
    return out


def _check_bound(p: torch.Tensor, q: torch.Tensor, order: float, value: float) -> None:
    if math.isinf(order):
        assert torch.equal(p > 0, q > 0), "adjacent inputs released on different supports"
        s = p > 0
        gap = float((p[s].log() - q[s].log()).abs().max())
        assert gap <= value * (1 + REL) + ABS, (gap, value)
    else:
        for a, b in ((p, q), (q, p)):
            d = float(renyi_divergence(a.log(), b.log(), order))
            assert d <= value * (1 + REL) + ABS, (d, value, order)


# ------------------------------------------------------------------------------------------------------ the checks
def check_step(spec: Spec, params: dict[str, Any], z: torch.Tensor, other: torch.Tensor, seed: int,
               t_max: int) -> None:
    """Every step-level property of the contract on one case (see the module docstring)."""
    v = z.shape[1]
    mech = spec.build(v, params)
    before = mech.guarantee(t_max).to_dict()
    mech.start(spec.k, v)
    joint = mech.mode == "joint"
    info = StepInfo(step=0, max_new_tokens=t_max, num_contexts=spec.k,
                    finished=None if joint else torch.zeros(spec.k, dtype=torch.bool))
    res = mech.step(z, info, torch.Generator().manual_seed(seed))
    # seeds reproduce
    twin = spec.build(v, params)
    twin.start(spec.k, v)
    again = twin.step(z, info, torch.Generator().manual_seed(seed))
    assert res.stop == again.stop and (res.stop or torch.equal(res.tokens, again.tokens))
    # the batched path (step_batch, where the mechanism has one): the per-job token and statistics, whatever job sits
    # beside it (here a job on other logits, with its own source)
    if mech.batch_key() is not None:
        pair, side = spec.build(v, params), spec.build(v, params)
        pair.start(spec.k, v)
        side.start(spec.k, v)
        beside = torch.cat([other[:1], z[1:]]).flip(-1)
        for order in ((0, 1), (1, 0)):
            jobs = [(pair, z, seed), (side, beside, seed + 1)]
            jobs = [jobs[i] for i in order]
            got = type(pair).step_batch([j[0] for j in jobs], [j[1] for j in jobs], [info, info],
                                        [torch.Generator().manual_seed(j[2]) for j in jobs])
            mine = got[order.index(0)]
            assert not isinstance(mine, Exception), mine
            assert torch.equal(mine.tokens, res.tokens) and mine.stats == res.stats
    # the guarantee reads no private data: the same before and after the step, and for a twin with the same parameters
    assert mech.guarantee(t_max).to_dict() == before == twin.guarantee(t_max).to_dict()
    if spec.bound is None:
        assert math.isinf(mech.guarantee(t_max).epsilon)  # no per-step bound, so no ex-ante guarantee is claimed
    if spec.released is None:
        assert res.stop or 0 <= int(res.tokens.reshape(-1)[0]) < v
        return
    # outputs are distributions, and the token lies in the support
    p = spec.released(mech, z)
    assert p.shape == (v,) and bool(torch.isfinite(p).all()) and bool((p >= 0).all())
    assert abs(float(p.sum()) - 1.0) <= 1e-9
    if not res.stop:
        assert float(p[int(res.tokens.reshape(-1)[0])]) > 0
    # the per-step bound between adjacent inputs (the public support is the same for both: it reads row 0 only)
    if spec.bound is not None:
        for i in range(spec.k - 1) if spec.adjacency == "null" else range(1):
            q = spec.released(mech, _neighbour(spec, mech, z, other, i))
            if spec.adjacency == "null":
                assert torch.equal(p > 0, q > 0), "the support moved with a private row"
            _check_bound(p, q, *spec.bound(mech, i))
    # zero budget: the output does not depend on the private rows (and is the public output where there is one)
    if spec.zero is not None:
        zero = spec.zero(v, params)
        zero.start(spec.k, v)
        p0 = spec.released(zero, z)
        if spec.adjacency == "any":
            p1 = spec.released(zero, _neighbour(spec, zero, z, other, 0))
        else:
            p1 = spec.released(zero, torch.cat([z[:1], other[:1].expand(spec.k - 1, -1)]))
            # the public-only input (every private row = the public row) releases the same
            assert float((p0 - spec.released(zero, z[:1].expand(spec.k, -1).clone())).abs().max()) <= ZERO_TOL
        assert float((p0 - p1).abs().max()) <= ZERO_TOL
        if spec.public is not None:
            assert float((p0 - spec.public(z, params)).abs().max()) <= ZERO_TOL


@pytest.mark.extended
@pytest.mark.parametrize("name", sorted(SPECS))
def test_step_properties(name: str) -> None:
    spec = SPECS[name]

    @PROPERTY
    @given(params=spec.params, case=logits_cases(spec.k), seed=st.integers(0, 2**32 - 1),
           t_max=st.integers(1, 2000))
    def run(params: dict[str, Any], case: tuple[torch.Tensor, torch.Tensor], seed: int, t_max: int) -> None:
        check_step(spec, params, case[0], case[1], seed, t_max)

    run()


def check_calibration(spec: Spec, eps: float, t_max: int, params: dict[str, Any]) -> None:
    """A calibrated mechanism reports at most its target (per group where there are groups)."""
    assert spec.calibrate is not None
    _, excess = spec.calibrate(eps, t_max, params)
    assert all(x <= 0.0 for x in excess), excess


@pytest.mark.extended
@pytest.mark.parametrize("name", sorted(n for n, s in SPECS.items() if s.calibrate is not None))
def test_calibration_never_exceeds_the_target(name: str) -> None:
    spec = SPECS[name]

    @settings(PROPERTY, max_examples=CALIBRATION_CASES)
    @given(eps=spec.target, t_max=st.integers(1, 2000), params=spec.params)
    def run(eps: float, t_max: int, params: dict[str, Any]) -> None:
        check_calibration(spec, eps, t_max, params)

    run()


# ==================================================================================================== a toy mechanism
@dataclass(frozen=True)
class ClippedDifferenceEvent(LossEvent):
    """One toy token: ``softmax(ℓ_pub + clip(ℓ_1 − ℓ_pub, −c, c))``. Replacing the private row by the public row moves
    the utility by at most c per coordinate: ``2c``-DP (the exponential mechanism's log-ratio bound)."""

    clip: float

    def step_loss(self) -> PrivacyLoss:
        return PureDp(2.0 * self.clip)


class ToyClippedDifference(Mechanism):
    """One public row, one private row; the released distribution is the public one nudged by at most c."""

    name = "toy-clipped-difference"
    mode = "joint"

    def __init__(self, *, clip: float, delta: float = 1e-5) -> None:
        if not (isinstance(clip, float) and 0.0 < clip < math.inf):
            raise ConfigurationError(f"clip must be a finite float > 0, got {clip!r}")
        self.clip, self.delta = clip, delta

    def start(self, num_contexts: int, vocab_size: int) -> None:
        if num_contexts != 2:
            raise ConfigurationError(f"the toy steps 2 contexts (public, private), got {num_contexts}")

    def distribution(self, z: torch.Tensor) -> torch.Tensor:
        pub = z[0]
        diff = torch.nan_to_num((z[1] - pub).clamp(-self.clip, self.clip), nan=0.0)
        return torch.softmax(pub + diff, dim=-1)

    def step(self, logits: torch.Tensor, info: StepInfo, generator: Randomness) -> StepResult:
        return StepResult(tokens=sample_probs(self.distribution(logits), generator))

    def guarantee(self, max_new_tokens: int) -> Any:
        return ex_ante_guarantee(ClippedDifferenceEvent(self.clip), steps=max_new_tokens, delta=self.delta,
                                 mechanism=self.name, adjacency="replace-by-null of the private context",
                                 parameters={"clip": self.clip}, max_new_tokens=max_new_tokens)


TOY_SPEC = Spec(
    k=2,
    params=st.fixed_dictionaries({"clip": st.floats(1e-3, 10.0)}),
    build=lambda v, p: TOY_REGISTRY.build("toy-clipped-difference", **p),
    released=lambda m, z: m.distribution(z),
    bound=lambda m, i: (math.inf, 2.0 * m.clip),
    zero=lambda v, p: TOY_REGISTRY.build("toy-clipped-difference", clip=TINY),
    public=lambda z, p: torch.softmax(z[0], dim=-1),
)
TOY_REGISTRY = MechanismRegistry()
TOY_REGISTRY.register("toy-clipped-difference", tasks=("synthesize",), summary="a toy for the contract")(
    ToyClippedDifference)


def test_a_toy_mechanism_defined_here_passes_the_contract() -> None:
    """Adding a mechanism touches its module, its registry entry and its tests only: a class and one register call
    (into a fresh registry here, so the built-in one stays as it is) pass the same contract checks."""
    assert "toy-clipped-difference" not in REGISTRY and TOY_REGISTRY.names() == ["toy-clipped-difference"]

    @settings(PROPERTY, max_examples=max(CASES, 50))
    @given(params=TOY_SPEC.params, case=logits_cases(TOY_SPEC.k), seed=st.integers(0, 2**32 - 1),
           t_max=st.integers(1, 2000))
    def run(params: dict[str, Any], case: tuple[torch.Tensor, torch.Tensor], seed: int, t_max: int) -> None:
        check_step(TOY_SPEC, params, case[0], case[1], seed, t_max)

    run()
    toy = TOY_REGISTRY.build("toy-clipped-difference", clip=0.25)
    assert toy.guarantee(4).epsilon == pytest.approx(compose_steps(ClippedDifferenceEvent(0.25), 4).to_epsilon(1e-5))


def test_a_toy_mechanism_registered_into_the_registry_is_dispatched_and_removed() -> None:
    """The same toy registered into the real REGISTRY is offered for its task, and the cleanup leaves no trace."""
    try:
        REGISTRY.register("toy-clipped-difference", tasks=("synthesize",), summary="a toy")(ToyClippedDifference)
        assert "toy-clipped-difference" in available_mechanisms("synthesize")
        assert isinstance(get_mechanism("toy-clipped-difference", clip=0.5), ToyClippedDifference)
    finally:
        REGISTRY._entries.pop("toy-clipped-difference", None)
    assert "toy-clipped-difference" not in available_mechanisms()


class ToyWithoutClipping(ToyClippedDifference):
    """The toy with its clipping forgotten: it still claims 2c per token."""

    def distribution(self, z: torch.Tensor) -> torch.Tensor:
        return torch.softmax(torch.nan_to_num(z[1], neginf=-math.inf), dim=-1)


def test_the_contract_catches_a_mechanism_that_breaks_its_bound() -> None:
    """The property suite has teeth: the toy without clipping fails the per-step bound on some case."""
    broken = Spec(k=2, params=TOY_SPEC.params, build=lambda v, p: ToyWithoutClipping(**p),
                  released=lambda m, z: m.distribution(z), bound=lambda m, i: (math.inf, 2.0 * m.clip))

    @settings(PROPERTY, max_examples=200, phases=[Phase.generate])  # no shrinking: only the failure matters
    @given(params=broken.params, case=logits_cases(broken.k), seed=st.integers(0, 2**32 - 1))
    def run(params: dict[str, Any], case: tuple[torch.Tensor, torch.Tensor], seed: int) -> None:
        check_step(broken, params, case[0], case[1], seed, 10)

    with pytest.raises(AssertionError):
        run()
