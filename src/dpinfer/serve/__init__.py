"""``dpinfer serve``: an HTTP service and a web page over one runtime and one engine (docs/serve.md).

:mod:`.app` (routes, keys, errors, the access log), :mod:`.runtime` (the service: the four jobs on one
:class:`~dpinfer.runtime.Runtime`), :mod:`.batcher` (continuous batching across requests on the one engine),
:mod:`.synth_jobs` (synthesis jobs kept on disk and resumed after a restart), :mod:`.budget` (per-unit budgets:
reserve, commit, cancel), :mod:`.keys` (API keys, tenants, roles), :mod:`.params` (request fields),
:mod:`.metrics` (``GET /metrics``), :mod:`.bench` (``dpinfer bench serve``), :mod:`.load` (the load test).
Needs the ``serve`` extra (FastAPI, uvicorn).
"""
