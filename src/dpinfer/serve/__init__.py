"""``dpinfer serve``: an HTTP service and a web page over one runtime and one engine (docs/serve.md).

:mod:`.app` (assembles the application), :mod:`.routes` (the routes, parse → plan → charge → run → finish each),
:mod:`.bodies` (request bodies parsed into the pipelines' options), :mod:`.chat` (the OpenAI-compatible chat models),
:mod:`.security` (Host/Origin checks, JSON bodies only, the CSP, the body limit, the access log), :mod:`.errors`
(one-line errors), :mod:`.deps` (keys, bodies, the service, settings), :mod:`.streams` (server-sent events),
:mod:`.service` (the service: the four jobs on one :class:`~dpinfer.runtime.Runtime`), :mod:`.batcher` (continuous
batching across requests on the one engine), :mod:`.synth_jobs` (synthesis jobs kept on disk and resumed after a
restart), :mod:`.budget` (tenants' units, charged through :mod:`dpinfer.accounting.charge`), :mod:`.keys` (API keys,
tenants, roles), :mod:`.params` (fields), :mod:`.metrics` (``GET /metrics``), :mod:`.replicas` (Ray Serve).
Its benchmarks are ``dpinfer bench serve`` (:mod:`dpinfer.bench.serve`) and the load test
(:mod:`dpinfer.bench.serve_load`). Needs the ``serve`` extra (FastAPI, uvicorn).
"""
