"""The runtime: the parts a request runs on, built once and handed to every pipeline (Presidio's
``AnalyzerEngine(registry=, nlp_engine=)`` shape: an engine that receives its parts).

A :class:`Runtime` holds one language model (:class:`~dpinfer.models.LM`), one :class:`~dpinfer.engine.Engine` on it,
the taggers asked of it (by name, built once each) and one sentence embedder; on a float32 CPU model also an engine on
its int8 decode twin (:attr:`Runtime.int8_engine`, for public greedy post-processing: DP-GTR's stage 3). Each part
is given or built on first use, and then kept: the Python API builds one default runtime per process
(:func:`default_runtime`), a server keeps one for its lifetime, a corpus job one for its run. Nothing here loads a
model at construction, so building a runtime is free and a refusal still comes before the model loads (rule 4).

>>> rt = Runtime.from_model("smollm2", device="cpu")   # nothing loaded yet
>>> rt.model_name, rt.loaded
('smollm2-135m-instruct', False)
>>> Runtime(tagger="regex").get_tagger().name
'regex'

Pipelines take ``runtime=`` and keep their older ``lm=`` / ``engine=`` / ``embedder=`` / ``tagger=`` keywords:
:func:`resolve_runtime` turns either into one runtime (no keyword at all: the process's default runtime).

Thread safety: building a part is guarded by a lock (two threads asking for the engine at once get the same one). An
engine runs one caller's jobs at a time; code that shares a runtime across threads serialises its engine use with
:attr:`Runtime.lock` (the server's batcher does).
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from dpinfer import taggers
from dpinfer.defaults import SANITIZE
from dpinfer.errors import ConfigurationError
from dpinfer.model_files import model_name
from dpinfer.models import LM, default_lm, int8_twin, load_model
from dpinfer.taggers import Tagger

if TYPE_CHECKING:
    from dpinfer.engine import Engine
    from dpinfer.eval.embeddings import Embedder


class Runtime:
    """One model, one engine, taggers by name and one embedder; each given or built on first use, then kept.

    Args:
        lm: an :class:`~dpinfer.models.LM`, a model name or path (loaded on first use with :func:`load_model`), or
            None for the embedded default model (:func:`~dpinfer.models.default_lm`, one per process).
        engine: an :class:`~dpinfer.engine.Engine`; it must run on ``lm`` when both are given. None: built on first
            use with ``engine_options``.
        tagger: the default tagger: a :class:`~dpinfer.taggers.Tagger` or a registered name (default
            ``SANITIZE.tagger``); :meth:`get_tagger` builds others by name.
        embedder: a sentence embedder (:class:`~dpinfer.eval.embeddings.Embedder`), a model folder, or None for
            all-MiniLM-L6-v2 (:func:`~dpinfer.eval.embeddings.shared_embedder`, one per process).
        engine_options: keywords for the engine built here (``Engine(lm, **engine_options)``).
        int8_engine: the engine of :attr:`int8_engine` when ``engine`` is given (a server's second shared batch).
    """

    def __init__(self, lm: LM | str | os.PathLike[str] | None = None, engine: Engine | None = None,
                 tagger: Tagger | str | None = None, embedder: Embedder | str | os.PathLike[str] | None = None, *,
                 engine_options: Mapping[str, Any] | None = None, int8_engine: Any = None) -> None:
        if engine is not None:
            if engine_options:
                raise ConfigurationError("give either an engine or engine_options, not both")
            if isinstance(lm, LM) and engine.lm is not lm:
                raise ConfigurationError("the engine runs on another model than the lm given; pass one of them")
            if lm is not None and not isinstance(lm, LM):
                raise ConfigurationError("an engine was given with a model name; pass the engine alone")
            lm = engine.lm
        self._lm: LM | None = lm if isinstance(lm, LM) else None
        self._lm_loader: Callable[[], LM] = (
            default_lm if lm is None else functools.partial(load_model, lm) if not isinstance(lm, LM) else
            (lambda: lm))  # type: ignore[assignment,return-value]
        self._lm_arg = None if isinstance(lm, LM) else lm
        self._engine = engine
        self._engine_given = engine is not None
        self._int8_engine: Engine | None = int8_engine
        self._no_int8 = False
        self._engine_options = dict(engine_options or {})
        if tagger is not None and not isinstance(tagger, (str, Tagger)):
            raise ConfigurationError(f"tagger must be a Tagger or a tagger name, got {type(tagger).__name__}")
        self._tagger_default: str = tagger if isinstance(tagger, str) else SANITIZE.tagger
        self._taggers: dict[str, Tagger] = {tagger.name: tagger} if isinstance(tagger, Tagger) else {}
        if isinstance(tagger, Tagger):
            self._tagger_default = tagger.name
        self._embedder: Embedder | None = None
        self._embedder_arg: Any = embedder
        self._build_lock = threading.RLock()
        self.lock = threading.RLock()
        """Held by code that shares this runtime's engine across threads, for each use of the engine."""

    # ------------------------------------------------------------------------------------------------ construction
    @classmethod
    def from_model(cls, name_or_path: str | os.PathLike[str] | None = None, *, device: str | None = None,
                   dtype: Any = None, quantize: str | None = None, **parts: Any) -> Runtime:
        """A runtime whose model is loaded on first use with :func:`~dpinfer.models.load_model` (``device``,
        ``dtype``, ``quantize`` as there); ``parts``: the other :class:`Runtime` arguments."""
        rt = cls(None, **parts)
        rt._lm_loader = functools.partial(load_model, name_or_path, device=device, dtype=dtype, quantize=quantize)
        rt._lm_arg = name_or_path
        return rt

    @classmethod
    def default(cls) -> Runtime:
        """The process's default runtime (:func:`default_runtime`)."""
        return default_runtime()

    # ------------------------------------------------------------------------------------------------ parts
    @property
    def loaded(self) -> bool:
        """Whether the model is loaded (nothing is loaded before a part is asked for)."""
        return self._lm is not None

    @property
    def model_name(self) -> str:
        """The model's name (``lm.name``) without loading it."""
        return self._lm.name if self._lm is not None else model_name(self._lm_arg)

    @property
    def lm(self) -> LM:
        """The language model (loaded on first use)."""
        if self._lm is None:
            with self._build_lock:
                if self._lm is None:
                    self._lm = self._lm_loader()
        return self._lm

    @property
    def engine(self) -> Engine:
        """The engine on :attr:`lm` (built on first use; importing it imports torch)."""
        if self._engine is None:
            with self._build_lock:
                if self._engine is None:
                    from dpinfer.engine import Engine  # torch: imported when the engine is first needed

                    self._engine = Engine(self.lm, **self._engine_options)
        return self._engine

    @property
    def int8_engine(self) -> Engine | None:
        """An engine on the int8-decode twin of :attr:`lm` (:func:`~dpinfer.quantize.int8_decode_twin`: the same
        float32 weights, int8 copies of the linear layers for decode steps), for public greedy post-processing
        (DP-GTR's stage 3). The twin is built once per model and process (a few seconds), this engine on first use.
        The one given as ``int8_engine`` (a server's shared batch on the twin) when there is one; else None when
        :attr:`lm` is not a float32 CPU model or this runtime was given its engine without one (its jobs stay in that
        engine); :attr:`engine` itself when the model is already int8-quantised."""
        if self._int8_engine is not None:
            return self._int8_engine
        if self._no_int8:
            return None
        with self._build_lock:
            if self._int8_engine is None and not self._no_int8:
                twin = int8_twin(self.lm) if not self._engine_given or self.lm.quantize == "int8" else None
                if twin is None:
                    self._no_int8 = True  # not a float32 CPU model, or an engine given without a twin: None
                else:
                    from dpinfer.engine import Engine  # torch: imported when the engine is first needed

                    self._int8_engine = (self.engine if twin is self.lm
                                         else Engine(twin, **self._engine_options))
        return self._int8_engine

    @property
    def tagger(self) -> Tagger:
        """The default tagger (built on first use)."""
        return self.get_tagger()

    def get_tagger(self, name: str | None = None, **options: Any) -> Tagger:
        """The tagger ``name`` (default: this runtime's default tagger). Without ``options`` it is built once and
        kept; with options (e.g. ``label_map=``, ``spans=``) a new one is built each call."""
        key = self._tagger_default if name is None else name
        if options:
            return taggers.get_tagger(key, **options)
        tagger = self._taggers.get(key)
        if tagger is None:
            with self._build_lock:
                tagger = self._taggers.get(key)
                if tagger is None:
                    tagger = self._taggers[key] = taggers.get_tagger(key)  # the registry's, looked up now
        return tagger

    @property
    def embedder(self) -> Embedder:
        """The sentence embedder (all-MiniLM-L6-v2 unless another was given; loaded on first use)."""
        if self._embedder is None:
            with self._build_lock:
                if self._embedder is None:
                    from dpinfer.eval.embeddings import load_embedder, shared_embedder  # numpy, on first use

                    arg = self._embedder_arg
                    # an object with encode(texts) is an encoder as it is (e.g. a test's stand-in); a str or path
                    # is a model folder
                    self._embedder = (shared_embedder() if arg is None else load_embedder(arg)
                                      if isinstance(arg, (str, os.PathLike)) else arg)
        return self._embedder

    def __repr__(self) -> str:
        built = [name for name, part in (("lm", self._lm), ("engine", self._engine), ("embedder", self._embedder))
                 if part is not None] + [f"tagger:{n}" for n in self._taggers]
        return f"Runtime(model={self.model_name!r}, built={built})"


_DEFAULT: Runtime | None = None
_DEFAULT_LOCK = threading.Lock()


def default_runtime() -> Runtime:
    """The process's default runtime (the embedded model, its engine, the default tagger and MiniLM), created on
    first use; the Python API's functions run on it when given no model, engine or runtime."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = Runtime()
        return _DEFAULT


def resolve_runtime(runtime: Runtime | None = None, *, lm: LM | str | None = None, engine: Engine | None = None,
                    embedder: Any = None, tagger: Tagger | str | None = None) -> Runtime:
    """The runtime a pipeline call runs on, from its ``runtime=`` or its older keywords.

    * ``runtime`` given: that runtime (``lm`` / ``engine`` / ``embedder`` must then be None or its own parts);
    * else ``lm`` / ``engine`` / ``embedder`` given: a new runtime on them (``lm`` may be a name or path);
    * else the process's :func:`default_runtime`.

    ``tagger`` is not a part chosen here: it names a call's tagger, which the pipeline asks of the runtime
    (:meth:`Runtime.get_tagger`); a :class:`Tagger` instance is kept by the new runtime.
    """
    if runtime is not None:
        if not isinstance(runtime, Runtime):
            raise ConfigurationError(f"runtime must be a dpinfer Runtime, got {type(runtime).__name__}")
        clash = [name for name, value, own in (("lm", lm, runtime._lm), ("engine", engine, runtime._engine),
                                              ("embedder", embedder, runtime._embedder))
                 if value is not None and value is not own]
        if clash:
            raise ConfigurationError(f"give either runtime= or {', '.join(f'{n}=' for n in clash)}, not both")
        return runtime
    if lm is None and engine is None and embedder is None and not isinstance(tagger, Tagger):
        return default_runtime()
    return Runtime(lm, engine, tagger if isinstance(tagger, Tagger) else None, embedder)
