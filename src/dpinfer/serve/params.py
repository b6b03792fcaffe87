"""Request-body parameters of the service's JSON routes: typed reads with the command line's one-line messages, and
the fields each route accepts (an unknown field is refused without echoing its name: it may be private text sent by
mistake)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dpinfer.errors import InvalidInputError

NUM = (int, float)

SANITIZE_FIELDS = ("text", "spans", "epsilon", "group_epsilon", "groups", "method", "max_new_tokens", "unit",
                   "delta", "alpha", "temperature", "top_k", "allow_untagged", "adjacency", "stream")
ASK_FIELDS = ("question", "mechanism", "epsilon", "delta", "max_new_tokens", "temperature", "unit", "stream")
SYNTH_FIELDS = ("references", "method", "epsilon", "delta", "batch_size", "max_new_tokens", "max_texts", "unit")
PROTECT_FIELDS = ("prompt", "method", "epsilon", "delta", "n_rewrites", "n_keywords", "keywords", "max_new_tokens",
                  "n_exemplars", "stage3_quorum", "unit")


def get(body: Mapping[str, Any], name: str, types: tuple[type, ...], default: Any = None, *,
        what: str | None = None) -> Any:
    """``body[name]`` checked against ``types`` (absent or null: ``default``)."""
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in types:
        raise InvalidInputError(f"{what or name} must be {'/'.join(t.__name__ for t in types)}, got a boolean")
    if not isinstance(value, types):
        names = " or ".join("a number" if t in (int, float) else f"a {t.__name__}" for t in types)
        raise InvalidInputError(f"{what or name} must be {names}, got {type(value).__name__}")
    return value


def unknown(body: Mapping[str, Any], allowed: Sequence[str]) -> None:
    """Refuse fields not in ``allowed`` (their names are not echoed)."""
    extra = [k for k in body if k not in allowed]
    if extra:
        raise InvalidInputError(f"{len(extra)} unknown field(s); allowed: {', '.join(allowed)}")


def text_field(body: Mapping[str, Any], name: str, what: str) -> str:
    """A non-empty string field."""
    value = body.get(name)
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError(f"{name} must be {what}, a non-empty string")
    return value
