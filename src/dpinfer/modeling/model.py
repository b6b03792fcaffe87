"""dpinfer's own decoder forward for Llama, Qwen2/2.5 and Mistral: grouped-query attention, RoPE (default and
Llama 3's scaling), RMSNorm, SwiGLU; the same module tree and parameter names as transformers' (``model.layers.N
.self_attn.q_proj``, ``lm_head``), so the checkpoint's ``safetensors`` load as they are and the engine's packed and
int8 layers (:mod:`dpinfer.packed`, :mod:`dpinfer.quantize`) find the same ``nn.Linear`` modules.

The interface the engine uses (and nothing else)
------------------------------------------------
``CausalLM.forward(input_ids, attention_mask=None, position_ids=None, past_key_values=None, logits_to_keep=0)``
(``logits_to_keep``: the last N positions, or a tensor of positions) returns :class:`Output` (``.logits``,
``.past_key_values``); ``CausalLM.get_decoder()`` is the :class:`Decoder`,
whose forward takes the same arguments and returns ``.last_hidden_state``; ``get_output_embeddings()`` is the head
(an ``nn.Linear``, the embedding's weight when tied).

* ``attention_mask``: ``None`` (every position up to the row's own), a 2-D ``(B, L)`` 0/1 mask of the key positions
  (left padding; causal on the index in the cache, as transformers does), or a 4-D additive float mask used as is
  (the slot cache's ``(S, 1, 1, C)``: :meth:`dpinfer.engine.cache.SlotCache.mask`).
* ``position_ids``: ``(B, q)``; default ``past + arange(q)``.
* ``past_key_values``: any object with ``update(keys, values, layer) -> (all keys, all values)`` and
  ``get_seq_length()``: :class:`DynamicKV`, :class:`StaticKV` (below), the engine's slot cache.

Masked positions get the dtype's most negative value, never ``-inf``: a query row that sees nothing (left padding)
stays finite.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from dpinfer.modeling.config import ModelConfig, inv_frequencies


@dataclass
class Output:
    """What a forward returns (the fields the engine reads)."""

    logits: torch.Tensor | None = None
    last_hidden_state: torch.Tensor | None = None
    past_key_values: Any = None

    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self, name, default)


# ------------------------------------------------------------------------------------------------------- KV caches
class KVLayer:
    """One layer's keys and values ``(B, H, L, D)`` (None before the first write)."""

    __slots__ = ("keys", "values")

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None


class DynamicKV:
    """A growing KV cache: each forward appends its keys and values (what ``DynamicCache`` does)."""

    def __init__(self, num_layers: int) -> None:
        self.layers = [KVLayer() for _ in range(num_layers)]

    def get_seq_length(self, layer: int = 0) -> int:
        keys = self.layers[layer].keys
        return 0 if keys is None else int(keys.shape[-2])

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer: int, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        entry = self.layers[layer]
        if entry.keys is None:
            entry.keys, entry.values = keys, values
        else:
            entry.keys = torch.cat([entry.keys, keys], dim=-2)
            entry.values = torch.cat([entry.values, values], dim=-2)
        return entry.keys, entry.values

    def batch_repeat_interleave(self, repeats: int) -> None:
        for entry in self.layers:
            if entry.keys is not None:
                entry.keys = entry.keys.repeat_interleave(repeats, dim=0)
                entry.values = entry.values.repeat_interleave(repeats, dim=0)


class StaticKV(DynamicKV):
    """A KV cache of ``max_len`` positions allocated at the first write (what ``StaticCache`` does): each forward
    writes after what the layer holds and the attention reads all ``max_len`` positions (the mask hides the rest)."""

    def __init__(self, num_layers: int, max_len: int) -> None:
        super().__init__(num_layers)
        self.max_len = max_len
        self.filled = [0] * num_layers

    def get_seq_length(self, layer: int = 0) -> int:
        return self.filled[layer]

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer: int, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        entry = self.layers[layer]
        if entry.keys is None:
            b, h, _, d = keys.shape
            entry.keys = keys.new_zeros((b, h, self.max_len, d))
            entry.values = values.new_zeros((b, h, self.max_len, values.shape[-1]))
        start, n = self.filled[layer], keys.shape[-2]
        if start + n > self.max_len:
            raise RuntimeError("a StaticKV cache is full")
        entry.keys[:, :, start:start + n] = keys
        entry.values[:, :, start:start + n] = values
        self.filled[layer] = start + n
        return entry.keys, entry.values


# ---------------------------------------------------------------------------------------------------------- layers
def _linear(n_in: int, n_out: int, bias: bool) -> nn.Linear:
    """An ``nn.Linear`` with uninitialised parameters on the meta device (the loader assigns the checkpoint's):
    ``nn.Linear(...)`` would run its random init, whose meta kernels import torch._dynamo."""
    m = nn.Linear.__new__(nn.Linear)
    nn.Module.__init__(m)
    m.in_features, m.out_features = n_in, n_out
    m.weight = nn.Parameter(torch.empty((n_out, n_in), device="meta"))
    m.bias = nn.Parameter(torch.empty(n_out, device="meta")) if bias else None
    return m


def _embedding(num: int, dim: int) -> nn.Embedding:
    """An ``nn.Embedding`` with an uninitialised weight on the meta device (see :func:`_linear`)."""
    m = nn.Embedding.__new__(nn.Embedding)
    nn.Module.__init__(m)
    m.num_embeddings, m.embedding_dim = num, dim
    m.padding_idx, m.max_norm, m.norm_type, m.scale_grad_by_freq, m.sparse = None, None, 2.0, False, False
    m.weight = nn.Parameter(torch.empty((num, dim), device="meta"))
    return m


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(size, device="meta"))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        self.groups = self.heads // self.kv_heads
        self.scaling = self.head_dim ** -0.5
        hidden = config.hidden_size
        self.q_proj = _linear(hidden, self.heads * self.head_dim, bias=config.qkv_bias)
        self.k_proj = _linear(hidden, self.kv_heads * self.head_dim, bias=config.qkv_bias)
        self.v_proj = _linear(hidden, self.kv_heads * self.head_dim, bias=config.qkv_bias)
        self.o_proj = _linear(self.heads * self.head_dim, hidden, bias=config.o_bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: Any, cache: Any) -> torch.Tensor:
        b, q, _ = x.shape
        shape = (b, q, -1, self.head_dim)
        query = self.q_proj(x).view(shape).transpose(1, 2)
        key = self.k_proj(x).view(shape).transpose(1, 2)
        value = self.v_proj(x).view(shape).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        query = query * cos + _rotate_half(query) * sin
        key = key * cos + _rotate_half(key) * sin
        if cache is not None:
            key, value = cache.update(key, value, self.layer)
        attn_mask = mask(key.shape[-2])
        causal = attn_mask is CAUSAL
        if causal:
            attn_mask = None
        if self.groups > 1 and q == 1:  # one query per row: the heads of a key/value head side by side
            out = F.scaled_dot_product_attention(query.reshape(b, self.kv_heads, self.groups, self.head_dim), key,
                                                 value, attn_mask=attn_mask, scale=self.scaling)
            out = out.reshape(b, self.heads, 1, self.head_dim)
        elif self.groups > 1 and attn_mask is None:  # no mask tensor: SDPA reads the key/value heads as they are
            out = F.scaled_dot_product_attention(query, key, value, scale=self.scaling, is_causal=causal,
                                                 enable_gqa=True)
        else:
            if self.groups > 1:  # a mask: each query head its key/value head's copy (with a mask, SDPA's GQA falls
                # back to the math kernel on CUDA; transformers does the same)
                key = key.repeat_interleave(self.groups, dim=1)
                value = value.repeat_interleave(self.groups, dim=1)
            out = F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, scale=self.scaling,
                                                 is_causal=causal)
        return self.o_proj(out.transpose(1, 2).reshape(b, q, -1))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden, inter = config.hidden_size, config.intermediate_size
        self.gate_proj = _linear(hidden, inter, bias=config.mlp_bias)
        self.up_proj = _linear(hidden, inter, bias=config.mlp_bias)
        self.down_proj = _linear(inter, hidden, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: Any, cache: Any) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


CAUSAL = object()
"""What :class:`_Mask` returns for a plain causal prefill (no cache before it, no padding): SDPA's ``is_causal``."""


class _Mask:
    """The additive mask of one forward, built once per key length (the first layer's) from the caller's mask."""

    def __init__(self, attention_mask: torch.Tensor | None, batch: int, q: int, past: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.given, self.batch, self.q, self.past, self.dtype, self.device = (
            attention_mask, batch, q, past, dtype, device)
        self.built: dict[int, torch.Tensor | None] = {}

    def __call__(self, key_length: int) -> torch.Tensor | None:
        if key_length in self.built:
            return self.built[key_length]
        given = self.given
        if given is not None and given.dim() == 4:
            out = given.to(self.dtype)
        elif given is None and self.q == 1 and key_length == self.past + 1:
            out = None  # one new position that sees everything before it
        elif (self.past == 0 and key_length == self.q > 1 and given is not None and given.dim() == 2
              and given.shape[-1] == key_length and bool(given.all())) or (
                given is None and self.past == 0 and key_length == self.q > 1):
            out = CAUSAL  # a prompt of its own, no padding: the causal kernel, no mask tensor
        else:
            kv = torch.arange(key_length, device=self.device)
            seen = kv.view(1, 1, -1) <= (self.past + torch.arange(self.q, device=self.device)).view(1, -1, 1)
            if given is not None:
                real = torch.zeros((given.shape[0], key_length), dtype=torch.bool, device=self.device)
                width = min(key_length, given.shape[-1])
                real[:, :width] = given[:, :width].bool()
                seen = seen & real[:, None, :]
            else:
                seen = seen & (kv < self.past + self.q).view(1, 1, -1)
            zero = torch.zeros((), dtype=self.dtype, device=self.device)
            out = torch.where(seen, zero, torch.finfo(self.dtype).min)[:, None]
        self.built[key_length] = out
        return out


class Decoder(nn.Module):
    """Embedding, decoder layers and final norm (transformers' ``model.model``)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = _embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.inv_freq: torch.Tensor = inv_frequencies(config)  # float32, not a buffer: .to(dtype) leaves it

    def rope(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = self.inv_freq
        if inv_freq.device != position_ids.device:
            inv_freq = self.inv_freq = inv_freq.to(position_ids.device)
        freqs = position_ids[..., None].float() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, past_key_values: Any = None, cache: Any = None,
                **_: Any) -> Output:
        cache = cache if cache is not None else past_key_values
        x = self.embed_tokens(input_ids)
        b, q = input_ids.shape
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + q, device=x.device).unsqueeze(0).expand(b, q)
        cos, sin = self.rope(position_ids, x.dtype)
        mask = _Mask(attention_mask, b, q, past, x.dtype, x.device)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, cache)
        return Output(last_hidden_state=self.norm(x), past_key_values=cache)


class CausalLM(nn.Module):
    """The decoder and its output head (transformers' ``*ForCausalLM``, the engine's subset of it). Built with its
    parameters on the meta device: :func:`dpinfer.modeling.load_causal_lm` assigns the checkpoint's."""

    backend = "own"

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Decoder(config)
        self.lm_head = _linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def get_decoder(self) -> Decoder:
        return self.model

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def new_cache(self, max_len: int | None = None) -> DynamicKV:
        """An empty KV cache for this model: growing, or of ``max_len`` positions."""
        layers = self.config.num_hidden_layers
        return DynamicKV(layers) if max_len is None else StaticKV(layers, max_len)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, past_key_values: Any = None, cache: Any = None,
                use_cache: bool = True, logits_to_keep: int | torch.Tensor = 0, **_: Any) -> Output:
        cache = cache if cache is not None else past_key_values
        if cache is None and use_cache:
            cache = self.new_cache()
        out = self.model(input_ids, attention_mask=attention_mask, position_ids=position_ids, past_key_values=cache)
        hidden = out.last_hidden_state
        if isinstance(logits_to_keep, int):
            logits = self.lm_head(hidden[:, -logits_to_keep:, :] if logits_to_keep else hidden)
        else:  # the positions to keep (a tensor of indices)
            logits = self.lm_head(hidden[:, logits_to_keep, :])
        return Output(logits=logits, last_hidden_state=hidden, past_key_values=cache)
