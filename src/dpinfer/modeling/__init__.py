"""dpinfer's own model code (Llama incl. SmolLM2 and Llama 3, Qwen2/2.5, Mistral): the forward the engine runs, the
weights read straight from a folder's ``safetensors``, the tokenizer through ``tokenizers`` and the chat template
through jinja2, without importing transformers (:func:`dpinfer.models.load_model` picks it for these architectures;
``backend="hf"`` keeps transformers' forward, the fallback for every other one).

Imports only torch, safetensors, tokenizers and jinja2 (the last two when a tokenizer is read).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dpinfer.modeling.config import OWN_MODEL_TYPES, ModelConfig, unsupported_reason

__all__ = ["OWN_MODEL_TYPES", "ModelConfig", "folder_unsupported_reason", "load_causal_lm", "read_eos_ids",
           "unsupported_reason"]


def folder_unsupported_reason(path: Path) -> str | None:
    """Why the own code cannot run the model in ``path`` (None: it can): its config, its weights' format
    (``safetensors`` only) and its tokenizer (``tokenizer.json``)."""
    try:
        fields = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "no readable config.json"
    reason = unsupported_reason(fields)
    if reason:
        return reason
    if not _weight_files(path):
        return "no safetensors weights"
    if not (path / "tokenizer.json").is_file():
        return "no tokenizer.json"
    return None


def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        files = [path / n for n in names]
        return files if all(f.is_file() for f in files) else []
    single = path / "model.safetensors"
    return [single] if single.is_file() else []


def load_causal_lm(path: Path, device: Any, dtype: Any) -> Any:
    """The model in ``path`` as a :class:`~dpinfer.modeling.model.CausalLM` on ``device`` in ``dtype`` (eval mode,
    no gradients): built on the meta device, then every parameter taken from the safetensors files.

    Raises:
        ValueError: a parameter is missing from the files, or a tensor does not fit its parameter.
    """
    import torch
    from safetensors import safe_open

    from dpinfer.modeling.config import inv_frequencies
    from dpinfer.modeling.model import CausalLM

    config = ModelConfig.from_folder(path)
    model = CausalLM(config)  # parameters on the meta device
    params = dict(model.named_parameters())  # a tied head appears once, as model.embed_tokens.weight
    state: dict[str, torch.Tensor] = {}
    for file in _weight_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as fh:
            for name in fh.keys():
                if name in params:
                    tensor = fh.get_tensor(name)
                    if tuple(tensor.shape) != tuple(params[name].shape):
                        raise ValueError(f"{name}: shape {tuple(tensor.shape)}, expected {tuple(params[name].shape)}")
                    state[name] = tensor.to(device=device, dtype=dtype)
    missing = sorted(set(params) - set(state))
    if missing:
        raise ValueError(f"{len(missing)} parameters missing from the safetensors files (first: {missing[0]})")
    model.load_state_dict(state, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.model.inv_freq = inv_frequencies(config).to(device)
    model.requires_grad_(False)
    return model.eval()


def read_eos_ids(path: Path, tokenizer: Any) -> frozenset[int]:
    """End-of-sequence ids: ``generation_config.json``'s (else ``config.json``'s) and the tokenizer's."""
    eos: set[int] = set()
    source = path / "generation_config.json"
    if not source.is_file():
        source = path / "config.json"
    try:
        value = json.loads(source.read_text(encoding="utf-8")).get("eos_token_id")
    except (OSError, ValueError):
        value = None
    for v in (value, tokenizer.eos_token_id):
        if isinstance(v, int):
            eos.add(v)
        elif v:
            eos.update(int(x) for x in v)
    return frozenset(eos)
