"""What a sanitisation returns: :class:`SanitizeResult`, whose :meth:`~SanitizeResult.release` is public by
construction and whose :meth:`~SanitizeResult.diagnostics` holds the rest."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dpinfer.accounting.sanitize_text import (
    guarantee_caveats,
    guarantee_details,
    guarantee_sentence,
    not_protected,
)
from dpinfer.methods.sanitize import TABLE
from dpinfer.taggers.base import Span

if TYPE_CHECKING:
    from dpinfer.accounting import Guarantee

DEBUG_WARNING = (
    "debug statistics are data-dependent: they are exact functions of the private document (λ and divergences per "
    "step, spans, prompt length, timing), reveal its content, are not covered by the guarantee, and must not be "
    "released"
)


@dataclass
class SanitizeResult:
    """Output of :func:`~dpinfer.pipelines.sanitize.sanitize`.

    Attributes:
        text: the released rewrite.
        guarantee: the ex-ante guarantee (``.epsilon`` is the worst group's, ``.groups`` has one entry per group).
        spans: the spans used (offsets into the input document; overlapping spans merged).
        groups: group name → the TAB labels it covers (only groups present in the document).
        method: the method used.
        data_dependent: per-step statistics of the realised decoding (mixing weights λ and divergences per group,
            summaries), filled only with ``sanitize(..., debug=True)``. DATA-DEPENDENT: exact functions of the
            private content (they reveal it), never a privacy guarantee, never part of the release.

    :meth:`release` is the release: the rewrite, the guarantee (in words too, with ``not_protected``: what the
    adjacency leaves public) and public settings. :meth:`diagnostics` holds the spans, the prompt length, the timing
    and the per-step statistics: functions of the private document, never released.
    """

    text: str
    guarantee: Guarantee
    spans: list[Span]
    token_ids: list[int]
    groups: dict[str, list[str]]
    method: str
    finish_reason: str
    prompt_tokens: int
    generated_tokens: int
    max_new_tokens: int
    seconds: float
    settings: dict[str, Any] = field(default_factory=dict)
    data_dependent: dict[str, Any] = field(default_factory=dict)
    debug: bool = False

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def protects(self) -> str:
        """What the method's guarantee covers (``"spans"``, ``"document"``, ``"nothing"``; its table entry)."""
        return TABLE.get(self.method).protects

    @property
    def not_protected(self) -> tuple[str, ...]:
        """What the guarantee leaves public (empty for ``original``, which protects nothing)."""
        return not_protected(self)

    def release(self) -> dict[str, Any]:
        """The release as a JSON-ready dict: the rewrite, the guarantee and public settings (no timing, no spans, no
        per-step statistic, no seed, no input text)."""
        g = self.guarantee.to_dict()
        g["not_protected"] = list(self.not_protected) if self.not_protected else "everything (no privacy protection)"
        g["sentence"] = guarantee_sentence(self)
        g["details"] = guarantee_details(self)
        g["caveats"] = guarantee_caveats(self)
        out: dict[str, Any] = {
            "text": self.text,
            "method": self.method,
            "guarantee": g,
            "finish_reason": self.finish_reason,
            "generated_tokens": self.generated_tokens,
            "max_new_tokens": self.max_new_tokens,
            "settings": self.settings,
        }
        if self.protects == "spans":
            out["groups"] = self.groups  # public under their adjacency (one group per entity type present)
        return out

    def to_dict(self) -> dict[str, Any]:
        """The release (:meth:`release`)."""
        return self.release()

    def diagnostics(self) -> dict[str, Any]:
        """The DATA-DEPENDENT rest, under a warning: the spans, the prompt length, the timing and (with ``debug``) the
        per-step λ and divergences. They reveal the private document: never release them."""
        return {"warning": DEBUG_WARNING, "spans": [s.to_dict() for s in self.spans],
                "prompt_tokens": self.prompt_tokens, "seconds": round(self.seconds, 3), **self.data_dependent}
