"""The FastAPI application of ``dpinfer serve``: routes, keys and tenants, errors, limits and the access log.

It only assembles the parts: :class:`~dpinfer.serve.security.Guard` (the middleware), the error handlers
(:mod:`.errors`), what every route is given (:mod:`.deps`) and the routes (:mod:`.routes`).

Errors are JSON ``{"error": "<one line>"}`` quoting no client value (a budget refusal adds ``"budget"``): 401
without a valid key, 403 for an admin-only route, a foreign ``Host`` or ``Origin`` (the Guard), 404 for a store or
job that does not exist for this tenant (another tenant's answers the same), 402 for a budget refusal (nothing
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

from collections.abc import Sequence
from importlib import resources

from fastapi import FastAPI

from dpinfer import __version__
from dpinfer.defaults import SERVE
from dpinfer.serve import errors
from dpinfer.serve.chat import check_forward
from dpinfer.serve.deps import Settings
from dpinfer.serve.keys import KeyStore
from dpinfer.serve.routes import budget, chat, page, rag, tasks
from dpinfer.serve.security import LOCAL_HOSTS, Guard, page_csp
from dpinfer.serve.service import Service

ROUTERS = (tasks.router, rag.router, budget.router, chat.router, page.router)


def create_app(
    runtime: Service,
    keys: KeyStore | None,
    *,
    upstream: str | None = None,
    upstream_model: str | None = None,
    max_body_bytes: int = SERVE.max_body_bytes,
    hosts: frozenset[str] | None = frozenset(LOCAL_HOSTS),
    docs: bool = False,
    forward: Sequence[str] = (),
) -> FastAPI:
    """The application over one :class:`~dpinfer.serve.service.Service`. ``keys=None``: no keys (every request is
    the local admin; the command line allows it on loopback only). ``hosts``: the names the ``Host`` header may give
    (:func:`~dpinfer.serve.security.allowed_hosts`; None: any). ``docs``: serve ``/docs`` (Swagger UI, whose assets
    come from a CDN). ``forward``: the roles of the messages ``dpinfer-protect`` forwards upstream unprotected for
    every request (``--forward``; a request may add its own)."""
    app = FastAPI(
        title="dpinfer",
        version=__version__,
        docs_url="/docs" if docs else None,
        redoc_url=None,
        description="Differentially private inference: sanitise, synthesise, ask a private store, protect a "
        "prompt; every release with its ex-ante guarantee and the budget left.",
    )
    html = resources.files("dpinfer.serve").joinpath("static/index.html").read_text(encoding="utf-8")
    app.add_middleware(
        Guard, limit=max_body_bytes, on_request=runtime.metrics.request, hosts=hosts, page_csp=page_csp(html)
    )
    app.state.runtime = runtime
    app.state.settings = Settings(
        keys=keys,
        page=html,
        upstream=upstream,
        upstream_model=upstream_model,
        forward=tuple(check_forward(list(forward), "--forward")),
    )
    errors.install(app, max_body_bytes)
    for router in ROUTERS:
        app.include_router(router)
    return app
