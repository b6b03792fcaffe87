"""The decoding engine: K contexts stepped together with one KV cache.

The engine owns the model; a :class:`~dpinfer.mechanisms.Mechanism` owns the choice of tokens. Per run:

1. **Prefill** the K token sequences in one batch. Rows of different lengths are left-padded, with an attention mask
   and position ids counted from each row's first real token, so padding changes nothing. When all rows share a
   prefix (the instruction before the first private token, or K copies of one prompt) the prefix is run once and its
   cache copied to the K rows (``prefix_sharing``); only the differing suffixes are run in the batch.
2. **Decode**: one forward per generated token for all K rows, ``logits_to_keep=1``. The last-position logits go to
   the mechanism in float64, unclamped.

   * ``joint`` mode: the mechanism returns ONE token, appended to every row; generation stops at EOS or ``T_max``.
   * ``independent`` mode: one token per row; a row stops at its own EOS, the run when every row has stopped.

**Public row** (joint mechanisms whose row 0 is the public context, :attr:`Mechanism.public_row`; K > 1): nothing the
public row's computation sees may depend on the private rows 1..K−1, bit for bit (their content AND their length).
The public row is prefilled alone, in one forward pass over its own tokens (no shared-prefix split, no padding); each
private row is prefilled alone too, reusing the public row's keys for the prefix it shares with it. Decode steps run
the K rows in one batch left-padded to a PUBLIC width ``max(len(row 0), pad_width)`` (``pad_width``: a bound the
caller derives from public parameters, e.g. template length + ``max_reference_tokens``); the public row's padding
holds zeros and every shape of the batch (K, width, step) is public. A private row longer than that width keeps its
slot in the batch filled with a copy of the public row (ignored) and is decoded in a second batch of its own. With
int8 layers every row has its own quantisation scale (:func:`dpinfer.models.quantize_int8`).

**Many jobs** (:meth:`Engine.run_jobs`): the slot engine of :mod:`dpinfer.slots` decodes every job's rows in one
forward per step (continuous batching, a KV cache with a length per row), with the same public-row rules across jobs.

Randomness comes only from a per-run :class:`~dpinfer.mechanisms.randomness.RandomSource`: the operating system's
CSPRNG by default, a whole-seed PCG64 stream with ``seed`` (tests and benchmarks: the same seed reproduces a run).
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dpinfer.errors import ConfigurationError, ContextTooLongError, InvalidInputError
from dpinfer.mechanisms.base import Mechanism, StepInfo, StepResult
from dpinfer.mechanisms.randomness import Randomness, as_random_source, random_source
from dpinfer.mechanisms.transforms import LogitsProcessor, apply, check_processors
from dpinfer.models import LM

MIN_SHARED_PREFIX = 8
"""Shortest common prefix worth a separate prefill (below it, batching everything is as fast)."""

SPLIT_HEAD_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "smollm3", "phi3", "olmo2"})
"""Architectures whose logits are exactly ``lm_head(final hidden state)``: the engine may then compute the private rows'
logits on a public subset of columns only (:meth:`Mechanism.private_columns`)."""

PER_ROW_PREFILL = 0.7
"""With the static cache, rows are prefilled one at a time when their real tokens fill less than this share of the
left-padded batch (e.g. references of very different lengths): the padding would cost more than the lost batching."""


@dataclass
class StepEvent:
    """One generated step, as streamed by :meth:`Engine.stream`.

    ``tokens`` has one id (joint) or K ids (independent; ``-1`` for rows already finished).
    ``stats`` are the mechanism's DATA-DEPENDENT per-step figures (never a guarantee).
    """

    step: int
    tokens: list[int]
    stats: dict[str, Any] | None = None


@dataclass
class EngineOutput:
    """Result of one engine run.

    Attributes:
        sequences: generated ids per row (joint mode: K identical lists), EOS excluded.
        finish_reasons: per row, ``"eos"``, ``"length"`` or ``"budget"`` (the mechanism stopped the run).
        steps: per-step data-dependent statistics from the mechanism (``[]`` when it reports none).
        prompt_lengths: prompt tokens per row (before padding).
        shared_prefix: tokens prefilled once for all rows (with a public row: the shortest prefix a private row reuses
            from the public row's cache). It reads the private rows: a diagnostic, never part of a release.
        prefill_seconds, decode_seconds: wall-clock time of the two phases.
    """

    sequences: list[list[int]]
    finish_reasons: list[str]
    steps: list[dict[str, Any]] = field(default_factory=list)
    prompt_lengths: list[int] = field(default_factory=list)
    shared_prefix: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0

    @property
    def num_generated(self) -> int:
        """Forward steps run after prefill (= tokens generated by the longest row)."""
        return max((len(s) for s in self.sequences), default=0)


@dataclass
class EngineJob:
    """One job for :meth:`Engine.run_jobs`: its K contexts, its mechanism and the :meth:`Engine.stream` arguments that
    apply to it alone (see there). Jobs are independent: each has its own mechanism state and its own randomness."""

    contexts: Sequence[Sequence[int]]
    mechanism: Mechanism
    max_new_tokens: int
    min_new_tokens: int = 0
    seed: int | None = None
    generator: Randomness | None = None
    stop_on_eos: bool = True
    processors: Sequence[LogitsProcessor] = ()
    pad_width: int | None = None


@functools.cache
def _cache_parameter(cls: type) -> str:
    """The name under which ``cls.forward`` takes the KV cache: ``cache`` (transformers ≥ 5.2x, where
    ``past_key_values`` warns that it is deprecated) or ``past_key_values`` (older releases)."""
    try:
        params = inspect.signature(cls.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover - a forward without a signature
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def _cache_kwargs(module: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with ``past_key_values`` renamed to what ``module`` accepts (:func:`_cache_parameter`)."""
    name = _cache_parameter(type(module))
    if name != "past_key_values" and "past_key_values" in kwargs:
        kwargs = dict(kwargs)
        kwargs[name] = kwargs.pop("past_key_values")
    return kwargs


def _common_prefix_length(rows: Sequence[Sequence[int]]) -> int:
    first = rows[0]
    n = min(len(r) for r in rows)
    for i in range(n):
        t = first[i]
        if any(r[i] != t for r in rows[1:]):
            return i
    return n


@dataclass
class _Batch:
    """Rows decoded in one forward call: ``dest[j]`` is the row slot ``j`` computes (``None``: a filler slot whose
    output is ignored), with its cache, attention mask and next position ids."""

    dest: list[int | None]
    cache: Any
    mask: torch.Tensor
    pos: torch.Tensor

    @property
    def identity(self) -> bool:
        return self.dest == list(range(len(self.dest)))


def _left_pad(rows: Sequence[Sequence[int]], pad_id: int, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):] = torch.as_tensor(r, dtype=torch.long)
            mask[i, width - len(r):] = 1
    return ids.to(device), mask.to(device)


class Engine:
    """Steps K contexts of one model together.

    >>> # engine = Engine(dpinfer.load_model())
    >>> # out = engine.generate([ids_a, ids_b], mechanism, max_new_tokens=64, seed=0)

    Args:
        lm: the loaded model.
        prefix_sharing: prefill a prefix common to all rows once (exact: same positions, same cache values).
        static_cache: for K > 1 rows, pre-allocate the KV cache for prompt + ``max_new_tokens`` (written in place)
            instead of growing it by concatenation, which copies the whole cache at every step. One row always uses
            the dynamic cache, exactly as Hugging Face ``generate`` does.
    """

    def __init__(self, lm: LM, *, prefix_sharing: bool = True, static_cache: bool = True,
                 split_head: bool = True) -> None:
        self.lm = lm
        self.prefix_sharing = prefix_sharing
        self.static_cache = static_cache
        self.split_head = split_head

    # ------------------------------------------------------------------ split output head
    def _head_splits(self) -> bool:
        """Whether the logits are exactly ``lm_head(last hidden state)`` (no soft-capping or scaling), so that the
        head may be applied to some columns only."""
        model = self.lm.model
        config = model.config
        if getattr(config, "model_type", None) not in SPLIT_HEAD_MODEL_TYPES:
            return False
        if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
            return False
        # an int8 decode twin (load_model(quantize="int8")) runs every row in one int8 call, which reads a quarter of
        # the bytes of the float32 public row alone: no split there
        return isinstance(model.get_output_embeddings(), torch.nn.Linear)

    def _split_step(self, next_ids: torch.Tensor, batches: Sequence[_Batch], mechanism: Mechanism,
                    generated: list[list[int]], processors: Sequence[LogitsProcessor],
                    eos: torch.Tensor | None) -> torch.Tensor:
        """One decode step whose output head runs on the public row in full and on the private rows only for the
        columns the mechanism asks for (:meth:`Mechanism.private_columns`, decided from the public row after the same
        public processors); the other private entries are ``-inf``."""
        model = self.lm.model
        decoder = model.get_decoder()
        hidden = self._gather(next_ids, batches, lambda b, ids: decoder(**_cache_kwargs(decoder, dict(
            input_ids=ids, attention_mask=b.mask, position_ids=b.pos.unsqueeze(1), past_key_values=b.cache,
            use_cache=True))).last_hidden_state[:, -1, :])
        head = model.get_output_embeddings()
        public = head(hidden[:1])
        probe = public.to(torch.float64)
        if eos is not None and eos.numel():
            probe[:, eos] = -torch.inf
        probe = apply(processors, probe, generated)
        cols = mechanism.private_columns(probe[0])
        if cols is None:
            return torch.cat([public, head(hidden[1:])])
        bias = head.bias.index_select(0, cols) if head.bias is not None else None
        private = torch.nn.functional.linear(hidden[1:], head.weight.index_select(0, cols), bias)
        logits = public.new_full((hidden.shape[0], public.shape[-1]), -torch.inf)
        logits[:1] = public
        logits[1:, cols] = private
        return logits

    @staticmethod
    def _gather(next_ids: torch.Tensor, batches: Sequence[_Batch], run: Any) -> torch.Tensor:
        """Run ``run(batch, input_ids)`` on every batch (after extending its mask) and return its last-position
        outputs in row order (filler slots dropped)."""
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

    # ------------------------------------------------------------------ prefill
    def _forward(self, **kwargs: Any) -> Any:
        return self.lm.model(use_cache=True, logits_to_keep=1, return_dict=True, **_cache_kwargs(self.lm.model, kwargs))

    def _prefill_public(self, rows: Sequence[Sequence[int]], max_new_tokens: int, pad_width: int
                        ) -> tuple[torch.Tensor, list[_Batch], int]:
        """Prefill for a mechanism with a public row 0 (see the module docstring): return (last logits (K, V), the
        decode batches, the shortest prefix a private row reuses from the public row)."""
        last, layers, reused = self._prefill_public_rows(rows)
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

    def _prefill_public_rows(self, rows: Sequence[Sequence[int]]
                             ) -> tuple[list[torch.Tensor], list[list[tuple[torch.Tensor, torch.Tensor]]], int]:
        """The public row prefilled alone, then each private row alone (reusing the public row's keys for a shared
        prefix): (last logits per row, per row and layer (keys, values) of shape (1, H, L, D), the shortest prefix
        a private row reuses). Also the slot engine's prefill (:mod:`dpinfer.slots`)."""
        from transformers import DynamicCache

        device, config = self.lm.device, self.lm.model.config
        public = rows[0]
        pub_cache = DynamicCache(config=config)
        ids = torch.as_tensor([public], dtype=torch.long, device=device)
        out = self._forward(input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=pub_cache)
        last = [out.logits[0, -1, :]]
        layers = [[(layer.keys, layer.values) for layer in pub_cache.layers]]
        reused = []
        for row in rows[1:]:
            shared = 0
            if self.prefix_sharing:  # the private row reads the public row's keys; the public row reads nothing
                shared = min(_common_prefix_length([row, public]), len(row) - 1)
                shared = shared if shared >= MIN_SHARED_PREFIX else 0
            reused.append(shared)
            row_cache = DynamicCache(config=config)
            for j, layer in enumerate(pub_cache.layers):
                if shared:
                    row_cache.update(layer.keys[:, :, :shared], layer.values[:, :, :shared], j)
            ids = torch.as_tensor([row[shared:]], dtype=torch.long, device=device)
            positions = torch.arange(shared, len(row), device=device).unsqueeze(0)
            out = self._forward(input_ids=ids, attention_mask=torch.ones((1, len(row)), dtype=torch.long,
                                                                         device=device),
                                position_ids=positions, past_key_values=row_cache)
            last.append(out.logits[0, -1, :])
            layers.append([(layer.keys, layer.values) for layer in row_cache.layers])
        return last, layers, min(reused, default=0)

    def _batch(self, dest: list[int | None], layers: Sequence[Sequence[tuple[torch.Tensor, torch.Tensor]]],
               lengths: Sequence[int], width: int, max_new_tokens: int) -> _Batch:
        """A decode batch from per-row caches: keys and values right-aligned in ``width`` slots (zeros before), in a
        static cache of ``width + max_new_tokens`` slots (or a dynamic cache)."""
        from transformers import DynamicCache, StaticCache

        device, config = self.lm.device, self.lm.model.config
        n = len(dest)
        cache = (StaticCache(config=config, max_cache_len=width + max_new_tokens) if self.static_cache
                 else DynamicCache(config=config))
        for j in range(len(layers[0])):
            k0, v0 = layers[0][j]
            keys = k0.new_zeros((n, k0.shape[1], width, k0.shape[-1]))
            values = v0.new_zeros((n, v0.shape[1], width, v0.shape[-1]))
            for i, row in enumerate(layers):
                keys[i, :, width - lengths[i]:] = row[j][0][0]
                values[i, :, width - lengths[i]:] = row[j][1][0]
            cache.update(keys, values, j)
        mask = torch.zeros((n, width), dtype=torch.long, device=device)
        for i, length in enumerate(lengths):
            mask[i, width - length:] = 1
        return _Batch(dest=dest, cache=cache, mask=mask,
                      pos=torch.as_tensor(list(lengths), dtype=torch.long, device=device))

    def _prefill(self, rows: Sequence[Sequence[int]], max_new_tokens: int
                 ) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor, int]:
        """Run the prompts; return (last logits (K, V), cache, attention mask, next position ids (K,), shared)."""
        from transformers import DynamicCache, StaticCache

        device, pad, config = self.lm.device, self.lm.pad_token_id, self.lm.model.config
        k = len(rows)
        shared = 0
        if self.prefix_sharing and k > 1:
            shared = min(_common_prefix_length(rows), min(len(r) for r in rows) - 1)
            if shared < MIN_SHARED_PREFIX:
                shared = 0
        width = max(len(r) for r in rows) - shared
        static = self.static_cache and k > 1
        cache = (StaticCache(config=config, max_cache_len=shared + width + max_new_tokens) if static
                 else DynamicCache(config=config))
        suffixes = [r[shared:] for r in rows]
        per_row = static and sum(map(len, suffixes)) < PER_ROW_PREFILL * k * width
        prefix_cache = None
        if shared:
            prefix = torch.as_tensor([rows[0][:shared]], dtype=torch.long, device=device)
            prefix_cache = DynamicCache(config=config)
            self._forward(input_ids=prefix, attention_mask=torch.ones_like(prefix), past_key_values=prefix_cache)
            if per_row:
                pass  # _prefill_rows writes prefix and suffixes at once
            elif static:  # copy the one prefix into every row of the pre-allocated cache
                for i, layer in enumerate(prefix_cache.layers):
                    cache.update(layer.keys.expand(k, -1, -1, -1), layer.values.expand(k, -1, -1, -1), i)
            else:
                prefix_cache.batch_repeat_interleave(k)
                cache = prefix_cache
        ids, mask = _left_pad(suffixes, pad, device)
        full_mask = torch.cat([torch.ones((k, shared), dtype=mask.dtype, device=device), mask], dim=1)
        next_pos = torch.as_tensor([len(r) for r in rows], dtype=torch.long, device=device)
        if per_row:
            logits = self._prefill_rows(suffixes, shared, width, prefix_cache, cache)
            return logits, cache, full_mask, next_pos, shared
        positions = (mask.cumsum(-1) - 1).clamp(min=0) + shared
        out = self._forward(input_ids=ids, attention_mask=full_mask, position_ids=positions, past_key_values=cache)
        cache = out.get("cache") if out.get("cache") is not None else out.past_key_values
        return out.logits[:, -1, :], cache, full_mask, next_pos, shared

    def _prefill_rows(self, suffixes: Sequence[Sequence[int]], shared: int, width: int, prefix_cache: Any,
                      cache: Any) -> torch.Tensor:
        """Prefill rows of very different lengths one at a time (no compute on padding), then write their keys and
        values, left-aligned as the batched layout expects, into the pre-allocated cache. Exact: each row's keys are
        computed at its own positions, and the padding slots stay masked."""
        from transformers import DynamicCache

        device, config = self.lm.device, self.lm.model.config
        k = len(suffixes)
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        last: list[torch.Tensor] = []
        for i, row in enumerate(suffixes):
            row_cache = DynamicCache(config=config)
            if prefix_cache is not None:
                for j, layer in enumerate(prefix_cache.layers):
                    row_cache.update(layer.keys, layer.values, j)
            ids = torch.as_tensor([row], dtype=torch.long, device=device)
            positions = torch.arange(shared, shared + len(row), device=device).unsqueeze(0)
            out = self._forward(input_ids=ids, attention_mask=torch.ones((1, shared + len(row)), dtype=torch.long,
                                                                         device=device),
                                position_ids=positions, past_key_values=row_cache)
            last.append(out.logits[0, -1, :])
            for j, layer in enumerate(row_cache.layers):
                if i == 0:
                    shape = (k, layer.keys.shape[1], shared + width, layer.keys.shape[-1])
                    keys.append(layer.keys.new_zeros(shape))
                    values.append(layer.values.new_zeros((*shape[:3], layer.values.shape[-1])))
                    if shared:
                        keys[j][:, :, :shared] = layer.keys[0, :, :shared]
                        values[j][:, :, :shared] = layer.values[0, :, :shared]
                start = shared + width - len(row)
                keys[j][i, :, start:] = layer.keys[0, :, shared:]
                values[j][i, :, start:] = layer.values[0, :, shared:]
        for j in range(len(keys)):
            cache.update(keys[j], values[j], j)
        return torch.stack(last)

    # ------------------------------------------------------------------ run
    def stream(
        self,
        contexts: Sequence[Sequence[int]],
        mechanism: Mechanism,
        *,
        max_new_tokens: int,
        min_new_tokens: int = 0,
        seed: int | None = None,
        generator: Randomness | None = None,
        stop_on_eos: bool = True,
        processors: Sequence[LogitsProcessor] = (),
        pad_width: int | None = None,
        result: list[EngineOutput] | None = None,
    ) -> EngineStream:
        """Generate step by step: an :class:`EngineStream` that yields a :class:`StepEvent` per token and, once
        exhausted, holds the :class:`EngineOutput` in :attr:`EngineStream.output`. Arguments are checked here, before
        the model runs.

        Args:
            contexts: K token-id sequences (already tokenised; no special tokens are added).
            mechanism: turns the K rows of logits into token(s); its ``mode`` picks joint or independent decoding.
            max_new_tokens: ``T_max``.
            min_new_tokens: EOS is masked out (for every row alike) before this many tokens (benchmarks).
            seed / generator: source of all randomness: by default a secure source (``os.urandom``); ``seed`` (tests
                and benchmarks only) a reproducible one; ``generator`` a source or ``torch.Generator`` to use as is.
            stop_on_eos: stop at EOS (else always run ``max_new_tokens`` steps; EOS is then an ordinary token).
            processors: :class:`~dpinfer.mechanisms.transforms.LogitsProcessor` objects, each called as
                ``processor(generated, logits)`` before the mechanism, where ``generated`` holds the tokens generated
                so far (one list in joint mode, applied to every row alike; one list per row in independent mode).
                They see released tokens only, never a prompt.
            pad_width: with a public row (:attr:`Mechanism.public_row`, K > 1), a PUBLIC bound on the private rows'
                lengths (from parameters, never from the private rows): the decode batch is left-padded to
                ``max(len(row 0), pad_width)``; a private row longer than that is decoded in a second batch (slower,
                still exact). Default: the public row's length (DP-Fusion's rows all have it).
            result: deprecated; the output is also appended to this list when the stream ends (use
                :attr:`EngineStream.output`).
        """
        rows = self._check_run(contexts, max_new_tokens, min_new_tokens, pad_width)
        procs = check_processors(processors)
        return EngineStream(self._run(rows, mechanism, max_new_tokens, min_new_tokens, seed, generator, stop_on_eos,
                                      procs, pad_width), result)

    def generate(self, contexts: Sequence[Sequence[int]], mechanism: Mechanism, **kwargs: Any) -> EngineOutput:
        """Run :meth:`stream` to the end and return the :class:`EngineOutput` (same arguments)."""
        run = self.stream(contexts, mechanism, **kwargs)
        for _ in run:
            pass
        return run.output

    def run_jobs(self, jobs: Sequence[EngineJob], *, max_rows: int | None = None, compile: bool | str = "auto",
                 slots: bool = True) -> Iterator[tuple[int, EngineOutput]]:
        """Run several independent jobs; yield ``(index in jobs, output)`` as each job finishes (not necessarily in
        order). Every job is checked before any runs (a bad job raises, naming its index).

        With ``slots`` (the default, for the architectures of :data:`dpinfer.slots.SLOT_MODEL_TYPES`) the jobs share
        one forward per decode step: the slot engine of :mod:`dpinfer.slots` (continuous batching; what a seed
        reproduces and the privacy rules of batching are stated there). ``slots=False`` (or another architecture)
        runs the jobs one after another, exactly as :meth:`generate` would.

        Args:
            jobs: the jobs; each keeps its own mechanism, processors, randomness and ``max_new_tokens``.
            max_rows: slot count of the shared batch (public; default per device,
                :data:`dpinfer.slots.DEFAULT_MAX_ROWS`, capped by the jobs' total K, at least their largest K).
            compile: compile the decode step (``torch.compile``, once per slot-count and capacity bucket): ``True``,
                ``False`` or ``"auto"`` (on CUDA; on CPU :data:`dpinfer.slots.COMPILE_CPU_DEFAULT`).
            slots: use the slot engine (else one job after another).
        """
        from dpinfer import slots as slot_engine

        server = slot_engine.SlotServer(self, max_rows=max_rows, compile=compile) if slots else None
        checked = []
        for i, job in enumerate(jobs):
            try:
                rows = self._check_run(job.contexts, job.max_new_tokens, job.min_new_tokens, job.pad_width)
                procs = check_processors(job.processors)
            except (ConfigurationError, InvalidInputError) as err:
                raise type(err)(f"job {i}: {err}") from None
            checked.append((rows, procs))
        if server is not None and slot_engine.slots_supported(self.lm.model):
            lives = [slot_engine.LiveJob(index=i, job=job, rows=rows, procs=procs,
                                       width=slot_engine.public_width(job, rows))
                     for i, (job, (rows, procs)) in enumerate(zip(jobs, checked, strict=True))]
            yield from server.serve(lives)
            return
        for i, (job, (rows, procs)) in enumerate(zip(jobs, checked, strict=True)):
            run = EngineStream(self._run(rows, job.mechanism, job.max_new_tokens, job.min_new_tokens, job.seed,
                                         job.generator, job.stop_on_eos, procs, job.pad_width))
            for _ in run:
                pass
            yield i, run.output

    def _check_run(self, contexts: Sequence[Sequence[int]], max_new_tokens: int, min_new_tokens: int,
                   pad_width: int | None) -> list[list[int]]:
        """The contexts as lists of ints, after checking every run argument (before the model runs)."""
        rows = [list(map(int, c)) for c in contexts]
        if not rows:
            raise InvalidInputError("no contexts to decode")
        if any(len(r) == 0 for r in rows):
            raise InvalidInputError("every context needs at least one token")
        if max_new_tokens < 1:
            raise ConfigurationError(f"max_new_tokens must be ≥ 1, got {max_new_tokens}")
        if not 0 <= min_new_tokens <= max_new_tokens:
            raise ConfigurationError("min_new_tokens must be between 0 and max_new_tokens")
        if pad_width is not None and (isinstance(pad_width, bool) or not isinstance(pad_width, int) or pad_width < 0):
            raise ConfigurationError(f"pad_width must be an integer ≥ 0 or None, got {pad_width!r}")
        longest = max(len(r) for r in rows)
        if longest + max_new_tokens > self.lm.context_window:
            raise ContextTooLongError(
                f"prompt of {longest} tokens plus max_new_tokens={max_new_tokens} exceeds the model's context window "
                f"of {self.lm.context_window} tokens; shorten the input or lower max_new_tokens"
            )
        return rows

    def _run(self, rows: list[list[int]], mechanism: Mechanism, max_new_tokens: int, min_new_tokens: int,
             seed: int | None, generator: Randomness | None, stop_on_eos: bool,
             processors: tuple[LogitsProcessor, ...], pad_width: int | None
             ) -> Generator[StepEvent, None, EngineOutput]:
        """The decoding loop behind :meth:`stream` (arguments already checked); returns the :class:`EngineOutput`."""
        k, vocab = len(rows), self.lm.vocab_size
        joint = mechanism.mode == "joint"
        mechanism.start(k, vocab)
        device = self.lm.device
        source = random_source(seed) if generator is None else as_random_source(generator)
        eos = torch.as_tensor(sorted(self.lm.eos_token_ids), dtype=torch.long, device=device)
        split = joint and k > 1 and self.split_head and mechanism.restricts_private_columns and self._head_splits()
        state = _RunState.new(k, device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            if joint and k > 1 and mechanism.public_row:
                logits, batches, shared = self._prefill_public(rows, max_new_tokens, pad_width or 0)
            else:
                logits, cache, mask, pos, shared = self._prefill(rows, max_new_tokens)
                batches = [_Batch(dest=list(range(k)), cache=cache, mask=mask, pos=pos)]
            t_prefill = time.perf_counter() - t0
            for t in range(max_new_tokens):
                scores = logits.to(torch.float64)
                if t < min_new_tokens and eos.numel():
                    scores[:, eos] = -torch.inf
                scores = apply(processors, scores, state.sequences[:1] if joint else state.sequences)
                info = StepInfo(step=t, max_new_tokens=max_new_tokens, num_contexts=k,
                                finished=None if joint else state.finished.clone())
                res = mechanism.step(scores, info, source)
                if res.stats is not None:
                    state.steps.append(dict(res.stats))
                if joint:
                    event, next_ids = self._joint_tokens(res, t, state, stop_on_eos)
                else:
                    event, next_ids = self._independent_tokens(res, t, state, stop_on_eos, eos)
                if event is not None:
                    yield event
                if next_ids is None or t == max_new_tokens - 1:
                    break
                if split:
                    logits = self._split_step(next_ids, batches, mechanism, state.sequences[:1], processors,
                                              eos if t + 1 < min_new_tokens else None)
                else:
                    logits = self._gather(next_ids, batches, lambda b, ids: self._forward(
                        input_ids=ids, attention_mask=b.mask, position_ids=b.pos.unsqueeze(1),
                        past_key_values=b.cache).logits[:, -1, :])
        total = time.perf_counter() - t0
        return EngineOutput(
            sequences=state.sequences, finish_reasons=state.reasons, steps=state.steps,
            prompt_lengths=[len(r) for r in rows], shared_prefix=shared, prefill_seconds=t_prefill,
            decode_seconds=total - t_prefill,
        )

    def _joint_tokens(self, res: StepResult, t: int, state: _RunState, stop_on_eos: bool
                      ) -> tuple[StepEvent | None, torch.Tensor | None]:
        """Joint mode: record the one token for every row; the event to yield and the next input ids (None: stop)."""
        k = len(state.sequences)
        if res.stop:
            state.reasons = ["budget"] * k
            return None, None
        tok = int(res.tokens)
        event = StepEvent(t, [tok], res.stats and dict(res.stats))
        if stop_on_eos and tok in self.lm.eos_token_ids:
            state.reasons = ["eos"] * k
            return event, None
        for s in state.sequences:
            s.append(tok)
        return event, torch.full((k, 1), tok, dtype=torch.long, device=self.lm.device)

    def _independent_tokens(self, res: StepResult, t: int, state: _RunState, stop_on_eos: bool, eos: torch.Tensor
                            ) -> tuple[StepEvent, torch.Tensor | None]:
        """Independent mode: one token per row (finished rows ignored); the event and the next input ids (None: every
        row has finished)."""
        k, finished = len(state.sequences), state.finished
        toks = res.tokens.to(device=self.lm.device, dtype=torch.long).reshape(k)
        toks = torch.where(finished, torch.full_like(toks, self.lm.pad_token_id), toks)
        is_eos = torch.isin(toks, eos) & ~finished if stop_on_eos else torch.zeros_like(finished)
        toks_list, eos_list, fin_list = toks.tolist(), is_eos.tolist(), finished.tolist()
        for i in range(k):
            if fin_list[i]:
                continue
            if eos_list[i]:
                state.reasons[i] = "eos"
            else:
                state.sequences[i].append(toks_list[i])
        finished |= is_eos
        event = StepEvent(t, [-1 if f else x for f, x in zip(fin_list, toks_list, strict=True)],
                          res.stats and dict(res.stats))
        return event, None if bool(finished.all()) else toks.unsqueeze(1)


@dataclass
class _RunState:
    """What one run accumulates: the generated ids, finish reasons, per-step statistics and finished rows."""

    sequences: list[list[int]]
    reasons: list[str]
    steps: list[dict[str, Any]]
    finished: torch.Tensor

    @classmethod
    def new(cls, k: int, device: Any) -> _RunState:
        return cls([[] for _ in range(k)], ["length"] * k, [], torch.zeros(k, dtype=torch.bool, device=device))


class EngineStream(Iterator[StepEvent]):
    """The events of one :meth:`Engine.stream` run; :attr:`output` holds the :class:`EngineOutput` once the stream
    is exhausted (the return value of the underlying generator).

    >>> # run = engine.stream([ids], mechanism, max_new_tokens=32, seed=0)
    >>> # tokens = [event.tokens for event in run]; run.output.finish_reasons
    """

    def __init__(self, gen: Generator[StepEvent, None, EngineOutput], result: list[EngineOutput] | None = None):
        self._gen = gen
        self._result = result
        self._output: EngineOutput | None = None

    def __iter__(self) -> EngineStream:
        return self

    def __next__(self) -> StepEvent:
        try:
            return next(self._gen)
        except StopIteration as stop:
            if self._output is None:
                self._output = stop.value
                if self._result is not None:
                    self._result.append(stop.value)
            raise

    def close(self) -> None:
        """Stop the run early (the output stays unset)."""
        self._gen.close()

    @property
    def finished(self) -> bool:
        """Whether the run has ended (and :attr:`output` is set)."""
        return self._output is not None

    @property
    def output(self) -> EngineOutput:
        """The :class:`EngineOutput` of the finished run; refused before the stream is exhausted."""
        if self._output is None:
            raise RuntimeError("the stream has not finished: iterate it to the end before reading its output")
        return self._output
