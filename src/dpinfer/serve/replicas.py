"""``dpinfer serve --replicas N [--ray-address A]``: the same FastAPI app as a Ray Serve deployment of N replicas.

Each replica is a Ray actor that builds its own runtime (model, engine, batcher: the app of ``dpinfer serve``, from
the same builder) and hands its app to Ray Serve (``@serve.ingress``, the app built at replica start); Ray Serve's
proxy on ``--host``/``--port`` spreads the requests over the replicas and restarts a replica whose process died.
What the replicas share must live outside them: the privacy-budget ledger and its adoptions (``--ledger
postgresql://…``: every spend of every replica is one transaction that locks its unit's row, so the budget holds
across replicas; a SQLite file works only while every replica runs on this machine), the API keys (in the same
database, ``dpinfer serve keys create --ledger URL``: each request is looked up there, so a key made or revoked
works at once on every replica; or a keys file, which every node must hold) and the RAG stores (``--stores
chroma://HOST:PORT``: one Chroma server; a stores folder is seen only by the replicas of its machine). Each replica
settles the pending charges of dead holders at its start (:func:`~dpinfer.accounting.ledger.settle_dead`): the
charges a killed replica left are settled by the ledger's rule when Ray starts its successor. A synthesis job runs
on the replica that took it (its files in that replica's own folder); with a PostgreSQL ledger its state is in the
ledger's database, so any replica answers its poll, and a job whose replica died reads as failed
(:mod:`dpinfer.serve.job_table`).

Nothing leaves the machine: Ray's usage statistics are off and a local Ray starts without its dashboard
(:func:`dpinfer.pipelines.corpus_ray.init_ray`). Ray Serve is an optional extra: ``.venv/bin/pip install -e
".[ray]"``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dpinfer.defaults import SERVE
from dpinfer.errors import ConfigurationError

APP_NAME = "dpinfer"


class Replica:
    """One replica: ``build(args, keys)`` (``dpinfer serve``'s app builder) run in the replica's own process."""

    def __init__(self, build: Callable[[argparse.Namespace, Any], Any], args: argparse.Namespace,
                 state: str) -> None:
        from ray import serve

        from dpinfer.pipelines.corpus_ray import _quiet_ray_env
        from dpinfer.serve.keys import open_keys

        _quiet_ray_env()
        replica = serve.get_replica_context().replica_tag
        args = argparse.Namespace(**vars(args))
        args.state = str(Path(state) / "".join(c if c.isalnum() else "-" for c in replica))
        # the keys the server chose at its start (a file, or the ledger's database), opened in this process
        self.built = build(args, open_keys(getattr(args, "keys_source", None), args.keys, args.ledger_location))

    def __serve_build_asgi_app__(self) -> Any:
        return self.built


def check_replica_args(args: argparse.Namespace) -> None:
    """``--replicas`` and ``--ray-address``, before Ray starts or a model loads."""
    from dpinfer.accounting.ledger_store import is_database_url
    from dpinfer.checks import positive_int
    from dpinfer.pipelines.corpus_ray import check_ray

    positive_int(args.replicas, "--replicas")
    check_ray()
    if args.ray_address and not is_database_url(args.ledger):
        raise ConfigurationError("--ray-address spreads the replicas over a cluster: give them one ledger with "
                                 "--ledger postgresql://USER@HOST/DB (a SQLite file is safe on one machine only)")


def serve_replicas(args: argparse.Namespace, build: Callable[[argparse.Namespace, Any], Any], state: Path, *,
                   block: bool = True) -> Any:
    """Deploy ``build``'s app as ``args.replicas`` replicas on Ray Serve (a local Ray, or ``args.ray_address``) and
    serve it on ``args.host:args.port`` until interrupted (``block=False``: return the Ray Serve handle)."""
    import torch

    from dpinfer.pipelines.corpus_ray import init_ray

    ray = init_ray(args.ray_address)
    from ray import serve

    use_gpu = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    serve.start(http_options={"host": args.host, "port": args.port}, logging_config={"enable_access_log": False})
    deployment = serve.deployment(
        name=APP_NAME, num_replicas=args.replicas, max_ongoing_requests=SERVE.replica_max_ongoing_requests,
        ray_actor_options={"num_gpus": 1} if use_gpu else {"num_cpus": 1},
        health_check_period_s=2, graceful_shutdown_timeout_s=5)(serve.ingress()(Replica))
    handle = serve.run(deployment.bind(build, args, str(state)), name=APP_NAME, route_prefix="/", blocking=False)
    print(f"dpinfer: serving {args.replicas} replica{'s' if args.replicas != 1 else ''} on Ray Serve at "
          f"http://{args.host}:{args.port}/", file=sys.stderr)
    if not block:
        return handle

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)  # a stopped server takes its replicas and its local Ray down with it
    try:
        while True:
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
        ray.shutdown()
    return None
