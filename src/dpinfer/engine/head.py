"""The output head, split: the public row in full, the private rows only on the columns the mechanism asks for.

For a job whose joint mechanism reads its private rows on a public subset of columns only
(:meth:`Mechanism.private_columns <dpinfer.mechanisms.base.Mechanism.private_columns>`, decided from the public row
after the same public processors), the head runs on those columns only for the private rows; their other entries are
``-inf``. Both runners call :func:`split_logits` (the one implementation).
"""

from __future__ import annotations

from typing import Any

import torch

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


def split_logits(job: Any, public: torch.Tensor, private_states: torch.Tensor, head: Any, eos: torch.Tensor
                 ) -> torch.Tensor:
    """The job's next logits ``(K, V)`` from its public row's logits ``(1, V)`` and its private rows' last hidden
    states: the columns come from the public row only (after EOS masking and the job's processors, as the mechanism
    will see it), so the public row is computed exactly as without a split."""
    probe = public.to(torch.float64)
    if job.t < job.min_new_tokens and eos.numel():
        probe[:, eos] = -torch.inf
    probe = apply(job.procs, probe, job.sequences[:1])
    cols = job.mechanism.private_columns(probe[0])
    if cols is None:
        return torch.cat([public, head(private_states)])
    bias = head.bias.index_select(0, cols) if head.bias is not None else None
    private = torch.nn.functional.linear(private_states, head.weight.index_select(0, cols), bias)
    logits = public.new_full((job.k, public.shape[-1]), -torch.inf)
    logits[:1] = public
    logits[1:, cols] = private
    return logits
