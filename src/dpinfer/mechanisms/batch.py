"""What the batched decisions share (:meth:`Mechanism.step_batch <dpinfer.mechanisms.base.Mechanism.step_batch>`):
a public top-k support for many rows at once, the exact CDF inversion of many rows with one 53-bit integer each, and
the one device-to-host transfer of a step.

Batch invariance. Every operation here is row-wise (``topk``, ``sort``, ``log_softmax``, ``cumsum``,
``searchsorted`` along the last dimension; element-wise arithmetic; sums over a fixed number of tensors written out
as a loop), so a row's result is bit for bit the same whatever rows sit beside it. A mechanism's per-job ``step``
runs the same kernel on a batch of one: the batched path releases the per-job path's tokens for the same seeds.

Why the rows are padded. On the CPU an element-wise kernel computes the bulk of a contiguous tensor with SIMD
instructions and its last ``numel mod (2 · lanes)`` elements with scalar code (2 · lanes: 8 float64 values with
AVX2, 16 with AVX-512), and a transcendental function (exp,
log, log1p) may round differently in the two: a row's figures would depend on how many rows came before it. The
batched computations therefore run on row counts padded to a multiple of :data:`ROW_ALIGN` (zero rows, dropped after)
in chunks small enough to run on one thread (:data:`MAX_CHUNK_ELEMENTS`): every element takes the SIMD path, on the
per-job path (a batch of one, padded alike) as on the batched one. Row-wise kernels (softmax, log-softmax,
reductions along the last dimension) treat every row alike already.

Support widths. A top-k support is gathered on ``W = min(k + SUPPORT_SLACK, V)`` columns, the ``W`` largest public
logits; when the ``W``-th still belongs to the support (ties or a margin reaching that far), the row is redone on the
whole vocabulary (``W = V``), alone: a public, per-row decision, the same on both paths.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from dpinfer.errors import ConfigurationError, InvalidInputError
from dpinfer.mechanisms.base import StepResult
from dpinfer.mechanisms.randomness import TWO_M53, Randomness, RandomSource, as_random_source

SUPPORT_SLACK = 8
"""Columns gathered beyond ``top_k`` so that ties at the k-th logit (kept by every top-k here) fit without a second
pass; a row whose support reaches the last gathered column is redone on the whole vocabulary."""

_TINY = 2.0**-900
_HUGE = 2.0**1000


def support_width(top_k: int | None, vocab: int, full: bool = False) -> int:
    """Columns gathered for a top-k support (the whole vocabulary without top-k or when ``full``)."""
    if top_k is None or full:
        return vocab
    return min(top_k + SUPPORT_SLACK, vocab)


def top_columns(parts: Sequence[torch.Tensor], scale: Callable[[torch.Tensor], torch.Tensor], top_k: int,
                margin: float | torch.Tensor, full: bool = False, width: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The top-k support of every row of ``parts`` (tensors ``(r_i, V)`` in any float dtype, e.g. each job's rows as
    the output head gave them; no full-vocabulary float64 copy): the ``W`` largest entries of each row, gathered and
    scaled to float64 by ``scale`` (the temperature; ``(R, W)`` descending), their ids, the mask of
    ``{v : scale(z_v) ≥ kth largest − margin}`` (``margin``: a number, or one per row as an ``(R, 1)`` tensor) and,
    per row, whether that set may reach beyond the gathered columns.

    ``scale`` is increasing (it may round two values to one), so the k-th largest scaled value is the scaled k-th
    largest, and a row whose ``W``-th scaled value is below the threshold has its whole support among its ``W``
    columns, whatever the dtype the ranking was made in: the same set as ranking the scaled float64 row.

    ``width``: gather exactly that many columns, known to hold the whole set (a row redone alone with its support's
    size, :func:`support_size`); nothing is then over."""
    vocab = parts[0].shape[-1]
    exact = width is not None
    width = min(width, vocab) if width is not None else support_width(top_k, vocab, full)
    if width >= vocab:
        got = [torch.sort(p, dim=-1, descending=True, stable=True) for p in parts]
    else:
        got = [torch.topk(p, width, dim=-1) for p in parts]
    vals = scale(torch.cat([g[0] for g in got]).to(torch.float64))
    ids = torch.cat([g[1] for g in got])
    k = min(top_k, vocab)
    keep = vals >= vals[:, k - 1 : k] - margin
    over = keep[:, -1] & (width < vocab) & (not exact)
    return vals, ids, keep, over


def topk_plus_columns(public: Sequence[torch.Tensor], top_k: int, margin: torch.Tensor, full: bool | int
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k⁺ of every public row (``(1, V)`` each, any float dtype): the finite entries ``≥ kth_largest − margin``
    (``margin``: ``(n, 1)``, one per job) on the gathered columns (``full``: True, the whole vocabulary; an int,
    exactly that many columns: a job redone alone with its support's size). ``(vals, ids, keep, kth, size)``:
    :func:`top_columns`'s values, ids and mask, the k-th largest public logit, and per row 0 or, when the support
    reaches beyond the gathered columns, its size (:func:`support_size`)."""
    vocab = public[0].shape[-1]
    width = None if isinstance(full, bool) else full
    vals, ids, keep, over = top_columns(public, lambda v: v, top_k, margin, full is True, width)
    keep = keep & torch.isfinite(vals)
    over = over & keep[:, -1]  # a −inf last column: nothing beyond it is in the support
    kth = vals[:, min(top_k, vocab) - 1]
    size = torch.where(over, support_size(public, (kth - margin[:, 0]).where(torch.isfinite(kth), math.inf)), 0)
    return vals, ids, keep, kth, size


def whole_vocabulary(public: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The public rows ``(n, V)``, every column's id ``(n, V)`` and the mask of their finite entries: the support
    of a mechanism without a top-k, in id order (nothing ranked)."""
    pub = torch.cat(list(public))
    return pub, torch.arange(pub.shape[-1], device=pub.device).expand_as(pub), torch.isfinite(pub)


def support_size(parts: Sequence[torch.Tensor], threshold: torch.Tensor) -> torch.Tensor:
    """Per row of ``parts`` (``(1, V)`` each, one per job, any float dtype), how many entries are ``≥ threshold[b]``
    (float64, ``(n,)``): the exact width of a Top-k⁺ support that reaches beyond the gathered columns, fetched with
    the step's one transfer so that the row is redone on that many columns instead of the whole vocabulary."""
    return torch.stack([(p[0].to(torch.float64) >= threshold[b]).sum() for b, p in enumerate(parts)])


def ascending(ids: torch.Tensor, keep: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kept ids of each row in increasing order, padded at the end (``(R, W)`` ids, clamped to a valid id on the
    padding, and the mask of the real ones): the order in which every sampler of dpinfer lays out its CDF."""
    marked = ids.masked_fill(~keep, vocab)
    ordered = torch.sort(marked, dim=-1).values
    real = ordered < vocab
    return ordered.clamp(max=vocab - 1), real


def draw_integers(sources: Sequence[Randomness], counts: Sequence[int]) -> tuple[list[Any], list[Any]]:
    """One 53-bit integer per row from each job's own source (``counts[b]`` rows for job b, as the per-job sampler
    draws them): per job, its integers (a numpy int64 array) and its source as a
    :class:`~dpinfer.mechanisms.randomness.RandomSource`."""
    srcs = [as_random_source(s) for s in sources]
    return [src.integers53(n) for src, n in zip(srcs, counts, strict=True)], srcs


def to_device(parts: Sequence[Any], device: Any) -> torch.Tensor:
    """The per-job integers of :func:`draw_integers` as one ``(R,)`` tensor on ``device`` (one host-to-device copy)."""
    import numpy as np

    k = np.concatenate(list(parts)) if len(parts) else np.zeros(0, dtype=np.int64)
    return host_to_device(torch.from_numpy(k), device)


def host_to_device(t: torch.Tensor, device: Any) -> torch.Tensor:
    """``t`` (a host tensor) on ``device``; on CUDA through pinned memory without blocking, so that the copy waits
    for nothing queued before it (a copy from pageable memory would wait for the device: a synchronisation)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return t.to(dev)
    return t.pin_memory().to(dev, non_blocking=True)


def host_tensor(values: Sequence[Any], dtype: torch.dtype, device: Any) -> torch.Tensor:
    """``torch.tensor(values)`` on ``device`` by :func:`host_to_device`."""
    return host_to_device(torch.tensor(values, dtype=dtype), device)


def invert(probs: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The index of each row of ``probs`` ``(R, W)`` (≥ 0, not necessarily normalised) for the uniform ``k·2⁻⁵³``, and
    whether it is certain (:func:`~dpinfer.mechanisms.sampler.sample_probs`'s error bound); an uncertain row (about
    ``8·W·2⁻⁵³`` of them) is finished exactly on the host by :func:`finish_exact`. No host synchronisation."""
    width = probs.shape[-1]
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1]
    a = k.to(torch.float64) * TWO_M53
    margin = (8.0 * width * TWO_M53) * total
    lo = a * total - margin
    hi = (a + TWO_M53) * total + margin
    j = torch.searchsorted(cdf, lo.unsqueeze(-1), right=True).squeeze(-1)
    jc = j.clamp(max=width - 1)
    cj = cdf.gather(-1, jc.unsqueeze(-1)).squeeze(-1)
    normal = (total >= _TINY) & (total <= _HUGE)
    ok = normal & (j < width) & (cj >= hi) & (probs.amin(dim=-1) >= 0)
    return jc, ok


def finish_exact(row: torch.Tensor, k: int, src: Any) -> int:
    """The index of one uncertain row (:func:`invert`), exactly, drawing more bits from the job's source."""
    return _exact_index(row.detach().to("cpu", torch.float64).numpy(), int(k), src)


def sample_weight_rows(weights: Sequence[torch.Tensor], sources: Sequence[Randomness]
                       ) -> list[list[int] | InvalidInputError]:
    """One index per row of every job's weights (``weights[b]``: ``(r_b, V)`` float64, ≥ 0, each job's computed by
    its own kernels), drawn as :func:`~dpinfer.mechanisms.sampler.sample_probs` draws them: ``r_b`` 53-bit integers
    from job b's own source, one inversion of all rows (row-wise) and one transfer; an uncertain row is finished
    exactly from its job's source, in row order. The token of a row is a function of its weights and its job's bits
    only (the inversion is exact), so it does not depend on the rows beside it. Per job, its indices or its
    refusal."""
    ints, srcs = draw_integers(sources, [w.shape[0] for w in weights])
    probs = torch.cat(list(weights))
    k = to_device(ints, probs.device)
    if probs.shape[-1] == 0:
        return [InvalidInputError("cannot sample from an empty vocabulary") for _ in weights]
    j, ok = invert(probs, k)
    rows = fetch(j, ok)
    out: list[list[int] | InvalidInputError] = []
    at = 0
    for b, w in enumerate(weights):
        mine: list[int] = []
        try:
            for r in range(w.shape[0]):
                idx, certain = rows[at + r]
                mine.append(int(idx) if certain else finish_exact(probs[at + r], int(ints[b][r]), srcs[b]))
        except InvalidInputError as err:
            out.append(err)
        else:
            out.append(mine)
        at += w.shape[0]
    return out


def fetch(*parts: torch.Tensor) -> list[list[float]]:
    """Every job's figures of a step in ONE device-to-host transfer: the parts, each ``(R,)`` or ``(R, n)``, as float64
    columns side by side (token ids below 2⁵³ are exact), one list per row."""
    cols = [p.to(torch.float64).reshape(p.shape[0], -1) for p in parts]
    return torch.cat(cols, dim=-1).tolist()


ROW_ALIGN = 16
"""Row counts of the batched element-wise computations are padded to a multiple of this: 2 × the widest float64 SIMD
lanes (AVX-512: 8), the step of torch's vectorised loops; every padded computation is in float64. A batch of one
computes this many rows (the cost of the per-job path: the profile of one job's DP-Fusion decision is the
exponentials of its bisection rounds, over the padded rows)."""
MAX_CHUNK_ELEMENTS = 32767
"""The largest tensor of a chunk stays below torch's intra-op grain size (32,768 elements): one thread, no split."""


def in_aligned_chunks(fn: Callable[..., tuple[torch.Tensor, ...]], *tensors: torch.Tensor, per_row: int
                      ) -> tuple[torch.Tensor, ...]:
    """``fn(*tensors)`` (row-wise along the first dimension) run on chunks of a multiple of :data:`ROW_ALIGN` rows,
    zero-padded, whose intermediates (``per_row`` elements per row at most) stay below :data:`MAX_CHUNK_ELEMENTS`;
    the padding rows are dropped from the outputs (see the module docstring)."""
    n = tensors[0].shape[0]
    chunk = max(ROW_ALIGN, (MAX_CHUNK_ELEMENTS // max(per_row, 1)) // ROW_ALIGN * ROW_ALIGN)
    outs = []
    for start in range(0, max(n, 1), chunk):
        part = [t[start:start + chunk] for t in tensors]
        rows = part[0].shape[0]
        size = max(ROW_ALIGN, -(-rows // ROW_ALIGN) * ROW_ALIGN)
        if size > rows:
            part = [torch.cat([p, p.new_zeros((size - rows, *p.shape[1:]))]) for p in part]
        outs.append([r[:rows] for r in fn(*part)])
    return tuple(torch.cat(list(x)) if len(x) > 1 else x[0] for x in zip(*outs, strict=True))


def fits_aligned(per_row: int) -> bool:
    """Whether :data:`ROW_ALIGN` rows of ``per_row`` elements fit one chunk (else the computation is not batched)."""
    return ROW_ALIGN * per_row <= MAX_CHUNK_ELEMENTS


def fixed_bisection_rounds(tol: float) -> int:
    """Bisection rounds after which a bracket of [0, 1] is at most ``tol/2`` wide."""
    return max(1, math.ceil(math.log2(2.0 / tol)))


def _exact_index(w: np.ndarray, k: int, src: RandomSource) -> int:
    """The index drawn by :func:`~dpinfer.mechanisms.sampler.sample_probs` for one row ``w`` whose uniform starts
    with the 53 bits ``k``, in exact integer arithmetic: the uniform is ``(k + R) · 2⁻⁵³`` with ``R`` uniform on
    [0, 1), and R's bits are drawn 64 at a time from ``src`` until the whole interval it may still lie in maps to one
    bucket."""
    if not bool(np.isfinite(w).all()) or bool((w < 0).any()):
        raise InvalidInputError("sampling weights must be finite, ≥ 0 and not NaN")
    pos = np.flatnonzero(w > 0)
    if pos.size == 0:
        raise InvalidInputError("no token has positive probability; nothing can be sampled")
    mant, expo = np.frexp(w[pos])  # w = mant · 2^expo, mant in [0.5, 1): mant · 2⁵³ is an integer
    ints = (mant * 2.0**53).astype(np.int64).tolist()
    expo = expo.astype(np.int64) - 53
    shifts = (expo - expo.min()).tolist()
    cum = list(itertools.accumulate(m << s for m, s in zip(ints, shifts, strict=True)))
    total = cum[-1]
    num, bits = k, 53  # the uniform lies in [num, num + 1) · 2^-bits
    while True:
        i = bisect.bisect_right(cum, (num * total) >> bits)  # first i with cum_i · 2^bits > num · total
        if cum[i] << bits >= (num + 1) * total:
            return int(pos[i])
        num = (num << 64) | int(src.words(1)[0])
        bits += 64


def release_tokens(ids: torch.Tensor, code: torch.Tensor, over: torch.Tensor, *, probs: torch.Tensor | None,
                   scores: torch.Tensor | None = None, ints: Sequence[int], srcs: Sequence[Any],
                   want: Sequence[bool], stats: Callable[[torch.Tensor], Sequence[torch.Tensor]] | None,
                   errors: Mapping[int, str], redo: Callable[[int, int], StepResult | Exception],
                   describe: Callable[[int, list[float], int | None], dict[str, Any]]
                   ) -> list[StepResult | Exception]:
    """The end of every batched step (DP-Fusion, InvisibleInk, PAD): one token per job, in ONE device-to-host
    transfer, from what the mechanism computed on the device for its ``n`` jobs:

    * ``ids`` ``(n, W)``: the token id of each gathered column; ``code`` ``(n,)``: 0, or the key in ``errors`` of the
      job's refusal; ``over`` ``(n,)``: 0, or (a public figure) how the job must be redone alone (``redo(b, over)``);
    * ``probs`` ``(n, W)``: the weights drawn from with the job's 53-bit integer ``ints[b]`` (an uncertain draw is
      finished exactly from ``srcs[b]``), or ``None`` and ``scores``: the argmax is taken (ties to the lowest column);
    * ``stats(j)`` (``j``: the chosen column of each row): DATA-DEPENDENT figures, fetched in the same transfer only
      when a job asks for them (``want[b]``, :attr:`~dpinfer.mechanisms.base.StepInfo.debug_stats`), and turned into
      the job's ``StepResult.stats`` by ``describe(b, values, exact column or None)``."""
    if probs is not None:
        j, ok = invert(probs, host_tensor(list(ints), torch.int64, probs.device))
    else:
        assert scores is not None
        j = torch.argmax(scores, dim=-1)
        ok = torch.ones_like(j, dtype=torch.bool)
    tok = ids.gather(-1, j.unsqueeze(-1)).squeeze(-1)
    extra = list(stats(j)) if stats is not None and any(want) else []
    rows = fetch(tok, ok, code, over, *extra)
    out: list[StepResult | Exception] = []
    for b, row in enumerate(rows):
        if row[2]:
            out.append(InvalidInputError(errors[int(row[2])]))
            continue
        if row[3]:
            out.append(redo(b, int(row[3])))
            continue
        token, exact = int(row[0]), None
        if not row[1]:
            assert probs is not None
            exact = finish_exact(probs[b], int(ints[b]), srcs[b])
            token = int(ids[b, exact])
        out.append(StepResult(tokens=torch.tensor(token, dtype=torch.long),
                              stats=describe(b, row[4:], exact) if want[b] else None, host_tokens=[token]))
    return out


def sample_weights_step(mechanisms: Sequence[Any], logits: Sequence[torch.Tensor], generators: Sequence[Randomness],
                        weights: Callable[[Any, torch.Tensor], torch.Tensor]) -> list[StepResult | Exception]:
    """The batched step of a mechanism that samples each of its rows from weights computed job by job on the full
    vocabulary (DP-Prompt, DP-Decoding: a full-vocabulary exponential over many jobs at once would not round alike
    on the CPU): ``weights(mechanism, logits)`` (``(r, V)``, ≥ 0; a refusal raised) by each job's own kernels, then
    every row's draw at once (:func:`sample_weight_rows`: one 53-bit integer per row from its job's own source, one
    inversion, one transfer). A joint mechanism releases its one row's token, an independent one a token per row."""
    out: list[StepResult | Exception | None] = [None] * len(mechanisms)
    rows, gens, where = [], [], []
    for b, (m, z, g) in enumerate(zip(mechanisms, logits, generators, strict=True)):
        try:
            rows.append(weights(m, z))
        except (ConfigurationError, InvalidInputError) as err:
            out[b] = err
            continue
        gens.append(g)
        where.append(b)
    for b, got in zip(where, sample_weight_rows(rows, gens) if rows else [], strict=True):
        if isinstance(got, Exception):
            out[b] = got
            continue
        tokens = torch.tensor(got, dtype=torch.long)
        joint = mechanisms[b].mode == "joint"
        out[b] = StepResult(tokens=tokens[0] if joint else tokens, host_tokens=got[:1] if joint else list(got))
    return [r for r in out if r is not None]


WHOLE_VOCABULARY_ELEMENTS = 1 << 24
"""Jobs decided on the whole vocabulary are taken in groups of at most this many float64 elements (128 MiB) each."""


def job_chunks(n: int, per_job: int) -> list[range]:
    """``range(n)`` in consecutive groups of at most :data:`WHOLE_VOCABULARY_ELEMENTS` // ``per_job`` jobs (one at
    least): the memory of a whole-vocabulary batch stays bounded, one transfer per group."""
    size = max(1, WHOLE_VOCABULARY_ELEMENTS // max(per_job, 1))
    return [range(i, min(i + size, n)) for i in range(0, n, size)]
