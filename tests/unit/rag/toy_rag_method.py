"""A toy RAG method for tests: the module a new method needs (its runner and its builder). It answers from the first
retrieved document only, decoded by the plain sampler with no defence (no guarantee)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpinfer.configs.ask import AskConfig
from dpinfer.rag.answering import AnswerMethod


@dataclass(frozen=True)
class FirstDocument(AnswerMethod):
    """The retrieved documents cut to the first one; everything else is the base runner's (no defence)."""

    def select(self, hits: list[Any]) -> list[Any]:
        return hits[:1]

    def settings(self) -> dict[str, Any]:
        return {"documents_shown": 1}


def build(config: AskConfig, runtime: Any = None) -> FirstDocument:
    return FirstDocument("first-document", config)
