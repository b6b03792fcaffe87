"""Request bodies parsed into a pipeline's options (the parse step of every route): the fields each route accepts
(:mod:`dpinfer.serve.params`), typed reads with the command line's one-line messages, and the library's checks of
the parameters, all before anything is planned, charged or loaded."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpinfer.checks import check_delta, non_negative_number
from dpinfer.defaults import PROTECT, RAG, SANITIZE, SYNTH
from dpinfer.errors import InvalidInputError
from dpinfer.pipelines.protect_prompt import check_protect_params
from dpinfer.pipelines.rag import check_ask_params
from dpinfer.serve.keys import check_unit_name
from dpinfer.serve.params import (
    ASK_FIELDS,
    NUM,
    PROTECT_FIELDS,
    SANITIZE_FIELDS,
    SYNTH_FIELDS,
    get,
    text_field,
    unknown,
)
from dpinfer.validation import check_sanitize_budget, check_sanitize_params, check_text


def tag(body: Mapping[str, Any]) -> str:
    """``POST /v1/tag``: the document."""
    unknown(body, ("text",))
    return check_text(body.get("text"), "the document")


def sanitize(body: Mapping[str, Any]) -> dict[str, Any]:
    """``POST /v1/sanitize``: the keyword arguments of :func:`~dpinfer.pipelines.sanitize_plan.plan_sanitize` (the
    text and spans included), checked."""
    unknown(body, SANITIZE_FIELDS)
    text = text_field(body, "text", "the document")
    spans = body.get("spans")
    if spans is not None and not isinstance(spans, (list, dict)):
        raise InvalidInputError("spans must be a list of {start, end, label} objects (or TAB entity mentions)")
    opts = {
        "method": get(body, "method", (str,), SANITIZE.method),
        "epsilon": get(body, "epsilon", NUM),
        "group_epsilon": get(body, "group_epsilon", (dict,)),
        "groups": get(body, "groups", (dict,)),
        "delta": get(body, "delta", NUM, SANITIZE.delta),
        "alpha": get(body, "alpha", NUM, SANITIZE.alpha),
        "temperature": get(body, "temperature", NUM),
        "max_new_tokens": get(body, "max_new_tokens", (int,)),
        "adjacency": get(body, "adjacency", (str,), SANITIZE.adjacency),
        "top_k": get(body, "top_k", (int,), SANITIZE.top_k),
    }
    allow_untagged = bool(get(body, "allow_untagged", (bool,), False))
    check_sanitize_params(tagger=None, **opts)
    check_sanitize_budget(**{k: opts[k] for k in ("method", "epsilon", "group_epsilon", "delta", "alpha")})
    return {"text": text, "spans": spans, "allow_untagged": allow_untagged, "unit": body.get("unit"), **opts}


def ask(body: Mapping[str, Any]) -> dict[str, Any]:
    """``POST /v1/rag/{store}/ask`` (and a ``dpinfer-rag/`` chat): the question and the keyword arguments of
    :meth:`~dpinfer.pipelines.rag.PrivateRAG.plan_ask`, checked."""
    unknown(body, ASK_FIELDS)
    question = text_field(body, "question", "the question")
    opts = {
        "mechanism": get(body, "mechanism", (str,), RAG.method),
        "epsilon": get(body, "epsilon", NUM),
        "delta": get(body, "delta", NUM, RAG.delta),
        "max_new_tokens": get(body, "max_new_tokens", (int,), RAG.max_new_tokens),
        "temperature": get(body, "temperature", NUM, RAG.temperature),
    }
    check_ask_params(**opts)
    return {"question": question, "unit": body.get("unit"), **opts}


def protect(body: Mapping[str, Any], prompt: str | None = None) -> tuple[str, dict[str, Any]]:
    """``POST /v1/protect-prompt`` (``prompt``: a ``dpinfer-protect`` chat's user message, the body its options):
    the prompt and the keyword arguments of :func:`~dpinfer.pipelines.protect_prompt.protect_prompt`, checked."""
    if prompt is None:
        unknown(body, PROTECT_FIELDS)
        prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidInputError("prompt must be a non-empty string")
    opts = {
        "method": get(body, "method", (str,), PROTECT.method),
        "epsilon": get(body, "epsilon", NUM),
        "delta": get(body, "delta", NUM, PROTECT.delta),
        "n_rewrites": get(body, "n_rewrites", (int,)),
        "n_keywords": get(body, "n_keywords", (int,), PROTECT.n_keywords),
        "keywords": get(body, "keywords", (str,), PROTECT.keywords),
        "max_new_tokens": get(body, "max_new_tokens", (int,), PROTECT.max_new_tokens),
        "n_exemplars": get(body, "n_exemplars", (int,), PROTECT.n_exemplars),
    }
    quorum = get(body, "stage3_quorum", (int, str), PROTECT.stage3_quorum)
    if isinstance(quorum, str) and quorum.strip().lower() == "all":  # every final decoded to its end
        quorum = None
    opts["stage3_quorum"] = quorum
    check_protect_params(**opts)
    return prompt, opts


def synth_options(body: Mapping[str, Any]) -> dict[str, Any]:
    """``POST /v1/synth``: the keyword arguments of :func:`~dpinfer.pipelines.synthesize.plan_synthesis` (the
    references included); the unit's name checked."""
    unknown(body, SYNTH_FIELDS)
    refs = body.get("references")
    if not isinstance(refs, list) or not refs or not all(isinstance(r, str) and r.strip() for r in refs):
        raise InvalidInputError("references must be a non-empty list of non-empty strings (the private records)")
    if body.get("unit") is not None:
        check_unit_name(body.get("unit"))
    return {
        "references": refs,
        "method": get(body, "method", (str,), SYNTH.method),
        "epsilon": get(body, "epsilon", NUM),
        "delta": get(body, "delta", NUM, SYNTH.delta),
        "batch_size": get(body, "batch_size", (int,), SYNTH.batch_size),
        "max_new_tokens": get(body, "max_new_tokens", (int,), SYNTH.max_new_tokens),
        "max_texts": get(body, "max_texts", (int,)),
    }


def budget(body: Mapping[str, Any]) -> tuple[float, float | None]:
    """``PUT /v1/budget/{unit}``: the unit's total ε and its δ (None: the ledger's default)."""
    unknown(body, ("epsilon", "delta"))
    eps = non_negative_number(body.get("epsilon"), "epsilon", " (the unit's total ε budget)")
    return eps, None if body.get("delta") is None else check_delta(body.get("delta"), "delta")


def documents(body: Mapping[str, Any]) -> list[Any]:
    """``POST /v1/rag/{store}/documents``: the documents (strings or ``{text, id}`` objects)."""
    unknown(body, ("documents",))
    docs = body.get("documents")
    if not isinstance(docs, list) or not docs:
        raise InvalidInputError("documents must be a non-empty list of strings or {text, id} objects")
    return docs
