"""The FastAPI application of ``dpinfer serve``: routes, keys and tenants, errors, limits and the access log.

Errors are JSON ``{"error": "<one line>"}`` quoting no client value (a budget refusal adds ``"budget"``): 401
without a valid key, 403 for an admin-only route, a foreign ``Host`` or ``Origin`` (:class:`Guard`), 404 for a store
or job that does not exist for this tenant (another tenant's answers the same), 402 for a budget refusal (nothing
generated), 413 for a body over the limit (4 MiB), 415 for a body that is not ``application/json``, 422 for bad JSON
or bad parameters with the command line's messages, 500 for anything unexpected (its message withheld: it may quote
the input; one log line, no traceback). No log line carries a request body, a header, a query string or a release:
the access log (logger ``dpinfer.serve.access``) writes method, route template, status and milliseconds only;
uvicorn's own access log is off.

Units (:meth:`~dpinfer.serve.service.Service.units_for`): a release is charged to the unit of the entity it reads and,
in addition, to a unit the request names. ``dpinfer-protect`` forwards the protected prompt and nothing else unless
the request (``dpinfer.forward``) or the operator (``forward``) opts roles in; a second user turn is refused.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from importlib import resources
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, StreamingResponse
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from dpinfer import __version__
from dpinfer.defaults import SERVE
from dpinfer.errors import DPInferError
from dpinfer.rag.server import StoreUnavailableError
from dpinfer.serve.budget import BudgetRefused
from dpinfer.serve.keys import LOCAL, Forbidden, KeyStore, NotFound, Principal
from dpinfer.serve.service import Service

access_log = logging.getLogger("dpinfer.serve.access")
log = logging.getLogger("dpinfer.serve")

PLAIN = "dpinfer-plain"
PROTECT = "dpinfer-protect"
RAG_PREFIX = "dpinfer-rag/"
NO_GUARANTEE = "no privacy guarantee: plain generation from the local model, nothing is protected"


class BodyTooLarge(Exception):
    pass


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def one_line(message: str) -> str:
    return " ".join(str(message).split())


def error(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": one_line(message), **extra}, status_code=status)


JSON_METHODS = ("POST", "PUT", "PATCH")
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


def host_name(value: str) -> str:
    """The host of a ``Host`` header or an origin's netloc, lower-cased, without the port or IPv6 brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def page_csp(html: str) -> str:
    """The page's Content-Security-Policy: its own inline script and style by hash, requests to this origin only,
    nothing loaded from anywhere else, no framing."""
    import base64
    import hashlib
    import re

    def hashes(tag: str) -> str:
        blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.S)
        return " ".join("'sha256-" + base64.b64encode(hashlib.sha256(b.encode("utf-8")).digest()).decode() + "'"
                        for b in blocks)

    return (f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; connect-src 'self'; "
            "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


API_CSP = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
DOCS_CSP = ("default-src 'none'; script-src https://cdn.jsdelivr.net 'unsafe-inline'; style-src "
            "https://cdn.jsdelivr.net; img-src https://fastapi.tiangolo.com data:; connect-src 'self'; "
            "frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
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

    def __init__(self, app: Any, limit: int, on_request: Callable[[str, str, int], None],
                 hosts: frozenset[str] | None = None, page_csp: str = API_CSP) -> None:
        self.app = app
        self.limit = limit
        self.on_request = on_request
        self.hosts = hosts
        self.page_csp = page_csp

    def refuse(self, scope: dict[str, Any]) -> JSONResponse | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        host = headers.get("host", "")
        if self.hosts is not None and host_name(host) not in self.hosts:
            return error(403, "the Host header does not name this server; use http://127.0.0.1:PORT/ or start the "
                              "server with --allowed-host NAME")
        origin = headers.get("origin")
        if origin is not None:
            from urllib.parse import urlsplit

            parts = urlsplit(origin)
            if parts.scheme not in ("http", "https") or parts.netloc.lower() != host.strip().lower():
                return error(403, "cross-origin requests are refused: use the page this server serves, or a client "
                                  "that sends no Origin header")
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
        csp = (self.page_csp if scope.get("path") == "/" else DOCS_CSP if scope.get("path") == "/docs"
               else API_CSP).encode()

        async def send_status(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                started[0] = True
                message = {**message, "headers": [
                    *[(k, v) for k, v in message.get("headers", []) if k.lower() != b"content-security-policy"],
                    (b"content-security-policy", csp), (b"x-frame-options", b"DENY"),
                    (b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer")]}
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
                await error(413, f"the request body is over the limit of {self.limit} bytes; send a smaller "
                                 "document")(scope, receive, send_status)
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
            log.error("unexpected %s on %s (message withheld: it may quote the input)", type(exc).__name__,
                      getattr(scope.get("route"), "path", "(no route)"))
            if not started[0]:
                try:
                    await error(500, f"unexpected {type(exc).__name__} (message withheld: it may quote the input)"
                                )(scope, receive, send_status)
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


def create_app(runtime: Service, keys: KeyStore | None, *, upstream: str | None = None,
               upstream_model: str | None = None, max_body_bytes: int = SERVE.max_body_bytes,
               hosts: frozenset[str] | None = frozenset(LOCAL_HOSTS), docs: bool = False,
               forward: Sequence[str] = ()) -> FastAPI:
    """The application over one :class:`~dpinfer.serve.service.Service`. ``keys=None``: no keys (every request is
    the local admin; the command line allows it on loopback only). ``hosts``: the names the ``Host`` header may give
    (:func:`allowed_hosts`; None: any). ``docs``: serve ``/docs`` (Swagger UI, whose assets come from a CDN).
    ``forward``: the roles of the messages ``dpinfer-protect`` forwards upstream unprotected for every request
    (``--forward``; a request may add its own)."""
    app = FastAPI(title="dpinfer", version=__version__, docs_url="/docs" if docs else None, redoc_url=None,
                  description="Differentially private inference: sanitise, synthesise, ask a private store, protect a "
                              "prompt; every release with its ex-ante guarantee and the budget left.")
    html = resources.files("dpinfer.serve").joinpath("static/index.html").read_text(encoding="utf-8")
    app.add_middleware(Guard, limit=max_body_bytes, on_request=runtime.metrics.request, hosts=hosts,
                       page_csp=page_csp(html))
    app.state.runtime = runtime
    operator_forward = check_forward(list(forward), "--forward")

    # ---------------------------------------------------------------- errors
    @app.exception_handler(BodyTooLarge)
    async def _too_large(request: Request, exc: BodyTooLarge) -> JSONResponse:
        return error(413, f"the request body is over the limit of {max_body_bytes} bytes; send a smaller document")

    @app.exception_handler(ApiError)
    async def _api(request: Request, exc: ApiError) -> JSONResponse:
        return error(exc.status, exc.message)

    @app.exception_handler(BudgetRefused)
    async def _refused(request: Request, exc: BudgetRefused) -> JSONResponse:
        return error(402, str(exc), budget=exc.state)

    @app.exception_handler(Forbidden)
    async def _forbidden(request: Request, exc: Forbidden) -> JSONResponse:
        return error(403, str(exc))

    @app.exception_handler(NotFound)
    async def _missing(request: Request, exc: NotFound) -> JSONResponse:
        return error(404, str(exc))

    @app.exception_handler(StoreUnavailableError)
    async def _store_down(request: Request, exc: StoreUnavailableError) -> JSONResponse:
        return error(503, str(exc))  # the Chroma server of --stores chroma://…: the operation and the error's type

    @app.exception_handler(DPInferError)
    async def _dpinfer(request: Request, exc: DPInferError) -> JSONResponse:
        return error(422, str(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error(422, "the request body is not valid JSON of the expected shape")  # never echo the input

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error(exc.status_code, str(exc.detail))

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, exc: ClientDisconnect) -> JSONResponse:
        return error(499, "the client closed the connection")  # nobody reads it; the access log says 499

    # anything else unexpected: one line in the log and a 500 (Guard), never a traceback

    # ---------------------------------------------------------------- auth and bodies
    def principal(request: Request) -> Principal:
        if keys is None:
            return LOCAL
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        found = keys.verify(key.strip()) if scheme.lower() == "bearer" else None
        if found is None:
            raise ApiError(401, "a valid API key is required: send 'Authorization: Bearer KEY' (make one with "
                                "dpinfer serve keys create)")
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

    User = Depends(principal)
    Admin = Depends(admin)
    Body = Depends(body)

    # ---------------------------------------------------------------- service routes
    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"status": "ok", "model": runtime.lm.name, "version": __version__}

    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics(who: Principal = Admin) -> str:  # an admin key (without keys: the local admin, loopback only)
        return runtime.metrics.text()

    @app.get("/v1/methods")
    def methods(who: Principal = User) -> dict[str, Any]:
        from dpinfer.methods import method_names, summaries

        out = {}
        for task in ("sanitize", "synthesize", "rag", "protect-prompt"):
            try:
                out[task] = {"methods": method_names(task), "summaries": summaries(task)}
            except DPInferError:
                continue
        return out

    @app.post("/v1/tag")
    async def tag(who: Principal = User, data: dict[str, Any] = Body) -> Any:
        return await run_in_threadpool(runtime.tag, data)

    @app.post("/v1/sanitize")
    async def sanitize(who: Principal = User, data: dict[str, Any] = Body) -> Any:
        if data.get("stream") is True:  # server-sent events: the released tokens, then the release
            prepared = await run_in_threadpool(runtime.prepare_sanitize_stream, who, data)
            source = runtime.sanitize_stream(prepared)
            return event_stream(in_thread(source), prepared[2], source)
        return await run_in_threadpool(runtime.sanitize, who, data)

    @app.post("/v1/protect-prompt")
    async def protect(who: Principal = User, data: dict[str, Any] = Body) -> Any:
        return await run_in_threadpool(runtime.protect, who, data)

    @app.get("/v1/rag")
    def list_stores(who: Principal = User) -> dict[str, Any]:
        return {"stores": runtime.stores(who)}

    @app.get("/v1/rag/{store}")
    def get_store(store: str, who: Principal = User) -> dict[str, Any]:
        return runtime.store_info(who, store)

    @app.post("/v1/rag/{store}/documents")
    async def rag_add(store: str, who: Principal = User, data: dict[str, Any] = Body) -> Any:
        return await run_in_threadpool(runtime.rag_add, who, store, data)

    @app.post("/v1/rag/{store}/ask")
    async def rag_ask(store: str, who: Principal = User, data: dict[str, Any] = Body) -> Any:
        if data.get("stream") is True:  # server-sent events: PAD's released tokens, then the answer
            prepared = await run_in_threadpool(runtime.prepare_rag_stream, who, store, data)
            source = runtime.rag_stream(prepared)
            return event_stream(in_thread(source), prepared["charge"], source)
        return await run_in_threadpool(runtime.rag_ask, who, store, data)

    @app.get("/v1/budget/{unit}")
    def get_budget(unit: str, who: Principal = User) -> dict[str, Any]:
        return runtime.budget(who, unit)

    @app.put("/v1/budget/{unit}")
    async def put_budget(unit: str, who: Principal = Admin, data: dict[str, Any] = Body) -> Any:
        return await run_in_threadpool(runtime.set_budget, who, unit, data)

    @app.post("/v1/synth")
    async def synth(who: Principal = User, data: dict[str, Any] = Body) -> Any:
        # bad parameters: 422 now, not a failed job later; the job is kept on disk and resumed after a restart
        return JSONResponse(await run_in_threadpool(runtime.jobs.submit, who, data), status_code=202)

    @app.get("/v1/jobs/{job_id}")
    def get_job(job_id: str, who: Principal = User) -> dict[str, Any]:
        return runtime.jobs.get(who, job_id)

    # ---------------------------------------------------------------- OpenAI-compatible
    @app.get("/v1/models")
    def models(who: Principal = User) -> dict[str, Any]:
        names = [PLAIN] + ([PROTECT] if upstream else []) + [RAG_PREFIX + s for s in runtime.stores(who)]
        return {"object": "list", "data": [{"id": n, "object": "model", "created": 0, "owned_by": "dpinfer"}
                                           for n in names]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request, who: Principal = User, data: dict[str, Any] = Body) -> Any:
        model = data.get("model")
        messages = data.get("messages")
        if not isinstance(model, str):
            raise ApiError(422, "model must be a string (see GET /v1/models)")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, Mapping) and isinstance(m.get("content"), str) and isinstance(m.get("role"), str)
                for m in messages):
            raise ApiError(422, "messages must be a non-empty list of {role, content} objects with string content")
        stream = bool(data.get("stream", False))
        max_tokens = data.get("max_completion_tokens", data.get("max_tokens")) or SERVE.chat_max_new_tokens
        temperature = data.get("temperature")
        top_p = data.get("top_p")
        ext = data.get("dpinfer") or {}
        if not isinstance(ext, dict):
            raise ApiError(422, "dpinfer (the extension field) must be an object of parameters")
        msgs = [{"role": m["role"], "content": m["content"]} for m in messages]
        cid = "chatcmpl-" + uuid.uuid4().hex
        if model == PLAIN:
            kw = {"max_new_tokens": max_tokens,
                  "temperature": SERVE_PLAIN_TEMPERATURE if temperature is None else temperature,
                  "top_p": SERVE_PLAIN_TOP_P if top_p is None else top_p}
            extension = {"guarantee": None, "note": NO_GUARANTEE}
            if stream:
                job = runtime.plan_generate(msgs, **kw)  # checks before the stream starts (422, not a broken stream)
                pieces = in_thread(runtime.generate_stream(job))
                return sse(cid, model, pieces, extension)
            out = await run_in_threadpool(lambda: runtime.generate(msgs, **kw))
            return completion(cid, model, out["text"], out["finish_reason"], extension,
                              usage=(out["prompt_tokens"], out["completion_tokens"]))
        if model.startswith(RAG_PREFIX):
            store = model[len(RAG_PREFIX):]
            question = next((m["content"] for m in reversed(msgs) if m["role"] == "user"), None)
            if question is None:
                raise ApiError(422, "the messages have no user message (the question)")
            ask = {k: v for k, v in ext.items() if k in ("mechanism", "epsilon", "delta", "temperature", "unit")}
            ask["max_new_tokens"] = ext.get("max_new_tokens", max_tokens)
            ask["question"] = question
            if stream:  # PAD releases token by token: each piece leaves as it is released
                prep = await run_in_threadpool(runtime.prepare_rag_stream, who, store, ask)
                extension = {k: prep[k] for k in ("guarantee", "unit", "budget", "units", "mechanism")}
                source = deltas(runtime.rag_stream(prep))
                return sse(cid, model, in_thread(source), extension, prep["charge"], source)
            res = await run_in_threadpool(runtime.rag_ask, who, store, ask)
            extension = {"guarantee": res["guarantee"], "unit": res["unit"], "budget": res["budget"],
                         "units": res["units"], "mechanism": res["mechanism"]}
            return completion(cid, model, res["text"], "stop", extension)
        if model == PROTECT:
            if not upstream:
                raise ApiError(422, "dpinfer-protect needs an upstream: start the server with --upstream URL")
            opted = check_forward(ext.get("forward") or [], "dpinfer.forward")
            roles = set(operator_forward) | set(opted)
            users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
            if not users:
                raise ApiError(422, "the messages have no user message (the prompt to protect)")
            if len(users) > 1:
                raise ApiError(422, "dpinfer-protect protects one user message per request and never forwards an "
                                    "earlier user turn: send the conversation's context inside that one message "
                                    "(it is protected whole), one request per prompt")
            last = users[0]
            options = {k: v for k, v in ext.items() if k != "forward"}
            res = await run_in_threadpool(runtime.protect, who, options, prompt=msgs[last]["content"])
            forwarded, unprotected, dropped = [], [], []
            for i, m in enumerate(msgs):
                if i == last:
                    forwarded.append({"role": "user", "content": res["prompt"]})
                elif m["role"] in roles:
                    forwarded.append(m)
                    unprotected.append({"index": i, "role": m["role"]})
                else:
                    dropped.append({"index": i, "role": m["role"]})
            extension = {"protected_prompt": res["prompt"], "guarantee": res["guarantee"], "unit": res["unit"],
                         "budget": res["budget"], "units": res["units"], "upstream": upstream,
                         "unprotected": unprotected, "dropped": dropped}
            reply = await forward_upstream(upstream, upstream_model, forwarded, data)
            choice = reply["choices"][0]
            if stream:
                return sse(cid, model, one_piece(choice["message"]["content"] or ""), extension)
            return completion(cid, model, choice["message"]["content"] or "", choice.get("finish_reason") or "stop",
                              extension)
        raise ApiError(404, f"unknown model; use {PLAIN}, {PROTECT} or {RAG_PREFIX}<store> (GET /v1/models)")

    # ---------------------------------------------------------------- web page
    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page() -> str:
        return html

    return app


SERVE_PLAIN_TEMPERATURE = 0.7
SERVE_PLAIN_TOP_P = 0.9


def completion(cid: str, model: str, text: str, finish: str, extension: dict[str, Any],
               usage: tuple[int, int] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
        "dpinfer": extension,
    }
    if usage is not None:
        out["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
    return out


FORWARDABLE = ("system", "developer", "assistant", "tool")
"""Roles whose messages dpinfer-protect forwards upstream, unprotected, when the operator (``--forward``) or the
request (``dpinfer.forward``) opts in; by default none is forwarded."""


def check_forward(roles: object, what: str) -> list[str]:
    """A list of roles among :data:`FORWARDABLE` (the message names none of the values)."""
    if not isinstance(roles, list) or not all(isinstance(r, str) and r in FORWARDABLE for r in roles):
        raise ApiError(422, f"{what} must be a list of roles among {', '.join(FORWARDABLE)} (an earlier user turn "
                            "is never forwarded)")
    return roles


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
                raise ApiError(422, "the request body holds a lone surrogate (\\uD800-\\uDFFF): send valid "
                                    "Unicode text") from None
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def close_when_idle(items: Any, timeout: float = 600.0) -> None:
    """Close a blocking generator, waiting for the step another thread may be running in it to end."""
    close = getattr(items, "close", None)
    deadline = time.monotonic() + timeout
    while close is not None:
        try:
            close()
            return
        except ValueError:  # "generator already executing": its current step ends with the next token
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)


class SettledStream(StreamingResponse):
    """A stream that settles its reservation however it ends: ``source`` (the blocking generator of the release)
    is closed, which commits the reservation if a piece was released and cancels it otherwise; a client that hung up
    before the first byte (the generator never started) leaves no pending reservation either: it is cancelled."""

    def __init__(self, content: Any, charge: Any = None, source: Any = None, **kw: Any) -> None:
        super().__init__(content, **kw)
        self.charge = charge
        self.source = source

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self.charge is not None and self.charge.pending:
                await run_in_threadpool(close_when_idle, self.source)  # commit if a piece left, else cancel
                if self.charge.pending:  # never started: nothing was released
                    await run_in_threadpool(self.charge.cancel)


def event_stream(events: AsyncIterator[dict[str, Any]], charge: Any = None, source: Any = None
                 ) -> StreamingResponse:
    """Server-sent events, one JSON object each; an error after the start is one in-band line (no input quoted)."""

    async def body() -> AsyncIterator[str]:
        try:
            async for event in events:
                yield f"data: {json.dumps(event, ensure_ascii=False)}\n\n"
        except Exception as exc:
            msg = one_line(str(exc)) if isinstance(exc, DPInferError) else f"unexpected {type(exc).__name__}"
            yield f"data: {json.dumps({'error': msg})}\n\n"

    return SettledStream(body(), charge, source, media_type="text/event-stream")


async def one_piece(text: str) -> AsyncIterator[str]:
    yield text


def deltas(events: Iterator[dict[str, Any]]) -> Iterator[str]:
    """The text pieces of a stream of events (``{"delta": ...}`` ... ``{"done": true, ...}``)."""
    try:
        for event in events:
            if "delta" in event:
                yield event["delta"]
    finally:
        getattr(events, "close", lambda: None)()


async def in_thread(items: Iterator[Any]) -> AsyncIterator[Any]:
    """``items`` (a blocking generator) read in worker threads; closed when the response ends early (a client gone:
    its job leaves the batch)."""
    try:
        async for item in iterate_in_threadpool(items):
            yield item
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            await run_in_threadpool(close)


def sse(cid: str, model: str, pieces: AsyncIterator[str], extension: dict[str, Any], charge: Any = None,
        source: Any = None) -> StreamingResponse:
    """Server-sent events in the OpenAI chunk format; the first chunk carries the ``dpinfer`` extension."""

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        obj = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

    async def events() -> AsyncIterator[str]:
        yield chunk({"role": "assistant", "content": ""}, dpinfer=extension)
        try:
            async for piece in pieces:
                yield chunk({"content": piece})
        except Exception as exc:  # the stream has started: the error goes in-band, one line, no input quoted
            msg = one_line(str(exc)) if isinstance(exc, DPInferError) else f"unexpected {type(exc).__name__}"
            yield f"data: {json.dumps({'error': {'message': msg}})}\n\n"
            return
        yield chunk({}, "stop")
        yield "data: [DONE]\n\n"

    return SettledStream(events(), charge, source, media_type="text/event-stream")


async def forward_upstream(upstream: str, model: str | None, messages: list[dict[str, Any]], data: Mapping[str, Any]
                  ) -> dict[str, Any]:
    """Send the protected messages to the upstream OpenAI-compatible server (its key from ``DPINFER_UPSTREAM_KEY``)."""
    import os

    import httpx

    base = upstream.rstrip("/")
    headers = {}
    if os.environ.get("DPINFER_UPSTREAM_KEY"):
        headers["Authorization"] = f"Bearer {os.environ['DPINFER_UPSTREAM_KEY']}"
    payload: dict[str, Any] = {"messages": messages, "stream": False}
    for k in ("max_tokens", "max_completion_tokens", "temperature", "top_p"):
        if data.get(k) is not None:
            payload[k] = data[k]
    try:
        async with httpx.AsyncClient(timeout=600) as client:
            if model is None:
                listed = await client.get(f"{base}/models", headers=headers)
                listed.raise_for_status()
                model = listed.json()["data"][0]["id"]
            payload["model"] = model
            reply = await client.post(f"{base}/chat/completions", json=payload, headers=headers)
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        raise ApiError(502, f"the upstream did not answer ({type(exc).__name__}); check --upstream") from None
    if reply.status_code != 200:
        raise ApiError(502, f"the upstream answered with status {reply.status_code}")
    try:
        out = reply.json()
        out["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise ApiError(502, "the upstream's reply is not an OpenAI chat completion") from None
    return out
