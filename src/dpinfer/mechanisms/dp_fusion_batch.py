"""DP-Fusion's batched computation (:meth:`DPFusion.step_batch <dpinfer.mechanisms.dp_fusion.DPFusion.step_batch>`):
with a top-k support, for B jobs at once (one job: the per-job step). Every operation is row-wise or element-wise
(:mod:`dpinfer.mechanisms.batch`), so a job's figures do not depend on the jobs beside it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dpinfer.errors import InvalidInputError
from dpinfer.mechanisms.base import StepResult
from dpinfer.mechanisms.batch import (
    ascending,
    fixed_bisection_rounds,
    host_tensor,
    in_aligned_chunks,
    release_tokens,
    top_columns,
)
from dpinfer.mechanisms.divergences import symmetric_renyi

_NEG_INF = -math.inf

ERRORS = {1: "the logits contain NaN (or +inf); nothing is sampled",
           2: "the public row has no finite logit; nothing can be sampled"}


def _inverse_temperatures(mechs: Sequence[Any], device: Any) -> torch.Tensor:
    return host_tensor([1.0 / m.temperature for m in mechs], torch.float64, device).unsqueeze(-1)


def batch_support(mechs: Sequence[Any], public: Sequence[torch.Tensor], full: bool
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """S of each job from its public row only (``public[b]``: ``(1, V)``, before temperature, any float dtype):
    top-k (with the margin), min-p and the public floor (:attr:`DPFusion.log_floor`), on the gathered columns;
    ``(ids (B, W) ascending, real (B, W), over (B,))``."""
    m0 = mechs[0]
    vocab = public[0].shape[-1]
    inv_t = _inverse_temperatures(mechs, public[0].device)
    vals, ids, keep, over = top_columns(public, lambda v: v * inv_t, m0.top_k, m0.support_margin, full)
    if m0.min_p is not None:
        keep = keep & (vals >= vals[:, :1] + math.log(m0.min_p))
    lps = torch.log_softmax(vals.masked_fill(~keep, _NEG_INF), dim=-1)
    floor = host_tensor([m.log_floor for m in mechs], torch.float64, vals.device).unsqueeze(-1)
    keep = keep & ~(lps < torch.minimum(floor, lps.amax(dim=-1, keepdim=True)))  # the public mode always stays
    sid, real = ascending(ids, keep, vocab)
    return sid, real, over


@dataclass
class _Mixture:
    probs: torch.Tensor  # (B, W) p_out on the gathered support (0 on the padding)
    ids: torch.Tensor  # (B, W) token ids
    lam: torch.Tensor  # (B, m)
    div: torch.Tensor  # (B, m)
    code: torch.Tensor  # (B,) 0, or the ERRORS key of the job's refusal
    over: torch.Tensor  # (B,) the support reaches beyond the gathered columns: redo the job on the whole vocabulary


def fusion_mixture(mechs: Sequence[Any], logits: Sequence[torch.Tensor], full: bool) -> _Mixture:
    """p_out of every job on its support, λ and the divergences, without a host synchronisation: the λ of every job
    and group in :func:`~dpinfer.mechanisms.batch.fixed_bisection_rounds` rounds of bisection (λ_i is the feasible
    end of a bracket narrower than ``tol/2``; evaluated with :func:`symmetric_renyi` against ``b·(1 − 1e-9)``)."""
    m0 = mechs[0]
    m = m0.num_groups
    for z in logits:
        if z.ndim != 2 or z.shape[0] != m + 1:
            raise InvalidInputError(
                f"DP-Fusion with m = {m} groups needs logits of shape (m + 1, V) = ({m + 1}, V), got {tuple(z.shape)}")
    device = logits[0].device
    inv_t = _inverse_temperatures(mechs, device)
    public = [z[:1] for z in logits]
    sid, real, over = batch_support(mechs, public, full)
    z = torch.stack([x.index_select(-1, sid[b]) for b, x in enumerate(logits)]).to(torch.float64)
    z = (z * inv_t.unsqueeze(-1)).masked_fill(~real.unsqueeze(1), _NEG_INF)
    # a public row is checked whole (its maximum: NaN propagates), a private row on S only (where it is read)
    bad = (torch.isnan(z) | (z == math.inf)).flatten(1).any(dim=-1) | _public_bad(public)
    logp = torch.log_softmax(z, dim=-1)
    no_public = ~(logp[:, 0].amax(dim=-1) > _NEG_INF)
    b = host_tensor([m.bounds for m in mechs], torch.float64, device) * (1.0 - 1e-9)
    order, rounds = m0.enforced_order, fixed_bisection_rounds(m0.tol)

    def solve(logp: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return _fusion_math(logp, b, order, rounds)

    if full:  # a job alone on the whole vocabulary, on both paths: the same layout, no padding needed
        probs, lam, div = solve(logp, b)
    else:
        probs, lam, div = in_aligned_chunks(solve, logp, b, per_row=logp[0].numel())
    code = torch.where(bad, 1, torch.where(no_public, 2, 0))
    return _Mixture(probs, sid, lam, div, code, over)


def _fusion_math(logp: torch.Tensor, b: torch.Tensor, order: float, rounds: int) -> tuple[torch.Tensor, ...]:
    """p_out (B, W), λ (B, m) and the divergences (B, m) from the log-probabilities on S (B, m + 1, W) and the
    bounds (B, m): element-wise and row-wise operations only."""
    m = b.shape[-1]
    lp, lq = logp[:, 0], logp[:, 1:]
    lpx = lp.unsqueeze(1).expand_as(lq)
    lq = torch.where(torch.isnan(lq).any(dim=-1, keepdim=True), lpx, lq)  # no finite private logit on S: q_i = p_pub
    d_one = symmetric_renyi(lq, lpx, order)
    lo, hi = torch.zeros_like(b), torch.ones_like(b)
    d_lo = torch.zeros_like(b)
    # the bisection evaluates D↔ as symmetric_renyi does (the same terms, masks and log-sum-exp, both directions in
    # one call): on S every mixture is finite for λ < 1, and the padding columns are -inf in every row
    pad = ~torch.isfinite(lpx)
    scale = 1.0 / (order - 1.0)
    for _ in range(rounds):
        x = 0.5 * (lo + hi)
        xc = x.unsqueeze(-1)
        lmix = torch.logaddexp(torch.log1p(-xc) + lpx, torch.log(xc) + lq)
        both = torch.stack([order * lmix + (1.0 - order) * lpx, order * lpx + (1.0 - order) * lmix])
        d = torch.logsumexp(both.masked_fill(pad, _NEG_INF), dim=-1).amax(dim=0) * scale
        ok = d <= b
        lo, d_lo, hi = torch.where(ok, x, lo), torch.where(ok, d, d_lo), torch.where(ok, hi, x)
    one = d_one <= b
    lam = torch.where(one, torch.ones_like(lo), lo)
    div = torch.where(one, d_one, d_lo)
    # p_out = (1 − mean λ)·p_pub + Σ_i (λ_i/m)·p_i in log space, the sums over groups written out (batch-invariant)
    total = lam[:, 0]
    for i in range(1, m):
        total = total + lam[:, i]
    terms = [torch.log1p(-(total / m)).unsqueeze(-1) + lp] + [torch.log(lam[:, i] / m).unsqueeze(-1) + lq[:, i]
                                                               for i in range(m)]
    top = terms[0]
    for t in terms[1:]:
        top = torch.maximum(top, t)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    acc = torch.exp(terms[0] - top)
    for t in terms[1:]:
        acc = acc + torch.exp(t - top)
    return torch.exp(top + torch.log(acc)), lam, div


def _public_bad(public: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per job, whether its public row holds a NaN or +inf (its maximum is NaN or +inf: one pass per row)."""
    top = torch.stack([p[0].amax() for p in public])
    return torch.isnan(top) | (top == math.inf)


def fusion_step(mechs: Sequence[Any], logits: Sequence[torch.Tensor], ints: Sequence[int], srcs: Sequence[Any],
                 want: Sequence[bool], full: bool) -> list[StepResult | Exception]:
    """One token per job from its p_out with its own 53-bit integer (``ints[b]``, drawn before: the same draw the
    per-job step makes), in one transfer (:func:`~dpinfer.mechanisms.batch.release_tokens`; λ and the divergences,
    DATA-DEPENDENT, only for the jobs that ask, ``want``); a job whose support reaches beyond the gathered columns is
    redone alone on the whole vocabulary with the same integer."""
    mix = fusion_mixture(mechs, logits, full)
    m = mechs[0].num_groups
    return release_tokens(
        mix.ids, mix.code, mix.over, probs=mix.probs, ints=ints, srcs=srcs, want=want,
        stats=lambda j: (mix.lam, mix.div), errors=ERRORS,
        redo=lambda b, _: fusion_step([mechs[b]], [logits[b]], [ints[b]], [srcs[b]], [want[b]], True)[0],
        describe=lambda b, row, _: {"lambda": row[:m], "divergence": row[m:2 * m]})
