"""Prefill: the prompts of one job run through the model, exactly (padding and shared prefixes change nothing).

* :func:`prefill_rows` (no public row): rows of different lengths are left-padded, with an attention mask and position
  ids counted from each row's first real token. When all rows share a prefix (the instruction before the first private
  token, or K copies of one prompt) it is run once and its cache copied to the K rows (``prefix_sharing``); rows of
  very different lengths are prefilled one at a time (:data:`PER_ROW_PREFILL`).
* :func:`prefill_public` (a mechanism with a public row 0, K > 1): the public row is prefilled alone, in one forward
  pass over its own tokens (no shared-prefix split, no padding); each private row is prefilled alone too, reusing the
  public row's keys for the prefix it shares with it. Nothing the public row computes reads a private row.
* :func:`prefill_seeded` (a job given :class:`PrefixKV` for some rows): each such row's first tokens are not run again;
  only the rest of every row is, in one batch on top of the given keys and values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dpinfer.engine.cache import cache_kwargs, new_kv_cache
from dpinfer.errors import ConfigurationError
from dpinfer.quantize import prompt_model

MIN_SHARED_PREFIX = 8
"""Shortest common prefix worth a separate prefill (below it, batching everything is as fast)."""

PER_ROW_PREFILL = 0.7
"""With the static cache, rows are prefilled one at a time when their real tokens fill less than this share of the
left-padded batch (e.g. references of very different lengths): the padding would cost more than the lost batching."""

KV = list[tuple[torch.Tensor, torch.Tensor]]
"""One row's cache: per layer (keys, values)."""


@dataclass(frozen=True, eq=False)
class PrefixKV:
    """The keys and values of a row's first tokens, already computed by the prompt processing of the model that will
    decode the row (a job's ``prefix_kv``): ``layers[j] = (keys (H, n, D), values (H, n, D))`` for ``n = len(tokens)``.

    Whoever builds one vouches that these are the model's own keys and values of ``tokens`` at positions ``0 … n−1``
    (the engine checks the tokens against the row and the shapes, not the numbers). Public text only: the engine keeps
    nothing of it after the job's prefill (DP-GTR's stage 3 reuses the ranking's pass over released rewrites).
    """

    tokens: tuple[int, ...]
    layers: tuple[tuple[torch.Tensor, torch.Tensor], ...]

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if not n or not self.layers:
            raise ConfigurationError("a PrefixKV needs at least one token and one layer")
        for keys, values in self.layers:
            if keys.dim() != 3 or values.dim() != 3 or keys.shape[1] != n or values.shape[1] != n:
                raise ConfigurationError(f"a PrefixKV of {n} tokens needs keys and values of shape (heads, {n}, "
                                         f"head size) in every layer, got {tuple(keys.shape)} / {tuple(values.shape)}")


class PrefixStore:
    """Public :class:`PrefixKV` entries computed on one model, found by their tokens: what one caller computed in an
    earlier pass (DP-GTR's ranking over released rewrites) for a later job to reuse (its stage 3). Built per call and
    dropped with it; nothing private may be put in it.

    >>> # store = PrefixStore(lm.model); store.put(entry)
    >>> # seed = store.get(row[:n]) if store.serves(engine.lm.model) else None
    """

    def __init__(self, model: Any) -> None:
        self.model = prompt_model(model)
        self._entries: dict[tuple[int, ...], PrefixKV] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, entry: PrefixKV) -> None:
        self._entries[entry.tokens] = entry

    def get(self, tokens: Sequence[int]) -> PrefixKV | None:
        return self._entries.get(tuple(tokens))

    def serves(self, model: Any) -> bool:
        """Whether ``model`` processes prompts with the layers these entries were computed on (the same model, or its
        int8 decode twin: :func:`dpinfer.quantize.prompt_model`)."""
        return prompt_model(model) is self.model


def check_prefix_kv(prefix_kv: Sequence[PrefixKV | None], rows: Sequence[Sequence[int]],
                    num_layers: int | None = None) -> None:
    """Refuse a ``prefix_kv`` that does not fit the job: one entry per row, each None or a :class:`PrefixKV` of the
    row's own first tokens (at least one token of the row left to run) with one entry per layer of the model (checked
    when ``num_layers`` is given)."""
    if len(prefix_kv) != len(rows):
        raise ConfigurationError(f"prefix_kv needs one entry (a PrefixKV or None) per row ({len(rows)}), "
                                 f"got {len(prefix_kv)}")
    for i, (seed, row) in enumerate(zip(prefix_kv, rows, strict=True)):
        if seed is None:
            continue
        if not isinstance(seed, PrefixKV):
            raise ConfigurationError(f"prefix_kv[{i}] must be a PrefixKV or None, got {type(seed).__name__}")
        n = len(seed.tokens)
        if n >= len(row) or tuple(row[:n]) != seed.tokens:
            raise ConfigurationError(f"prefix_kv[{i}] must hold the first tokens of row {i} and leave at least one "
                                     "to run (its tokens differ from the row's, or cover all of it)")
        if num_layers is not None and len(seed.layers) != num_layers:
            raise ConfigurationError(f"prefix_kv[{i}] has {len(seed.layers)} layers; the model has {num_layers}")


def right_aligned(rows: Sequence[KV | None], width: int) -> tuple[KV, torch.Tensor]:
    """Several rows' caches (per layer keys and values ``(H, L_i, D)``) as one batch: per layer keys and values
    ``(K, H, width, D)``, each row right-aligned (zeros before it; a None row all zeros, at least one row given), and
    the ``(K, width)`` mask of the real positions."""
    first = next(r for r in rows if r is not None)
    lengths = [0 if r is None else int(r[0][0].shape[1]) for r in rows]
    out: KV = []
    for j, (k0, v0) in enumerate(first):
        keys = k0.new_zeros((len(rows), k0.shape[0], width, k0.shape[-1]))
        values = v0.new_zeros((len(rows), v0.shape[0], width, v0.shape[-1]))
        for i, row in enumerate(rows):
            if row is not None:
                keys[i, :, width - lengths[i]:] = row[j][0]
                values[i, :, width - lengths[i]:] = row[j][1]
        out.append((keys, values))
    mask = torch.zeros((len(rows), width), dtype=torch.long, device=first[0][0].device)
    for i, n in enumerate(lengths):
        mask[i, width - n:] = 1  # n = 0: an empty slice
    return out, mask


def common_prefix_length(rows: Sequence[Sequence[int]]) -> int:
    first = rows[0]
    n = min(len(r) for r in rows)
    for i in range(n):
        t = first[i]
        if any(r[i] != t for r in rows[1:]):
            return i
    return n


def forward(lm: Any, **kwargs: Any) -> Any:
    """The full model on some positions, last-position logits only."""
    return lm.model(use_cache=True, logits_to_keep=1, return_dict=True, **cache_kwargs(lm.model, kwargs))


def left_pad(rows: Sequence[Sequence[int]], pad_id: int, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):] = torch.as_tensor(r, dtype=torch.long)
            mask[i, width - len(r):] = 1
    return ids.to(device), mask.to(device)


def prefill_public(lm: Any, rows: Sequence[Sequence[int]], prefix_sharing: bool
                   ) -> tuple[list[torch.Tensor], list[list[tuple[torch.Tensor, torch.Tensor]]], int]:
    """The public row prefilled alone, then each private row alone (reusing the public row's keys for a shared
    prefix): (last logits per row, per row and layer (keys, values) of shape (1, H, L, D), the shortest prefix a
    private row reuses)."""
    device = lm.device
    public = rows[0]
    pub_cache = new_kv_cache(lm)
    ids = torch.as_tensor([public], dtype=torch.long, device=device)
    out = forward(lm, input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=pub_cache)
    last = [out.logits[0, -1, :]]
    layers = [[(layer.keys, layer.values) for layer in pub_cache.layers]]
    reused = []
    for row in rows[1:]:
        shared = 0
        if prefix_sharing:  # the private row reads the public row's keys; the public row reads nothing
            shared = min(common_prefix_length([row, public]), len(row) - 1)
            shared = shared if shared >= MIN_SHARED_PREFIX else 0
        reused.append(shared)
        row_cache = new_kv_cache(lm)
        for j, layer in enumerate(pub_cache.layers):
            if shared:
                row_cache.update(layer.keys[:, :, :shared], layer.values[:, :, :shared], j)
        ids = torch.as_tensor([row[shared:]], dtype=torch.long, device=device)
        positions = torch.arange(shared, len(row), device=device).unsqueeze(0)
        out = forward(lm, input_ids=ids, attention_mask=torch.ones((1, len(row)), dtype=torch.long, device=device),
                      position_ids=positions, past_key_values=row_cache)
        last.append(out.logits[0, -1, :])
        layers.append([(layer.keys, layer.values) for layer in row_cache.layers])
    return last, layers, min(reused, default=0)


def prefill_rows(lm: Any, rows: Sequence[Sequence[int]], max_new_tokens: int, *, prefix_sharing: bool,
                 static_cache: bool) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor, int]:
    """Run the prompts, left-padded; return (last logits (K, V), cache, attention mask, next position ids (K,),
    shared prefix). With ``static_cache`` and K > 1 the cache is pre-allocated for ``max_new_tokens`` more."""
    device, pad = lm.device, lm.pad_token_id
    k = len(rows)
    shared = 0
    if prefix_sharing and k > 1:
        shared = min(common_prefix_length(rows), min(len(r) for r in rows) - 1)
        if shared < MIN_SHARED_PREFIX:
            shared = 0
    width = max(len(r) for r in rows) - shared
    static = static_cache and k > 1
    cache = new_kv_cache(lm, shared + width + max_new_tokens if static else None)
    suffixes = [r[shared:] for r in rows]
    per_row = static and sum(map(len, suffixes)) < PER_ROW_PREFILL * k * width
    prefix_cache = None
    if shared:
        prefix = torch.as_tensor([rows[0][:shared]], dtype=torch.long, device=device)
        prefix_cache = new_kv_cache(lm)
        forward(lm, input_ids=prefix, attention_mask=torch.ones_like(prefix), past_key_values=prefix_cache)
        if per_row:
            pass  # _prefill_one_by_one writes prefix and suffixes at once
        elif static:  # copy the one prefix into every row of the pre-allocated cache
            for i, layer in enumerate(prefix_cache.layers):
                cache.update(layer.keys.expand(k, -1, -1, -1), layer.values.expand(k, -1, -1, -1), i)
        else:
            prefix_cache.batch_repeat_interleave(k)
            cache = prefix_cache
    ids, mask = left_pad(suffixes, pad, device)
    full_mask = torch.cat([torch.ones((k, shared), dtype=mask.dtype, device=device), mask], dim=1)
    next_pos = torch.as_tensor([len(r) for r in rows], dtype=torch.long, device=device)
    if per_row:
        logits = _prefill_one_by_one(lm, suffixes, shared, width, prefix_cache, cache)
        return logits, cache, full_mask, next_pos, shared
    positions = (mask.cumsum(-1) - 1).clamp(min=0) + shared
    out = forward(lm, input_ids=ids, attention_mask=full_mask, position_ids=positions, past_key_values=cache)
    cache = out.get("cache") if out.get("cache") is not None else out.past_key_values
    return out.logits[:, -1, :], cache, full_mask, next_pos, shared


def _prefill_one_by_one(lm: Any, suffixes: Sequence[Sequence[int]], shared: int, width: int, prefix_cache: Any,
                        cache: Any) -> torch.Tensor:
    """Prefill rows of very different lengths one at a time (no compute on padding), then write their keys and
    values, left-aligned as the batched layout expects, into the pre-allocated cache. Exact: each row's keys are
    computed at its own positions, and the padding slots stay masked."""
    device = lm.device
    k = len(suffixes)
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    last: list[torch.Tensor] = []
    for i, row in enumerate(suffixes):
        row_cache = new_kv_cache(lm)
        if prefix_cache is not None:
            for j, layer in enumerate(prefix_cache.layers):
                row_cache.update(layer.keys, layer.values, j)
        ids = torch.as_tensor([row], dtype=torch.long, device=device)
        positions = torch.arange(shared, shared + len(row), device=device).unsqueeze(0)
        out = forward(lm, input_ids=ids, attention_mask=torch.ones((1, shared + len(row)), dtype=torch.long,
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


def prefill_seeded(lm: Any, rows: Sequence[Sequence[int]], seeds: Sequence[PrefixKV | None]
                   ) -> tuple[torch.Tensor, list[KV]]:
    """Prefill rows of which some come with the keys and values of their first tokens (:class:`PrefixKV`, checked by
    :func:`check_prefix_kv`): (last logits (K, V), per row its cache with keys (H, L, D)).

    Only the rest of each row (its tail) runs, all tails in one forward: the given keys sit right-aligned in a first
    block of ``max n`` positions, the tails left-padded in a second block, so a row's tail attends to its own prefix
    and its own earlier tail tokens only (a 2-D mask with a gap between the blocks; each tail's position ids continue
    from its prefix). Exact up to floating-point rounding: the same keys and logits as running each row whole."""
    device = lm.device
    k = len(rows)
    lengths = [0 if s is None else len(s.tokens) for s in seeds]
    cache = new_kv_cache(lm)
    ids, tail_mask = left_pad([r[n:] for r, n in zip(rows, lengths, strict=True)], lm.pad_token_id, device)
    seed_mask = tail_mask.new_zeros((k, 0))
    if any(lengths):
        layers, seed_mask = right_aligned([None if s is None else list(s.layers) for s in seeds], max(lengths))
        for j, (keys, values) in enumerate(layers):
            cache.update(keys, values, j)
    mask = torch.cat([seed_mask.to(device), tail_mask], dim=1)
    positions = (tail_mask.cumsum(-1) - 1).clamp(min=0) + torch.as_tensor(lengths, device=device).unsqueeze(1)
    out = forward(lm, input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache)
    cache = out.get("cache") if out.get("cache") is not None else out.past_key_values
    kv = []
    for i in range(k):
        keep = mask[i].bool()
        kv.append([(layer.keys[i][:, keep], layer.values[i][:, keep]) for layer in cache.layers])
    return out.logits[:, -1, :], kv


def prefill_job(lm: Any, job: Any, prefix_sharing: bool, static_cache: bool) -> tuple[torch.Tensor, list[KV], int]:
    """A job's prefill for the slot cache: (last logits (K, V), per row its cache with keys (H, L, D), shared
    prefix): :func:`prefill_seeded` for a job given ``prefix_kv``, :func:`prefill_public` for a public-row mechanism,
    :func:`prefill_rows` otherwise."""
    rows = job.rows
    if job.prefix_kv is not None:
        logits, kv = prefill_seeded(lm, rows, job.prefix_kv)
        return logits, kv, 0
    if job.joint and job.k > 1 and job.mechanism.public_row:
        last, layers, shared = prefill_public(lm, rows, prefix_sharing)
        return torch.stack(last), [[(k[0], v[0]) for k, v in row] for row in layers], shared
    logits, pcache, mask, _, shared = prefill_rows(lm, rows, 1, prefix_sharing=prefix_sharing,
                                                   static_cache=static_cache)
    width = mask.shape[1]
    kv = []
    for i in range(len(rows)):
        keep = mask[i].bool()
        kv.append([(layer.keys[i, :, :width][:, keep], layer.values[i, :, :width][:, keep])
                   for layer in pcache.layers])
    return logits, kv, shared
