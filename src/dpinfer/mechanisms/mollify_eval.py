"""The divergence evaluations behind the mollification solver (:mod:`dpinfer.mechanisms.mollify`).

For the m groups still being solved, an :class:`Evaluator` gives ``D↔_α((1 − λ)·p_pub + λ·p_i, p_pub)`` at a trial λ,
a first point and an upper end for the bracket, and the Newton quantities of ``G = log(S − 1) − log(e^{(α−1)b} − 1)``
with ``S = max(S_1, S_2)``. :class:`LinearEvaluator` works in linear space (exact closed forms at α = 2, products for
integer α), :class:`LogSpaceEvaluator` in log space for public supports with tiny probabilities;
:func:`evaluator_for` picks one.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from dpinfer.mechanisms.divergences import symmetric_renyi

__all__ = ["LINEAR_FLOOR", "Evaluator", "LinearEvaluator", "LogSpaceEvaluator", "evaluator_for"]

LINEAR_FLOOR = -700.0
"""Mollification evaluates in linear space when ``max(1, α − 1)·log p_pub ≥ −700`` on the support (no overflow or
underflow: e^-700 ≈ 1e-304 is a normal float64), in log space otherwise."""


def evaluator_for(lp: torch.Tensor, lq: torch.Tensor, b: torch.Tensor, alpha: float) -> Evaluator:
    """:class:`LinearEvaluator` when ``max(1, α − 1)·(−log p_pub) ≤ 700`` on the support, else
    :class:`LogSpaceEvaluator` (``lp`` (S,) and ``lq`` (m, S) on the public support, ``b`` (m,) the bounds)."""
    if max(1.0, alpha - 1.0) * -float(lp.min()) <= -LINEAR_FLOOR:
        return LinearEvaluator(lp, lq, b, alpha)
    return LogSpaceEvaluator(lp, lq, b, alpha)


class Evaluator:
    """The divergence evaluations behind :mod:`~dpinfer.mechanisms.mollify`, on the public support, for m groups."""

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


class LinearEvaluator(Evaluator):
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
            # p_i = e^ℓ underflows to 0 in linear space below ℓ ≈ −745 while p_pub ≥ e^-700 there, making the sum
            # +inf or NaN although the true term is finite (p_pub,v = e^-373, p_i,v = e^-746 contributes
            # p_pub²/p_i = 1): re-evaluate those rows exactly in log space
            bad = ~torch.isfinite(d)
            if bool(bad.any()):
                d = torch.where(bad, symmetric_renyi(self.lq, self.lp, self.alpha), d)
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


class LogSpaceEvaluator(Evaluator):
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


