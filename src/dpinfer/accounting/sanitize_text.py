"""A sanitisation's guarantee in words: one plain sentence, the details, the caveats, and what stays public.

Every clause is true for the run that printed it: the functions read the result's guarantee (computed ex ante), what
its method protects (``result.protects``: ``"spans"``, ``"document"`` or ``"nothing"``), the privacy groups present,
where the spans came from (``settings["span_source"]``) and how T_max was fixed (``settings["max_new_tokens_from"]``).
They read no private text and no data-dependent statistic. ε is rounded UP to the digits shown
(:func:`~dpinfer.checks.format_up`).

A result here is anything with ``guarantee``, ``groups``, ``settings`` and ``protects`` (a
:class:`~dpinfer.pipelines.sanitize.SanitizeResult`).
"""

from __future__ import annotations

import math
from typing import Any

from dpinfer.accounting.guarantee import SEEDED_NOTE, epsilon_caveat
from dpinfer.checks import format_up

NOT_PROTECTED = (
    "the existence, position and token length of each tagged span",
    "which privacy groups (entity types) the document contains",
    "anything the tagger missed",
    "how long the rewrite took (timing)",
)
"""What DP-Fusion's (and NER scrubbing's) adjacency leaves public: released as ``guarantee.not_protected``."""

BASELINE_NOT_PROTECTED = ("that a document was rewritten with these settings", "how long the rewrite took (timing)")
"""What the whole-document methods' adjacency (any two documents) leaves public."""

FUSION_ADJACENCY = (
    "replace-by-null of one privacy group's tagged spans (the content of the spans is protected; their existence, "
    "positions and token lengths, and anything the tagger missed, are not)"
)
"""The adjacency of the span-protecting methods (DP-Fusion, NER scrubbing), in words."""


def _span_words(result: Any) -> tuple[str, str]:
    """(what found the spans, what the guarantee cannot cover because of it), true for this run."""
    spans_from = result.settings.get("span_source") or {}
    source, tagger = spans_from.get("from", "tagger"), spans_from.get("tagger", "the")
    if source == "given":
        return "the spans given", "anything the given spans do not cover"
    if source == "given+tagger":
        return (f"the spans given, completed by the {tagger} tagger for the types they left out",
                "anything the spans and the tagger missed")
    return f"the {tagger} tagger", "anything the tagger missed"


def _t_max_words(result: Any) -> str:
    """How T_max was set in this run, in words."""
    t = result.guarantee.max_new_tokens
    how = result.settings.get("max_new_tokens_from")
    if how == "max_new_tokens":
        return f"a limit of {t} generated tokens, set with max-new-tokens"
    if how == "document length":
        return (f"a limit of {t} generated tokens that follows the document's length (which this adjacency leaves "
                "public)")
    return f"a fixed limit of {t} generated tokens"


def not_protected(result: Any) -> tuple[str, ...]:
    """What the guarantee of ``result`` leaves public, true for this run (given spans: what they do not cover;
    tagged: what the tagger missed); empty when nothing is protected."""
    if result.protects == "spans":
        if not result.groups:
            return ()
        missed = _span_words(result)[1]
        return tuple(missed if item == "anything the tagger missed" else item for item in NOT_PROTECTED)
    if result.protects == "document":
        return BASELINE_NOT_PROTECTED
    return ()


def guarantee_sentence(result: Any) -> str:
    """The guarantee in ONE plain sentence: what is protected, ε, what is not (printed by ``dpinfer sanitize``, in
    the release as ``guarantee.sentence``)."""
    g = result.guarantee
    if result.protects == "spans" and not result.groups:
        return ("Guarantee: none. Nothing was tagged, so nothing in the document was protected: the rewrite was "
                "generated from the full document (allowed with --allow-untagged).")
    if math.isinf(g.epsilon):
        return ("Guarantee: none. This output was generated from the full private document without a privacy "
                "mechanism.")
    flag = " (authors' published accounting, for comparison only)" if g.accounting == "as_published" else ""
    if result.protects != "spans":
        return (f"Guarantee{flag}: the whole document is protected with ε = {format_up(g.epsilon)} "
                f"(δ = {format_up(g.delta)}); not protected: {', and '.join(not_protected(result))}.")
    types = [gr.name for gr in g.groups]
    named = types[0] if len(types) == 1 else ", ".join(types[:-1]) + " and " + types[-1]
    missed = _span_words(result)[1]
    if g.epsilon == 0:
        return (f"Guarantee: the rewrite reveals nothing about what the tagged {named} spans say (ε = 0: it was "
                f"written without reading them); not protected: where the spans are and how long they are, and "
                f"{missed}{_opening_words(result)}.")
    values = {format_up(gr.epsilon) for gr in g.groups}
    if len(values) == 1:
        eps = f"ε = {values.pop()} for each entity type" if len(types) > 1 else f"ε = {format_up(g.epsilon)}"
    else:
        eps = ", ".join(f"{gr.name} ε = {format_up(gr.epsilon)}" for gr in g.groups)
    against = ", against any other values in the same spans," if "replace-one" in (g.adjacency or "") else ""
    return (f"Guarantee{flag}: what the tagged {named} spans say is protected{against} with {eps} "
            f"(δ = {format_up(g.delta)}); not protected: where the spans are and how long they are, and {missed}"
            f"{_opening_words(result)}.")


def _opening_words(result: Any) -> str:
    """The sentence's last clause when the rewrite starts with a public opening (empty otherwise)."""
    if not (getattr(result, "settings", None) or {}).get("opening_tokens"):
        return ""
    return "; the rewrite starts with the document's first untagged words (--no-opening to omit them)"


def guarantee_details(result: Any) -> str | None:
    """What the sentence means, in full (``dpinfer sanitize --explain``; ``guarantee.details`` in the release): the
    odds bound, how ε was fixed (T_max as set in this run) and everything left public; None without a guarantee."""
    g = result.guarantee
    if math.isinf(g.epsilon) or (result.protects == "spans" and not result.groups):
        return None
    if result.protects == "spans":
        scope = "the content of one entity type's spans"
        if "replace-one" in (g.adjacency or ""):
            scope += ", compared with any other values in the same spans"
        found = f" The spans were found by {_span_words(result)[0]}."
        if (getattr(result, "settings", None) or {}).get("opening_tokens"):
            found += (" The rewrite starts with the document's opening as the public context shows it (its first "
                      "tokens up to the first tagged span, copied: untagged text is public).")
    else:
        scope, found = "the document", ""
    return (f"Whatever else anyone knows, this rewrite changes the odds of any conclusion about {scope} by a factor "
            f"of at most e^ε, except with probability δ = {format_up(g.delta)}. ε was fixed before the document was "
            f"read, from the method's settings and {_t_max_words(result)}.{found} Not protected: "
            f"{'; '.join(not_protected(result))}.")


def guarantee_caveats(result: Any) -> list[str]:
    """What a reader must know beside the sentence: a large ε (what e^ε means there, where to read how to choose
    ε), and a seed (the guarantee then holds only while it is secret)."""
    g = result.guarantee
    out: list[str] = []
    if not math.isinf(g.epsilon):
        caveat = epsilon_caveat(g.epsilon, "the protected spans" if g.groups else "the document")
        if caveat:
            out.append(caveat)
    if g.seeded and g.epsilon > 0:
        out.append(SEEDED_NOTE)
    return out


def guarantee_statement(result: Any, *, explain: bool = False) -> str:
    """What is printed under the rewrite: the sentence, its caveats and, with ``explain``, the details (one
    paragraph each)."""
    parts = [guarantee_sentence(result), *guarantee_caveats(result)]
    details = guarantee_details(result) if explain else None
    if details:
        parts.append("Details: " + details)
    return "\n".join(parts)
