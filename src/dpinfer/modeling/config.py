"""A model folder's ``config.json``, read without transformers, and which architectures dpinfer's own model code runs.

:class:`ModelConfig` keeps every field of the file as an attribute (so ``getattr(config, "sliding_window", None)``
works as on a transformers config) and adds what the forward needs (head size, RoPE parameters, biases).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

OWN_MODEL_TYPES = frozenset({"llama", "qwen2", "mistral"})
"""Architectures :mod:`dpinfer.modeling` runs itself (Llama incl. SmolLM2 and Llama 3, Qwen2/2.5, Mistral); every
other one loads through transformers (``backend="hf"``)."""

ROPE_TYPES = frozenset({"default", "llama3"})
"""RoPE variants implemented here (``rope_scaling`` / ``rope_parameters``: none, or Llama 3's ``"llama3"``)."""


class ModelConfig:
    """The fields of ``config.json`` as attributes, plus the derived ones the forward reads (module docstring)."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.__dict__.update(fields)
        self.fields = dict(fields)
        self.head_dim = int(fields.get("head_dim") or fields["hidden_size"] // fields["num_attention_heads"])
        self.num_key_value_heads = int(fields.get("num_key_value_heads") or fields["num_attention_heads"])
        self.rms_norm_eps = float(fields.get("rms_norm_eps", 1e-6))
        self.tie_word_embeddings = bool(fields.get("tie_word_embeddings", False))
        self.hidden_act = fields.get("hidden_act", "silu")
        model_type = fields.get("model_type")
        self.qkv_bias = True if model_type == "qwen2" else bool(fields.get("attention_bias", False))
        self.o_bias = False if model_type == "qwen2" else bool(fields.get("attention_bias", False))
        self.mlp_bias = bool(fields.get("mlp_bias", False))
        self.rope = rope_parameters(fields)

    def get(self, name: str, default: Any = None) -> Any:
        return self.__dict__.get(name, default)

    @classmethod
    def from_folder(cls, path: Path) -> ModelConfig:
        return cls(json.loads((path / "config.json").read_text(encoding="utf-8")))


def rope_parameters(fields: dict[str, Any]) -> dict[str, Any]:
    """The RoPE parameters of a config, old style (``rope_theta`` + ``rope_scaling``) or transformers 5's
    ``rope_parameters``: a dict with ``rope_type`` and ``rope_theta`` (and the scaling's own keys)."""
    params = dict(fields.get("rope_parameters") or {})
    scaling = fields.get("rope_scaling") or {}
    params = {**scaling, **params}
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params.pop("type")
    params.setdefault("rope_type", "default")
    params.setdefault("rope_theta", float(fields.get("rope_theta", 10000.0)))
    if params["rope_type"] == "llama3":
        params.setdefault("original_max_position_embeddings", fields.get("max_position_embeddings"))
    return params


def unsupported_reason(fields: dict[str, Any]) -> str | None:
    """Why dpinfer's own model code cannot run this config (None: it can)."""
    model_type = fields.get("model_type")
    if model_type not in OWN_MODEL_TYPES:
        return f"architecture {model_type!r} (own code: {', '.join(sorted(OWN_MODEL_TYPES))})"
    if fields.get("hidden_act", "silu") != "silu":
        return f"activation {fields.get('hidden_act')!r}"
    rope_type = rope_parameters(fields)["rope_type"]
    if rope_type not in ROPE_TYPES:
        return f"RoPE type {rope_type!r}"
    if float(rope_parameters(fields).get("partial_rotary_factor", 1.0)) != 1.0:
        return "partial rotary embeddings"
    sliding = fields.get("sliding_window")
    if sliding and fields.get("use_sliding_window", model_type == "mistral"):
        return "a sliding attention window"
    layer_types = fields.get("layer_types")
    if layer_types and any(t != "full_attention" for t in layer_types):
        return "layers other than full attention"
    if fields.get("quantization_config"):
        return "a quantised checkpoint"
    if fields.get("pretraining_tp", 1) not in (1, None):
        return "pretraining_tp > 1"
    return None


def inv_frequencies(config: ModelConfig) -> Any:
    """RoPE inverse frequencies ``(head_dim / 2,)`` in float32, as transformers computes them (default and llama3)."""
    import torch

    rope = config.rope
    dim = config.head_dim
    base = float(rope["rope_theta"])
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))
    if rope["rope_type"] != "llama3":
        return inv_freq
    factor = rope["factor"]
    low_freq_factor = rope["low_freq_factor"]
    high_freq_factor = rope["high_freq_factor"]
    old_context_len = rope["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)
