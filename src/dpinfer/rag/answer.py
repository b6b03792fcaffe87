"""One private-RAG answer: :class:`RagAnswer` (its :meth:`~RagAnswer.release` and :meth:`~RagAnswer.diagnostics`)
and :class:`AskPlan`, a question planned for the engine (:meth:`dpinfer.PrivateRAG.plan_ask`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dpinfer.release import check_release, with_warning
from dpinfer.task import Plan

if TYPE_CHECKING:
    from dpinfer.accounting import Guarantee
    from dpinfer.rag.answering import AnswerMethod
    from dpinfer.rag.store import Hit

__all__ = ["AskPlan", "RagAnswer"]


@dataclass
class RagAnswer:
    """One answer. :meth:`release` is what may be published; :meth:`diagnostics` is for the store's owner.

    ``doc_ids`` (the documents shown to the model) and ``retrieved`` (their text and distance) are NOT covered by the
    guarantee; ``data_dependent`` holds figures computed from private data (e.g. pad-as-published's own figure); the
    timing depends on the retrieved documents. None of these is ever part of the release.
    """

    text: str
    doc_ids: list[str]
    guarantee: Guarantee
    mechanism: str
    settings: dict[str, Any]
    seconds: float
    generation_seconds: float
    tokens: int
    finish_reason: str
    token_ids: list[int] = field(default_factory=list, repr=False)
    retrieved: list[Hit] = field(default_factory=list, repr=False)
    data_dependent: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.generation_seconds if self.generation_seconds > 0 else 0.0

    def __str__(self) -> str:
        return self.text

    def release(self) -> dict[str, Any]:
        """The release, public by construction: the text, what is read off it (``tokens``, ``finish_reason``), the
        guarantee and the public settings (never the seed, the question, the documents' ids or the timing)."""
        return check_release({"text": self.text, "mechanism": self.mechanism, "guarantee": self.guarantee.to_dict(),
                              "settings": dict(self.settings), "tokens": self.tokens,
                              "finish_reason": self.finish_reason})

    def diagnostics(self) -> dict[str, Any]:
        """What is computed from the private documents, for the store's owner (``--debug-stats``): never released."""
        return with_warning({"doc_ids": list(self.doc_ids), **self.data_dependent, "seconds": round(self.seconds, 3),
                             "generation_seconds": round(self.generation_seconds, 3)})

    def to_dict(self, *, doc_ids: bool = False, debug: bool = False) -> dict[str, Any]:
        """:meth:`release`, with ``doc_ids`` and (``debug``) :meth:`diagnostics` under ``data_dependent`` when
        asked (for the store's owner: such a dict is no release)."""
        out = self.release()
        if doc_ids:
            out["doc_ids"] = list(self.doc_ids)
        if debug:
            out["data_dependent"] = self.diagnostics()
        return out


@dataclass(frozen=True, kw_only=True, eq=False)
class AskPlan(Plan):
    """One question planned for the engine (:meth:`dpinfer.PrivateRAG.plan_ask`): a :class:`~dpinfer.task.Plan` of
    one job (:attr:`job`), the answer's ex-ante guarantee and charges (scope ``store``), and what
    :meth:`dpinfer.PrivateRAG.finish_ask` needs. Its rows hold the retrieved private documents: never log or
    serialise it."""

    method: AnswerMethod
    hits: list[Hit]
    settings: dict[str, Any]
    t0: float

    @property
    def mechanism(self) -> str:
        return self.method.name

    @property
    def delta(self) -> float:
        return self.method.config.delta

    @property
    def adjacency(self) -> str:
        return self.method.adjacency.value
