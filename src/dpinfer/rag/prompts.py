"""The prompts of private RAG and the rows the engine decodes, from PUBLIC quantities wherever a width is set.

:class:`RagTemplate`: the context, the question (as the user's own message) and the instruction as one user turn
of the model's chat template (the PAD paper's plain completion prompt, ``RagTemplate.completion()``, makes an
instruct model continue a quiz even without privacy; a ``Question:`` label makes the 135M model answer "The correct
answer is:"). :class:`RagRows`: the public row (the question alone), the private row (the question with the retrieved
documents, each cut to a public number of tokens), the padding width and the per-document budget, which read only
the question, the settings and the model's context window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dpinfer.errors import ConfigurationError, ContextTooLongError

if TYPE_CHECKING:
    from dpinfer.models import LM

__all__ = ["DOC_SLACK", "MIN_DOC_TOKENS", "RagRows", "RagTemplate"]

DOC_SLACK = 8
"""Tokens per document added to ``max_doc_tokens`` in the public padding width (merges at the boundaries)."""
MIN_DOC_TOKENS = 16
"""The fewest tokens per retrieved document :meth:`RagRows.doc_budget` shrinks to before it refuses the question."""


@dataclass(frozen=True)
class RagTemplate:
    """The prompts: ``private`` with ``{context}`` and ``{question}``, ``public`` with ``{question}`` only (the
    null context). ``chat``: wrap both in the model's chat template (one user turn; the default, for instruct
    models). :meth:`completion` gives the PAD paper's plain completion prompts.

    >>> t = RagTemplate()
    >>> t.render_public("Why?")
    'Why?\\n\\nReply to this message in two or three sentences.'
    >>> RagTemplate.completion().render_private("Doc A", "Why?")
    'Context:\\nDoc A\\n\\nQuestion: Why?\\nAnswer:\\n'
    """

    private: str = ("Notes:\n{context}\n\n{question}\n\n"
                    "Reply to this message in two or three sentences, using the notes where they help.")
    public: str = "{question}\n\nReply to this message in two or three sentences."
    summary: str = ("Text:\n{document}\n\nQuestion: {question}\nIn one or two sentences, state only the facts of the "
                    "text that help answer the question.")
    separator: str = "\n\n"
    chat: bool = True
    system: str | None = None
    """The system turn of both rows (public, like the rest of the template); None: the model's default."""

    @classmethod
    def completion(cls) -> RagTemplate:
        """The PAD paper's plain completion prompts (no chat template), for base models."""
        return cls(private="Context:\n{context}\n\nQuestion: {question}\nAnswer:\n",
                   public="Question: {question}\nAnswer:\n", chat=False)

    def __post_init__(self) -> None:
        if "{context}" not in self.private or "{question}" not in self.private:
            raise ConfigurationError("the private template must contain {context} and {question}")
        if "{context}" in self.public or "{question}" not in self.public:
            raise ConfigurationError("the public template must contain {question} and not {context}")

    def render_private(self, context: str, question: str) -> str:
        return self.private.replace("{context}", context).replace("{question}", question)

    def render_public(self, question: str) -> str:
        return self.public.replace("{question}", question)

    def wrap(self, lm: LM, text: str) -> str:
        return lm.instruction_prompt(text, system=self.system) if self.chat else text


@dataclass(frozen=True)
class RagRows:
    """The rows of one question for ``lm`` under ``template``, with ``top_n`` documents of at most
    ``max_doc_tokens`` tokens each."""

    lm: LM
    template: RagTemplate
    top_n: int
    max_doc_tokens: int

    def cut(self, text: str, doc_tokens: int | None = None) -> str:
        """``text`` cut to ``doc_tokens`` (default ``max_doc_tokens``) tokens."""
        limit = self.max_doc_tokens if doc_tokens is None else doc_tokens
        ids = self.lm.encode(text)
        return text if len(ids) <= limit else self.lm.decode(ids[:limit])

    def public_ids(self, question: str) -> list[int]:
        """Token ids of the public row: the question alone (the null context)."""
        return self.lm.encode(self.template.wrap(self.lm, self.template.render_public(question)))

    def private_ids(self, question: str, documents: Sequence[str], doc_tokens: int | None = None) -> list[int]:
        """Token ids of the private row: the question with ``documents`` (each cut to ``doc_tokens``). The row never
        exceeds :meth:`pad_width` at that budget: should the joined documents re-tokenise longer, each is cut
        further (a function of the private row alone, which the clip covers)."""
        limit = self.max_doc_tokens if doc_tokens is None else doc_tokens
        width = self.pad_width(question, limit)
        while True:
            context = self.template.separator.join(self.cut(d, limit) for d in documents)
            ids = self.lm.encode(self.template.wrap(self.lm, self.template.render_private(context, question)))
            if len(ids) <= width or limit <= 1:
                return ids[:width]
            limit = max(1, limit - max(1, (len(ids) - width) // max(1, len(documents))))

    def pad_width(self, question: str, doc_tokens: int | None = None) -> int:
        """The engine's padding width, from PUBLIC quantities only: the private template with an empty context for
        this question, plus ``top_n · (doc_tokens + slack)``."""
        empty = self.lm.encode(self.template.wrap(self.lm, self.template.render_private("", question)))
        limit = self.max_doc_tokens if doc_tokens is None else doc_tokens
        return len(empty) + self.top_n * (limit + DOC_SLACK)

    def doc_budget(self, question: str, max_new_tokens: int) -> int:
        """Tokens per retrieved document, from PUBLIC quantities only (the question, ``top_n``, ``max_doc_tokens``,
        ``T_max`` and the model's context window): ``max_doc_tokens``, or fewer when :meth:`pad_width` plus
        ``T_max`` would not fit the window. Refused (one line, before anything is retrieved) when fewer than
        :data:`MIN_DOC_TOKENS` per document would fit."""
        window = self.lm.context_window
        empty = self.pad_width(question, 0) - self.top_n * DOC_SLACK
        fits = (window - max_new_tokens - empty) // self.top_n - DOC_SLACK
        if fits >= self.max_doc_tokens:
            return self.max_doc_tokens
        if fits < MIN_DOC_TOKENS:
            raise ContextTooLongError(
                f"the question's prompt ({empty} tokens) with top_n={self.top_n} documents of at least "
                f"{MIN_DOC_TOKENS} tokens and max_new_tokens={max_new_tokens} does not fit the model's context window "
                f"of {window} tokens; lower --max-new-tokens or --top-n, or shorten the question")
        return fits
