"""Streamed replies: server-sent events over a blocking generator of the release (read in worker threads), settled
however they end (:class:`SettledStream`), in dpinfer's own format (:func:`event_stream`) or OpenAI's chunks
(:func:`sse`). An error after the stream started is one in-band line that quotes no input."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from fastapi.responses import StreamingResponse
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool

from dpinfer.errors import DPInferError
from dpinfer.serve.errors import one_line


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


def in_band(exc: Exception) -> str:
    """An error after the stream started, in one line (a library error's message; any other: its type only)."""
    return one_line(str(exc)) if isinstance(exc, DPInferError) else f"unexpected {type(exc).__name__}"


def event_stream(source: Iterator[dict[str, Any]], charge: Any = None) -> StreamingResponse:
    """Server-sent events, one JSON object each, from ``source`` (a blocking generator of the release, settling
    ``charge``); an error after the start is one in-band line (no input quoted)."""

    async def body() -> AsyncIterator[str]:
        try:
            async for event in in_thread(source):
                yield f"data: {json.dumps(event, ensure_ascii=False)}\n\n"
        except Exception as exc:
            yield f"data: {json.dumps({'error': in_band(exc)})}\n\n"

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


def sse(
    cid: str, model: str, pieces: AsyncIterator[str], extension: dict[str, Any], charge: Any = None, source: Any = None
) -> StreamingResponse:
    """Server-sent events in the OpenAI chunk format; the first chunk carries the ``dpinfer`` extension."""

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        obj = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            **extra,
        }
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

    async def events() -> AsyncIterator[str]:
        yield chunk({"role": "assistant", "content": ""}, dpinfer=extension)
        try:
            async for piece in pieces:
                yield chunk({"content": piece})
        except Exception as exc:  # the stream has started: the error goes in-band, one line, no input quoted
            yield f"data: {json.dumps({'error': {'message': in_band(exc)}})}\n\n"
            return
        yield chunk({}, "stop")
        yield "data: [DONE]\n\n"

    return SettledStream(events(), charge, source, media_type="text/event-stream")
