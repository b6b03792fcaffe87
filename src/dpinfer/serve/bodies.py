"""Request bodies parsed (the parse step of every route): a route's settings read into its task's config
(:func:`dpinfer.serve.params.parse`: the config's request fields, typed, with the command line's one-line messages),
its own fields (the text, the unit) read here, and the library's checks of the settings, all before anything is
planned, charged or loaded."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpinfer.checks import check_delta, non_negative_number
from dpinfer.configs.ask import AskConfig
from dpinfer.configs.protect import ProtectConfig
from dpinfer.configs.sanitize import SanitizeConfig
from dpinfer.configs.synth import SynthConfig
from dpinfer.errors import InvalidInputError
from dpinfer.pipelines.protect_prompt import method_for
from dpinfer.pipelines.rag import answer_method
from dpinfer.serve.keys import check_unit_name
from dpinfer.serve.params import parse, text_field, unknown
from dpinfer.validation import check_sanitize_budget, check_sanitize_config, check_text


def tag(body: Mapping[str, Any]) -> str:
    """``POST /v1/tag``: the document."""
    unknown(body, ("text",))
    return check_text(body.get("text"), "the document")


def sanitize(body: Mapping[str, Any]) -> dict[str, Any]:
    """``POST /v1/sanitize``: the text, the spans (None: the server's tagger), the unit named and the
    :class:`~dpinfer.configs.sanitize.SanitizeConfig` of the request, checked."""
    config = parse(body, SanitizeConfig, "text", "spans", "unit", "stream")
    text = text_field(body, "text", "the document")
    spans = body.get("spans")
    if spans is not None and not isinstance(spans, (list, dict)):
        raise InvalidInputError("spans must be a list of {start, end, label} objects (or TAB entity mentions)")
    check_sanitize_budget(check_sanitize_config(config, check_tagger=False))
    return {"text": text, "spans": spans, "unit": body.get("unit"), "config": config}


def ask(body: Mapping[str, Any]) -> dict[str, Any]:
    """``POST /v1/rag/{store}/ask`` (and a ``dpinfer-rag/`` chat): the question, the unit named and the
    :class:`~dpinfer.configs.ask.AskConfig` of the request, checked (the method's checks and PAD's calibration)."""
    config = parse(body, AskConfig, "question", "unit", "stream")
    question = text_field(body, "question", "the question")
    answer_method(config)  # before the store is read
    return {"question": question, "unit": body.get("unit"), "config": config}


def protect(body: Mapping[str, Any], prompt: str | None = None) -> tuple[str, ProtectConfig]:
    """``POST /v1/protect-prompt`` (``prompt``: a ``dpinfer-protect`` chat's user message, the body its ``dpinfer``
    extension, whose other fields are the chat's): the prompt and its
    :class:`~dpinfer.configs.protect.ProtectConfig`, checked (the method's, its number of rewrites)."""
    if prompt is None:
        config = parse(body, ProtectConfig, "prompt", "unit")
        prompt = body.get("prompt")
    else:
        config = parse({k: v for k, v in body.items() if k in ProtectConfig.request_fields()}, ProtectConfig)
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidInputError("prompt must be a non-empty string")
    method_for(config)  # before the model
    return prompt, config


def synth(body: Mapping[str, Any]) -> tuple[list[str], SynthConfig]:
    """``POST /v1/synth``: the references and the :class:`~dpinfer.configs.synth.SynthConfig` of the request (the
    arguments of :func:`~dpinfer.pipelines.synthesize.plan_synthesis`); the unit's name checked."""
    config = parse(body, SynthConfig, "references", "unit")
    refs = body.get("references")
    if not isinstance(refs, list) or not refs or not all(isinstance(r, str) and r.strip() for r in refs):
        raise InvalidInputError("references must be a non-empty list of non-empty strings (the private records)")
    if body.get("unit") is not None:
        check_unit_name(body.get("unit"))
    return refs, config


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
