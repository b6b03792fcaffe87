"""PAD's batched computation (:meth:`Pad.step_batch <dpinfer.mechanisms.pad.Pad.step_batch>`): the centre, clip and
noise of many jobs on their public supports at once (one job: the per-job step), row-wise and element-wise
(:mod:`dpinfer.mechanisms.batch`), so a job's release does not depend on the jobs beside it."""

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
    host_tensor,
    host_to_device,
    in_aligned_chunks,
    release_tokens,
    support_width,
    topk_plus_columns,
    whole_vocabulary,
)

SHIFT_LIMIT = 1e6
"""Private logits that are −inf (or absurdly large) on the support are brought to ±this before centring; the clip
makes the value irrelevant."""

ERRORS = {1: "the public row's logits contain NaN or +inf; nothing is released",
           2: "the public row has no finite logit; nothing can be released"}


def pad_support(mechs: Sequence[Any], public: Sequence[torch.Tensor], full: bool | int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """V⁺ of each job from its public row only (``public[b]``: ``(1, V)``, any float dtype): the finite public
    logits ``≥ kth_largest − 2C`` (and ``≥ max + ln min_p``) on the gathered columns (``full``: an int, exactly
    that many: a job redone alone with the size of its Top-k⁺; True: the whole vocabulary; without a top-k, every
    finite public entry on the whole vocabulary, not ranked); ``(ids (n, W) ascending, real (n, W), over (n,): 0, or
    the size of Top-k⁺ when it reaches beyond the gathered columns)``."""
    m0 = mechs[0]
    vocab = public[0].shape[-1]
    if m0.top_k is None:  # and the min-p cut
        pub, ids, real = whole_vocabulary(public)
        if m0.min_p is not None:
            real = real & (pub >= pub.amax(dim=-1, keepdim=True) + math.log(m0.min_p))
        return ids, real, real.new_zeros(real.shape[0])
    margin = host_tensor([2.0 * m.clip_norm for m in mechs], torch.float64, public[0].device).unsqueeze(-1)
    vals, ids, keep, _, over = topk_plus_columns(public, m0.top_k, margin, full)
    if m0.min_p is not None:  # relative to the PUBLIC maximum (the first gathered column)
        keep = keep & (vals >= vals[:, :1] + math.log(m0.min_p))
    sid, real = ascending(ids, keep, vocab)
    return sid, real, over


@dataclass
class _PadRelease:
    noisy: torch.Tensor  # (n, W) ℓ_pub + clip(centre(s)) + σ·N(0, 1) on V⁺ (−inf on the padding)
    ids: torch.Tensor  # (n, W) token ids (ascending; the padding clamped to a valid id)
    size: torch.Tensor  # (n,) |V⁺|
    clipped: torch.Tensor  # (n,) 1.0 when the shift was scaled down (DATA-DEPENDENT)
    code: torch.Tensor  # (n,) 0, or the ERRORS key of the job's refusal
    over: torch.Tensor  # (n,) 0, or |Top-k⁺| when it reaches beyond the gathered columns: redo the job on that many


def _pad_release(mechs: Sequence[Any], logits: Sequence[torch.Tensor], noise: torch.Tensor, full: bool | int
                 ) -> _PadRelease:
    """The noisy release of every job on its V⁺, without a host synchronisation (``noise``: ``(n, W)`` standard
    normals, each job's from its own source)."""
    for z in logits:
        if z.ndim != 2 or z.shape[0] != 2:
            raise InvalidInputError(f"PAD needs logits of shape (2, V), got {tuple(z.shape)}")
    device = logits[0].device
    public = [z[:1] for z in logits]
    sid, real, over = pad_support(mechs, public, full)
    if mechs[0].top_k is None:
        z = torch.stack(list(logits)).to(torch.float64)
    else:
        z = torch.stack([x.index_select(-1, sid[b]) for b, x in enumerate(logits)]).to(torch.float64)
    top = torch.stack([p[0].amax() for p in public]).to(torch.float64)  # the public row is checked whole
    bad = torch.isnan(top) | (top == math.inf)
    no_public = ~real.any(dim=-1)
    clip = host_tensor([m.clip_norm for m in mechs], torch.float64, device).unsqueeze(-1)
    sigma = host_tensor([m.sigma for m in mechs], torch.float64, device).unsqueeze(-1)
    pub = torch.where(real, z[:, 0], torch.zeros_like(z[:, 0]))  # the padding: finite, masked out below
    ctx = torch.where(real, z[:, 1], pub)

    def release(pub: torch.Tensor, ctx: torch.Tensor, real: torch.Tensor, clip: torch.Tensor, sigma: torch.Tensor,
                noise: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return _pad_math(pub, ctx, real, clip, sigma, noise)

    if full is not False:  # a job alone on its whole support, on both paths (or whole vocabularies: exact
        noisy, clipped = release(pub, ctx, real, clip, sigma, noise)  # element-wise operations, sums by cumsum)
    else:
        noisy, clipped = in_aligned_chunks(release, pub, ctx, real, clip, sigma, noise, per_row=4 * pub.shape[-1])
    code = torch.where(bad, 1, torch.where(no_public, 2, 0))
    return _PadRelease(noisy, sid, real.sum(dim=-1), clipped, code, over)


def _pad_math(pub: torch.Tensor, ctx: torch.Tensor, real: torch.Tensor, clip: torch.Tensor, sigma: torch.Tensor,
              noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``ℓ_pub + clip(centre(ℓ_ctx − ℓ_pub), C) + σ·noise`` on the real columns (n, W), −inf on the padding, and
    whether the shift was scaled down (n,): element-wise operations and reductions along the last dimension."""
    s = torch.nan_to_num(ctx - pub, nan=0.0, posinf=SHIFT_LIMIT, neginf=-SHIFT_LIMIT)  # NaN: no shift
    s = s.clamp(-SHIFT_LIMIT, SHIFT_LIMIT).masked_fill(~real, 0.0)
    count = real.sum(dim=-1, keepdim=True).clamp(min=1).to(torch.float64)
    s = (s - _row_sum(s) / count).masked_fill(~real, 0.0)
    norm = torch.sqrt(_row_sum(s * s))
    s = torch.where(norm > clip, s * (clip / norm), s)
    after = torch.sqrt(_row_sum(s * s))[:, 0]
    clipped = (after >= clip[:, 0] * (1 - 1e-12)).to(torch.float64)
    noisy = (pub + s + sigma * noise).masked_fill(~real, -math.inf)
    return noisy, clipped


def _row_sum(x: torch.Tensor) -> torch.Tensor:
    """The sum of each row ``(n, 1)``, added in column order whatever the rows beside it (a cumulative sum: a plain
    ``sum`` of one long row may be split across threads, of many rows not)."""
    return x.cumsum(dim=-1)[:, -1:]


def _pad_draws(mechs: Sequence[Any], srcs: Sequence[Any], width: int, device: Any) -> tuple[torch.Tensor, list[int]]:
    """Per job, from its own source: ``width`` standard normals (one per gathered column, a public count), then at
    τ > 0 one 53-bit integer (0 at τ = 0: unused)."""
    noise, ints = [], []
    for m, src in zip(mechs, srcs, strict=True):
        noise.append(src.normal((width,)).to("cpu", torch.float64))
        ints.append(int(src.integers53(1)[0]) if m.temperature > 0.0 else 0)
    return host_to_device(torch.stack(noise), device), ints


def pad_step(mechs: Sequence[Any], logits: Sequence[torch.Tensor], srcs: Sequence[Any], want: Sequence[bool],
              full: bool | int) -> list[StepResult | Exception]:
    """One token per job: the argmax of its noisy release on V⁺ (ties to the lowest id), or at τ > 0 a draw from
    ``softmax(release/τ)`` with its own 53-bit integer, in one transfer (:func:`~dpinfer.mechanisms.batch.
    release_tokens`; the statistics only for the jobs that ask, ``want``); a job whose V⁺ reaches beyond the gathered
    columns is redone alone on exactly that many columns (the size of its Top-k⁺, public, fetched in the same
    transfer) with fresh draws from its source (a public decision, the same on both paths)."""
    device = logits[0].device
    vocab = logits[0].shape[-1]
    width = min(full, vocab) if not isinstance(full, bool) else support_width(mechs[0].top_k, vocab, full)
    noise, ints = _pad_draws(mechs, srcs, width, device)
    rel = _pad_release(mechs, logits, noise, full)
    probs = None
    if mechs[0].temperature > 0.0:
        temp = host_tensor([m.temperature for m in mechs], torch.float64, device).unsqueeze(-1)
        probs = torch.softmax(rel.noisy / temp, dim=-1)
    return release_tokens(
        rel.ids, rel.code, rel.over, probs=probs, scores=rel.noisy, ints=ints, srcs=srcs, want=want,
        stats=lambda j: (rel.size, rel.clipped), errors=ERRORS,
        redo=lambda b, size: pad_step([mechs[b]], [logits[b]], [srcs[b]], [want[b]], size)[0],
        describe=lambda b, row, _: {"support": row[0], "clipped": row[1]})
