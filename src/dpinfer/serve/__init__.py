"""``dpinfer serve``: an HTTP service and a web page over one model and one engine (docs/serve.md).

:mod:`.app` (routes, keys, errors, the access log), :mod:`.runtime` (model, engine, batching across requests, the
four jobs), :mod:`.budget` (per-unit budgets: reserve, commit, cancel), :mod:`.keys` (API keys, tenants, roles).
Needs the ``serve`` extra (FastAPI, uvicorn).
"""
