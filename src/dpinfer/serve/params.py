"""Request-body parameters of the service's JSON routes: a route's settings are its task config's (the fields
declared ``request=True``, read by :meth:`Config.from_mapping <dpinfer.configs.base.Config.from_mapping>` with the
command line's one-line messages), its own fields (the text, the unit) are the route's; an unknown field is refused
without echoing its name (it may be private text sent by mistake)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from dpinfer.configs.base import Config
from dpinfer.errors import InvalidInputError

C = TypeVar("C", bound=Config)


def parse(body: Mapping[str, Any], config: type[C], *fields: str) -> C:
    """The ``config`` of a request ``body``: the settings a request may give (:meth:`Config.request_fields`) typed and
    checked, the route's own ``fields`` left to the route; any other field refused (422, one line, not echoed)."""
    return config.from_mapping(body, allowed=config.request_fields(), extra=fields)


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
