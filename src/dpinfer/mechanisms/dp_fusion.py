"""DP-Fusion: token-level DP for document sanitisation by mollifying each privacy group's distribution (ALGORITHMS §1).

Thareja et al., "DP-Fusion: Token-Level Differentially Private Inference for Large Language
Models" (ICLR 2026, https://openreview.net/forum?id=WLK37mn0El). The document's sensitive spans are tagged into m
privacy groups X_1..X_m. The engine steps m + 1 contexts of the same length together: row 0 is the PUBLIC context
(every tagged token replaced by a placeholder), row i the PRIVATE context of group i (every tagged token replaced
except those of group i). At every step, with ``p_pub`` and ``p_i`` the (temperature-scaled, public-support-truncated)
next-token distributions,

    λ_i = max { λ ∈ [0, 1] : D↔_α((1 − λ)·p_pub + λ·p_i, p_pub) ≤ b_i },      b_i = α·β_i (the paper's convention),
    q_i = (1 − λ_i)·p_pub + λ_i·p_i,         p_out = (1/m)·Σ_i q_i,         x_t ~ p_out,

where ``D_α(P‖Q) = 1/(α−1)·log Σ_v P_v^α Q_v^(1−α)`` and ``D↔_α(P, Q) = max(D_α(P‖Q), D_α(Q‖P))`` (this module's
:func:`renyi_divergence`, :func:`symmetric_renyi`, :func:`mix`, :func:`mollify`).

Privacy. Adjacency is replace-by-null of one group's tagged spans: D′ equals D with the tokens of group i replaced
by placeholders, so ``private_i(D′) = public(D)`` while the public context and every other private context are
unchanged (they already hide group i). Under D′ the mixture for group i is ``p_pub`` itself; the other q_j are the
same. The map ``(P, Q) ↦ Σ_v P_v^α Q_v^(1−α)`` is jointly convex for α > 1 (the perspective of ``t ↦ t^α``), and it
equals 1 for P = Q, so for both orders of the arguments

    D_α(p_out(D) ‖ p_out(D′)) ≤ 1/(α−1) · log( (m−1)/m + e^{(α−1)·b_i}/m )  =  :func:`step_epsilon` (b_i, m, α),

which is ``b_i`` for m = 1. This holds at the order α only. Over at most ``T_max`` tokens, adaptive composition
(Mironov 2017, "Rényi Differential Privacy", Prop. 1) gives ``T_max · step_epsilon`` at order α, converted to (ε, δ)
at that order (Canonne, Kamath & Steinke 2020; Balle et al. 2020): ``ε = T_max·ε_step + log1p(−1/α) −
(log δ + log α)/(α − 1)``. The conversion alone costs ≈ 10.1 at α = 2, δ = 1e-5 and ≈ 1.2 at α = 8.

The guarantee covers the content of the tagged spans, not their existence, positions or token lengths (the
placeholders reveal those), and nothing the tagger missed. Temperature and truncation to a token set S are applied to
every row before mollification, with S computed from the PUBLIC logits only (:class:`~dpinfer.mechanisms.transforms.
PublicSupport`), so the bound is checked on the distributions actually sampled from and S costs nothing.

Numerics. S also drops the tokens whose public probability is below ``e^{(α−1)/α·(−708 + log m + min b)}`` (≈ e^-353
at α = 2; a public choice like top-k), so every mollified row, hence ``p_out``, is ≥ e^-708 on S for every document:
the support of the released distribution is the same public set for adjacent documents. ``p_out`` is formed in log
space (``logsumexp``), and λ is solved against ``b·(1 − 1e-9)`` so that the bound still holds when the divergence is
re-evaluated with other rounding.

The authors' library charges ``4·β_i = 4·b_i/α`` per step (a constant inherited from PMixED's replace-one
analysis); ``accounting="as_published"`` reproduces it and flags the guarantee as such.

The realised λ_i and ``D↔_α(q_i, p_pub)`` returned per step (``StepResult.stats``) are DATA-DEPENDENT diagnostics,
never a privacy guarantee.

>>> import torch
>>> logp_pub = torch.log(torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64))
>>> logp_priv = torch.log(torch.tensor([[0.1, 0.1, 0.8]], dtype=torch.float64))
>>> lam = mollify(logp_pub, logp_priv, [0.05], alpha=2.0)
>>> q = mix(logp_pub, logp_priv, lam)
>>> bool(symmetric_renyi(q, logp_pub, 2.0)[0] <= 0.05), round(float(lam[0]), 4)
(True, 0.1508)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from dpinfer.accounting import GroupGuarantee, Guarantee, PrivacyLoss, SingleOrderRdp, calibrate
from dpinfer.accounting._format import format_up
from dpinfer.errors import ConfigurationError, InfeasibleBudgetError, InvalidInputError
from dpinfer.mechanisms import register
from dpinfer.mechanisms._checks import check_delta, positive_int
from dpinfer.mechanisms.base import Mechanism, StepInfo, StepResult
from dpinfer.mechanisms.randomness import Randomness
from dpinfer.mechanisms.sampler import sample_probs
from dpinfer.mechanisms.transforms import PublicSupport

ADJACENCY = (
    "replace-by-null of one privacy group's tagged spans (the content of the spans is protected; their existence, "
    "positions and token lengths are not)"
)
ADJACENCY_REPLACE_ONE = (
    "replace-one of one privacy group's tagged spans (their content swapped for any other values; existence, "
    "positions and token lengths are not protected)"
)
ADJACENCIES = ("replace-by-null", "replace-one")
ACCOUNTINGS = ("dpinfer", "as_published")

_NEG_INF = -math.inf
_LINEAR_FLOOR = -700.0
"""Mollification evaluates in linear space when ``max(1, α − 1)·log p_pub ≥ −700`` on the support (no overflow or
underflow: e^-700 ≈ 1e-304 is a normal float64), in log space otherwise."""
_MAX_ITER = 200
_SAFETY = 1e-9
"""Relative safety margin: λ is solved against ``b·(1 − 1e-9)``, so that ``D↔_α(q_i, p_pub) ≤ b`` still holds when the
divergence is re-evaluated in another order of floating-point operations (the solver's own evaluation and the
log-space reference differ by up to ~5e-12 relative; fuzz tests check the reference with no slack)."""
_LOG_TINY = -708.0
"""log of a normal float64 (e^-708 ≈ 3e-308): every released probability on the support is at least this."""


# --------------------------------------------------------------------------------------------------------------------
# validation helpers


def _check_alpha(alpha: object) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 1.0 < alpha < math.inf:
        raise ConfigurationError(
            f"the Rényi order α must be a finite number > 1, got {alpha!r} (DP-Fusion's default is α = 2; a larger α, "
            "e.g. 8, lowers the cost of converting the bound to (ε, δ))"
        )
    return float(alpha)




def _groups(value: object) -> int:
    return positive_int(value, "the number of privacy groups m")


def _tokens(value: object) -> int:
    return positive_int(value, "max_new_tokens (T_max)")


def _check_bound(b: object, what: str = "a bound b") -> float:
    if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0.0 <= b < math.inf:
        raise ConfigurationError(f"{what} must be a finite number ≥ 0, got {b!r}")
    return float(b)


def _check_adjacency(adjacency: object, accounting: str = "dpinfer") -> str:
    if adjacency not in ADJACENCIES:
        raise ConfigurationError(
            f"adjacency must be 'replace-by-null' (a group's spans replaced by placeholders; the default) or "
            f"'replace-one' (a group's values swapped for others), got {adjacency!r}"
        )
    if adjacency == "replace-one" and accounting == "as_published":
        raise ConfigurationError(
            "accounting='as_published' reproduces the authors' replace-by-null charge; use accounting='dpinfer' "
            "with adjacency='replace-one'"
        )
    return str(adjacency)


def replace_one_factor(alpha: float) -> float:
    """``(α − ½)/(α − 1) + 1``: under replace-one adjacency a group whose mollified distribution is held within b of
    ``p_pub`` at order 2α (both directions) moves by at most this times b at order α.

    Mironov's weak triangle inequality (Mironov 2017, "Rényi Differential Privacy", Prop. 11) with ``p_pub`` in the
    middle: ``D_α(q‖q′) ≤ (α − ½)/(α − 1)·D_2α(q‖p_pub) + D_{2α−1}(p_pub‖q′)``, and ``D_{2α−1} ≤ D_2α``.

    >>> replace_one_factor(2.0)
    2.5
    """
    a = _check_alpha(alpha)
    return (a - 0.5) / (a - 1.0) + 1.0


def enforcement_order(alpha: float, adjacency: str = "replace-by-null") -> float:
    """The Rényi order at which the mollification bound is enforced: α (replace-by-null) or 2α (replace-one)."""
    a = _check_alpha(alpha)
    return 2.0 * a if _check_adjacency(adjacency) == "replace-one" else a


def _check_accounting(accounting: object) -> str:
    if accounting not in ACCOUNTINGS:
        raise ConfigurationError(
            f"accounting must be 'dpinfer' (this project's analysis) or 'as_published' (the authors' 4·β per step, "
            f"kept for comparison), got {accounting!r}"
        )
    return str(accounting)



# --------------------------------------------------------------------------------------------------------------------
# divergences and mixtures (float64, from log-probabilities)


def renyi_divergence(logp: torch.Tensor, logq: torch.Tensor, alpha: float) -> torch.Tensor:
    """``D_α(P‖Q) = 1/(α−1) · log Σ_v P_v^α Q_v^(1−α)`` along the last dimension, from log-probabilities.

    Computed as ``logsumexp(α·log P + (1−α)·log Q)/(α−1)`` (van Erven & Harremoës 2014, "Rényi Divergence and
    Kullback-Leibler Divergence", Def. 2), never from clamped probabilities. A token with ``P_v = 0`` contributes
    nothing (also where ``Q_v = 0``); a token with ``P_v > 0 = Q_v`` makes the divergence ``+inf``.

    >>> import torch
    >>> p = torch.log(torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64))
    >>> q = torch.log(torch.tensor([0.25, 0.25, 0.5], dtype=torch.float64))
    >>> round(float(renyi_divergence(p, q, 2.0)), 6), float(renyi_divergence(q, p, 2.0))  # log 2, and inf
    (0.693147, inf)
    """
    alpha = _check_alpha(alpha)
    terms = alpha * logp + (1.0 - alpha) * logq
    terms = terms.masked_fill(logp == _NEG_INF, _NEG_INF)
    return torch.logsumexp(terms, dim=-1) / (alpha - 1.0)


def symmetric_renyi(logp: torch.Tensor, logq: torch.Tensor, alpha: float) -> torch.Tensor:
    """``D↔_α(P, Q) = max(D_α(P‖Q), D_α(Q‖P))`` along the last dimension (DP-Fusion's constraint).

    >>> import torch
    >>> p = torch.log(torch.tensor([0.9, 0.1], dtype=torch.float64))
    >>> q = torch.log(torch.tensor([0.5, 0.5], dtype=torch.float64))
    >>> bool(symmetric_renyi(p, q, 2.0) == torch.maximum(renyi_divergence(p, q, 2.0), renyi_divergence(q, p, 2.0)))
    True
    """
    return torch.maximum(renyi_divergence(logp, logq, alpha), renyi_divergence(logq, logp, alpha))


def mix(logp_pub: torch.Tensor, logp_priv: torch.Tensor, lam: float | torch.Tensor) -> torch.Tensor:
    """``log((1 − λ)·p_pub + λ·p_i)``, computed with ``logaddexp``; ``lam`` is a scalar or one λ per private row.

    ``logp_pub`` is ``(V,)`` and ``logp_priv`` is ``(m, V)`` (or ``(V,)``); a λ of shape ``(m,)`` weighs row i by λ_i.

    >>> import torch
    >>> pub = torch.log(torch.tensor([1.0, 0.0], dtype=torch.float64))
    >>> priv = torch.log(torch.tensor([[0.0, 1.0], [0.5, 0.5]], dtype=torch.float64))
    >>> mix(pub, priv, torch.tensor([0.25, 1.0], dtype=torch.float64)).exp()
    tensor([[0.7500, 0.2500],
            [0.5000, 0.5000]], dtype=torch.float64)
    """
    lam_t = torch.as_tensor(lam, dtype=torch.float64, device=logp_priv.device)
    if lam_t.ndim >= 1 and lam_t.ndim == logp_priv.ndim - 1:
        lam_t = lam_t.unsqueeze(-1)
    if bool(((lam_t < 0) | (lam_t > 1) | torch.isnan(lam_t)).any()):
        raise InvalidInputError("λ must lie in [0, 1]")
    return torch.logaddexp(torch.log1p(-lam_t) + logp_pub, torch.log(lam_t) + logp_priv)


# --------------------------------------------------------------------------------------------------------------------
# mollification


def mollify(
    logp_pub: torch.Tensor,
    logp_priv: torch.Tensor,
    bounds: Sequence[float] | torch.Tensor,
    alpha: float = 2.0,
    tol: float = 1e-6,
) -> torch.Tensor:
    """``λ_i = max { λ ∈ [0, 1] : D↔_α((1 − λ)·p_pub + λ·p_i, p_pub) ≤ b_i }`` for every group i, shape ``(m,)``.

    See :func:`mollify_with_divergence`, which also returns the realised divergences.

    >>> import torch
    >>> pub = torch.log(torch.tensor([0.6, 0.4], dtype=torch.float64))
    >>> mollify(pub, pub.unsqueeze(0), [0.01]).tolist()  # identical distributions: nothing to hide
    [1.0]
    """
    return mollify_with_divergence(logp_pub, logp_priv, bounds, alpha, tol)[0]


def mollify_with_divergence(
    logp_pub: torch.Tensor,
    logp_priv: torch.Tensor,
    bounds: Sequence[float] | torch.Tensor,
    alpha: float = 2.0,
    tol: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The mixing weights λ (m,) of :func:`mollify` and the realised ``D↔_α(q_i, p_pub)`` (m,) at those weights.

    Args:
        logp_pub: ``(V,)`` float64 log-probabilities of the public context (``-inf`` outside its support).
        logp_priv: ``(m, V)`` float64 log-probabilities of the m private contexts.
        bounds: ``(m,)`` budgets ``b_i = α·β_i ≥ 0``.
        alpha: the Rényi order α > 1.
        tol: the returned λ_i is within ``tol/2`` of the largest feasible λ.

    Guarantees. Each returned λ_i is feasible as evaluated (``D↔_α(q_i, p_pub) ≤ b_i``; the evaluation agrees with
    :func:`symmetric_renyi` to float rounding, ~1e-15), and either λ_i = 1 or the largest feasible λ is below
    ``λ_i + tol/2``, so ``λ_i + tol`` violates the bound. λ ↦ D↔_α is non-decreasing on [0, 1]: both
    ``S_1 = Σ p_λ^α p_pub^(1−α)`` and ``S_2 = Σ p_pub^α p_λ^(1−α)`` are convex in λ with minimum 1 at λ = 0
    (Thareja et al., Thm 3), so the solver keeps a bracket [lo, hi] with lo evaluated feasible and hi either
    evaluated infeasible or a tangent bound (below).

    Algorithm. Work is restricted to the public support ``{v : p_pub[v] > 0}``: a group with private mass outside it
    gets λ = 0 (then ``D_α(p_λ‖p_pub) = ∞`` for every λ > 0). A group feasible at λ = 1 gets 1. The others are solved
    vectorised across groups (one ``(m, |S|)`` evaluation per iteration) by a safeguarded Newton iteration in
    ``t = log λ`` on ``G = log(S − 1) − log(e^{(α−1)·b} − 1)`` with ``S = max(S_1, S_2)``; since
    ``S − 1 ≈ α(α−1)/2·λ²·χ²`` near 0, G is nearly linear in t. Each Newton point is moved ``tol/4`` towards the
    feasible side; at a feasible point x the tangent of the convex S gives ``λ* ≤ x + (e^{(α−1)b} − S(x))/S′(x)``, which
    closes the bracket without an infeasible evaluation. A Newton point outside the bracket, or a step that fails to
    halve, falls back to bisection; iteration stops when every bracket is narrower than ``tol/2``.

    Starting points. For α = 2, ``D_2(p_λ‖p_pub) = log(1 + λ²·χ²(p_i‖p_pub))`` caps λ at ``sqrt((e^b − 1)/χ²)``; for
    an integer α, ``S_1 − 1 = Σ_k C(α, k)·λ^k·Σ_v p_pub·r_v^k`` (``r = p_i/p_pub − 1``) is a polynomial solved in
    Python floats. The first evaluation is just below that root, and the other direction usually holds there, so one
    evaluation suffices in most steps. Evaluations are in linear space when every
    ``max(1, α − 1)·log p_pub ≥ −700`` on the support (no overflow or underflow; for α = 2 the second direction is
    ``log(1 + λ²·Σ_v d_v²/(p_pub,v + λ·d_v))`` with ``d = p_i − p_pub``, non-negative terms, no transcendental
    function), in log space otherwise.

    >>> import torch
    >>> pub = torch.log(torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64))
    >>> priv = torch.log(torch.tensor([[0.9, 0.1, 0.0], [0.4, 0.4, 0.2]], dtype=torch.float64))
    >>> lam, div = mollify_with_divergence(pub, priv, [0.1, 0.1])
    >>> [round(x, 4) for x in lam.tolist()], [round(x, 4) for x in div.tolist()]  # group 2 leaks outside the support
    ([0.3856, 0.0], [0.1, 0.0])
    """
    alpha = _check_alpha(alpha)
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 1e-12 <= tol <= 0.1:
        raise ConfigurationError(f"tol must lie in [1e-12, 0.1], got {tol!r}")
    if logp_pub.ndim != 1 or logp_priv.ndim != 2 or logp_priv.shape[1] != logp_pub.shape[0]:
        raise InvalidInputError(
            f"mollify needs logp_pub of shape (V,) and logp_priv of shape (m, V), got {tuple(logp_pub.shape)} and "
            f"{tuple(logp_priv.shape)}"
        )
    device = logp_priv.device
    m = logp_priv.shape[0]
    b = torch.as_tensor(bounds, dtype=torch.float64, device=device).reshape(-1)
    if b.shape[0] != m:
        raise InvalidInputError(f"one bound per private row is needed: {m} rows, {b.shape[0]} bounds")
    if not bool(((b >= 0) & torch.isfinite(b)).all()):
        raise ConfigurationError(f"bounds must be finite numbers ≥ 0, got {b.tolist()}")
    lp = logp_pub.to(torch.float64)
    lq = logp_priv.to(torch.float64)

    b = b * (1.0 - _SAFETY)  # the bound must hold after rounding (see _SAFETY)
    lam = torch.zeros(m, dtype=torch.float64, device=device)
    div = torch.zeros(m, dtype=torch.float64, device=device)
    pub_pos = lp > _NEG_INF
    if not bool(pub_pos.any()):
        raise InvalidInputError("the public distribution has no support (every log-probability is -inf)")
    if bool(pub_pos.all()):
        leak = torch.zeros(m, dtype=torch.bool, device=device)
    else:  # restrict to the public support; private mass outside it forces λ = 0
        leak = ((lq > _NEG_INF) & ~pub_pos).any(dim=-1)
        idx = pub_pos.nonzero().squeeze(-1)
        lp, lq = lp.index_select(0, idx), lq.index_select(1, idx)

    if max(1.0, alpha - 1.0) * -float(lp.min()) <= -_LINEAR_FLOOR:
        solver: _Solver = _Linear(lp, lq, b, alpha)
    else:
        solver = _LogSpace(lp, lq, b, alpha)

    one, div_one = solver.feasible_at_one()
    one &= ~leak
    lam = torch.where(one, torch.ones_like(lam), lam)
    div = torch.where(one, div_one, div)
    active = ~one & ~leak & (b > 0)
    if not bool(active.any()):
        return lam, div

    rows = active.nonzero().squeeze(-1)
    lo = torch.zeros(rows.shape[0], dtype=torch.float64, device=device)
    div_lo = torch.zeros_like(lo)
    hi, x = solver.initial(rows)
    last_step = torch.full_like(lo, math.inf)
    for _ in range(_MAX_ITER):
        d_x, cache = solver.value(rows, x)
        feasible = d_x <= b.index_select(0, rows)
        lo = torch.where(feasible, x, lo)
        div_lo = torch.where(feasible, d_x, div_lo)
        hi = torch.where(feasible, hi, x)
        keep = hi - lo > 0.5 * tol
        if not bool(keep.all()):
            lam[rows[~keep]], div[rows[~keep]] = lo[~keep], div_lo[~keep]
            if not bool(keep.any()):
                return lam, div
            rows, lo, hi, x, div_lo = rows[keep], lo[keep], hi[keep], x[keep], div_lo[keep]
            feasible, last_step = feasible[keep], last_step[keep]
        else:
            keep = None
        g_x, slope = solver.newton(cache, keep)
        # S is convex in λ, so from a feasible x its tangent's crossing of e^{(α−1)b} bounds λ* from above:
        # λ* ≤ x + (e^{(α−1)b} − S(x))/S'(x) = x + x·expm1(−G)/(dG/d log λ)
        tangent = x + x * torch.expm1(-g_x) / slope
        use = feasible & (slope > 0) & (tangent >= x)
        hi = torch.where(use, torch.minimum(hi, tangent), hi)
        keep = hi - lo > 0.5 * tol
        if not bool(keep.all()):
            lam[rows[~keep]], div[rows[~keep]] = lo[~keep], div_lo[~keep]
            if not bool(keep.any()):
                return lam, div
            rows, lo, hi, x, div_lo = rows[keep], lo[keep], hi[keep], x[keep], div_lo[keep]
            g_x, slope, last_step = g_x[keep], slope[keep], last_step[keep]
        # Newton step in t = log λ, then tol/4 towards the feasible side, so that the next point is feasible once
        # Newton has converged and the tangent bound above closes the bracket
        x_raw = torch.exp(torch.log(x) - g_x / slope)
        step = (x_raw - x).abs()
        x_new = torch.minimum(torch.maximum(x_raw - 0.25 * tol, lo + 0.0625 * tol), hi - 0.0625 * tol)
        # bisect where Newton is undefined, leaves the bracket, or fails to halve its step
        bisect = ~torch.isfinite(x_raw) | ~(slope > 0) | (x_raw < lo) | (x_raw > hi) | (step > 0.5 * last_step)
        x = torch.where(bisect, 0.5 * (lo + hi), x_new)
        last_step = torch.where(bisect, hi - lo, step)
    lam[rows], div[rows] = lo, div_lo  # pragma: no cover - bisection converges in well under _MAX_ITER steps
    return lam, div


class _Solver:
    """The divergence evaluations behind :func:`mollify_with_divergence`, on the public support, for m groups."""

    def feasible_at_one(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(m,) bool ``D↔_α(p_i, p_pub) ≤ b_i``, and the (m,) divergences (exact where the test was needed)."""
        raise NotImplementedError

    def initial(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """For the active ``rows``: ``hi`` (λ above it is infeasible) and the first point to evaluate."""
        raise NotImplementedError

    def value(self, rows: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """``D↔_α(p_λ, p_pub)`` at λ = x (0 < x < 1) for ``rows``, and what :meth:`newton` needs."""
        raise NotImplementedError

    def newton(self, cache: Any, keep: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``G = log(S − 1) − log(e^{(α−1)b} − 1)`` and ``dG/d log λ`` at the last point, for the rows ``keep``."""
        raise NotImplementedError


def _select(t: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    return t if rows.shape[0] == t.shape[0] else t.index_select(0, rows)


def _keep(t: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    return t if keep is None else t[keep]


def _int_power(u: torch.Tensor, k: int) -> torch.Tensor:
    """``u**k`` for an integer k ≥ 1 by repeated squaring (much faster than ``pow`` for k > 3)."""
    if k <= 3:
        return u.pow(k)
    result: torch.Tensor | None = None
    base = u
    while True:
        if k & 1:
            result = base if result is None else result * base
        k >>= 1
        if not k:
            return result  # type: ignore[return-value]
        base = base * base


def _poly_root(coeffs: list[float], target: float) -> float:
    """The root in (0, 1) of ``P(λ) = Σ_k coeffs[k]·λ^(k+2) = target`` for P convex increasing on [0, 1] with
    P(0) = 0, by safeguarded Newton in Python floats; 1.0 if ``P(1) ≤ target``, NaN if the data are not finite."""

    def p_and_dp(x: float) -> tuple[float, float]:
        val = der = 0.0
        for k in range(len(coeffs) - 1, -1, -1):  # Horner on λ²·Σ c_k λ^k
            der = der * x + val
            val = val * x + coeffs[k]
        return val * x * x, der * x * x + 2.0 * val * x

    if not all(math.isfinite(c) for c in coeffs) or not math.isfinite(target):
        return math.nan
    if p_and_dp(1.0)[0] <= target:
        return 1.0
    lo, hi = 0.0, 1.0
    x = math.sqrt(target / coeffs[0]) if coeffs[0] > 0 else 0.5
    x = x if 0.0 < x < 1.0 else 0.5
    for _ in range(100):
        val, der = p_and_dp(x)
        if val > target:
            hi = x
        else:
            lo = x
        nxt = x - (val - target) / der if der > 0 else math.nan
        if not lo < nxt < hi:
            nxt = 0.5 * (lo + hi)
        if abs(nxt - x) <= 1e-15 * x or hi - lo <= 1e-15:
            return nxt
        x = nxt
    return x


class _Linear(_Solver):
    """Linear space, valid when ``max(1, α − 1)·(−log p_pub) ≤ 700`` on the support (no overflow or underflow).

    With ``r = p_i/p_pub − 1``, ``d = p_i − p_pub = p_pub·r`` and ``u = p_λ/p_pub = 1 + λr``:
    ``S_1 = Σ p_λ^α p_pub^(1−α) = Σ p_pub·u·u^(α−1)`` and ``S_2 = Σ p_pub^α p_λ^(1−α) = Σ p_pub/u^(α−1)``;
    ``u^(α−1) ≤ p_pub^(1−α) ≤ e^700`` and ``1/u^(α−1) ≤ (1 − λ)^(1−α)``. For integer α the powers are products.

    For α = 2: ``S_1 = 1 + λ²·χ²`` exactly (``χ² = Σ d·r``, a closed-form cap on λ), and
    ``S_2 − 1 = λ²·Σ d·r/u`` (from ``Σ d = 0``), a sum of non-negative terms without cancellation.
    """

    def __init__(self, lp: torch.Tensor, lq: torch.Tensor, b: torch.Tensor, alpha: float) -> None:
        self.lp, self.lq, self.b, self.alpha = lp, lq, b, alpha
        p = lp.exp()
        self.p = p
        self.q = lq.exp()
        self.d = self.q - p
        self.r = self.d * torch.reciprocal(p)
        self.dr = self.d * self.r  # p·r² ≥ 0
        self.chi2 = self.dr.sum(dim=-1)
        self.log_target = torch.log(torch.expm1((alpha - 1.0) * b))
        k = alpha - 1.0
        self.int_power = int(k) if k == int(k) and k <= 64 else None

    def feasible_at_one(self) -> tuple[torch.Tensor, torch.Tensor]:
        d_lower = torch.log1p(self.chi2)  # D_2(p_i‖p_pub) = log(1 + χ²) ≤ D_α(p_i‖p_pub) for α ≥ 2
        if self.alpha == 2.0:
            # exact at α = 2, λ = 1: D_2(p_pub‖p_i) = log Σ p_pub²/p_i = log(1 + Σ d²/p_i) (from Σ d = 0), a sum
            # of non-negative terms (+inf where p_i = 0 < p_pub): value() at λ = 1, without the detour through r
            d = torch.maximum(d_lower, torch.log1p((self.d * self.d / self.q).sum(dim=-1)))
            return d <= self.b, d
        if self.alpha >= 2.0:
            maybe = d_lower <= self.b
            if not bool(maybe.any()):
                return maybe, d_lower
        d = symmetric_renyi(self.lq, self.lp, self.alpha)  # exact, in log space
        return d <= self.b, d

    def initial(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = self.alpha
        chi2, c = _select(self.chi2, rows), torch.expm1((a - 1.0) * _select(self.b, rows))
        if a == 2.0:
            cap = torch.sqrt(c / chi2)  # D_2(p_λ‖p_pub) = log1p(λ²χ²) ≤ b  ⟺  λ ≤ cap
            # just below the cap (the closed-form direction then holds with margin), or mid-bracket if cap ≥ 1
            return torch.clamp(cap, max=1.0), torch.where(cap < 1.0, cap * (1.0 - 1e-12), torch.full_like(cap, 0.5))
        if self.int_power is not None and 2 <= self.int_power <= 15:
            # integer α ≤ 16: S_1 − 1 = Σ_{k=2..α} C(α,k)·M_k·λ^k with M_k = Σ p_pub·r^k (M_1 = 0), a polynomial;
            # its root is where D_α(p_λ‖p_pub) = b, the binding direction in practice. Start just below it.
            t = _select(self.dr, rows)
            r = _select(self.r, rows)
            moments = [t.sum(dim=-1)]
            for _ in range(int(a) - 2):
                t = t * r
                moments.append(t.sum(dim=-1))
            coeffs = [[math.comb(int(a), k + 2) * float(mk) for mk in row] for k, row in enumerate(moments)]
            roots = [_poly_root([row[i] for row in coeffs], float(ci)) for i, ci in enumerate(c.tolist())]
            x = torch.tensor(roots, dtype=torch.float64, device=c.device)
            x = torch.where(x < 1.0, x * (1.0 - 1e-12), torch.full_like(x, 0.5))
            return torch.ones_like(x), x
        # S − 1 ≈ A·λ² + B·λ³ near 0, A = α(α−1)/2·χ², B from the third moment Σ p r³ (larger of both directions)
        m3 = (_select(self.dr, rows) * _select(self.r, rows)).sum(dim=-1)
        big_a = 0.5 * a * (a - 1.0) * chi2
        big_b = torch.maximum(a * (a - 1.0) * (a - 2.0) / 6.0 * m3, -a * (a - 1.0) * (a + 1.0) / 6.0 * m3)
        x = torch.sqrt(c / big_a)
        for _ in range(4):
            x = x - (big_a * x * x + big_b * x**3 - c) / (2.0 * big_a * x + 3.0 * big_b * x * x)
        fallback = torch.sqrt(c / big_a)
        x = torch.where(torch.isfinite(x) & (x > 0), x, fallback)
        x = torch.where(torch.isfinite(x) & (x > 0) & (x < 1.0), x, torch.full_like(x, 0.5))
        return torch.ones_like(x), x

    def value(self, rows: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, Any]:
        a = self.alpha
        r = _select(self.r, rows)
        xc = x.unsqueeze(-1)
        u = (r * xc).add_(1.0)
        if a == 2.0:
            w = _select(self.dr, rows) / u
            excess = x * x * w.sum(dim=-1)  # S_2 − 1
            d1 = torch.log1p(x * x * _select(self.chi2, rows))
            d_x = torch.maximum(d1, torch.log1p(excess))
            return d_x, (rows, x, u, w, excess)
        pw = _int_power(u, self.int_power) if self.int_power is not None else u.pow(a - 1.0)  # u^(α−1)
        inv = torch.reciprocal(pw)
        s1 = (u * pw) @ self.p
        s2 = inv @ self.p
        log_s = torch.log(torch.maximum(s1, s2))
        return log_s / (a - 1.0), (rows, x, u, pw, inv, s1, s2)

    def newton(self, cache: Any, keep: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        a = self.alpha
        if a == 2.0:
            rows, x, u, w, excess = (_keep(t, keep) for t in cache)
            r = _select(self.r, rows)
            gp = (w * r / u).sum(dim=-1)  # −(d/dλ) Σ d·r/u
            g_val = torch.log(excess) - _select(self.log_target, rows)
            return g_val, 2.0 - x * gp / (excess / (x * x))
        rows, x, u, pw, inv, s1, s2 = (_keep(t, keep) for t in cache)
        d = _select(self.d, rows)
        first = s1 >= s2
        # dS_1/dλ = α·Σ d·u^(α−1),  dS_2/dλ = (1−α)·Σ d/(u·u^(α−1))
        ds1 = a * (d * pw).sum(dim=-1)
        ds2 = (1.0 - a) * (d * inv / u).sum(dim=-1)
        s, ds = torch.where(first, s1, s2), torch.where(first, ds1, ds2)
        g_val = torch.log(s - 1.0) - _select(self.log_target, rows)
        return g_val, x * ds / (s - 1.0)


class _LogSpace(_Solver):
    """Any α, in log space: ``log u = log(p_λ/p_pub) = log1p(λ·r)``, ``r = expm1(log p_i − log p_pub)``.

    ``log S_1 = logsumexp(log p_pub + α·log u)``, ``log S_2 = logsumexp(log p_pub + (1−α)·log u)``; derivatives use
    ``d log u/dλ = r/u = 1/(1/r + λ)``, finite for r ∈ {−1, 0, ∞}. Where ``r`` may overflow (p_i/p_pub > e^700),
    ``log u = logaddexp(log(1 − λ), log λ + ℓ)``. Used when p_pub has entries too small for linear space.
    """

    def __init__(self, lp: torch.Tensor, lq: torch.Tensor, b: torch.Tensor, alpha: float) -> None:
        self.lp, self.lq, self.b, self.alpha = lp, lq, b, alpha
        self.ell = lq - lp
        self.r = torch.expm1(self.ell)
        self.s = torch.reciprocal(self.r)
        self.big = self.ell > 700.0
        self.any_big = bool(self.big.any())
        self.log_target = torch.log(torch.expm1((alpha - 1.0) * b))

    def feasible_at_one(self) -> tuple[torch.Tensor, torch.Tensor]:
        d = symmetric_renyi(self.lq, self.lp, self.alpha)
        return d <= self.b, d

    def initial(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ell = _select(self.ell, rows)
        # log χ² = logsumexp(log p_pub + 2·log|r|), with log|r| = max(ℓ, 0) + log(1 − e^{−|ℓ|}) (no overflow)
        log_abs_r = torch.clamp(ell, min=0.0) + torch.log(-torch.expm1(-ell.abs()))
        log_chi2 = torch.logsumexp(self.lp + 2.0 * log_abs_r, dim=-1)
        a = self.alpha
        # S − 1 ≈ α(α−1)/2 · λ² · χ² near λ = 0 (both directions)
        x = torch.exp(0.5 * (_select(self.log_target, rows) - log_chi2 - math.log(0.5 * a * (a - 1.0))))
        x = torch.where(torch.isfinite(x) & (x < 1.0) & (x > 0.0), x, torch.full_like(x, 0.5))
        return torch.ones_like(x), x

    def value(self, rows: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, Any]:
        xc = x.unsqueeze(-1)
        logu = torch.log1p(xc * _select(self.r, rows))
        if self.any_big:
            ell = _select(self.ell, rows)
            exact = torch.logaddexp(torch.log1p(-xc), torch.log(xc) + ell)  # log((1 − λ) + λ·e^ℓ), no overflow
            logu = torch.where(_select(self.big, rows), exact, logu)
        a = self.alpha
        log_s, parts = [], []
        for power in (a, 1.0 - a):
            terms = self.lp + power * logu
            top = terms.amax(dim=-1, keepdim=True)
            ex = torch.exp(terms - top)
            total = ex.sum(dim=-1)
            log_s.append(torch.log(total) + top.squeeze(-1))
            parts.append((ex, total))
        first = log_s[0] >= log_s[1]
        log_sm = torch.where(first, log_s[0], log_s[1])
        return log_sm / (a - 1.0), (rows, x, first, log_sm, *parts[0], *parts[1])

    def newton(self, cache: Any, keep: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        rows, x, first, log_sm, ex1, tot1, ex2, tot2 = (_keep(t, keep) for t in cache)
        a = self.alpha
        h = torch.reciprocal(_select(self.s, rows) + x.unsqueeze(-1))  # d log u / dλ
        dlog1 = a * (ex1 * h).sum(dim=-1) / tot1
        dlog2 = (1.0 - a) * (ex2 * h).sum(dim=-1) / tot2
        dlog = torch.where(first, dlog1, dlog2)
        g_val = torch.log(torch.expm1(log_sm)) - _select(self.log_target, rows)
        return g_val, x * dlog / -torch.expm1(-log_sm)


# --------------------------------------------------------------------------------------------------------------------
# accounting


def step_epsilon(bound: float, num_groups: int, alpha: float) -> float:
    """The per-token Rényi loss at order α of one group: ``1/(α−1)·log((m−1)/m + e^{(α−1)·b}/m)`` (b for m = 1).

    By joint convexity of ``Σ P^α Q^(1−α)``: replacing one of the m mollified distributions (each within ``b`` of
    ``p_pub``) by ``p_pub`` itself moves the average ``p_out`` by at most this much, in both directions. Computed as
    ``log1p(expm1((α−1)·b)/m)/(α−1)``.

    >>> step_epsilon(0.05, 1, 2.0)
    0.05
    >>> round(step_epsilon(0.05, 3, 2.0), 10) == round(math.log((2 + math.exp(0.05)) / 3), 10)
    True
    """
    b, m, a = _check_bound(bound), _groups(num_groups), _check_alpha(alpha)
    if m == 1:
        return b
    x = (a - 1.0) * b
    if x > 700.0:  # e^x overflows: log((m−1)/m + e^x/m) = x − log m + log1p((m−1)·e^{−x})
        return (x - math.log(m) + math.log1p((m - 1) * math.exp(-x))) / (a - 1.0)
    return math.log1p(math.expm1(x) / m) / (a - 1.0)


def bound_for_step_epsilon(step_eps: float, num_groups: int, alpha: float) -> float:
    """The inverse of :func:`step_epsilon`: the bound b whose per-token loss is ``step_eps``.

    ``b = log1p(m·expm1((α−1)·ε_step))/(α−1)``.

    >>> b = bound_for_step_epsilon(0.02, 4, 2.0)
    >>> round(step_epsilon(b, 4, 2.0), 12)
    0.02
    """
    e, m, a = _check_bound(step_eps, "a per-step ε"), _groups(num_groups), _check_alpha(alpha)
    if m == 1:
        return e
    x = (a - 1.0) * e
    if x > 700.0:
        return (x + math.log(m) + math.log1p(-math.exp(-x) * (m - 1) / m)) / (a - 1.0)
    return math.log1p(m * math.expm1(x)) / (a - 1.0)


def per_step_rdp(bound: float, num_groups: int, alpha: float, accounting: str = "dpinfer",
                 adjacency: str = "replace-by-null") -> float:
    """The per-token Rényi loss at order α charged to a group with bound b: :func:`step_epsilon` (``"dpinfer"``) or
    the authors' ``4·β = 4·b/α`` (``"as_published"``). Under ``adjacency="replace-one"`` the bound is enforced at
    order 2α and the group's mollified distribution moves by at most ``replace_one_factor(α)·b`` at order α, which
    enters the same mixture formula: ``step_epsilon(replace_one_factor(α)·b, m, α)``.

    >>> per_step_rdp(0.05, 3, 2.0, "as_published")
    0.1
    >>> per_step_rdp(0.05, 1, 2.0, adjacency="replace-one")
    0.125
    """
    accounting = _check_accounting(accounting)
    if _check_adjacency(adjacency, accounting) == "replace-one":
        return step_epsilon(replace_one_factor(alpha) * _check_bound(bound), num_groups, alpha)
    if accounting == "as_published":
        _groups(num_groups)
        return 4.0 * _check_bound(bound) / _check_alpha(alpha)
    return step_epsilon(bound, num_groups, alpha)


def group_loss(
    bound: float, num_groups: int, alpha: float, max_new_tokens: int, accounting: str = "dpinfer",
    adjacency: str = "replace-by-null",
) -> SingleOrderRdp:
    """The ex-ante loss of one group over at most ``T_max`` tokens: ``SingleOrderRdp(α, T_max·ε_step)``."""
    t = _tokens(max_new_tokens)
    return SingleOrderRdp(_check_alpha(alpha), t * per_step_rdp(bound, num_groups, alpha, accounting, adjacency))


def group_guarantees(
    bounds: Sequence[float],
    group_names: Sequence[str],
    *,
    alpha: float,
    delta: float,
    max_new_tokens: int,
    accounting: str = "dpinfer",
    adjacency: str = "replace-by-null",
) -> tuple[GroupGuarantee, ...]:
    """One :class:`~dpinfer.accounting.GroupGuarantee` per privacy group, ex ante (from b_i, m, α, δ and T_max).

    >>> groups = group_guarantees([0.05, 0.1], ["PERSON", "LOC"], alpha=2.0, delta=1e-5, max_new_tokens=100)
    >>> [(g.name, round(g.epsilon, 3)) for g in groups]
    [('PERSON', 12.658), ('LOC', 15.252)]
    """
    if len(bounds) != len(group_names):
        raise ConfigurationError(f"one bound per group is needed: {len(group_names)} names, {len(bounds)} bounds")
    m = _groups(len(bounds))
    delta = check_delta(delta)
    out = []
    for name, b in zip(group_names, bounds, strict=True):
        loss = group_loss(b, m, alpha, max_new_tokens, accounting, adjacency)
        params = {
            "bound": float(b),
            "beta": float(b) / alpha,
            "alpha": float(alpha),
            "step_rdp": per_step_rdp(b, m, alpha, accounting, adjacency),
        }
        if adjacency != "replace-by-null":
            params["adjacency"] = adjacency
            params["enforced_order"] = enforcement_order(alpha, adjacency)
        out.append(GroupGuarantee.from_loss(name, loss, delta=delta, parameters=params))
    return tuple(out)


def calibrate_bound(
    epsilon: float,
    *,
    num_groups: int,
    max_new_tokens: int,
    delta: float = 1e-5,
    alpha: float = 2.0,
    accounting: str = "dpinfer",
    group: str = "",
    adjacency: str = "replace-by-null",
) -> float:
    """The largest bound b whose group guarantee over ``max_new_tokens`` tokens is at most ``(epsilon, delta)``.

    Raises :class:`~dpinfer.errors.InfeasibleBudgetError` with the smallest reachable ε when even b → 0 misses the
    target (the single-order conversion costs ``log1p(−1/α) − (log δ + log α)/(α − 1)`` on its own).

    >>> b = calibrate_bound(20.0, num_groups=3, max_new_tokens=100)
    >>> round(b, 4), group_loss(b, 3, 2.0, 100).to_epsilon(1e-5) <= 20.0
    (0.271, True)
    """
    m, t = _groups(num_groups), _tokens(max_new_tokens)
    alpha, delta, accounting = _check_alpha(alpha), check_delta(delta), _check_accounting(accounting)
    adjacency = _check_adjacency(adjacency, accounting)
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not 0.0 < epsilon < math.inf:
        raise ConfigurationError(f"the target ε must be a finite number > 0, got {epsilon!r}")
    name = f"bound b of group {group}" if group else "bound b"

    def loss(b: float) -> PrivacyLoss:
        return SingleOrderRdp(alpha, t * per_step_rdp(b, m, alpha, accounting, adjacency))

    hi = 1.0
    while loss(hi).to_epsilon(delta) <= epsilon and hi < 1e6:
        hi *= 2.0
    try:
        b = calibrate(loss, epsilon=epsilon, delta=delta, lo=0.0, hi=hi, increasing=True, name=name)
    except InfeasibleBudgetError as err:
        raise InfeasibleBudgetError(_infeasible_message(epsilon, delta, alpha, t, group)) from err
    if not b > 0.0:
        raise InfeasibleBudgetError(_infeasible_message(epsilon, delta, alpha, t, group))
    return b


def conversion_cost(alpha: float, delta: float) -> float:
    """What converting a Rényi bound held at the single order α to (ε, δ) costs on its own (Canonne, Kamath & Steinke
    2020): ``log1p(−1/α) − (log δ + log α)/(α − 1)``; the infimum of every reachable DP-Fusion ε at that α and δ.

    >>> round(conversion_cost(2.0, 1e-5), 4), round(conversion_cost(8.0, 1e-5), 4)
    (10.1266, 1.2141)
    """
    alpha, delta = _check_alpha(alpha), check_delta(delta)
    return math.log1p(-1.0 / alpha) - (math.log(delta) + math.log(alpha)) / (alpha - 1.0)


def _infeasible_message(epsilon: float, delta: float, alpha: float, max_new_tokens: int, group: str) -> str:
    floor = conversion_cost(alpha, delta)
    other = 8.0 if alpha < 8.0 else 4.0 * alpha
    who = f"group {group}" if group else "a privacy group"
    return (
        f"DP-Fusion cannot give {who} ε = {epsilon:g} at δ = {delta:g} over {max_new_tokens} tokens: the smallest "
        f"reachable ε is {format_up(floor, 4)} at α = {alpha:g}, the cost of converting a Rényi bound held at that "
        f"single order to (ε, δ) before any token is generated. Ask for ε > {format_up(floor, 4)}, a larger δ, or "
        f"enforce the bound at a larger α (the conversion costs {format_up(conversion_cost(other, delta), 3)} at "
        f"α = {other:g})."
    )


def _sample(probs: torch.Tensor, generator: Randomness) -> torch.Tensor:
    """One index drawn from the 1-D ``probs`` (≥ 0, not normalised) with one uniform from ``generator``
    (:func:`~dpinfer.mechanisms.sampler.sample_probs`, the sampler every dpinfer mechanism shares)."""
    return sample_probs(probs, generator)


# --------------------------------------------------------------------------------------------------------------------
# the mechanism


@register(
    "dp-fusion",
    tasks=("sanitize",),
    summary="DP-Fusion: per-group mollified mixture of public and private contexts",
)
class DPFusion(Mechanism):
    """DP-Fusion (Thareja et al.): mollify each privacy group's distribution towards the public one, average, sample.

    Row 0 of the logits is the public context, row i (1 ≤ i ≤ m) the private context of group ``group_names[i−1]``.
    Per step: temperature, then truncation to a support S computed from row 0 only (``top_k``/``top_p``/
    ``support_margin``, as :class:`~dpinfer.mechanisms.transforms.PublicSupport`; without truncation, the public
    row's finite entries, which differ from the vocabulary when a processor bans tokens), applied to every row; then
    ``λ_i = max{λ : D↔_α((1−λ)p_pub + λp_i, p_pub) ≤ b_i}`` (:func:`mollify`) and one token drawn from
    ``p_out = (1/m)·Σ_i ((1−λ_i)p_pub + λ_i p_i)``.

    Args:
        bounds: ``b_i = α·β_i > 0``, one per group (the paper's αβ ∈ {0.01 … 0.10}).
        group_names: one distinct name per group (e.g. ``"PERSON"``), in the order of the private rows.
        alpha: the Rényi order α > 1 at which the bound is enforced and accounted.
        temperature: τ > 0 (DP-Fusion must sample: greedy decoding has no DP guarantee).
        top_k, top_p, support_margin: public-side truncation (``support_margin`` widens a top-k set by that many
            logits, after temperature).
        delta: δ of the reported guarantee.
        accounting: ``"dpinfer"`` (:func:`step_epsilon` per token) or ``"as_published"`` (the authors' 4·β).
        tol: mollification tolerance on λ.
        adjacency: ``"replace-by-null"`` (default; ALGORITHMS §1) or ``"replace-one"`` (a group's values swapped
            for others): the bound is then enforced at order 2α and each group is charged
            ``step_epsilon(replace_one_factor(α)·b_i, m, α)`` per token (:func:`per_step_rdp`).

    ``StepResult.stats`` holds the realised ``"lambda"`` and ``"divergence"`` (``D↔_α(q_i, p_pub)`` at the enforced
    order) per group:
    DATA-DEPENDENT diagnostics that must not be reported as ε.

    >>> import torch
    >>> from dpinfer.mechanisms.base import StepInfo
    >>> mech = DPFusion(bounds=[0.05, 0.05], group_names=["PERSON", "LOC"], temperature=0.8, top_k=3)
    >>> mech.start(num_contexts=3, vocab_size=5)
    >>> z = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0],
    ...                   [0.0, 3.0, 0.5, 0.0, 9.0],
    ...                   [2.0, 1.0, 2.5, 0.0, -1.0]], dtype=torch.float64)
    >>> out = mech.step(z, StepInfo(step=0, max_new_tokens=100, num_contexts=3), torch.Generator().manual_seed(0))
    >>> int(out.tokens) in (0, 1, 2), [round(x, 3) for x in out.stats["lambda"]]
    (True, [0.122, 0.144])
    >>> g = mech.guarantee(max_new_tokens=100)
    >>> round(g.epsilon, 3), g.order, [group.name for group in g.groups]
    (12.658, 2.0, ['PERSON', 'LOC'])
    """

    name = "dp-fusion"
    mode = "joint"

    def __init__(
        self,
        *,
        bounds: Sequence[float],
        group_names: Sequence[str],
        alpha: float = 2.0,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        support_margin: float = 0.0,
        delta: float = 1e-5,
        accounting: str = "dpinfer",
        tol: float = 1e-6,
        adjacency: str = "replace-by-null",
    ) -> None:
        if isinstance(bounds, (str, bytes)) or not isinstance(bounds, Sequence) or len(bounds) == 0:
            raise ConfigurationError(
                f"bounds must be a non-empty sequence with one b_i = α·β_i > 0 per privacy group, got {bounds!r}"
            )
        for b in bounds:
            if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0.0 < b < math.inf:
                raise ConfigurationError(
                    f"every bound b_i = α·β_i must be a finite number > 0, got {list(bounds)!r} (the paper uses "
                    "αβ between 0.01 and 0.10; use DPFusion.calibrated(...) to derive them from a target ε)"
                )
        if isinstance(group_names, (str, bytes)) or not isinstance(group_names, Sequence):
            raise ConfigurationError(f"group_names must be a sequence of names, got {group_names!r}")
        names = list(group_names)
        if len(names) != len(bounds):
            raise ConfigurationError(
                f"group_names and bounds must have the same length (one bound per privacy group), got "
                f"{len(names)} names and {len(bounds)} bounds"
            )
        if not all(isinstance(n, str) and n for n in names):
            raise ConfigurationError(f"group names must be non-empty strings, got {names!r}")
        if len(set(names)) < len(names):
            raise ConfigurationError(f"group names must be distinct, got {names!r}")
        self.alpha = _check_alpha(alpha)
        if (
            isinstance(temperature, bool)
            or not isinstance(temperature, (int, float))
            or not (math.isfinite(temperature) and temperature > 0)
        ):
            raise ConfigurationError(
                f"temperature must be a finite number > 0, got {temperature!r}: DP-Fusion must sample from the "
                "mollified mixture; greedy decoding (τ = 0) is a deterministic function of the private contexts and "
                "has no DP guarantee. For readable text from a small model use e.g. temperature=0.7 with top_k."
            )
        if support_margin and top_k is None:
            raise ConfigurationError(
                f"support_margin={support_margin!r} widens a top-k support; set top_k as well (or leave the margin 0)"
            )
        self.support = PublicSupport(top_k=top_k, top_p=top_p, margin=support_margin)
        self.delta = check_delta(delta)
        self.accounting = _check_accounting(accounting)
        self.adjacency = _check_adjacency(adjacency, self.accounting)
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 1e-12 <= tol <= 0.1:
            raise ConfigurationError(f"tol must lie in [1e-12, 0.1], got {tol!r}")
        self.bounds = tuple(float(b) for b in bounds)
        self.group_names = tuple(names)
        self.temperature = float(temperature)
        self.top_k, self.top_p, self.support_margin = top_k, top_p, float(support_margin)
        self.tol = float(tol)
        self._bounds_t: torch.Tensor | None = None
        a = self.enforced_order
        # log q_i ≥ α/(α−1)·log p_pub − b_i for every mollified row (one term of D_α(p_pub‖q_i) ≤ b_i), so on tokens
        # with log p_pub ≥ this floor every q_i, hence p_out, stays ≥ e^-708 > 0 for EVERY document: the released
        # support is a public set, identical for adjacent documents (no underflow makes supports differ)
        self.log_floor = min((a - 1.0) / a * (_LOG_TINY + math.log(len(self.bounds)) + min(self.bounds)), -1e-3)

    @property
    def num_groups(self) -> int:
        """m, the number of privacy groups (the engine steps m + 1 contexts)."""
        return len(self.bounds)

    @property
    def enforced_order(self) -> float:
        """The order at which λ_i holds the bound: α, or 2α under replace-one adjacency."""
        return enforcement_order(self.alpha, self.adjacency)

    @property
    def betas(self) -> tuple[float, ...]:
        """β_i = b_i/α, the paper's per-group budget."""
        return tuple(b / self.alpha for b in self.bounds)

    @classmethod
    def calibrated(
        cls,
        group_epsilon: Mapping[str, float],
        *,
        max_new_tokens: int,
        delta: float = 1e-5,
        alpha: float = 2.0,
        accounting: str = "dpinfer",
        adjacency: str = "replace-by-null",
        **kw: Any,
    ) -> DPFusion:
        """The DP-Fusion mechanism whose group i meets ``(group_epsilon[i], delta)`` over ``max_new_tokens`` tokens.

        Each b_i is the largest bound with ``SingleOrderRdp(α, T_max·step_epsilon(b_i, m, α)).to_epsilon(δ) ≤ ε_i``
        (:func:`dpinfer.accounting.calibrate`), i.e. exactly the loss :meth:`guarantee` reports. A target below the
        single-order conversion cost (≈ 10.1 at α = 2, δ = 1e-5) raises
        :class:`~dpinfer.errors.InfeasibleBudgetError` with the smallest reachable ε. Other keyword arguments go to
        the constructor.

        >>> mech = DPFusion.calibrated({"PERSON": 15.0, "CODE": 12.0}, max_new_tokens=200)
        >>> [round(b, 4) for b in mech.bounds], mech.guarantee(200).epsilon <= 15.0
        ([0.0482, 0.0186], True)
        """
        if not isinstance(group_epsilon, Mapping) or len(group_epsilon) == 0:
            raise ConfigurationError(
                f"group_epsilon must map each privacy group's name to its target ε, got {group_epsilon!r}"
            )
        m = len(group_epsilon)
        bounds = []
        for name, eps in group_epsilon.items():
            if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0.0 < eps < math.inf:
                raise ConfigurationError(f"the target ε of group {name!r} must be a finite number > 0, got {eps!r}")
            bounds.append(
                calibrate_bound(
                    eps,
                    num_groups=m,
                    max_new_tokens=max_new_tokens,
                    delta=delta,
                    alpha=alpha,
                    accounting=accounting,
                    group=str(name),
                    adjacency=adjacency,
                )
            )
        return cls(
            bounds=bounds, group_names=list(group_epsilon), alpha=alpha, delta=delta, accounting=accounting,
            adjacency=adjacency, **kw
        )

    def start(self, num_contexts: int, vocab_size: int) -> None:
        m = self.num_groups
        if num_contexts != m + 1:
            raise ConfigurationError(
                f"DP-Fusion with m = {m} privacy groups ({', '.join(self.group_names)}) steps m + 1 = {m + 1} contexts "
                f"(row 0 public, row i the private context of group i), got {num_contexts}; build one private "
                "context per group, in the order of group_names"
            )

    def _scaled(self, logits: torch.Tensor) -> torch.Tensor:
        z = logits.to(torch.float64)
        return z * (1.0 / self.temperature) if self.temperature != 1.0 else z

    def _support_ids(self, z_pub: torch.Tensor) -> torch.Tensor | None:
        """The ids of S from the public row (after temperature) only; ``None`` for the whole vocabulary. Without
        truncation S is the public row's finite entries (e.g. EOS banned for every row alike): a public choice,
        applied to every row like a top-k support, so the solver works on a full support."""
        if not self.support.is_full:
            keep = self.support.mask(z_pub)
        elif bool((z_pub == _NEG_INF).any()):
            keep = z_pub > _NEG_INF
        else:
            keep = None
        # public-only floor: drop tokens whose PUBLIC probability on S is below e^log_floor (at most e^-353 at α = 2),
        # so that every released probability is a normal float > 0 on S for every document (see log_floor)
        zs = z_pub if keep is None else z_pub.masked_fill(~keep, _NEG_INF)
        lps = torch.log_softmax(zs, dim=-1)
        low = lps < min(self.log_floor, float(lps.max()))  # the public mode always stays
        if keep is None:
            if not bool(low.any()):
                return None
            keep = ~low
        else:
            keep = keep & ~low
        return keep.nonzero().squeeze(-1)

    def private_columns(self, public_scores: torch.Tensor) -> torch.Tensor | None:
        """The ids of the public support S, exactly as :meth:`step` computes it: the private rows are read there and
        nowhere else."""
        return self._support_ids(self._scaled(public_scores))

    @property
    def restricts_private_columns(self) -> bool:
        return not self.support.is_full

    def _mixture(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """``p_out`` on the public support S, the ids of S (None for the full vocabulary), λ and the divergences."""
        m = self.num_groups
        if logits.ndim != 2 or logits.shape[0] != m + 1:
            raise InvalidInputError(
                f"DP-Fusion with m = {m} groups needs logits of shape (m + 1, V) = ({m + 1}, V), got "
                f"{tuple(logits.shape)}"
            )
        z = self._scaled(logits)
        if bool(torch.isnan(z.sum(dim=-1)).any()):  # a NaN (or +inf next to -inf) anywhere makes its row sum NaN
            raise InvalidInputError("the logits contain NaN (or +inf); nothing is sampled")
        idx = self._support_ids(z[0])  # S from the public row only, applied to every row
        if idx is not None:
            z = z.index_select(1, idx)
        logp = torch.log_softmax(z, dim=-1)
        lp, lq = logp[0], logp[1:]
        if not bool(lp.max() > _NEG_INF):  # NaN (no finite public logit) compares False
            raise InvalidInputError("the public row has no finite logit; nothing can be sampled")
        undefined = torch.isnan(lq[:, :1])  # a private row with no finite logit on S is NaN throughout
        if bool(undefined.any()):
            lq = torch.where(undefined, lp.expand_as(lq), lq)  # use p_pub: then q_i = p_pub whatever λ_i
        if self._bounds_t is None or self._bounds_t.device != lq.device:
            self._bounds_t = torch.tensor(self.bounds, dtype=torch.float64, device=lq.device)
        lam, div = mollify_with_divergence(lp, lq, self._bounds_t, self.enforced_order, self.tol)
        # p_out = (1/m)·Σ_i ((1 − λ_i)·p_pub + λ_i·p_i) = (1 − mean λ)·p_pub + Σ_i (λ_i/m)·p_i, formed in log space
        # (a linear-space sum underflows where p_pub < e^-745 while λ_i·p_i > 0, and supports would differ)
        terms = torch.cat([(torch.log1p(-lam.mean()) + lp).unsqueeze(0), (torch.log(lam / m).unsqueeze(-1) + lq)])
        probs = torch.logsumexp(terms, dim=0).exp()
        return probs, idx, lam, div

    def distribution(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The released distribution ``p_out`` over the full vocabulary (V,), with λ (m,) and ``D↔_α(q_i, p_pub)``
        (m,) for the ``(m + 1, V)`` logits: what :meth:`step` samples from. λ and the divergences are
        DATA-DEPENDENT."""
        probs, idx, lam, div = self._mixture(logits)
        if idx is not None:
            probs = torch.zeros(logits.shape[1], dtype=torch.float64, device=probs.device).index_copy_(0, idx, probs)
        return probs, lam, div

    def step(self, logits: torch.Tensor, info: StepInfo, generator: Randomness) -> StepResult:
        """Sample one token from ``p_out`` with ``generator``; stats hold the DATA-DEPENDENT λ and divergences."""
        probs, idx, lam, div = self._mixture(logits)
        j = _sample(probs, generator)
        token = idx[j] if idx is not None else j
        return StepResult(tokens=token.to(torch.long), stats={"lambda": lam.tolist(), "divergence": div.tolist()})

    def group_guarantees(self, max_new_tokens: int) -> tuple[GroupGuarantee, ...]:
        """One ex-ante guarantee per group over at most ``max_new_tokens`` tokens."""
        return group_guarantees(
            self.bounds,
            self.group_names,
            alpha=self.alpha,
            delta=self.delta,
            max_new_tokens=max_new_tokens,
            accounting=self.accounting,
            adjacency=self.adjacency,
        )

    def guarantee(self, max_new_tokens: int) -> Guarantee:
        """(ε, δ) per group at order α from b_i, m, α, δ and T_max only; the headline is the worst group."""
        t = _tokens(max_new_tokens)
        groups = self.group_guarantees(t)
        worst_loss = max(
            (group_loss(b, self.num_groups, self.alpha, t, self.accounting, self.adjacency) for b in self.bounds),
            key=lambda loss: loss.epsilon,
        )
        return Guarantee.from_loss(
            worst_loss,
            delta=self.delta,
            mechanism=self.name,
            adjacency=ADJACENCY if self.adjacency == "replace-by-null" else ADJACENCY_REPLACE_ONE,
            parameters={
                "alpha": self.alpha,
                "bounds": dict(zip(self.group_names, self.bounds, strict=True)),
                "beta": dict(zip(self.group_names, self.betas, strict=True)),
                "num_groups": self.num_groups,
                "temperature": self.temperature,
                "top_k": self.top_k,
                "top_p": self.top_p,
                "support_margin": self.support_margin,
                "T_max": t,
                "tol": self.tol,
                "adjacency": self.adjacency,
                "enforced_order": self.enforced_order,
            },
            max_new_tokens=t,
            groups=groups,
            accounting=self.accounting,
        )
