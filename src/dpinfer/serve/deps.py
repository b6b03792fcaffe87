"""What every route is given (FastAPI dependencies): who sent the request (its API key), its JSON body, the
:class:`~dpinfer.serve.service.Service` and the server's settings, all kept on ``app.state`` by
:func:`~dpinfer.serve.app.create_app`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, Request

from dpinfer.serve.errors import ApiError
from dpinfer.serve.keys import LOCAL, KeyStore, Principal
from dpinfer.serve.service import Service


@dataclass(frozen=True)
class Settings:
    """The server's own settings: the keys (None: every request is the local admin), the page, and what
    ``dpinfer-protect`` forwards to (``upstream``, ``upstream_model``) and forwards unprotected (``forward``: the
    operator's roles)."""

    keys: KeyStore | None
    page: str
    upstream: str | None = None
    upstream_model: str | None = None
    forward: tuple[str, ...] = ()


def settings(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


def service(request: Request) -> Service:
    return request.app.state.runtime  # type: ignore[no-any-return]


def principal(request: Request) -> Principal:
    keys = settings(request).keys
    if keys is None:
        return LOCAL
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    found = keys.verify(key.strip()) if scheme.lower() == "bearer" else None
    if found is None:
        raise ApiError(
            401,
            "a valid API key is required: send 'Authorization: Bearer KEY' (make one with dpinfer serve keys create)",
        )
    return found


def admin(who: Principal = Depends(principal)) -> Principal:  # noqa: B008
    if not who.admin:
        raise ApiError(403, "this route needs an admin key")
    return who


async def body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(422, "the request body is not valid JSON") from None
    except RecursionError:
        raise ApiError(422, "the request body is nested too deeply") from None
    if not isinstance(data, dict):
        raise ApiError(422, "the request body must be a JSON object")
    check_unicode(data)
    return data


def check_unicode(data: Any) -> None:
    """Refuse a body whose strings hold a lone surrogate (JSON's \\ud800 escapes): not text any tokeniser, log or
    file can hold (422, one line)."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise ApiError(
                    422, "the request body holds a lone surrogate (\\uD800-\\uDFFF): send valid Unicode text"
                ) from None
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


User = Depends(principal)
Admin = Depends(admin)
Body = Depends(body)
Svc = Depends(service)
Setup = Depends(settings)
