"""The slot KV cache and its decode step.

:class:`SlotCache` keeps a length per row slot: rows are left-aligned, each writes its next key/value at its own
position, the attention mask of a step is built from the lengths (a 4-D mask, used as is by the model) and every row
has its own position ids. No write position is shared and nothing is copied to realign rows. A row's attention reads
its own slot only (its mask comes from its own length; a slot is zeroed beyond the prefill when a job takes it).

:class:`DecodeStep` is one forward of the decoder over every slot, compiled once per (slot count, capacity) with
``torch.compile(dynamic=False)`` when asked.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from typing import Any

import torch

from dpinfer.errors import ConfigurationError

COMPILE_CPU_DEFAULT = False
"""``compile="auto"`` on CPU: eager. Measured with ``dpinfer bench engine --jobs 8 --compile`` on the 2-core development
machine (docs/benchmarks.md): the interleaved decode-step A/B had eager faster (compiled ×0.64), and compiling costs
up to ~2 minutes per (slot count, capacity) bucket."""


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


@functools.cache
def _cache_parameter(cls: type) -> str:
    """The name under which ``cls.forward`` takes the KV cache: ``cache`` (transformers ≥ 5.2x, where
    ``past_key_values`` warns that it is deprecated) or ``past_key_values`` (older releases)."""
    try:
        params = inspect.signature(cls.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover - a forward without a signature
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def cache_kwargs(module: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with ``past_key_values`` renamed to what ``module`` accepts (:func:`_cache_parameter`)."""
    name = _cache_parameter(type(module))
    if name != "past_key_values" and "past_key_values" in kwargs:
        kwargs = dict(kwargs)
        kwargs[name] = kwargs.pop("past_key_values")
    return kwargs


def own_model(model: Any) -> bool:
    """Whether ``model`` is dpinfer's own model code (:mod:`dpinfer.modeling`) rather than a transformers model."""
    return getattr(model, "backend", None) == "own"


def new_kv_cache(lm: Any, max_len: int | None = None) -> Any:
    """An empty KV cache for ``lm``'s forward: growing (``max_len`` None) or of ``max_len`` positions; dpinfer's own
    (:class:`~dpinfer.modeling.model.DynamicKV` / ``StaticKV``) for its own model code, transformers'
    ``DynamicCache`` / ``StaticCache`` otherwise."""
    if own_model(lm.model):
        return lm.model.new_cache(max_len)
    from transformers import DynamicCache, StaticCache

    config = lm.model.config
    return DynamicCache(config=config) if max_len is None else StaticCache(config=config, max_cache_len=max_len)


def _slot_update(owner: SlotCache, layer: Any, key_states: torch.Tensor, value_states: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Write one new position per row at its length; return the layer's whole keys and values."""
    s, h, q, _ = key_states.shape
    if q != 1:
        raise RuntimeError("a SlotCache takes one new position per row (decode steps only)")
    keys, values = (layer.keys, layer.values) if s == owner.slots else (layer.keys[:s], layer.values[:s])
    idx = owner.lengths[:s].view(s, 1, 1, 1)
    keys.scatter_(2, idx.expand(s, h, 1, key_states.shape[-1]), key_states)
    values.scatter_(2, idx.expand(s, h, 1, value_states.shape[-1]), value_states)
    return keys, values


# ---------------------------------------------------------------------------------------------------- the KV cache
class _OwnSlotLayer:
    """One layer of a :class:`SlotCache` for dpinfer's own model code (keys and values ``(S, H, C, D)``)."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.is_initialized = False


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
            return _slot_update(self.owner, self, key_states, value_states)

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.owner.capacity, 0

        def get_seq_length(self) -> int:
            return 0

        def get_max_length(self) -> int:
            return self.owner.capacity

    return SlotLayer


class SlotCache:
    """A KV cache of ``slots`` rows × ``capacity`` positions with a length per row (see the module docstring).

    ``kv`` is what the decoder's forward writes through: the cache itself (``update(keys, values, layer)``) for
    dpinfer's own model code (``hf=False``), a :class:`transformers.Cache` of slot layers for a transformers model.
    The tensors are allocated at the first :meth:`write` with the prefill's head count, head size, dtype and device.
    """

    def __init__(self, num_layers: int, slots: int, capacity: int, device: Any, *, hf: bool = True) -> None:
        self.slots, self.capacity, self.num_layers = slots, capacity, num_layers
        self.lengths = torch.zeros(slots, dtype=torch.long, device=device)
        self.positions = torch.arange(capacity, device=device)
        self.kv: Any
        if hf:
            from transformers.cache_utils import Cache

            layer_cls = _layer_class()
            self.kv = Cache(layers=[layer_cls(self) for _ in range(num_layers)])
            self._layers = self.kv.layers
        else:
            self.kv = self
            self._layers = [_OwnSlotLayer() for _ in range(num_layers)]
        self.allocated = False
        self.busy = False

    @property
    def layers(self) -> list[Any]:
        return self._layers

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer: int, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """A decode step's new keys and values of ``layer`` (dpinfer's own model code): written at each row's
        length; the layer's whole tensors returned (the step's mask hides what is not the row's)."""
        return _slot_update(self, self._layers[layer], key_states, value_states)

    def get_seq_length(self, layer: int = 0) -> int:
        return 0

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

    def move(self, src: int, dst: int) -> None:
        """Move the row in slot ``src`` to slot ``dst`` (its keys and values up to its length, and the length); ``src``
        is idle afterwards. Used to keep one job's unfinished rows in its lowest slots, so that a step can leave its
        finished rows out (:meth:`DecodeStep.__call__` on the first slots only)."""
        n = int(self.lengths[src])
        for layer in self.layers:
            layer.keys[dst, :, :n] = layer.keys[src, :, :n]
            layer.values[dst, :, :n] = layer.values[src, :, :n]
        self.lengths[dst] = n
        self.lengths[src] = 0

    def mask(self, dtype: torch.dtype, rows: int | None = None) -> torch.Tensor:
        """The additive 4-D mask ``(S, 1, 1, C)`` of the next step (the first ``rows`` slots only, when given): row
        ``s`` sees positions ``0..lengths[s]`` (its prefix and the key it writes now)."""
        lengths = self.lengths if rows is None else self.lengths[:rows]
        seen = self.positions.view(1, -1) <= lengths.view(-1, 1)
        zero = torch.zeros((), dtype=dtype, device=seen.device)
        return torch.where(seen, zero, torch.finfo(dtype).min)[:, None, None, :]


class DecodeStep:
    """One decode forward over the slots of a :class:`SlotCache`: ``(S', 1)`` input ids → ``(S', hidden)`` last
    hidden states of the first ``S' ≤ S`` slots (every slot when compiled: fixed shapes), the new keys written at each
    row's length (the caller then advances the lengths). The slots past ``S'`` are left as they are."""

    def __init__(self, lm: Any, cache: SlotCache, compile: bool) -> None:
        self.decoder = lm.model.get_decoder()
        self.cache = cache
        self.dtype = lm.dtype
        self._cache_name = "past_key_values" if own_model(lm.model) else _cache_parameter(type(self.decoder))
        self.compiled = compile
        self._fn = self._eager
        if compile:
            mode = "reduce-overhead" if torch.device(lm.device).type == "cuda" else None
            self._fn = torch.compile(self._eager, dynamic=False, mode=mode)

    def _eager(self, ids: torch.Tensor) -> torch.Tensor:
        cache, rows = self.cache, ids.shape[0]
        out = self.decoder(input_ids=ids, attention_mask=cache.mask(self.dtype, rows),
                           position_ids=cache.lengths[:rows].view(-1, 1), use_cache=True,
                           **{self._cache_name: cache.kv})
        return out.last_hidden_state[:, -1, :]

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        out = self._fn(ids)
        if self.compiled and torch.device(out.device).type == "cuda":
            out = out.clone()  # CUDA-graph outputs are overwritten by the next replay
        return out
