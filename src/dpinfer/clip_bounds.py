"""Public clip bounds for DP-Prompt (and DP-GTR's stage 1): measured on a public corpus, stored per model.

DP-Prompt clips every logit to ``[b_min, b_max]`` before sampling (``ε_tok = 2(b_max − b_min)/τ``). The bounds must
not be computed from the private data. DP-GTR (Li et al. 2025, Appendix A.2) takes ``(μ, μ + 4σ)`` of all logits the
model produces while paraphrasing a public corpus; :func:`measure_clip_bounds` does exactly that on the paragraphs of
``dpinfer/data/public_corpus.txt`` (generic, non-personal descriptions written for calibration). Nothing private is
read, so the bounds cost no privacy, and any fixed public bounds keep the guarantee: they only move utility.

Where the bounds come from (:func:`clip_bounds`), in order:

1. the dpinfer cache, ``<cache>/clip_bounds/<model key>.json``, written by ``dpinfer calibrate-clip [--model M]``
   (:func:`calibrate_and_store`);
2. the bounds shipped with the package for the embedded model (``dpinfer/data/clip_bounds.json``, pinned by a test);
3. otherwise they are measured now (a few CPU-seconds for a small model) and stored in the cache for next time.

There is no in-memory cache: a process that needs the bounds twice reads the small JSON file twice.

>>> record = ClipBounds(clip_min=4.0, clip_max=28.0, model="m", mean=4.0, std=6.0, n_texts=8, max_new_tokens=32,
...                     sigmas=4.0, source="measured")
>>> record.bounds, ClipBounds.from_dict(record.to_dict()) == record
((4.0, 28.0), True)
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from dpinfer.checks import positive_int
from dpinfer.engine import Engine
from dpinfer.errors import ConfigurationError, CorruptCacheError
from dpinfer.io import atomic_write_text
from dpinfer.mechanisms.base import Mechanism, StepInfo, StepResult
from dpinfer.mechanisms.randomness import Randomness
from dpinfer.mechanisms.sampler import Sampler
from dpinfer.models import LM
from dpinfer.paths import cache_dir

PARAPHRASE_INSTRUCTION = "Paraphrase the following text in your own words.\n\n{text}"
"""The instruction used to paraphrase the public corpus in :func:`measure_clip_bounds`."""

DEFAULT_N_TEXTS = 8
DEFAULT_MAX_NEW_TOKENS = 32
DEFAULT_SIGMAS = 4.0
CALIBRATION_SEED = 0
"""The public calibration run samples at τ = 1 with this fixed seed (public data: a seed is harmless here, and it makes
the shipped bounds reproducible)."""

PACKAGED_FILE = "data/clip_bounds.json"
CACHE_FOLDER = "clip_bounds"
SOURCES = ("measured", "cache", "package")


def public_corpus() -> list[str]:
    """The paragraphs of ``dpinfer/data/public_corpus.txt`` (generic, non-personal text written for calibration).

    >>> paragraphs = public_corpus()
    >>> 10 <= len(paragraphs) <= 20, paragraphs[0].startswith("A court")
    (True, True)
    """
    text = resources.files("dpinfer").joinpath("data/public_corpus.txt").read_text(encoding="utf-8")
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]


def corpus_digest() -> str:
    """SHA-256 (first 16 hex digits) of the public corpus text: stored with the bounds it produced."""
    data = resources.files("dpinfer").joinpath("data/public_corpus.txt").read_bytes()
    return hashlib.sha256(data).hexdigest()[:16]


@dataclass(frozen=True)
class ClipBounds:
    """Clip bounds ``(clip_min, clip_max) = (μ, μ + sigmas·σ)`` of one model, and how they were obtained.

    ``source`` is ``"measured"`` (just now), ``"cache"`` (read from the dpinfer cache) or ``"package"`` (shipped).
    """

    clip_min: float
    clip_max: float
    model: str
    mean: float
    std: float
    n_texts: int
    max_new_tokens: int
    sigmas: float
    source: str = "measured"
    corpus: str = ""

    def __post_init__(self) -> None:
        for name in ("clip_min", "clip_max", "mean", "std", "sigmas"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigurationError(f"clip bounds: {name} must be a finite number, got {value!r}")
        if not self.clip_min < self.clip_max:
            raise ConfigurationError(f"clip bounds need clip_min < clip_max, got {self.clip_min!r}, {self.clip_max!r}")
        if self.source not in SOURCES:
            raise ConfigurationError(f"clip bounds: source must be one of {SOURCES}, got {self.source!r}")

    @property
    def bounds(self) -> tuple[float, float]:
        """``(clip_min, clip_max)``."""
        return (float(self.clip_min), float(self.clip_max))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClipBounds:
        fields = {k: data[k] for k in ("clip_min", "clip_max", "model", "mean", "std", "n_texts", "max_new_tokens",
                                       "sigmas")}
        return cls(**fields, source=data.get("source", "measured"), corpus=data.get("corpus", ""))


class _LogitMoments(Mechanism):
    """Plain sampling (τ = 1, independent rows) that records the count, sum and sum of squares of the logits seen."""

    name = "logit-moments"
    mode = "independent"

    def __init__(self) -> None:
        self.sampler = Sampler(temperature=1.0, mode="independent")
        self.count, self.total, self.total_sq = 0, 0.0, 0.0

    def step(self, logits: torch.Tensor, info: StepInfo, generator: Randomness) -> StepResult:
        live = logits if info.finished is None else logits[~info.finished.to(logits.device)]
        values = live[torch.isfinite(live)]
        self.count += int(values.numel())
        self.total += float(values.sum())
        self.total_sq += float((values * values).sum())
        return self.sampler.step(logits, info, generator)


def _check_settings(n_texts: object, max_new_tokens: object, sigmas: object) -> tuple[int, int, float]:
    n = positive_int(n_texts, "n_texts")
    t = positive_int(max_new_tokens, "max_new_tokens")
    if isinstance(sigmas, bool) or not isinstance(sigmas, (int, float)) or not (math.isfinite(sigmas) and sigmas > 0):
        raise ConfigurationError(f"sigmas must be a finite number > 0 (DP-GTR uses 4), got {sigmas!r}")
    corpus_size = len(public_corpus())
    if n > corpus_size:
        raise ConfigurationError(
            f"n_texts must be between 1 and {corpus_size} (the public corpus has that many paragraphs), got {n}"
        )
    return n, t, float(sigmas)


def measure_clip_bounds(lm: LM, *, n_texts: int = DEFAULT_N_TEXTS, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                        sigmas: float = DEFAULT_SIGMAS) -> ClipBounds:
    """``(μ, μ + sigmas·σ)`` of the logits ``lm`` produces while paraphrasing the public corpus (DP-GTR, App. A.2).

    The first ``n_texts`` paragraphs of :func:`public_corpus` are each put in the model's chat template with
    :data:`PARAPHRASE_INSTRUCTION` and paraphrased in one batch on the :class:`~dpinfer.engine.Engine` for at most
    ``max_new_tokens`` tokens (plain sampling at τ = 1, seed :data:`CALIBRATION_SEED`). μ and σ are the mean and
    standard deviation of every finite logit of every generation step (all V entries, all rows still generating), in
    float64. Nothing private is read. Nothing is cached: see :func:`clip_bounds`.

    >>> # measure_clip_bounds(dpinfer.load_model()).bounds   # SmolLM2-135M: (4.78, 26.78), about 5 CPU-seconds
    """
    n_texts, max_new_tokens, sigmas = _check_settings(n_texts, max_new_tokens, sigmas)
    corpus = public_corpus()
    prompts = [lm.encode(lm.instruction_prompt(PARAPHRASE_INSTRUCTION.format(text=t))) for t in corpus[:n_texts]]
    prompts = [p for p in prompts if len(p) + max_new_tokens <= lm.context_window]
    if not prompts:
        raise ConfigurationError(
            f"no public paraphrase prompt plus max_new_tokens={max_new_tokens} fits the model's context window of "
            f"{lm.context_window} tokens; lower max_new_tokens"
        )
    recorder = _LogitMoments()
    Engine(lm).generate(prompts, recorder, max_new_tokens=max_new_tokens, seed=CALIBRATION_SEED)
    if recorder.count < 2:
        raise ConfigurationError("the public paraphrase run produced no finite logits; check the model")
    mean = recorder.total / recorder.count
    std = math.sqrt(max(recorder.total_sq / recorder.count - mean * mean, 0.0))
    if not std > 0:
        raise ConfigurationError(f"the model's public logits have no spread (σ = {std!r}); check the model")
    return ClipBounds(clip_min=mean, clip_max=mean + sigmas * std, model=str(lm.name), mean=mean, std=std,
                      n_texts=n_texts, max_new_tokens=max_new_tokens, sigmas=sigmas, source="measured",
                      corpus=corpus_digest())


# ------------------------------------------------------------------------------------------------ storage per model
def model_key(lm: LM) -> str:
    """The file name stem of a model's stored bounds: a readable slug of its name and a hash of name and source.

    >>> class Fake: name, source = "smollm2-135m-instruct", "/cache/x"
    >>> model_key(Fake())  # doctest: +ELLIPSIS
    'smollm2-135m-instruct-...'
    """
    name = str(lm.name)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(name).name or name).strip("-.")[:60] or "model"
    digest = hashlib.sha256(f"{name}\n{lm.source}".encode()).hexdigest()[:12]
    return f"{slug}-{digest}"


def cache_path(lm: LM) -> Path:
    """``<dpinfer cache>/clip_bounds/<model key>.json``."""
    return cache_dir() / CACHE_FOLDER / f"{model_key(lm)}.json"


def packaged_bounds() -> dict[str, ClipBounds]:
    """The bounds shipped with dpinfer (``dpinfer/data/clip_bounds.json``), by model name.

    >>> shipped = packaged_bounds()["smollm2-135m-instruct"]
    >>> shipped.source, round(shipped.clip_min, 2), round(shipped.clip_max, 2)
    ('package', 4.78, 26.78)
    """
    text = resources.files("dpinfer").joinpath(PACKAGED_FILE).read_text(encoding="utf-8")
    return {name: replace(ClipBounds.from_dict(data), source="package") for name, data in json.loads(text).items()}


def _settings_match(record: ClipBounds, n_texts: int, max_new_tokens: int, sigmas: float) -> bool:
    return (record.n_texts, record.max_new_tokens, record.sigmas, record.corpus) == (
        n_texts, max_new_tokens, sigmas, corpus_digest())


def read_cached(lm: LM) -> ClipBounds | None:
    """The bounds stored in the cache for ``lm`` (None when there are none); a damaged file is refused."""
    path = cache_path(lm)
    if not path.is_file():
        return None
    try:
        record = ClipBounds.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError, ConfigurationError):
        raise CorruptCacheError(
            f"the stored clip bounds {path} cannot be read; delete the file and run: dpinfer calibrate-clip"
        ) from None
    if record.model != str(lm.name):
        raise CorruptCacheError(f"the stored clip bounds {path} belong to another model ({record.model}); delete it "
                                "and run: dpinfer calibrate-clip")
    return replace(record, source="cache")


def store(lm: LM, record: ClipBounds) -> Path:
    """Write ``record`` to the cache for ``lm`` atomically; returns the path."""
    path = cache_path(lm)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(replace(record, source="measured").to_dict(), indent=2) + "\n")
    return path


def calibrate_and_store(lm: LM, *, n_texts: int = DEFAULT_N_TEXTS, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                        sigmas: float = DEFAULT_SIGMAS) -> tuple[ClipBounds, Path]:
    """Measure the bounds of ``lm`` (:func:`measure_clip_bounds`) and store them in the cache (``calibrate-clip``)."""
    record = measure_clip_bounds(lm, n_texts=n_texts, max_new_tokens=max_new_tokens, sigmas=sigmas)
    return record, store(lm, record)


def clip_bounds(lm: LM, *, n_texts: int = DEFAULT_N_TEXTS, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                sigmas: float = DEFAULT_SIGMAS, measure: bool = True) -> ClipBounds:
    """The public clip bounds of ``lm``: stored in the cache, shipped with the package, or measured now and stored.

    Stored or shipped bounds are used only when they were measured with the same settings on the same corpus. With
    ``measure=False`` a model without stored bounds is refused (with the command that stores them).
    """
    n_texts, max_new_tokens, sigmas = _check_settings(n_texts, max_new_tokens, sigmas)
    cached = read_cached(lm)
    if cached is not None and _settings_match(cached, n_texts, max_new_tokens, sigmas):
        return cached
    shipped = packaged_bounds().get(str(lm.name))
    if shipped is not None and _settings_match(shipped, n_texts, max_new_tokens, sigmas):
        return shipped
    if not measure:
        raise ConfigurationError(f"no stored clip bounds for the model {lm.name}; store them first with: "
                                 f"dpinfer calibrate-clip --model {lm.name}")
    record, _ = calibrate_and_store(lm, n_texts=n_texts, max_new_tokens=max_new_tokens, sigmas=sigmas)
    return record


__all__ = [
    "PARAPHRASE_INSTRUCTION",
    "ClipBounds",
    "cache_path",
    "calibrate_and_store",
    "clip_bounds",
    "measure_clip_bounds",
    "model_key",
    "packaged_bounds",
    "public_corpus",
    "read_cached",
    "store",
]
