"""The slot engine: many jobs, each with its own K rows, decoded in ONE forward per step (continuous batching).

:meth:`dpinfer.engine.Engine.run_jobs` serves J jobs × K_j rows through a fixed set of row *slots*. A job joins when
K_j slots are free (first fit, in job order), is prefilled on its own (eagerly, with the engine's prefill code), and
leaves when it finishes (EOS, ``T_max`` or its mechanism's stop); its slots are then given to the next job. The KV cache
(:class:`SlotCache`) keeps a length per slot: rows are left-aligned, each writes its next key/value at its own
position, the attention mask of a step is built from the lengths (a 4-D mask, used as is by the model) and every row
has its own position ids. No write position is shared and nothing is copied to realign rows.

Per step: one forward of the decoder over the S slots (compiled once per (slot count, capacity) bucket with
``torch.compile(dynamic=False)`` when ``compile`` is on), then, outside the graph, the output head and each job's own
mechanism, processors and random source on its own K rows (mechanisms are unchanged). For a job whose mechanism reads
the private rows on a public column subset (:meth:`Mechanism.private_columns`) the head is split as in the one-job
engine: full on the public row, on the requested columns only for the private rows.

Privacy rules for batching (rule 2, across jobs)
------------------------------------------------
* **Public shapes.** Every shape of the shared decode batch depends only on public quantities: the slot count ``S``
  (``max_rows``, or the jobs' K_j), the capacity ``C`` (the largest ``public width + max_new_tokens`` over the mixed
  jobs, rounded up to a multiple of :data:`CAPACITY_STEP`) and the row order (jobs in order, first fit, leaving only
  after a released token). A job's *public width* is ``max(len(row 0), pad_width)`` when its mechanism has a public
  row 0 (:attr:`Mechanism.public_row`, K > 1), ``pad_width`` otherwise; a job without one (no public row and no
  ``pad_width``) is never mixed with others: it runs alone, after the mixed jobs, in a batch sized for it.
* **Rows that do not fit.** A private row whose length plus ``T_max`` exceeds ``C`` keeps its slot in the shared batch
  as an idle filler (same shapes) and is decoded in a side batch of its own job; whether a row fits changes nothing any
  other row computes.
* **Public row independence.** A row's attention reads its own slot only (its mask comes from its own length; a slot
  is zeroed beyond the prefill when a job takes it), and every other operation of the step is row-wise for fixed
  shapes, so the public row of every job is bit-for-bit independent of every private row in the batch, its own job's
  and other jobs' (content AND length). ``tests/unit/test_slots.py`` checks it with ``torch.equal``.
* **Leaving is post-processing.** A job leaves after a released token (EOS, ``T_max``) or its mechanism's stop, so
  the batch composition over time is a function of public parameters and DP releases.

What a seed reproduces
----------------------
Batched kernels are not bit-identical across batch compositions (a row's floating-point rounding may depend on S, C
and where its slot sits). The same jobs, in the same order, with the same seeds, ``max_rows``, ``compile`` setting,
model and machine give the same outputs, token for token; a job run alone (:meth:`Engine.generate`) or in another mix
gives the same tokens up to that rounding (greedy choices agree unless two candidates are within rounding).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dpinfer.errors import ConfigurationError

CAPACITY_STEP = 64
"""The shared cache capacity is rounded up to a multiple of this (fewer compiled shapes across calls)."""

DEFAULT_MAX_ROWS = {"cpu": 64, "cuda": 144}
"""Default slot count per device type (capped by the jobs' total K, at least the largest K). CPU: 8 TAB documents
(DP-Fusion, 7 rows each) through ``sanitize_many`` on the embedded model took 63 s with 64 slots against 91 s with
16 on an idle 2-core machine; ``dpinfer bench sanitize --corpus 8 --repeats 2``: 2.24× one by one with 64."""

SLOT_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral", "olmo2", "phi3", "smollm3"})
"""Architectures whose decoder takes a caller's 4-D mask and per-row position ids as is (``create_causal_mask``) and
stores keys/values through ``Cache.update``; the slot engine is used for them when no sliding window is active."""

COMPILE_CPU_DEFAULT = False
"""``compile="auto"`` on CPU: eager. Measured with ``dpinfer bench engine --jobs 8 --compile`` on the 2-core development
machine (docs/benchmarks.md): the interleaved decode-step A/B had eager faster (compiled ×0.64), and compiling costs
up to ~2 minutes per (slot count, capacity) bucket."""


def slots_supported(model: Any) -> bool:
    """Whether ``model`` can run in the slot engine (see :data:`SLOT_MODEL_TYPES`)."""
    config = model.config
    if getattr(config, "model_type", None) not in SLOT_MODEL_TYPES:
        return False
    if getattr(config, "use_sliding_window", True) and getattr(config, "sliding_window", None):
        return False
    layer_types = getattr(config, "layer_types", None)
    return not layer_types or all(t == "full_attention" for t in layer_types)


def resolve_compile(compile: bool | str, device: Any) -> bool:
    """``compile`` as a bool: ``"auto"`` compiles on CUDA and follows :data:`COMPILE_CPU_DEFAULT` on CPU.

    >>> resolve_compile("auto", torch.device("cuda")), resolve_compile(False, torch.device("cuda"))
    (True, False)
    """
    if compile == "auto":
        return torch.device(device).type == "cuda" or COMPILE_CPU_DEFAULT
    if isinstance(compile, bool):
        return compile
    raise ConfigurationError(f"compile must be 'auto', True or False, got {compile!r}")


def bucket_capacity(need: int) -> int:
    """The cache capacity for ``need`` positions, rounded up to a multiple of :data:`CAPACITY_STEP`.

    >>> bucket_capacity(1), bucket_capacity(64), bucket_capacity(65)
    (64, 64, 128)
    """
    return -(-need // CAPACITY_STEP) * CAPACITY_STEP


# ---------------------------------------------------------------------------------------------------- the KV cache
def _layer_class() -> type:
    from transformers.cache_utils import CacheLayerMixin

    class SlotLayer(CacheLayerMixin):
        """One layer of a :class:`SlotCache`: keys and values ``(S, H, C, D)``; a decode step writes row ``s`` at
        ``lengths[s]`` and attends to the whole fixed-capacity tensors (the mask hides what is not the row's)."""

        is_compileable = True
        supports_early_init = False

        def __init__(self, owner: SlotCache) -> None:
            super().__init__()
            self.owner = owner

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            raise RuntimeError("a SlotCache is allocated by SlotCache.write before the first step")

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
                   ) -> tuple[torch.Tensor, torch.Tensor]:
            s, h, q, _ = key_states.shape
            if q != 1:
                raise RuntimeError("a SlotCache takes one new position per row (decode steps only)")
            idx = self.owner.lengths.view(s, 1, 1, 1)
            self.keys.scatter_(2, idx.expand(s, h, 1, key_states.shape[-1]), key_states)
            self.values.scatter_(2, idx.expand(s, h, 1, value_states.shape[-1]), value_states)
            return self.keys, self.values

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.owner.capacity, 0

        def get_seq_length(self) -> int:
            return 0

        def get_max_length(self) -> int:
            return self.owner.capacity

    return SlotLayer


class SlotCache:
    """A KV cache of ``slots`` rows × ``capacity`` positions with a length per row (see the module docstring).

    Built as a :class:`transformers.Cache` (:meth:`as_hf`); the tensors are allocated at the first :meth:`write` with
    the prefill's head count, head size, dtype and device.
    """

    def __init__(self, num_layers: int, slots: int, capacity: int, device: Any) -> None:
        from transformers.cache_utils import Cache

        self.slots, self.capacity, self.num_layers = slots, capacity, num_layers
        self.lengths = torch.zeros(slots, dtype=torch.long, device=device)
        self.positions = torch.arange(capacity, device=device)
        layer_cls = _layer_class()
        self.hf = Cache(layers=[layer_cls(self) for _ in range(num_layers)])
        self.allocated = False
        self.busy = False

    @property
    def layers(self) -> list[Any]:
        return self.hf.layers

    def _allocate(self, kv: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        for layer, (k, v) in zip(self.layers, kv, strict=True):
            layer.keys = k.new_zeros((self.slots, k.shape[0], self.capacity, k.shape[-1]))
            layer.values = v.new_zeros((self.slots, v.shape[0], self.capacity, v.shape[-1]))
            layer.is_initialized = True
            if torch.device(k.device).type == "cuda":  # fixed addresses for CUDA graphs
                torch._dynamo.mark_static_address(layer.keys)
                torch._dynamo.mark_static_address(layer.values)
        self.allocated = True

    def write(self, slot: int, kv: Sequence[tuple[torch.Tensor, torch.Tensor]], length: int) -> None:
        """Put one row's prefill in ``slot``: ``kv[layer] = (keys (H, length, D), values)``; positions from
        ``length`` on are zeroed (nothing of a slot's previous job stays)."""
        if length > self.capacity:
            raise RuntimeError("row longer than the slot capacity")  # callers route such rows elsewhere
        if not self.allocated:
            self._allocate(kv)
        for layer, (k, v) in zip(self.layers, kv, strict=True):
            layer.keys[slot, :, :length] = k[:, :length]
            layer.keys[slot, :, length:] = 0
            layer.values[slot, :, :length] = v[:, :length]
            layer.values[slot, :, length:] = 0
        self.lengths[slot] = length

    def release(self, slots: Sequence[int]) -> None:
        """Make ``slots`` idle (length 0: an idle slot attends to its position 0 only; its output is ignored)."""
        self.lengths[list(slots)] = 0

    def mask(self, dtype: torch.dtype) -> torch.Tensor:
        """The additive 4-D mask ``(S, 1, 1, C)`` of the next step: row ``s`` sees positions ``0..lengths[s]``
        (its prefix and the key it writes now)."""
        seen = self.positions.view(1, -1) <= self.lengths.view(-1, 1)
        zero = torch.zeros((), dtype=dtype, device=seen.device)
        return torch.where(seen, zero, torch.finfo(dtype).min)[:, None, None, :]


class DecodeStep:
    """One decode forward over every slot of a :class:`SlotCache`: ``(S, 1)`` input ids → ``(S, hidden)`` last
    hidden states, the new keys written at each row's length (the caller then advances the lengths)."""

    def __init__(self, lm: Any, cache: SlotCache, compile: bool) -> None:
        from dpinfer.engine import _cache_parameter

        self.decoder = lm.model.get_decoder()
        self.cache = cache
        self.dtype = lm.dtype
        self._cache_name = _cache_parameter(type(self.decoder))
        self.compiled = compile
        self._fn = self._eager
        if compile:
            mode = "reduce-overhead" if torch.device(lm.device).type == "cuda" else None
            self._fn = torch.compile(self._eager, dynamic=False, mode=mode)

    def _eager(self, ids: torch.Tensor) -> torch.Tensor:
        cache = self.cache
        out = self.decoder(input_ids=ids, attention_mask=cache.mask(self.dtype), position_ids=cache.lengths.view(-1, 1),
                           use_cache=True, **{self._cache_name: cache.hf})
        return out.last_hidden_state[:, -1, :]

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        out = self._fn(ids)
        if self.compiled and torch.device(out.device).type == "cuda":
            out = out.clone()  # CUDA-graph outputs are overwritten by the next replay
        return out


# ---------------------------------------------------------------------------------------------------- scheduling
@dataclass
class LiveJob:
    """A job being served: its checked rows, randomness, state, slots and pending logits."""

    index: int
    job: Any
    rows: list[list[int]]
    procs: tuple
    width: int | None
    joint: bool = False
    split: bool = False
    source: Any = None
    state: Any = None
    slots: list[int] = field(default_factory=list)
    side_rows: list[int] = field(default_factory=list)
    side: tuple[SlotCache, DecodeStep] | None = None
    t: int = 0
    logits: torch.Tensor | None = None
    shared: int = 0
    prefill_seconds: float = 0.0
    started: float = 0.0

    @property
    def k(self) -> int:
        return len(self.rows)


def public_width(job: Any, rows: Sequence[Sequence[int]]) -> int | None:
    """The job's public width (module docstring): ``max(len(row 0), pad_width)`` with a public row, else
    ``pad_width`` (``None``: the job is not mixed with others)."""
    mech = job.mechanism
    if mech.mode == "joint" and len(rows) > 1 and mech.public_row:
        return max(len(rows[0]), job.pad_width or 0)
    return job.pad_width


class SlotServer:
    """Serves checked jobs through the slot cache of an :class:`~dpinfer.engine.Engine` (see the module docstring)."""

    def __init__(self, engine: Any, *, max_rows: int | None = None, compile: bool | str = "auto") -> None:
        if max_rows is not None and (isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1):
            raise ConfigurationError(f"max_rows must be an integer ≥ 1 or None, got {max_rows!r}")
        self.engine = engine
        self.lm = engine.lm
        self.max_rows = max_rows
        self.compile = resolve_compile(compile, self.lm.device)
        self.eos = torch.as_tensor(sorted(self.lm.eos_token_ids), dtype=torch.long, device=self.lm.device)

    # -------------------------------------------------------------- plan
    def plan(self, lives: Sequence[LiveJob]) -> tuple[list[LiveJob], list[LiveJob], int, int]:
        """(mixed jobs, solo jobs, slot count S, capacity C), from public quantities only."""
        mixed = [x for x in lives if x.width is not None]
        solo = [x for x in lives if x.width is None]
        if not mixed:
            return mixed, solo, 0, 0
        largest = max(x.k for x in mixed)
        device_type = torch.device(self.lm.device).type
        default = DEFAULT_MAX_ROWS.get(device_type, DEFAULT_MAX_ROWS["cpu"])
        slots = max(largest, min(sum(x.k for x in mixed), self.max_rows or default))
        need = max(x.width + x.job.max_new_tokens for x in mixed)
        capacity = min(bucket_capacity(need), max(need, self.lm.context_window))
        return mixed, solo, slots, capacity

    def _pool(self, slots: int, capacity: int) -> tuple[SlotCache, DecodeStep]:
        """The engine's cache and decode step for this (S, C) bucket, reused across calls (one compilation each);
        a fresh pair while another ``run_jobs`` of the same engine still holds it."""
        pools = self.engine.__dict__.setdefault("_slot_pools", {})
        key = (slots, capacity, self.compile)
        if key not in pools or pools[key][0].busy:
            cache = SlotCache(self.lm.model.config.num_hidden_layers, slots, capacity, self.lm.device)
            pair = (cache, DecodeStep(self.lm, cache, self.compile))
            if key in pools:
                return pair
            pools.clear()  # one bucket held at a time (memory)
            pools[key] = pair
        cache, step = pools[key]
        cache.lengths.zero_()
        return cache, step

    # -------------------------------------------------------------- run
    def serve(self, lives: Sequence[LiveJob]) -> Iterator[tuple[int, Any]]:
        """Yield ``(job index, EngineOutput)`` as jobs finish: the mixed jobs through one shared batch, then each
        solo job in a batch of its own. The work runs under ``torch.inference_mode``, never held across a yield (the
        caller's code, or another ``run_jobs`` interleaved with this one, keeps its own grad mode)."""
        mixed, solo, slots, capacity = self.plan(lives)
        if mixed:
            with torch.inference_mode():
                cache, step = self._pool(slots, capacity)
            cache.busy = True
            try:
                yield from self._serve(mixed, cache, step)
            finally:
                cache.busy = False
        for live in solo:
            need = max(map(len, live.rows)) + live.job.max_new_tokens
            with torch.inference_mode():
                cache = SlotCache(self.lm.model.config.num_hidden_layers, live.k, need, self.lm.device)
            yield from self._serve([live], cache, DecodeStep(self.lm, cache, False))

    def _serve(self, queue: list[LiveJob], cache: SlotCache, step: DecodeStep) -> Iterator[tuple[int, Any]]:
        pending = list(queue)
        free = list(range(cache.slots))
        active: list[LiveJob] = []
        with torch.inference_mode():
            ids = torch.full((cache.slots, 1), self.lm.pad_token_id, dtype=torch.long, device=self.lm.device)
        while pending or active:
            with torch.inference_mode():
                finished, active, free = self._round(pending, active, free, cache, step, ids)
            yield from finished

    def _round(self, pending: list[LiveJob], active: list[LiveJob], free: list[int], cache: SlotCache,
               step: DecodeStep, ids: torch.Tensor) -> tuple[list[tuple[int, Any]], list[LiveJob], list[int]]:
        """One round: admit what fits (first fit, in job order), step every active job's mechanism, release the
        finished ones, run one forward for the others. Returns (finished (index, output), active, free slots)."""
        lm = self.lm
        for live in list(pending):
            if live.k <= len(free):
                live.slots, free = free[:live.k], free[live.k:]
                pending.remove(live)
                self._admit(live, cache)
                active.append(live)
        finished, still = [], []
        for live in active:
            next_ids = self._mechanism_step(live)
            if next_ids is None:
                cache.release(live.slots)
                free = sorted(free + live.slots)
                finished.append((live.index, self._output(live)))
                continue
            ids[live.slots] = next_ids
            still.append(live)
        active = still
        if not active:
            if pending and min(x.k for x in pending) > cache.slots:
                raise RuntimeError("a job needs more slots than the batch has")  # plan() prevents it
            return finished, active, free
        hidden = step(ids)
        advance = torch.zeros(cache.slots, dtype=torch.long, device=lm.device)
        for live in active:
            advance[live.slots] = 1
            for r in live.side_rows:
                advance[live.slots[r]] = 0  # idle filler
        cache.lengths += advance
        self._logits(active, hidden, ids)
        for live in active:
            ids[live.slots] = lm.pad_token_id
        return finished, active, free

    def _admit(self, live: LiveJob, cache: SlotCache) -> None:
        """Prefill a job alone and put its rows in its slots (rows that do not fit go to a side batch)."""
        from dpinfer.engine import _RunState
        from dpinfer.mechanisms.randomness import as_random_source, random_source

        engine, job = self.engine, live.job
        mech = job.mechanism
        live.joint = mech.mode == "joint"
        mech.start(live.k, self.lm.vocab_size)
        live.source = random_source(job.seed) if job.generator is None else as_random_source(job.generator)
        live.split = (live.joint and live.k > 1 and engine.split_head and mech.restricts_private_columns
                      and engine._head_splits())
        live.state = _RunState.new(live.k, self.lm.device)
        t0 = time.perf_counter()
        logits, kv, live.shared = self._prefill(live)
        live.logits = logits
        room = cache.capacity - job.max_new_tokens
        side = [i for i, r in enumerate(live.rows) if len(r) > room]
        live.side_rows = side
        for i, row in enumerate(live.rows):
            if i in side:
                cache.release([live.slots[i]])
            else:
                cache.write(live.slots[i], kv[i], len(row))
        if side:
            need = max(len(live.rows[i]) for i in side) + job.max_new_tokens
            side_cache = SlotCache(self.lm.model.config.num_hidden_layers, len(side), need, self.lm.device)
            for j, i in enumerate(side):
                side_cache.write(j, kv[i], len(live.rows[i]))
            live.side = (side_cache, DecodeStep(self.lm, side_cache, False))
        live.started = time.perf_counter()
        live.prefill_seconds = live.started - t0

    def _prefill(self, live: LiveJob) -> tuple[torch.Tensor, list[list[tuple[torch.Tensor, torch.Tensor]]], int]:
        """(last logits (K, V), per row and layer (keys (H, L, D), values), shared prefix) with the engine's
        prefill: the public-row prefill (row 0 alone) for a public-row mechanism, the batched one otherwise."""
        engine, rows = self.engine, live.rows
        if live.joint and live.k > 1 and live.job.mechanism.public_row:
            last, layers, shared = engine._prefill_public_rows(rows)
            kv = [[(k[0], v[0]) for k, v in row] for row in layers]
            return torch.stack(last), kv, shared
        logits, pcache, mask, _, shared = engine._prefill(rows, 1)
        width = mask.shape[1]
        kv = []
        for i in range(len(rows)):
            keep = mask[i].bool()
            kv.append([(layer.keys[i, :, :width][:, keep], layer.values[i, :, :width][:, keep])
                       for layer in pcache.layers])
        return logits, kv, shared

    def _mechanism_step(self, live: LiveJob) -> torch.Tensor | None:
        """The job's mechanism on its pending logits (as in :meth:`Engine.stream`); the next input ids ``(K, 1)``,
        or None when the job has finished."""
        from dpinfer.mechanisms.base import StepInfo
        from dpinfer.mechanisms.transforms import apply

        job, state, t = live.job, live.state, live.t
        scores = live.logits.to(torch.float64)
        live.logits = None
        if t < job.min_new_tokens and self.eos.numel():
            scores[:, self.eos] = -torch.inf
        scores = apply(live.procs, scores, state.sequences[:1] if live.joint else state.sequences)
        info = StepInfo(step=t, max_new_tokens=job.max_new_tokens, num_contexts=live.k,
                        finished=None if live.joint else state.finished.clone())
        res = job.mechanism.step(scores, info, live.source)
        if res.stats is not None:
            state.steps.append(dict(res.stats))
        if live.joint:
            _, next_ids = self.engine._joint_tokens(res, t, state, job.stop_on_eos)
        else:
            _, next_ids = self.engine._independent_tokens(res, t, state, job.stop_on_eos, self.eos)
        live.t += 1
        if next_ids is None or t == job.max_new_tokens - 1:
            return None
        return next_ids

    def _logits(self, active: Sequence[LiveJob], hidden: torch.Tensor, ids: torch.Tensor) -> None:
        """Each active job's next logits (K, V) from the step's hidden states (side rows from their own batch): one
        output-head call for every row that needs all columns, one per split job for its private columns."""
        model = self.lm.model
        head = model.get_output_embeddings()
        parts, offset = [hidden], hidden.shape[0]
        where: dict[int, list[int]] = {}
        for live in active:
            loc = list(live.slots)
            if live.side is not None:
                side_cache, side_step = live.side
                side_ids = ids[[live.slots[r] for r in live.side_rows]]
                h = side_step(side_ids)
                side_cache.lengths += 1
                parts.append(h)
                for j, r in enumerate(live.side_rows):
                    loc[r] = offset + j
                offset += h.shape[0]
            where[id(live)] = loc
        states = torch.cat(parts) if len(parts) > 1 else hidden
        full_rows: list[int] = []
        for live in active:
            loc = where[id(live)]
            full_rows.extend(loc[:1] if live.split else loc)
        full = head(states[full_rows])
        at = 0
        for live in active:
            loc = where[id(live)]
            if not live.split:
                live.logits = full[at:at + live.k]
                at += live.k
                continue
            public = full[at:at + 1]
            at += 1
            live.logits = self._split_logits(live, public, states[loc[1:]], head)

    def _split_logits(self, live: LiveJob, public: torch.Tensor, private_states: torch.Tensor, head: Any
                      ) -> torch.Tensor:
        """The split head of :meth:`Engine._split_step` for one job: public row in full, private rows on the
        columns the mechanism asks for (decided from the public row after the same processors)."""
        from dpinfer.mechanisms.transforms import apply

        probe = public.to(torch.float64)
        if live.t < live.job.min_new_tokens and self.eos.numel():
            probe[:, self.eos] = -torch.inf
        probe = apply(live.procs, probe, live.state.sequences[:1])
        cols = live.job.mechanism.private_columns(probe[0])
        if cols is None:
            return torch.cat([public, head(private_states)])
        bias = head.bias.index_select(0, cols) if head.bias is not None else None
        private = torch.nn.functional.linear(private_states, head.weight.index_select(0, cols), bias)
        logits = public.new_full((live.k, public.shape[-1]), -torch.inf)
        logits[:1] = public
        logits[1:, cols] = private
        return logits

    def _output(self, live: LiveJob) -> Any:
        from dpinfer.engine import EngineOutput

        state = live.state
        return EngineOutput(
            sequences=state.sequences, finish_reasons=state.reasons, steps=state.steps,
            prompt_lengths=[len(r) for r in live.rows], shared_prefix=live.shared,
            prefill_seconds=live.prefill_seconds, decode_seconds=time.perf_counter() - live.started,
        )
