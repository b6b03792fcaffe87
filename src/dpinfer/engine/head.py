"""The output head, split: the public row in full, the private rows only on the columns the mechanism asks for.

For a job whose joint mechanism reads its private rows on a public subset of columns only
(:meth:`Mechanism.private_columns <dpinfer.mechanisms.base.Mechanism.private_columns>`, decided from the public row
after the same public processors), the head runs on those columns only for the private rows; their other entries are
``-inf``. Both runners call :func:`split_logits` (the one implementation); the slot runner calls it through
:func:`split_logits_many`, which makes the column choices of all its jobs with one host transfer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from dpinfer.mechanisms.batch import fetch
from dpinfer.mechanisms.transforms import apply

SPLIT_HEAD_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "smollm3", "phi3", "olmo2"})
"""Architectures whose logits are exactly ``lm_head(final hidden state)``: the engine may then compute the private rows'
logits on a public subset of columns only (:meth:`Mechanism.private_columns`)."""


def head_splits(model: Any) -> bool:
    """Whether the logits are exactly ``lm_head(last hidden state)`` (no soft-capping or scaling), so that the head
    may be applied to some columns only."""
    config = model.config
    if getattr(config, "model_type", None) not in SPLIT_HEAD_MODEL_TYPES:
        return False
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return False
    # an int8 decode twin (load_model(quantize="int8")) runs every row in one int8 call, which reads a quarter of the
    # bytes of the float32 public row alone: no split there
    return isinstance(model.get_output_embeddings(), torch.nn.Linear)


def _probe(job: Any, public: torch.Tensor, eos: torch.Tensor) -> torch.Tensor:
    """The public row ``(1, V)`` as the mechanism will see it: float64, EOS masked before ``min_new_tokens``, the
    job's processors applied."""
    probe = public.to(torch.float64)
    if job.t < job.min_new_tokens and eos.numel():
        probe[:, eos] = -torch.inf
    return apply(job.procs, probe, job.sequences[:1])


def _on_columns(job: Any, public: torch.Tensor, private_states: torch.Tensor, head: Any, cols: torch.Tensor | None
                ) -> torch.Tensor:
    if cols is None:
        return torch.cat([public, head(private_states)])
    bias = head.bias.index_select(0, cols) if head.bias is not None else None
    private = torch.nn.functional.linear(private_states, head.weight.index_select(0, cols), bias)
    logits = public.new_full((job.k, public.shape[-1]), -torch.inf)
    logits[:1] = public
    logits[1:, cols] = private
    return logits


def split_logits(job: Any, public: torch.Tensor, private_states: torch.Tensor, head: Any, eos: torch.Tensor
                 ) -> torch.Tensor:
    """The job's next logits ``(K, V)`` from its public row's logits ``(1, V)`` and its private rows' last hidden
    states: the columns come from the public row only (after EOS masking and the job's processors, as the mechanism
    will see it), so the public row is computed exactly as without a split."""
    return _on_columns(job, public, private_states, head, job.mechanism.private_columns(_probe(job, public, eos)[0]))


def split_logits_many(items: Sequence[tuple[Any, torch.Tensor, torch.Tensor]], head: Any, eos: torch.Tensor
                      ) -> list[torch.Tensor]:
    """:func:`split_logits` of several jobs (``(job, public (1, V), private states)`` each) with ONE device-to-host
    transfer for all their column choices: the jobs whose mechanisms share a batch key and give their public support
    on the device (:meth:`Mechanism.public_support <dpinfer.mechanisms.base.Mechanism.public_support>`) have it
    computed together, and the size of each (and whether it reaches beyond the gathered columns) is fetched at once;
    the columns are then each job's first ``size`` support ids, the set :meth:`~dpinfer.mechanisms.base.Mechanism.
    private_columns` gives. A job whose support reaches further, or whose mechanism has no batched support, takes
    :func:`split_logits` alone (public decisions, the same columns)."""
    groups: dict[Any, list[int]] = {}
    for i, (job, _, _) in enumerate(items):
        key = job.batch_key()
        if key is not None:
            groups.setdefault(key, []).append(i)
    found: list[tuple[int, torch.Tensor]] = []
    sizes, overs = [], []
    for members in groups.values():
        mechs = [items[i][0].mechanism for i in members]
        got = type(mechs[0]).public_support(mechs, [_probe(items[i][0], items[i][1], eos) for i in members])
        if got is None:
            continue
        ids, real, over = got
        found += [(i, ids[b]) for b, i in enumerate(members)]
        sizes.append(real.sum(dim=-1))
        overs.append(over)
    out: list[torch.Tensor | None] = [None] * len(items)
    if found:
        for (i, ids), (size, over) in zip(found, fetch(torch.cat(sizes), torch.cat(overs)), strict=True):
            if not over:
                job, public, states = items[i]
                out[i] = _on_columns(job, public, states, head, ids[:int(size)])  # real ids first, ascending
    return [x if x is not None else split_logits(job, public, states, head, eos)
            for x, (job, public, states) in zip(out, items, strict=True)]
