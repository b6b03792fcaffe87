"""The mollification root solver of DP-Fusion and AdaPMixED: the largest λ that keeps a mixture within a Rényi bound.

For a public distribution ``p_pub`` and m private distributions ``p_i``, :func:`mollify_with_divergence` returns, for
every i at once (vectorised across groups),

    λ_i = max { λ ∈ [0, 1] : D↔_α((1 − λ)·p_pub + λ·p_i, p_pub) ≤ b_i },

and the realised divergence at that λ_i. The divergences are evaluated by :mod:`dpinfer.mechanisms.mollify_eval` (in
linear space when the public probabilities on the support are not too small, in log space otherwise); the solver keeps
the bracket invariant described in :func:`mollify_with_divergence`. λ and the divergences are DATA-DEPENDENT (they
read the private rows): a mechanism uses them to form its output, never to state its guarantee.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from dpinfer.checks import check_alpha
from dpinfer.errors import ConfigurationError, InvalidInputError
from dpinfer.mechanisms.mollify_eval import Evaluator, evaluator_for

__all__ = ["check_tol", "mollify", "mollify_with_divergence"]

_NEG_INF = -math.inf
_MAX_ITER = 200
_SAFETY = 1e-9
"""Relative safety margin: λ is solved against ``b·(1 − 1e-9)``, so that ``D↔_α(q_i, p_pub) ≤ b`` still holds when the
divergence is re-evaluated in another order of floating-point operations (the solver's own evaluation and the
log-space reference differ by up to ~5e-12 relative; fuzz tests check the reference with no slack)."""


def check_tol(tol: object) -> float:
    """The solver tolerance on λ, in [1e-12, 0.1].

    >>> check_tol(1e-6)
    1e-06
    """
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 1e-12 <= tol <= 0.1:
        raise ConfigurationError(f"tol must lie in [1e-12, 0.1], got {tol!r}")
    return float(tol)


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
    alpha, tol = check_alpha(alpha, "the Rényi order α", "", label=""), check_tol(tol)
    lp, lq, b = _checked_inputs(logp_pub, logp_priv, bounds)
    b = b * (1.0 - _SAFETY)  # the bound must hold after rounding (see _SAFETY)
    lam = torch.zeros_like(b)
    div = torch.zeros_like(b)
    lp, lq, leak = _public_support(lp, lq)
    solver = evaluator_for(lp, lq, b, alpha)

    one, div_one = solver.feasible_at_one()
    one &= ~leak
    lam = torch.where(one, torch.ones_like(lam), lam)
    div = torch.where(one, div_one, div)
    active = ~one & ~leak & (b > 0)
    if bool(active.any()):
        _solve(solver, lam, div, b, active.nonzero().squeeze(-1), tol)
    return lam, div


def _checked_inputs(
    logp_pub: torch.Tensor, logp_priv: torch.Tensor, bounds: Sequence[float] | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The public and private log-probabilities (float64) and the bounds (m,), their shapes and values checked."""
    if logp_pub.ndim != 1 or logp_priv.ndim != 2 or logp_priv.shape[1] != logp_pub.shape[0]:
        raise InvalidInputError(
            f"mollify needs logp_pub of shape (V,) and logp_priv of shape (m, V), got {tuple(logp_pub.shape)} and "
            f"{tuple(logp_priv.shape)}"
        )
    m = logp_priv.shape[0]
    b = torch.as_tensor(bounds, dtype=torch.float64, device=logp_priv.device).reshape(-1)
    if b.shape[0] != m:
        raise InvalidInputError(f"one bound per private row is needed: {m} rows, {b.shape[0]} bounds")
    if not bool(((b >= 0) & torch.isfinite(b)).all()):
        raise ConfigurationError(f"bounds must be finite numbers ≥ 0, got {b.tolist()}")
    return logp_pub.to(torch.float64), logp_priv.to(torch.float64), b


def _public_support(lp: torch.Tensor, lq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``lp`` and ``lq`` restricted to the public support, and the rows (m,) with private mass outside it (their
    λ is 0)."""
    pub_pos = lp > _NEG_INF
    if not bool(pub_pos.any()):
        raise InvalidInputError("the public distribution has no support (every log-probability is -inf)")
    if bool(pub_pos.all()):
        return lp, lq, torch.zeros(lq.shape[0], dtype=torch.bool, device=lq.device)
    leak = ((lq > _NEG_INF) & ~pub_pos).any(dim=-1)
    idx = pub_pos.nonzero().squeeze(-1)
    return lp.index_select(0, idx), lq.index_select(1, idx), leak


def _solve(
    solver: Evaluator, lam: torch.Tensor, div: torch.Tensor, b: torch.Tensor, rows: torch.Tensor, tol: float
) -> None:
    """The safeguarded Newton iteration of :func:`mollify_with_divergence` for ``rows``: writes their λ and
    divergence into ``lam`` and ``div``."""
    device = lam.device
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
        keep, (rows, lo, hi, div_lo, x, feasible, last_step) = _settle(
            lam, div, tol, rows, lo, hi, div_lo, x, feasible, last_step
        )
        if rows.numel() == 0:
            return
        g_x, slope = solver.newton(cache, keep)
        # S is convex in λ, so from a feasible x its tangent's crossing of e^{(α−1)b} bounds λ* from above:
        # λ* ≤ x + (e^{(α−1)b} − S(x))/S'(x) = x + x·expm1(−G)/(dG/d log λ)
        tangent = x + x * torch.expm1(-g_x) / slope
        use = feasible & (slope > 0) & (tangent >= x)
        hi = torch.where(use, torch.minimum(hi, tangent), hi)
        _, (rows, lo, hi, div_lo, x, g_x, slope, last_step) = _settle(
            lam, div, tol, rows, lo, hi, div_lo, x, g_x, slope, last_step
        )
        if rows.numel() == 0:
            return
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


def _settle(
    lam: torch.Tensor,
    div: torch.Tensor,
    tol: float,
    rows: torch.Tensor,
    lo: torch.Tensor,
    hi: torch.Tensor,
    div_lo: torch.Tensor,
    *others: torch.Tensor,
) -> tuple[torch.Tensor | None, tuple[torch.Tensor, ...]]:
    """Retire the groups whose bracket is narrower than ``tol/2``: their feasible end ``lo`` and its divergence go
    into ``lam`` and ``div`` (in place). Returns the mask of the groups still active (None when all are) and
    ``(rows, lo, hi, div_lo, *others)`` restricted to them (``rows`` is empty once every group is settled)."""
    keep = hi - lo > 0.5 * tol
    if bool(keep.all()):
        return None, (rows, lo, hi, div_lo, *others)
    lam[rows[~keep]], div[rows[~keep]] = lo[~keep], div_lo[~keep]
    return keep, tuple(t[keep] for t in (rows, lo, hi, div_lo, *others))
