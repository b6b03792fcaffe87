"""The web page (its Content-Security-Policy: :func:`dpinfer.serve.security.page_csp`)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from dpinfer.serve.deps import Settings, Setup

router = APIRouter()


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
def page(setup: Settings = Setup) -> str:
    return setup.page
