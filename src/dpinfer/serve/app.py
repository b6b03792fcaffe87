"""The FastAPI application of ``dpinfer serve``: routes, keys and tenants, errors, limits and the access log.

Errors are JSON ``{"error": "<one line>"}`` (a budget refusal adds ``"budget"``): 401 without a valid key, 403 for
another tenant's resource or an admin-only route, 404 for a missing store or job, 402 for a budget refusal (nothing
generated), 413 for a body over the limit (4 MiB), 422 for bad parameters with the command line's messages, 500 for
anything unexpected (its message withheld: it may quote the input). No log line carries a request body, a header, a
query string or a release: the access log (logger ``dpinfer.serve.access``) writes method, route template, status
and milliseconds only; uvicorn's own access log is off.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from importlib import resources
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, StreamingResponse
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from dpinfer import __version__
from dpinfer.defaults import SERVE
from dpinfer.errors import DPInferError
from dpinfer.serve.budget import BudgetRefused
from dpinfer.serve.keys import LOCAL, Forbidden, KeyStore, NotFound, Principal
from dpinfer.serve.runtime import Service, replace_last_user

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


class Guard:
    """Pure ASGI middleware: the body limit (Content-Length checked before reading; a chunked body counted as it
    arrives) and the access log (method, route template, status, milliseconds; nothing else)."""

    def __init__(self, app: Any, limit: int, on_request: Callable[[str, str, int], None]) -> None:
        self.app = app
        self.limit = limit
        self.on_request = on_request

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = [500]

        async def send_status(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
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
                return message

            await self.app(scope, limited, send_status)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "(no route)"
            ms = (time.perf_counter() - t0) * 1000
            access_log.info("%s %s %d %.0fms", scope.get("method", "?"), template, status[0], ms)
            self.on_request(scope.get("method", "?"), template, status[0])


def create_app(runtime: Service, keys: KeyStore | None, *, upstream: str | None = None,
               upstream_model: str | None = None, max_body_bytes: int = SERVE.max_body_bytes) -> FastAPI:
    """The application over one :class:`~dpinfer.serve.runtime.Service`. ``keys=None``: no keys (every request is
    the local admin; the command line allows it on loopback only)."""
    app = FastAPI(title="dpinfer", version=__version__,
                  description="Differentially private inference: sanitise, synthesise, ask a private store, protect a "
                              "prompt; every release with its ex-ante guarantee and the budget left.")
    app.add_middleware(Guard, limit=max_body_bytes, on_request=runtime.metrics.request)
    app.state.runtime = runtime

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

    @app.exception_handler(DPInferError)
    async def _dpinfer(request: Request, exc: DPInferError) -> JSONResponse:
        return error(422, str(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error(422, "the request body is not valid JSON of the expected shape")  # never echo the input

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("unexpected %s on %s (message withheld: it may quote the input)", type(exc).__name__,
                  getattr(request.scope.get("route"), "path", "?"))
        return error(500, f"unexpected {type(exc).__name__} (message withheld: it may quote the input)")

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
        if not isinstance(data, dict):
            raise ApiError(422, "the request body must be a JSON object")
        return data

    User = Depends(principal)
    Admin = Depends(admin)
    Body = Depends(body)

    # ---------------------------------------------------------------- service routes
    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"status": "ok", "model": runtime.lm.name, "version": __version__}

    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics() -> str:
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
            return event_stream(in_thread(runtime.sanitize_stream(prepared)))
        return await run_in_threadpool(runtime.sanitize, who, data)

    @app.post("/v1/protect-prompt")
    async def protect(who: Principal = User, data: dict[str, Any] = Body) -> Any:
        return await run_in_threadpool(runtime.protect, who, data)

    @app.get("/v1/rag")
    def list_stores(who: Principal = User) -> dict[str, Any]:
        return {"stores": runtime.stores(who)}

    @app.post("/v1/rag/{store}/documents")
    async def rag_add(store: str, who: Principal = User, data: dict[str, Any] = Body) -> Any:
        return await run_in_threadpool(runtime.rag_add, who, store, data)

    @app.post("/v1/rag/{store}/ask")
    async def rag_ask(store: str, who: Principal = User, data: dict[str, Any] = Body) -> Any:
        if data.get("stream") is True:  # server-sent events: PAD's released tokens, then the answer
            prepared = await run_in_threadpool(runtime.prepare_rag_stream, who, store, data)
            return event_stream(in_thread(runtime.rag_stream(prepared)))
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
                runtime.plain_job(msgs, **kw)  # checks before the stream starts (422, not a broken stream)
                pieces = in_thread(runtime.generate_stream(msgs, **kw))
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
                extension = {k: prep[k] for k in ("guarantee", "unit", "budget", "mechanism")}
                return sse(cid, model, in_thread(deltas(runtime.rag_stream(prep))), extension)
            res = await run_in_threadpool(runtime.rag_ask, who, store, ask)
            extension = {"guarantee": res["guarantee"], "unit": res["unit"], "budget": res["budget"],
                         "mechanism": res["mechanism"]}
            return completion(cid, model, res["text"], "stop", extension)
        if model == PROTECT:
            if not upstream:
                raise ApiError(422, "dpinfer-protect needs an upstream: start the server with --upstream URL")
            prompt = next((m["content"] for m in reversed(msgs) if m["role"] == "user"), None)
            if prompt is None:
                raise ApiError(422, "the messages have no user message (the prompt to protect)")
            res = await run_in_threadpool(runtime.protect, who, ext, prompt=prompt)
            forwarded = replace_last_user(msgs, res["prompt"])
            extension = {"protected_prompt": res["prompt"], "guarantee": res["guarantee"], "unit": res["unit"],
                         "budget": res["budget"], "upstream": upstream}
            reply = await forward(upstream, upstream_model, forwarded, data)
            choice = reply["choices"][0]
            if stream:
                return sse(cid, model, one_piece(choice["message"]["content"] or ""), extension)
            return completion(cid, model, choice["message"]["content"] or "", choice.get("finish_reason") or "stop",
                              extension)
        raise ApiError(404, f"unknown model; use {PLAIN}, {PROTECT} or {RAG_PREFIX}<store> (GET /v1/models)")

    # ---------------------------------------------------------------- web page
    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page() -> str:
        return resources.files("dpinfer.serve").joinpath("static/index.html").read_text(encoding="utf-8")

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


def event_stream(events: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
    """Server-sent events, one JSON object each; an error after the start is one in-band line (no input quoted)."""

    async def body() -> AsyncIterator[str]:
        try:
            async for event in events:
                yield f"data: {json.dumps(event, ensure_ascii=False)}\n\n"
        except Exception as exc:
            msg = one_line(str(exc)) if isinstance(exc, DPInferError) else f"unexpected {type(exc).__name__}"
            yield f"data: {json.dumps({'error': msg})}\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")


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


def sse(cid: str, model: str, pieces: AsyncIterator[str], extension: dict[str, Any]) -> StreamingResponse:
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

    return StreamingResponse(events(), media_type="text/event-stream")


async def forward(upstream: str, model: str | None, messages: list[dict[str, Any]], data: Mapping[str, Any]
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
