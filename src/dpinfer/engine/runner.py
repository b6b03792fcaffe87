"""The slot runner: every running job's rows decoded in ONE forward per step over a pool of row slots.

A job admitted by the :class:`~dpinfer.engine.scheduler.Scheduler` is prefilled on its own
(:func:`~dpinfer.engine.prefill.prefill_job`) and its rows written to its slots of the :class:`SlotCache`; rows the
scheduler keeps out of the pool (side rows, or every row of an own-cache job) go to a small cache of the job's own.
Per step: one forward of the decoder over the S slots (:class:`DecodeStep`, compiled once per (S, C) when ``compile``
is on), one per job with rows outside the pool, then the output head: one call for every row that needs all columns
and, for a job whose mechanism reads its private rows on some columns only, the split head of
:func:`~dpinfer.engine.head.split_logits`.

Rule 2 (a public row never depends on a private row), enforced here
--------------------------------------------------------------------
Every shape of the pooled forward is public (S, C, the slot of each row: see the scheduler). A row's attention reads
its own slot only: its mask comes from its own length, its position ids are its own, and a slot is zeroed beyond the
prefill when a job takes it. Every other operation of the step is row-wise for fixed shapes, and the public row's
logits come from the full head on its own hidden state. So the public row of every job is bit-for-bit independent of
every private row in the batch, its own job's and other jobs' (content AND length): ``tests/unit/test_public_row.py``
checks it with ``torch.equal``. With int8 layers every row has its own quantisation scale
(:func:`dpinfer.quantize.quantize_int8`).

What a seed reproduces
----------------------
Batched kernels are not bit-identical across batch compositions (a row's floating-point rounding may depend on S, C
and where its slot sits). The same jobs, submitted in the same order, with the same seeds, settings, model and machine
give the same outputs, token for token; a job in another mix gives the same tokens up to that rounding.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dpinfer.engine.cache import DecodeStep, SlotCache, own_model
from dpinfer.engine.head import head_splits, split_logits_many
from dpinfer.engine.prefill import prefill_job
from dpinfer.engine.scheduler import Pool

_POOLS: weakref.WeakKeyDictionary[Any, dict[tuple[int, int, bool], tuple[SlotCache, DecodeStep]]] = (
    weakref.WeakKeyDictionary())
"""Per model, the pool caches and decode steps of the last :data:`POOLS_PER_MODEL` (S, C) buckets: reused by every
engine on that model (a new engine per call compiles nothing again); an engine that finds one busy with another
engine's jobs makes its own."""

POOLS_PER_MODEL = 3
"""(S, C) buckets kept per model, least recently used dropped (each holds a KV cache of S × C positions)."""


@dataclass
class Placement:
    """Where a job's rows live: ``slots[i]`` is row i's pool slot (``[]``: no pool slot), ``side_rows`` the rows
    decoded in the job's own cache ``side``, ``side_slot[r]`` the slot of side row ``r`` there; ``dropped`` the rows
    that finished (independent mode) and are no longer computed."""

    slots: list[int]
    side_rows: list[int]
    side: tuple[SlotCache, DecodeStep] | None = None
    side_slot: dict[int, int] = field(default_factory=dict)
    dropped: set[int] = field(default_factory=set)


class SlotRunner:
    """Runs admitted jobs on the slot cache (module docstring)."""

    shared_pool = True

    def __init__(self, lm: Any, *, prefix_sharing: bool, static_cache: bool, split_head: bool, compile: bool) -> None:
        self.lm = lm
        self.prefix_sharing = prefix_sharing
        self.static_cache = static_cache
        self.split_head = split_head and head_splits(lm.model)
        self.compile = compile
        self.eos = torch.as_tensor(sorted(lm.eos_token_ids), dtype=torch.long, device=lm.device)
        self.pooled = 0
        self.drop_finished = True
        """Leave finished rows (independent mode) out of the decode steps (:meth:`forward`); False: compute them."""
        self.cache: SlotCache | None = None
        self.step: DecodeStep | None = None
        self.ids: torch.Tensor | None = None

    def _new_cache(self, slots: int, capacity: int) -> SlotCache:
        return SlotCache(self.lm.model.config.num_hidden_layers, slots, capacity, self.lm.device,
                         hf=not own_model(self.lm.model))

    def use_pool(self, pool: Pool) -> None:
        """Allocate the pool's cache and decode step (one (S, C) bucket held at a time; reused, so compiled once)."""
        if self.cache is not None:
            self.cache.busy = False  # no job runs in the old pool (the scheduler plans only then)
        pools = _POOLS.setdefault(self.lm.model, {})
        key = (pool.slots, pool.capacity, self.compile)
        pair = pools.pop(key, None)
        if pair is not None:
            pools[key] = pair  # most recently used last
        if pair is None or pair[0].busy:
            cache = self._new_cache(pool.slots, pool.capacity)
            pair = (cache, DecodeStep(self.lm, cache, self.compile))
            if key not in pools:
                while len(pools) >= POOLS_PER_MODEL:
                    pools.pop(next(iter(pools)))
                pools[key] = pair
        self.cache, self.step = pair
        self.cache.busy = True
        self.cache.lengths.zero_()
        self.ids = torch.full((pool.slots, 1), self.lm.pad_token_id, dtype=torch.long, device=self.lm.device)

    def admit(self, job: Any, slots: Sequence[int], side_rows: Sequence[int]) -> None:
        """Prefill a job alone; its rows go to their slots, or to a cache of the job's own (``side_rows``)."""
        t0 = time.perf_counter()
        logits, kv, job.shared = prefill_job(self.lm, job, self.prefix_sharing, self.static_cache)
        job.logits = logits
        side = list(side_rows)
        if slots:
            self.pooled += 1
            for i, row in enumerate(job.rows):
                if i in side:
                    self.cache.release([slots[i]])
                else:
                    self.cache.write(slots[i], kv[i], len(row))
        placement = Placement(list(slots), side, side_slot={r: j for j, r in enumerate(side)})
        if side:
            need = max(len(job.rows[i]) for i in side) + job.max_new_tokens
            side_cache = self._new_cache(len(side), need)
            for j, i in enumerate(side):
                side_cache.write(j, kv[i], len(job.rows[i]))
            placement.side = (side_cache, DecodeStep(self.lm, side_cache, False))
        job.placement = placement
        job.started = time.perf_counter()
        job.prefill_seconds = job.started - t0

    def release(self, job: Any) -> None:
        """The job has left: its pool slots go idle (length 0: an idle slot attends to its position 0 only)."""
        if job.placement is not None and job.placement.slots:
            self.cache.release(job.placement.slots)
            self.pooled -= 1
            if not self.pooled:
                self.cache.busy = False  # another engine on this model may take the pool

    def _drop_finished(self, job: Any) -> None:
        """Leave the rows of ``job`` that have finished (independent mode) out of the next steps: each one's slot takes
        the job's unfinished row with the highest slot (its keys and values moved), so that the unfinished rows of a
        job keep its lowest slots and a step computes the first slots only (:meth:`forward`). Which rows have finished
        follows from released tokens (a row's EOS), so the batch's shapes stay public."""
        p = job.placement
        if job.joint or p is None or not self.drop_finished:
            return
        done = [i for i, d in enumerate(job.done_rows.tolist()) if d and i not in p.dropped]
        for r in done:
            p.dropped.add(r)
            if r in p.side_slot:
                where, cache = p.side_slot, p.side[0]
            elif p.slots:
                where = {i: p.slots[i] for i in range(job.k) if i not in p.side_slot}
                cache = self.cache
            else:
                continue
            live = [i for i in where if i not in p.dropped]
            top = max(live, key=lambda i: where[i], default=None)
            if top is not None and where[top] > where[r]:
                cache.move(where[top], where[r])
                where[top], where[r] = where[r], where[top]
                if where is not p.side_slot:
                    p.slots[top], p.slots[r] = where[top], where[r]
            else:
                cache.release([where[r]])

    def forward(self, going: Sequence[tuple[Any, torch.Tensor]]) -> None:
        """One decode step for these jobs (each with its next input ids ``(K, 1)``): sets each job's logits.

        Rows that have finished (independent mode) are not computed: their logits are zeros, which the mechanism
        reads for nothing (their tokens are discarded). With the compiled step the pool is computed whole."""
        lm = self.lm
        for job, _ in going:
            self._drop_finished(job)
        live = {id(job): [i for i in range(job.k) if i not in job.placement.dropped] for job, _ in going}
        pooled = [job for job, _ in going if job.placement.slots]
        in_pool = [(job, [r for r in live[id(job)] if r not in job.placement.side_slot]) for job in pooled]
        parts: list[torch.Tensor] = []
        width = 0
        if any(rows for _, rows in in_pool):
            for job, next_ids in going:
                if job.placement.slots:
                    self.ids[job.placement.slots] = next_ids
            width = self.cache.slots if self.compile else 1 + max(job.placement.slots[r] for job, rows in in_pool
                                                                  for r in rows)
            parts.append(self.step(self.ids[:width]))
            advance = torch.zeros(self.cache.slots, dtype=torch.long, device=lm.device)
            for job, rows in in_pool:
                advance[[job.placement.slots[r] for r in rows]] = 1
            self.cache.lengths += advance
        offset = width
        where: list[list[int]] = []
        for job, next_ids in going:
            p = job.placement
            loc = list(p.slots) if p.slots else [-1] * job.k
            if p.side is not None:
                side_cache, side_step = p.side
                rows = [r for r in p.side_rows if r not in p.dropped]
                if rows:
                    ids = next_ids.new_empty((len(rows), 1))
                    ids[[p.side_slot[r] for r in rows]] = next_ids[rows]
                    h = side_step(ids)
                    side_cache.lengths[:len(rows)] += 1
                    parts.append(h)
                    for r in rows:
                        loc[r] = offset + p.side_slot[r]
                    offset += h.shape[0]
            where.append(loc)
        states = torch.cat(parts) if len(parts) > 1 else parts[0]
        head = lm.model.get_output_embeddings()
        full_rows: list[int] = []
        for (job, _), loc in zip(going, where, strict=True):
            full_rows.extend(loc[:1] if job.split else [loc[r] for r in live[id(job)]])
        full = head(states[full_rows])
        at = 0
        split: list[tuple[Any, torch.Tensor, torch.Tensor]] = []
        for (job, _), loc in zip(going, where, strict=True):
            if not job.split:
                rows = live[id(job)]
                if len(rows) == job.k:
                    job.logits = full[at:at + job.k]
                else:  # finished rows: zeros, read for nothing
                    job.logits = full.new_zeros((job.k, full.shape[-1]))
                    job.logits[rows] = full[at:at + len(rows)]
                at += len(rows)
                continue
            split.append((job, full[at:at + 1], states[loc[1:]]))
            at += 1
        for (job, _, _), logits in zip(split, split_logits_many(split, head, self.eos) if split else [], strict=True):
            job.logits = logits
        for job in pooled:
            self.ids[job.placement.slots] = lm.pad_token_id
