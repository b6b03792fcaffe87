"""The non-private sampler: temperature, top-k, top-p, greedy. No privacy guarantee.

It powers :func:`dpinfer.generate` and the ``original`` baselines. In ``independent`` mode (the default) each of the
K rows gets its own token; in ``joint`` mode only row ``row`` (default 0) is read and its token goes to every row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from dpinfer.errors import ConfigurationError, InvalidInputError
from dpinfer.mechanisms.base import Mechanism, Mode, StepInfo, StepResult
from dpinfer.mechanisms.batch import (
    _exact_index,
    ascending,
    draw_integers,
    fetch,
    finish_exact,
    host_tensor,
    invert,
    to_device,
    top_columns,
)
from dpinfer.mechanisms.randomness import TWO_M53, Randomness, as_random_source
from dpinfer.mechanisms.transforms import LogitsProcessor, Temperature, TopK, TopP, apply


def sample_probs(probs: torch.Tensor, generator: Randomness) -> torch.Tensor:
    """One index per row of ``probs`` (``(..., V)``, ≥ 0, not necessarily normalised), drawn EXACTLY from the weights
    given: index ``j`` of a row comes out with probability ``w_j / Σ w`` computed without rounding (each float64 weight
    is an exact dyadic rational), so a token of weight 0 is never drawn and a tiny weight next to a large cumulative
    sum keeps its exact share (an inverted float CDF gives it 0 or one ulp).

    Each row inverts its CDF with ONE 53-bit uniform ``k · 2⁻⁵³`` from ``generator`` (a
    :class:`~dpinfer.mechanisms.randomness.RandomSource`, or a ``torch.Generator``). The float cumulative sums carry
    a rigorous error bound (``2 · V · 2⁻⁵³ · total`` for any summation order); when the whole interval
    ``[k, k + 1) · 2⁻⁵³ · total``, widened by the bound, lies in one bucket, that bucket is the answer for every
    continuation of the uniform's bits. Otherwise (a boundary of a positive weight lies within
    ``8 · V · 2⁻⁵³ · total`` of the draw: about 4e-6 per row for a flat 49k vocabulary, 4e-9 with 40 tokens left by
    top-k) the row is finished in exact integer arithmetic, drawing 64 more bits at a time from the same source.

    Every sampler of dpinfer draws this way (unlike ``torch.multinomial``, which draws one exponential per vocabulary
    entry), so two mechanisms run with the same seed consume the same first uniform per row: at λ = 0, DP-Fusion and
    NER scrubbing release the same text, and benchmarks compare methods on common random numbers. Each method's output
    distribution is unaffected.

    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> sample_probs(torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 0.0]], dtype=torch.float64), g).tolist()
    [1, 0]
    """
    src = as_random_source(generator)
    w = probs.to(torch.float64)
    lead, vocab = w.shape[:-1], w.shape[-1]
    if vocab == 0:
        raise InvalidInputError("cannot sample from an empty vocabulary")
    rows = w.reshape(-1, vocab)
    n = rows.shape[0]
    if n == 0:
        return torch.zeros(lead, dtype=torch.long, device=w.device)
    k = torch.from_numpy(src.integers53(n)).to(w.device)
    if not bool(rows.min() >= 0):  # also catches NaN
        raise InvalidInputError("sampling weights must be ≥ 0 and not NaN")
    cdf = rows.cumsum(dim=-1)
    total = cdf[:, -1]
    a = k.to(torch.float64) * TWO_M53  # exact
    margin = (8.0 * vocab * TWO_M53) * total  # 4 × the cumsum error bound 2·V·2⁻⁵³·total (covers the rounding below)
    lo = a * total - margin
    hi = (a + TWO_M53) * total + margin
    j = torch.searchsorted(cdf, lo.unsqueeze(-1), right=True).squeeze(-1)  # first j with cdf_j > lo
    cj = cdf.gather(-1, j.clamp(max=vocab - 1).unsqueeze(-1)).squeeze(-1)
    normal = (total >= _TINY) & (total <= _HUGE)  # the error analysis needs normal floats (no under/overflow)
    ok = normal & (j < vocab) & (cj >= hi)
    if not bool(ok.all()):
        j = j.clone()
        k_list = k.tolist()
        for r in (~ok).nonzero().squeeze(-1).tolist():
            j[r] = _exact_index(rows[r].cpu().numpy(), int(k_list[r]), src)
    return j.reshape(lead)


_TINY = 2.0**-900
_HUGE = 2.0**1000


def sample_rows(logits: torch.Tensor, generator: Randomness) -> torch.Tensor:
    """Draw one token per row from ``softmax(logits)`` (rows may hold ``-inf``) with ``generator``
    (:func:`sample_probs`)."""
    return sample_probs(torch.softmax(logits, dim=-1), generator)


class Sampler(Mechanism):
    """Plain decoding: ``temperature == 0`` is greedy (argmax, ties to the lowest id, as in transformers).

    >>> import torch
    >>> s = Sampler(temperature=0.0)
    >>> g = torch.Generator().manual_seed(0)
    >>> z = torch.tensor([[0.0, 2.0, 1.0], [5.0, 0.0, 0.0]], dtype=torch.float64)
    >>> s.step(z, StepInfo(step=0, max_new_tokens=1, num_contexts=2), g).tokens.tolist()
    [1, 0]
    """

    name = "sampler"

    def __init__(self, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                 mode: Mode = "independent", row: int = 0) -> None:
        if mode not in ("joint", "independent"):
            raise ConfigurationError(f"mode must be 'joint' or 'independent', got {mode!r}")
        if not (isinstance(temperature, (int, float)) and temperature >= 0):
            raise ConfigurationError(f"temperature must be ≥ 0 (0 = greedy), got {temperature!r}")
        self.greedy = temperature == 0
        self.transforms: list[LogitsProcessor] = []
        if not self.greedy:
            self.transforms.append(Temperature(temperature))
            if top_k is not None:
                self.transforms.append(TopK(top_k))
            if top_p is not None:
                self.transforms.append(TopP(top_p))
        self.temperature, self.top_k, self.top_p, self.row = float(temperature), top_k, top_p, row
        self.mode = mode  # type: ignore[misc]  # instance override of the class default

    def start(self, num_contexts: int, vocab_size: int) -> None:
        if self.mode == "joint" and not 0 <= self.row < num_contexts:
            raise ConfigurationError(f"row {self.row} out of range for {num_contexts} contexts")

    def batch_key(self) -> tuple[Any, ...] | None:
        """Sampling with a temperature and without top-p decides in batches (:func:`_sampler_step`; the per-job
        :meth:`step` is the same computation on a batch of one): one key per mode and top-k."""
        if self.greedy or self.top_p is not None:
            return None
        return (Sampler, self.mode, self.top_k)

    def _rows(self, logits: torch.Tensor) -> torch.Tensor:
        return logits[self.row : self.row + 1] if self.mode == "joint" else logits

    @classmethod
    def step_batch(cls, mechanisms: Sequence[Mechanism], logits: Sequence[torch.Tensor], infos: Sequence[StepInfo],
                   generators: Sequence[Randomness]) -> list[StepResult | Exception]:
        """Every job's rows sampled at once: temperature, the top-k support of each row on its gathered columns
        (:mod:`dpinfer.mechanisms.batch`), one 53-bit integer per row from the job's own source, one transfer."""
        mechs = [m for m in mechanisms if isinstance(m, Sampler)]
        rows = [m._rows(z) for m, z in zip(mechs, logits, strict=True)]
        ints, srcs = draw_integers(generators, [r.shape[0] for r in rows])
        temps = [m.temperature for m, r in zip(mechs, rows, strict=True) for _ in range(r.shape[0])]
        toks = _sample_rows_batch(rows, temps, mechs[0].top_k,
                                  [k for part in ints for k in part.tolist()],
                                  [src for src, r in zip(srcs, rows, strict=True) for _ in range(r.shape[0])])
        out: list[StepResult | Exception] = []
        at = 0
        for m, r in zip(mechs, rows, strict=True):
            mine = toks[at:at + r.shape[0]]
            at += r.shape[0]
            err = next((t for t in mine if isinstance(t, Exception)), None)
            if err is not None:
                out.append(err)
                continue
            tokens = torch.tensor(mine, dtype=torch.long)
            joint = m.mode == "joint"
            out.append(StepResult(tokens=tokens[0] if joint else tokens,
                                  host_tokens=[int(x) for x in (mine[:1] if joint else mine)]))
        return out

    def step(self, logits: torch.Tensor, info: StepInfo, generator: Randomness) -> StepResult:
        if (res := self.batch_of_one(logits, info, generator)) is not None:
            return res
        rows = self._rows(logits)
        if self.greedy:
            tokens = rows.argmax(dim=-1)
        else:
            tokens = sample_rows(apply(self.transforms, rows), generator)
        return StepResult(tokens=tokens[0] if self.mode == "joint" else tokens)


def _sample_rows_batch(parts: Sequence[torch.Tensor], temperatures: Sequence[float], top_k: int | None,
                       ints: Sequence[int], srcs: Sequence[Any], full: bool = False) -> list[int | Exception]:
    """One token per row of ``parts`` (tensors ``(r_i, V)``, any float dtype): ``softmax(z/τ)`` (float64) on the
    row's top-k (ties kept; every column without top-k) with the row's own 53-bit integer, one transfer for all rows;
    a row whose top-k reaches beyond the gathered columns is redone alone on the whole vocabulary with the same
    integer (row-wise throughout: batch-invariant)."""
    device = parts[0].device
    vocab = parts[0].shape[-1]
    t = host_tensor(list(temperatures), torch.float64, device).unsqueeze(-1)
    if top_k is None:
        sid, probs = None, torch.softmax(torch.cat([p.to(torch.float64) for p in parts]) / t, dim=-1)
        over = torch.zeros(probs.shape[0], dtype=torch.bool, device=device)
    else:
        _, ids, keep, over = top_columns(parts, lambda v: v / t, top_k, 0.0, full)
        sid, real = ascending(ids, keep, vocab)
        z = torch.cat([p.gather(-1, s).to(torch.float64) for p, s in
                       zip(parts, sid.split([p.shape[0] for p in parts]), strict=True)])
        probs = torch.softmax((z / t).masked_fill(~real, -torch.inf), dim=-1)
    j, ok = invert(probs, to_device([np.asarray(ints, dtype=np.int64)], device))
    tok = j if sid is None else sid.gather(-1, j.unsqueeze(-1)).squeeze(-1)
    flat = [p[r:r + 1] for p in parts for r in range(p.shape[0])]
    out: list[int | Exception] = []
    for r, (token, certain, wide) in enumerate(fetch(tok, ok, over)):
        try:
            if wide:
                (again,) = _sample_rows_batch(flat[r:r + 1], temperatures[r:r + 1], top_k, ints[r:r + 1],
                                              srcs[r:r + 1], True)
                if isinstance(again, Exception):
                    raise again
                out.append(again)
            elif not certain:
                i = finish_exact(probs[r], int(ints[r]), srcs[r])
                out.append(i if sid is None else int(sid[r, i]))
            else:
                out.append(int(token))
        except InvalidInputError as err:
            out.append(err)
    return out
