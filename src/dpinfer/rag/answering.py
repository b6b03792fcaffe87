"""How each RAG method answers: the runners that the rag method table (:mod:`dpinfer.methods.rag`) builds.

A runner (:class:`AnswerMethod`) is built from an :class:`~dpinfer.configs.ask.AskConfig` by its table entry's
``build(config, runtime)`` and tells :class:`~dpinfer.pipelines.rag.PrivateRAG` everything that differs between
methods, from PUBLIC parameters only: the calibrated mechanism and its ex-ante guarantee, whether it retrieves, which
retrieved documents it shows (and in what form), which rows the engine decodes, its public settings, and the event
the session's accountant composes for one answer. The pipeline itself knows no method by name.

Adding a method: subclass :class:`AnswerMethod` (override what differs), write a ``build(config, runtime)`` returning
it, and add one :class:`~dpinfer.methods.table.Method` entry to :data:`dpinfer.methods.rag.TABLE`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from dpinfer.accounting import Guarantee, PureDp
from dpinfer.accounting.accountant import Adjacency, LossEvent, NoGuaranteeEvent, NoLossEvent
from dpinfer.accounting.calibration import Budget, Spec
from dpinfer.configs.ask import AskConfig
from dpinfer.engine import Job
from dpinfer.errors import ConfigurationError
from dpinfer.mechanisms import get_mechanism
from dpinfer.mechanisms.pad import Pad
from dpinfer.mechanisms.sampler import Sampler

__all__ = [
    "SUMMARY_TOKENS",
    "AnswerMethod",
    "DistanceThreshold",
    "PadAnswer",
    "PlainAnswer",
    "PublicAnswer",
    "PublishedPad",
    "StaticAnswer",
    "Summarize",
]

SUMMARY_TOKENS = 32
"""Length cap of each condensation of the ``summarize`` baseline."""

PUBLIC_ADJACENCY = "any change to the store (the question alone is decoded; nothing is retrieved)"


@dataclass(frozen=True)
class AnswerMethod:
    """One method's answer, built from ``config`` (see the module docstring). Subclasses override what differs.

    ``knobs``: the optional settings (``epsilon``, ``noise_scale``) this method reads; any other given is refused,
    so that no knob is silently ignored (another method's knob is never an ε).
    """

    name: str
    config: AskConfig
    knobs: ClassVar[frozenset[str]] = frozenset()
    retrieves: ClassVar[bool] = True
    """Whether it reads the store (False: nothing is retrieved, and an empty store is no error)."""
    prepares: ClassVar[bool] = False
    """Whether its documents need the engine (:meth:`documents_many` runs once for a whole batch of questions)."""

    def __post_init__(self) -> None:
        given = {k for k in ("epsilon", "noise_scale") if getattr(self.config, k) is not None}
        for knob in sorted(given - self.knobs):
            flag = self.config.name(knob)
            if knob == "epsilon":
                raise ConfigurationError(f"{flag} applies to pad, not to {self.name}, which has no guarantee")
            raise ConfigurationError(f"{flag} is pad-as-published's noise knob; it does not apply to {self.name}")

    # ------------------------------------------------------------ public: before anything private is read
    @functools.cached_property
    def mechanism(self) -> Any:
        """The mechanism that decodes the answer, calibrated from public parameters only (default: greedy
        sampling from the rows, no defence)."""
        return get_mechanism("sampler", temperature=self.config.temperature, mode="joint")

    def guarantee(self) -> Guarantee:
        """The answer's ex-ante guarantee (default: none, ε = ∞)."""
        return self.mechanism.guarantee(self.config.max_new_tokens)

    def settings(self) -> dict[str, Any]:
        """The public settings of this method beyond the common ones (never the seed)."""
        return {}

    def loss_event(self) -> tuple[LossEvent, int]:
        """What one answer composes into the session's accountant: (event, count). Default: no guarantee."""
        return NoGuaranteeEvent(), 1

    @property
    def adjacency(self) -> Adjacency:
        return self.config.adjacency

    # ------------------------------------------------------------ private: the documents and the rows
    def select(self, hits: list[Any]) -> list[Any]:
        """The retrieved hits this method shows the model (default: all)."""
        return hits

    def documents_many(self, rag: Any, items: Sequence[tuple[str, list[Any], int | None]]) -> list[list[str]]:
        """The documents shown for each (question, hits, seed) item (default: the hits' texts)."""
        return [[h.text for h in hits] for _, hits, _ in items]

    def rows(self, public: list[int], private: list[int] | None, width: int) -> tuple[list[list[int]], int]:
        """The engine's rows and padding width: the private row (question and documents) alone, or the public row
        padded to the same public width when no document is shown."""
        return ([public] if private is None else [private]), width

    def data_dependent(self) -> dict[str, Any]:
        """Figures computed from private data after the answer (diagnostics only)."""
        return {}


@dataclass(frozen=True)
class PadAnswer(AnswerMethod):
    """Rigorous PAD: K = 2 rows (the question alone, public; with the documents, private), C solved from (ε, δ,
    T_max) with σ fixed (:class:`~dpinfer.mechanisms.pad.Pad`). With no document, both rows are the public one."""

    knobs: ClassVar[frozenset[str]] = frozenset({"epsilon"})

    @functools.cached_property
    def mechanism(self) -> Pad:
        c = self.config
        return Pad.calibrated(Budget(c.target_epsilon, c.delta),
                              Spec(c.max_new_tokens, sigma=c.sigma, top_k=c.support_top_k, temperature=c.temperature,
                                   adjacency=c.adjacency, min_p=c.support_min_p))

    def settings(self) -> dict[str, Any]:
        c = self.config
        return {"epsilon": c.target_epsilon, "sigma": c.sigma, "support_top_k": c.support_top_k,
                "support_min_p": c.support_min_p, "adjacency": c.adjacency.value, "clip_norm": self.mechanism.clip_norm}

    def loss_event(self) -> tuple[LossEvent, int]:
        return self.mechanism.loss_event(), self.config.max_new_tokens

    def rows(self, public: list[int], private: list[int] | None, width: int) -> tuple[list[list[int]], int]:
        return [public, public if private is None else private], width


@dataclass(frozen=True)
class PublishedPad(AnswerMethod):
    """The authors' PAD decoding step: no guarantee; its own figure is reported as data-dependent."""

    knobs: ClassVar[frozenset[str]] = frozenset({"epsilon", "noise_scale"})

    @functools.cached_property
    def mechanism(self) -> Any:
        c = self.config
        kw: dict[str, Any] = {"delta": c.delta, "temperature": c.temperature}
        knob = c.noise_scale if c.noise_scale is not None else c.epsilon  # epsilon: the deprecated alias
        if knob is not None:
            kw["noise_scale"] = knob
        return get_mechanism("pad-as-published", **kw)

    def settings(self) -> dict[str, Any]:
        return {"noise_scale": self.mechanism.params["noise_scale"]}

    def data_dependent(self) -> dict[str, Any]:
        return dict(self.mechanism.diagnostics())


@dataclass(frozen=True)
class StaticAnswer(AnswerMethod):
    """Fixed Gaussian noise on every logit (baseline, no guarantee)."""

    @functools.cached_property
    def mechanism(self) -> Any:
        return get_mechanism("static", sigma=self.config.static_sigma, temperature=self.config.temperature)

    def settings(self) -> dict[str, Any]:
        return {"static_sigma": self.config.static_sigma}


@dataclass(frozen=True)
class PlainAnswer(AnswerMethod):
    """``none``: greedy decoding with the documents (no defence)."""


@dataclass(frozen=True)
class PublicAnswer(AnswerMethod):
    """``public``: the question alone (nothing is retrieved: ε = 0 for the store)."""

    retrieves: ClassVar[bool] = False

    @property
    def adjacency(self) -> Adjacency:
        return Adjacency.ANY_TWO_INPUTS  # ε = 0 under any relation: it never constrains a session

    def guarantee(self) -> Guarantee:
        t = self.config.max_new_tokens
        return Guarantee(epsilon=0.0, delta=self.config.delta, mechanism="public", adjacency=PUBLIC_ADJACENCY,
                         parameters={"T_max": t}, max_new_tokens=t, loss=PureDp(0.0))

    def loss_event(self) -> tuple[LossEvent, int]:
        return NoLossEvent(), 1

    def rows(self, public: list[int], private: list[int] | None, width: int) -> tuple[list[list[int]], int]:
        return [public], len(public)


@dataclass(frozen=True)
class DistanceThreshold(AnswerMethod):
    """Documents farther than ``theta`` (Euclidean distance between unit embeddings) dropped, then ``none``."""

    def select(self, hits: list[Any]) -> list[Any]:
        return [h for h in hits if h.distance <= self.config.theta]

    def settings(self) -> dict[str, Any]:
        return {"theta": self.config.theta}


@dataclass(frozen=True)
class Summarize(AnswerMethod):
    """Each retrieved document first condensed by the LM to what the question needs (greedy, at most
    :data:`SUMMARY_TOKENS` tokens), then ``none`` on the condensations (Zeng et al. 2024). Every question's
    condensations run in one engine run, each job with a public padding width."""

    prepares: ClassVar[bool] = True

    def documents_many(self, rag: Any, items: Sequence[tuple[str, list[Any], int | None]]) -> list[list[str]]:
        jobs, owner = [], []
        for n, (question, hits, seed) in enumerate(items):
            template = rag.template
            empty = template.summary.replace("{document}", "").replace("{question}", question)
            width = len(rag.lm.encode(template.wrap(rag.lm, empty))) + rag.max_doc_tokens + rag.doc_slack
            for hit in hits:
                prompt = template.summary.replace("{document}", rag.cut(hit.text)).replace("{question}", question)
                jobs.append(Job(contexts=[rag.lm.encode(template.wrap(rag.lm, prompt))],
                                      mechanism=Sampler(temperature=0.0, mode="joint"),
                                      max_new_tokens=SUMMARY_TOKENS, seed=seed, pad_width=width))
                owner.append(n)
        texts: list[str | None] = [None] * len(jobs)
        if jobs:
            for j, out in rag.engine.run_jobs(jobs):
                texts[j] = rag.lm.decode(out.sequences[0]).strip()
        summaries: list[list[str]] = [[] for _ in items]
        for n, text in zip(owner, texts, strict=True):
            if text:
                summaries[n].append(text)
        return summaries


def build_pad(config: AskConfig, runtime: Any = None) -> PadAnswer:
    return PadAnswer("pad", config)


def build_pad_as_published(config: AskConfig, runtime: Any = None) -> PublishedPad:
    return PublishedPad("pad-as-published", config)


def build_static(config: AskConfig, runtime: Any = None) -> StaticAnswer:
    return StaticAnswer("static", config)


def build_none(config: AskConfig, runtime: Any = None) -> PlainAnswer:
    return PlainAnswer("none", config)


def build_public(config: AskConfig, runtime: Any = None) -> PublicAnswer:
    return PublicAnswer("public", config)


def build_summarize(config: AskConfig, runtime: Any = None) -> Summarize:
    return Summarize("summarize", config)


def build_distance_threshold(config: AskConfig, runtime: Any = None) -> DistanceThreshold:
    return DistanceThreshold("distance-threshold", config)
