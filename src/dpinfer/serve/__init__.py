"""``dpinfer serve``: an HTTP service and a web page over one runtime and one engine (docs/serve.md).

:mod:`.app` (routes, keys, errors, the access log), :mod:`.service` (the service: the four jobs on one
:class:`~dpinfer.runtime.Runtime`), :mod:`.batcher` (continuous batching across requests on the one engine),
:mod:`.synth_jobs` (synthesis jobs kept on disk and resumed after a restart), :mod:`.budget` (tenants' units,
charged through :mod:`dpinfer.accounting.charge`), :mod:`.keys` (API keys, tenants, roles), :mod:`.params` (fields),
:mod:`.metrics` (``GET /metrics``), :mod:`.bench` (``dpinfer bench serve``), :mod:`.load` (the load test).
Needs the ``serve`` extra (FastAPI, uvicorn).
"""
