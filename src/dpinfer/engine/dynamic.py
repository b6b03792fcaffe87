"""The dynamic-cache runner: for architectures the slot cache cannot serve (:attr:`LM.supports_slot_cache
<dpinfer.models.LM.supports_slot_cache>` false: a sliding window, a model that builds its own mask), and on request.

Each job keeps its own Hugging Face cache (static, pre-allocated for ``max_new_tokens``, or dynamic) and is decoded in
its own forward per step; jobs share nothing, so a job's tokens are those it gets alone.

Layout of a job's rows:

* no public row: :func:`~dpinfer.engine.prefill.prefill_rows` (left-padded, exact).
* rows given the keys of their first tokens (``prefix_kv``): :func:`~dpinfer.engine.prefill.prefill_seeded`, then
  the rows decoded in one batch, right-aligned.
* a public row 0 (joint, K > 1): each row prefilled alone (:func:`~dpinfer.engine.prefill.prefill_public`), then the
  K rows decoded in one batch left-padded to a PUBLIC width ``max(len(row 0), pad_width)``; the public row's padding
  holds zeros and every shape of the batch (K, width, step) is public. A private row longer than that width keeps its
  place in the batch filled with a copy of the public row (ignored) and is decoded in a second batch of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dpinfer.engine.cache import cache_kwargs, new_kv_cache
from dpinfer.engine.head import head_splits, split_logits
from dpinfer.engine.prefill import forward, prefill_public, prefill_rows, prefill_seeded, right_aligned
from dpinfer.engine.scheduler import Pool


@dataclass
class Batch:
    """Rows decoded in one forward call: ``dest[j]`` is the row slot ``j`` computes (``None``: a filler slot whose
    output is ignored), with its cache, attention mask and next position ids."""

    dest: list[int | None]
    cache: Any
    mask: torch.Tensor
    pos: torch.Tensor

    @property
    def identity(self) -> bool:
        return self.dest == list(range(len(self.dest)))


def gather(next_ids: torch.Tensor, batches: Sequence[Batch], run: Callable[[Batch, torch.Tensor], torch.Tensor]
           ) -> torch.Tensor:
    """Run ``run(batch, input_ids)`` on every batch (after extending its mask) and return its last-position outputs
    in row order (filler slots dropped)."""
    outs = []
    for b in batches:
        b.mask = torch.cat([b.mask, b.mask.new_ones((b.mask.shape[0], 1))], dim=1)
        ids = next_ids if b.identity else next_ids[[0 if d is None else d for d in b.dest]]
        outs.append(run(b, ids))
        b.pos = b.pos + 1
    if len(batches) == 1 and batches[0].identity:
        return outs[0]
    result = outs[0].new_empty((next_ids.shape[0], *outs[0].shape[1:]))
    for b, o in zip(batches, outs, strict=True):
        slots = [j for j, d in enumerate(b.dest) if d is not None]
        result[[b.dest[j] for j in slots]] = o[slots]
    return result


class DynamicRunner:
    """Runs each admitted job on its own Hugging Face cache (module docstring)."""

    shared_pool = False

    def __init__(self, lm: Any, *, prefix_sharing: bool, static_cache: bool, split_head: bool) -> None:
        self.lm = lm
        self.prefix_sharing = prefix_sharing
        self.static_cache = static_cache
        self.split_head = split_head and head_splits(lm.model)
        self.eos = torch.as_tensor(sorted(lm.eos_token_ids), dtype=torch.long, device=lm.device)

    def use_pool(self, pool: Pool) -> None:  # pragma: no cover - the scheduler plans no pool for this runner
        raise RuntimeError("the dynamic-cache runner has no shared pool")

    def admit(self, job: Any, slots: Sequence[int], side_rows: Sequence[int]) -> None:
        t0 = time.perf_counter()
        rows, k = job.rows, job.k
        if job.prefix_kv is not None:
            logits, kv = prefill_seeded(self.lm, rows, job.prefix_kv)
            lengths = [len(r) for r in rows]
            batches = [self._batch(list(range(k)), kv, lengths, max(lengths), job.max_new_tokens)]
        elif job.joint and k > 1 and job.mechanism.public_row:
            logits, batches, job.shared = self._prefill_public(rows, job.max_new_tokens, job.pad_width or 0)
        else:
            logits, cache, mask, pos, job.shared = prefill_rows(
                self.lm, rows, job.max_new_tokens, prefix_sharing=self.prefix_sharing, static_cache=self.static_cache)
            batches = [Batch(dest=list(range(k)), cache=cache, mask=mask, pos=pos)]
        job.logits, job.placement = logits, batches
        job.started = time.perf_counter()
        job.prefill_seconds = job.started - t0

    def release(self, job: Any) -> None:
        job.placement = None

    def forward(self, going: Sequence[tuple[Any, torch.Tensor]]) -> None:
        model = self.lm.model
        decoder = model.get_decoder()
        for job, next_ids in going:
            if job.split:
                hidden = gather(next_ids, job.placement, lambda b, ids: decoder(**cache_kwargs(decoder, dict(
                    input_ids=ids, attention_mask=b.mask, position_ids=b.pos.unsqueeze(1), past_key_values=b.cache,
                    use_cache=True))).last_hidden_state[:, -1, :])
                head = model.get_output_embeddings()
                job.logits = split_logits(job, head(hidden[:1]), hidden[1:], head, self.eos)
            else:
                job.logits = gather(next_ids, job.placement, lambda b, ids: forward(
                    self.lm, input_ids=ids, attention_mask=b.mask, position_ids=b.pos.unsqueeze(1),
                    past_key_values=b.cache).logits[:, -1, :])

    # -------------------------------------------------------------- the public-row layout
    def _prefill_public(self, rows: Sequence[Sequence[int]], max_new_tokens: int, pad_width: int
                        ) -> tuple[torch.Tensor, list[Batch], int]:
        """(last logits (K, V), the decode batches, the shortest prefix a private row reuses from the public row)."""
        last, batched, reused = prefill_public(self.lm, rows, self.prefix_sharing)
        layers = [[(key[0], value[0]) for key, value in row] for row in batched]  # per row (H, L, D)
        width = max(len(rows[0]), pad_width)
        lengths = [len(r) for r in rows]
        main = [i if i == 0 or lengths[i] <= width else None for i in range(len(rows))]
        batches = [self._batch(main, [layers[0] if d is None else layers[d] for d in main],
                               [lengths[0] if d is None else lengths[d] for d in main], width, max_new_tokens)]
        over = [i for i in range(1, len(rows)) if lengths[i] > width]
        if over:  # never seen by the public row: its batch above has the same shapes either way
            batches.append(self._batch(over, [layers[i] for i in over], [lengths[i] for i in over],
                                       max(lengths[i] for i in over), max_new_tokens))
        return torch.stack(last), batches, reused

    def _batch(self, dest: list[int | None], layers: Sequence[Sequence[tuple[torch.Tensor, torch.Tensor]]],
               lengths: Sequence[int], width: int, max_new_tokens: int) -> Batch:
        """A decode batch from per-row caches (per layer keys ``(H, L, D)``): keys and values right-aligned in
        ``width`` slots (zeros before, :func:`~dpinfer.engine.prefill.right_aligned`), in a static cache of
        ``width + max_new_tokens`` slots (or a dynamic cache)."""
        device = self.lm.device
        cache = new_kv_cache(self.lm, width + max_new_tokens if self.static_cache else None)
        batched, mask = right_aligned(layers, width)
        for j, (keys, values) in enumerate(batched):
            cache.update(keys, values, j)
        return Batch(dest=dest, cache=cache, mask=mask.to(device),
                     pos=torch.as_tensor(list(lengths), dtype=torch.long, device=device))
