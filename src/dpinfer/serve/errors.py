"""The service's errors: JSON ``{"error": "<one line>"}`` quoting no client value (a budget refusal adds
``"budget"``), and the exception handlers that map each error to its status (module docstring of
:mod:`dpinfer.serve.app`)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from dpinfer.errors import DPInferError
from dpinfer.rag.server import StoreUnavailableError
from dpinfer.serve.budget import BudgetRefused
from dpinfer.serve.keys import Forbidden, NotFound


class BodyTooLarge(Exception):
    """A chunked body passed the limit while it was read."""


class ApiError(Exception):
    """An error of the HTTP layer, answered with ``status`` and ``message`` (one line, no client value)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def one_line(message: str) -> str:
    return " ".join(str(message).split())


def error(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": one_line(message), **extra}, status_code=status)


def too_large(limit: int) -> str:
    return f"the request body is over the limit of {limit} bytes; send a smaller document"


STATUS: tuple[tuple[type[Exception], int], ...] = (
    (Forbidden, 403),
    (NotFound, 404),
    (StoreUnavailableError, 503),  # the Chroma server of --stores chroma://…: the operation and the error's type
    (DPInferError, 422),
)
"""Library errors and their status; the message is the command line's (one line)."""


def install(app: FastAPI, max_body_bytes: int) -> None:
    """The exception handlers: each error one line, never a traceback (anything else unexpected: one line in the log
    and a 500, by :class:`~dpinfer.serve.security.Guard`)."""

    async def body_too_large(request: Request, exc: Exception) -> JSONResponse:
        return error(413, too_large(max_body_bytes))

    async def api(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error(exc.status, exc.message)

    async def refused(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, BudgetRefused)
        return error(402, str(exc), budget=exc.state)

    def library(status: int) -> Any:
        async def handler(request: Request, exc: Exception) -> JSONResponse:
            return error(status, str(exc))

        return handler

    async def validation(request: Request, exc: Exception) -> JSONResponse:
        return error(422, "the request body is not valid JSON of the expected shape")  # never echo the input

    async def http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        return error(exc.status_code, str(exc.detail))

    async def gone(request: Request, exc: Exception) -> JSONResponse:
        return error(499, "the client closed the connection")  # nobody reads it; the access log says 499

    app.add_exception_handler(BodyTooLarge, body_too_large)
    app.add_exception_handler(ApiError, api)
    app.add_exception_handler(BudgetRefused, refused)
    for kind, status in STATUS:
        app.add_exception_handler(kind, library(status))
    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(StarletteHTTPException, http)
    app.add_exception_handler(ClientDisconnect, gone)
