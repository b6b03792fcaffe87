"""A local server no web page can drive: :class:`Guard`, the ASGI middleware around every route (``Host`` and
``Origin`` checks, JSON bodies only, the Content-Security-Policy, the body limit, no traceback, the access log)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from dpinfer.serve.errors import BodyTooLarge, error, too_large

access_log = logging.getLogger("dpinfer.serve.access")
log = logging.getLogger("dpinfer.serve")


JSON_METHODS = ("POST", "PUT", "PATCH")
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


def host_name(value: str) -> str:
    """The host of a ``Host`` header or an origin's netloc, lower-cased, without the port or IPv6 brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def page_csp(html: str) -> str:
    """The page's Content-Security-Policy: its own inline script and style by hash, requests to this origin only,
    nothing loaded from anywhere else, no framing."""
    import base64
    import hashlib
    import re

    def hashes(tag: str) -> str:
        blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.S)
        return " ".join(
            "'sha256-" + base64.b64encode(hashlib.sha256(b.encode("utf-8")).digest()).decode() + "'" for b in blocks
        )

    return (
        f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


API_CSP = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
DOCS_CSP = (
    "default-src 'none'; script-src https://cdn.jsdelivr.net 'unsafe-inline'; style-src "
    "https://cdn.jsdelivr.net; img-src https://fastapi.tiangolo.com data:; connect-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
"""``/docs`` (only with ``--docs``): FastAPI's Swagger UI, whose assets come from a CDN (no package ships them)."""


class Guard:
    """Pure ASGI middleware, around every route:

    - a local server no web page can drive: the ``Host`` header must name one of ``hosts`` (the bind address,
      localhost, 127.0.0.1, [::1] and the ``--allowed-host`` names; None: any, a server with keys told ``*``), else
      403 (DNS rebinding); a request with an ``Origin`` other than its own ``Host`` is refused (403: a cross-site
      page); a POST/PUT/PATCH body must be ``application/json`` (415: a cross-site form cannot send one without a
      preflight the server never answers);
    - every response carries a Content-Security-Policy with ``frame-ancestors 'none'`` (the page's: its own inline
      script and style by hash, nothing from outside), ``X-Frame-Options: DENY`` and ``nosniff``;
    - the body limit (Content-Length checked before reading; a chunked body counted as it arrives);
    - no traceback for anything: a client that hangs up is logged as status 499 by the access log, nothing else;
      an unexpected error is one line (its type, the route template), answered 500 if nothing was sent yet;
    - the access log (method, route template, status, milliseconds; nothing else).
    """

    def __init__(
        self,
        app: Any,
        limit: int,
        on_request: Callable[[str, str, int], None],
        hosts: frozenset[str] | None = None,
        page_csp: str = API_CSP,
    ) -> None:
        self.app = app
        self.limit = limit
        self.on_request = on_request
        self.hosts = hosts
        self.page_csp = page_csp

    def refuse(self, scope: dict[str, Any]) -> JSONResponse | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        host = headers.get("host", "")
        if self.hosts is not None and host_name(host) not in self.hosts:
            return error(
                403,
                "the Host header does not name this server; use http://127.0.0.1:PORT/ or start the "
                "server with --allowed-host NAME",
            )
        origin = headers.get("origin")
        if origin is not None:
            from urllib.parse import urlsplit

            parts = urlsplit(origin)
            if parts.scheme not in ("http", "https") or parts.netloc.lower() != host.strip().lower():
                return error(
                    403,
                    "cross-origin requests are refused: use the page this server serves, or a client "
                    "that sends no Origin header",
                )
        if scope.get("method") in JSON_METHODS:
            ctype = headers.get("content-type", "").split(";")[0].strip().lower()
            if ctype != "application/json":
                return error(415, "send the request body as JSON with 'Content-Type: application/json'")
        return None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = [500]
        started = [False]
        csp = (
            self.page_csp if scope.get("path") == "/" else DOCS_CSP if scope.get("path") == "/docs" else API_CSP
        ).encode()

        async def send_status(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                started[0] = True
                message = {
                    **message,
                    "headers": [
                        *[(k, v) for k, v in message.get("headers", []) if k.lower() != b"content-security-policy"],
                        (b"content-security-policy", csp),
                        (b"x-frame-options", b"DENY"),
                        (b"x-content-type-options", b"nosniff"),
                        (b"referrer-policy", b"no-referrer"),
                    ],
                }
            try:
                await send(message)
            except OSError:
                raise ClientGone from None

        try:
            refused = self.refuse(scope)
            if refused is not None:
                await refused(scope, receive, send_status)
                return
            length = dict(scope.get("headers") or []).get(b"content-length")
            if length is not None and (not length.isdigit() or int(length) > self.limit):
                await error(413, too_large(self.limit))(scope, receive, send_status)
                return
            seen = 0

            async def limited() -> dict[str, Any]:
                nonlocal seen
                message = await receive()
                if message["type"] == "http.request":
                    seen += len(message.get("body", b""))
                    if seen > self.limit:
                        raise BodyTooLarge
                elif message["type"] == "http.disconnect":
                    gone[0] = True
                return message

            gone = [False]
            await self.app(scope, limited, send_status)
            if gone[0] and status[0] == 500:
                status[0] = 499
        except (ClientGone, ClientDisconnect):
            status[0] = 499  # the client hung up: not an error of the server
        except Exception as exc:  # one line, no traceback (it may quote the input)
            log.error(
                "unexpected %s on %s (message withheld: it may quote the input)",
                type(exc).__name__,
                getattr(scope.get("route"), "path", "(no route)"),
            )
            if not started[0]:
                try:
                    await error(500, f"unexpected {type(exc).__name__} (message withheld: it may quote the input)")(
                        scope, receive, send_status
                    )
                except (ClientGone, OSError):
                    status[0] = 499
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "(no route)"
            ms = (time.perf_counter() - t0) * 1000
            access_log.info("%s %s %d %.0fms", scope.get("method", "?"), template, status[0], ms)
            self.on_request(scope.get("method", "?"), template, status[0])


class ClientGone(Exception):
    """The client hung up (its connection closed before or while the reply was sent)."""


def allowed_hosts(bind: str, extra: Sequence[str] = ()) -> frozenset[str] | None:
    """The names a request's ``Host`` may give: the bind address, localhost, 127.0.0.1, ::1 and ``extra``
    (``--allowed-host``; ``*``: any, None)."""
    if "*" in extra:
        return None
    return frozenset(host_name(h) for h in (bind, *LOCAL_HOSTS, *extra))
