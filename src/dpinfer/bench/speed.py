"""What every speed benchmark shares: the document prompt, the random-weight model shapes and their options, the
model a run loads, and the timers of Hugging Face ``generate`` and of the engine (CUDA synchronised).

``--device cuda --dtype bf16 --shape qwen2.5-7b`` runs a random-weight model of a named shape (:data:`SHAPES`; built
from its config on the device, nothing downloaded) with the embedded model's tokenizer for the prompts.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from dpinfer.errors import DataNotFoundError

DEFAULT_DOC = "echr_case_001-66929.txt"
INSTRUCTION = "Rewrite the following court document in your own words, keeping its meaning:\n\n"


def example_document(name: str = DEFAULT_DOC) -> str:
    """Text of a document shipped in the repository's ``examples/`` folder."""
    from dpinfer.paths import repo_root

    root = repo_root()
    candidates = [Path.cwd() / "examples" / name]
    if root is not None:
        candidates.insert(0, root / "examples" / name)
    for c in candidates:
        if c.is_file():
            return c.read_text(encoding="utf-8")
    raise DataNotFoundError(f"example document {name} not found (looked in {', '.join(map(str, candidates))})")


def document_prompt_ids(lm: Any, target_tokens: int = 500, document: str | None = None) -> list[int]:
    """Chat prompt asking to rewrite a document, cut at a paragraph so that it has about ``target_tokens`` tokens."""
    doc = document if document is not None else example_document()
    paragraphs = doc.split("\n\n")
    best: list[int] = lm.encode(lm.instruction_prompt(INSTRUCTION + paragraphs[0]))
    for n in range(2, len(paragraphs) + 1):
        ids = lm.encode(lm.instruction_prompt(INSTRUCTION + "\n\n".join(paragraphs[:n])))
        if len(ids) > target_tokens * 1.1:
            break
        best = ids
    return best


_SHAPE_FIELDS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "vocab_size", "tie_word_embeddings", "max_position_embeddings", "rope_theta")

SHAPES: dict[str, dict[str, Any]] = {
    # name: model_type and config fields of a public architecture (random weights, nothing downloaded), in the order
    # of _SHAPE_FIELDS
    name: dict(zip(_SHAPE_FIELDS, values, strict=True)) for name, values in {
        "smollm2-135m": ("llama", 576, 1536, 30, 9, 3, 49152, True, 8192, 100000.0),
        "qwen2.5-0.5b": ("qwen2", 896, 4864, 24, 14, 2, 151936, True, 32768, 1000000.0),
        # the CPU proxy of a 7B-class vocabulary: Qwen2.5's 151,936 tokens, two small layers (the per-step work after
        # the logits dominates, as on a GPU with a large model)
        "qwen2.5-tiny": ("qwen2", 128, 256, 2, 4, 2, 151936, True, 32768, 1000000.0),
        "qwen2.5-7b": ("qwen2", 3584, 18944, 28, 28, 4, 152064, False, 32768, 1000000.0),
        "llama-3.1-8b": ("llama", 4096, 14336, 32, 32, 8, 128256, False, 131072, 500000.0),
    }.items()
}
"""Model shapes for ``--shape`` (a random-weight model of that architecture)."""


def shape_model(shape: str, *, device: str | None = None, dtype: Any = None, tokenizer_lm: Any = None,
                tokenizer: str | None = None) -> Any:
    """A random-weight model of a :data:`SHAPES` shape on ``device`` (built there, no download), wrapped as an
    :class:`~dpinfer.models.LM` with the tokenizer of ``tokenizer_lm`` (a loaded LM) or of the model ``tokenizer``
    names (default: the embedded model's; only its tokenizer files are read). Its ids must fit the shape's
    vocabulary (the embedded tokenizer's fit every shape here)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from dpinfer.errors import ConfigurationError
    from dpinfer.models import LM, _pick_device, _pick_dtype, load_tokenizer

    if shape not in SHAPES:
        raise ConfigurationError(f"unknown shape {shape!r}; choose one of {', '.join(SHAPES)}")
    dev = _pick_device(device)
    dt = _pick_dtype(dtype, dev)
    fields = dict(SHAPES[shape])
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    config.use_sliding_window = False
    if tokenizer_lm is not None:
        tok, eos = tokenizer_lm.tokenizer, tokenizer_lm.eos_token_ids
    else:
        tok, eos = load_tokenizer(tokenizer)
    if len(tok) > config.vocab_size:
        raise ConfigurationError(f"the tokenizer has {len(tok)} tokens, more than the {shape} shape's vocabulary "
                                 f"({config.vocab_size}): use the embedded model's tokenizer (no --model)")
    config.eos_token_id = sorted(eos)[0]
    t0 = time.perf_counter()
    torch.manual_seed(0)
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(config, dtype=dt, attn_implementation="sdpa")
    model.eval()
    model.generation_config.eos_token_id = config.eos_token_id
    lm = LM(model=model, tokenizer=tok, name=f"random {shape}", source=Path("."),
            load_seconds=time.perf_counter() - t0, eos_token_ids=eos)
    model.generation_config.pad_token_id = lm.pad_token_id
    return lm


def add_speed_arguments(p: argparse.ArgumentParser, runs: str | None) -> None:
    """``--device``, ``--dtype`` and ``--shape`` of a benchmark's speed runs (``runs``: the options that select
    them, e.g. ``"--perf"``; None for a benchmark that is all speed runs), checked by :func:`check_speed_arguments`
    and used by :func:`speed_model`."""
    at = f"{runs}: " if runs else ""
    p.add_argument("--device", default=None, help=f"{at}cpu, cuda or cuda:N (default: CUDA when available)")
    p.add_argument("--dtype", default=None, help=f"{at}float32, bf16, fp16 (default: float32 on CPU, bf16 on GPU)")
    p.add_argument("--shape", default=None, help=f"{at}a random-weight model of this shape instead of --model's "
                                                 f"weights ({', '.join(SHAPES)}; nothing downloaded; speed only); "
                                                 "prompts are tokenised with --model's tokenizer (default: the "
                                                 "embedded model's; a folder with only the tokenizer files will do)")


def check_speed_arguments(args: argparse.Namespace, *, speed_run: bool, runs: str) -> None:
    """Refuse (before any model loads) speed options outside a speed run, an unknown shape, a shape with
    ``--quantize``, and an unknown device or dtype (or a missing GPU). With ``--shape``, ``--model`` names the
    tokenizer only."""
    from dpinfer.errors import ConfigurationError
    from dpinfer.model_files import EMBEDDED_NAME, model_name
    from dpinfer.models import _pick_device, _pick_dtype

    device, dtype, shape = (getattr(args, n, None) for n in ("device", "dtype", "shape"))  # options not given: absent
    given = [f"--{n}" for n, v in (("device", device), ("dtype", dtype), ("shape", shape)) if v is not None]
    if not given:
        return
    if not speed_run:
        raise ConfigurationError(f"{', '.join(given)} apply to the speed runs: add {runs}")
    if shape is not None:
        if shape not in SHAPES:
            raise ConfigurationError(f"unknown --shape {shape!r}; choose one of {', '.join(SHAPES)}")
        if getattr(args, "quantize", None) is not None:
            raise ConfigurationError("--shape builds its own random-weight model: drop --quantize")
        model = getattr(args, "model", None)
        if model is not None and model_name(model) != EMBEDDED_NAME and not (
                Path(model).expanduser().is_dir() and (Path(model).expanduser() / "config.json").is_file()):
            raise ConfigurationError(f"with --shape, --model names the tokenizer: {model} is not a model folder "
                                     "(give a folder with config.json and the tokenizer files, or drop --model)")
    _pick_dtype(dtype, _pick_device(device))  # an unknown device, dtype or missing GPU fails here


def speed_model(model: str | None, *, device: str | None = None, dtype: str | None = None, shape: str | None = None,
                quantize: str | None = None, backend: str | None = None) -> Any:
    """The model a benchmark runs: a random-weight :data:`SHAPES` model when ``shape`` is given (with ``model``'s
    tokenizer; transformers' forward), else :func:`~dpinfer.models.load_model` (``backend``: see there) with its
    packed linears' copies made now (so that no timed arm pays for them at its first step)."""
    from dpinfer.models import load_model
    from dpinfer.packed import pack_now

    if shape is not None:
        return shape_model(shape, device=device, dtype=dtype, tokenizer=model)
    lm = load_model(model, device=device, dtype=dtype, quantize=quantize, backend=backend)
    pack_now(lm.model)
    return lm


def hf_twin(lm: Any) -> Any:
    """``lm`` on transformers' forward: ``lm`` itself when it already is, else the same folder loaded again with
    ``backend="hf"``: the Hugging Face ``generate`` baselines and the own-vs-hf A/B. The packed copies of both are made
    now, so that neither side makes its own inside a timed run."""
    if getattr(lm, "backend", "hf") == "hf":
        return lm
    from dpinfer.models import load_model
    from dpinfer.packed import pack_now

    twin = load_model(str(lm.source), device=str(lm.device), dtype=lm.dtype, backend="hf")
    pack_now(twin.model)
    pack_now(lm.model)
    return twin


def sync(lm: Any) -> None:
    import torch

    if torch.device(lm.device).type == "cuda":
        torch.cuda.synchronize()


def slot_decode_step(lm: Any, job: Any) -> str:
    """How ``Engine.run_jobs(compile="auto")`` decodes ``job`` on ``lm``: ``"compiled"`` or ``"eager"`` in the shared
    slot batch, ``"eager (runs alone)"`` for a job without a public width (it is never mixed with others, see
    :mod:`dpinfer.engine.scheduler`), ``"eager (dynamic cache)"`` for an architecture the slot runner does not serve
    (:attr:`LM.supports_slot_cache <dpinfer.models.LM.supports_slot_cache>`)."""
    from dpinfer.engine import public_width, resolve_compile

    if not lm.supports_slot_cache:
        return "eager (dynamic cache)"
    if public_width(job, [list(c) for c in job.contexts]) is None:
        return "eager (runs alone)"
    return "compiled" if resolve_compile("auto", lm.device) else "eager"


def time_hf(lm: Any, ids: list[int], n: int, *, compiled: bool = False) -> float:
    import torch

    kwargs: dict[str, Any] = {}
    if compiled:  # static cache + torch.compile of the forward (CUDA graphs on GPU), on any device
        from transformers import CompileConfig

        kwargs = dict(cache_implementation="static", compile_config=CompileConfig(fullgraph=False))
        kwargs["compile_config"]._compile_all_devices = True
    x = torch.tensor([ids], device=lm.device)
    sync(lm)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = lm.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, min_new_tokens=n,
                                max_new_tokens=n, pad_token_id=lm.pad_token_id, **kwargs)
    sync(lm)
    dt = time.perf_counter() - t0
    assert out.shape[1] - len(ids) == n
    return dt


def time_engine(lm: Any, ids: list[int], k: int, n: int, shared: bool) -> tuple[float, float]:
    from dpinfer.engine import Engine
    from dpinfer.mechanisms.sampler import Sampler

    eng = Engine(lm, prefix_sharing=shared)
    t0 = time.perf_counter()
    out = eng.generate([ids] * k, Sampler(temperature=0.0, mode="joint"), max_new_tokens=n, min_new_tokens=n,
                       seed=0)
    dt = time.perf_counter() - t0
    assert len(out.sequences[0]) == n
    return dt, out.prefill_seconds


class HostReads:
    """Counts the Python-level reads of a tensor's value on the host while active (``with HostReads() as reads``;
    ``reads()`` is the count so far): ``item``, ``tolist``, ``numpy``, ``nonzero``, ``bool``/``int``/``float``/
    ``index`` of a tensor, and ``cpu``/``to`` of a tensor that is not on the CPU. On CUDA each is a device-to-host
    synchronisation; on the CPU the count says how many there would be. Reads made inside torch's C++ code (e.g. a
    boolean-mask index) are not seen."""

    _NAMES = ("item", "tolist", "numpy", "nonzero", "__bool__", "__int__", "__float__", "__index__")

    def __init__(self) -> None:
        self.count = 0
        self._saved: dict[str, Any] = {}

    def __call__(self) -> int:
        return self.count

    def __enter__(self) -> HostReads:
        import torch

        def counted(fn: Any, device_only: bool = False) -> Any:
            def wrapper(t: Any, *args: Any, **kwargs: Any) -> Any:
                if not device_only or t.device.type != "cpu":
                    self.count += 1
                return fn(t, *args, **kwargs)
            return wrapper

        for name in (*self._NAMES, "cpu"):
            self._saved[name] = torch.Tensor.__dict__.get(name)  # None: inherited from torch's C++ base class
            setattr(torch.Tensor, name, counted(getattr(torch.Tensor, name), device_only=name == "cpu"))
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch

        for name, fn in self._saved.items():
            if fn is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, fn)
        self._saved.clear()


def job_prompts(lm: Any, n_jobs: int, prompt_tokens: int) -> list[list[int]]:
    """``n_jobs`` different chat prompts of about ``prompt_tokens`` tokens: windows of the example document starting
    at successive paragraphs (cut to ``prompt_tokens``; the document repeats when it runs out)."""
    paragraphs = [p for p in example_document().split("\n\n") if p.strip()]
    out = []
    for i in range(n_jobs):
        text = "\n\n".join(paragraphs[(i + j) % len(paragraphs)] for j in range(len(paragraphs)))
        out.append(lm.encode(lm.instruction_prompt(INSTRUCTION + text))[:prompt_tokens])
    return out
