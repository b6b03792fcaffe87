"""``dpinfer serve``: the HTTP service (FastAPI on uvicorn) and its web page; ``dpinfer serve keys create``."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import sys
from pathlib import Path
from typing import Any

from dpinfer.cli.output import add_model_arguments, print_json, show
from dpinfer.defaults import SERVE
from dpinfer.errors import ConfigurationError, MissingDependencyError


def default_home() -> Path:
    from platformdirs import user_data_dir

    return Path(user_data_dir("dpinfer", appauthor=False)) / "serve"


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    sp = sub.add_parser(
        "serve", parents=[common], help="the HTTP service and web page (keys, tenants, budgets, OpenAI-compatible API)",
        description="Serve sanitisation, synthesis, private RAG and prompt protection over HTTP, with a web page at / "
                    "and OpenAPI docs at /docs. One process holds one model and one engine; concurrent requests are "
                    "decoded together. Every release is charged to its unit's budget before anything is generated. "
                    "Without keys (no --keys, and none in the ledger's database) the server serves this machine only "
                    "(loopback) and every request is the local admin.",
        epilog="Keys: dpinfer serve keys create --keys PATH --tenant T --role user|admin (the key is printed once), "
               "or --ledger postgresql://USER@HOST/DB instead of --keys: the keys in the ledger's database, shared by "
               "every replica (then no --keys is given to the server). Stores on a Chroma server: --stores "
               "chroma://HOST:PORT (docs/deploy.md).")
    sp.add_argument("--host", default=SERVE.host, help=f"address to bind (default {SERVE.host}; another address "
                                                       "needs keys)")
    sp.add_argument("--port", type=int, default=SERVE.port, help=f"port (default {SERVE.port})")
    sp.add_argument("--ledger", default=None, help="the privacy-budget ledger, a file or postgresql://USER@HOST/DB "
                                                   "(dpinfer budget; default: "
                                                   "serve/ledger.db in dpinfer's data folder, created with a default "
                                                   f"budget of ε = {show(SERVE.default_epsilon)} per new unit)")
    sp.add_argument("--keys", default=None, help="the keys file (made by 'dpinfer serve keys create --keys PATH'). "
                                                 "Without it: the keys in the ledger's database when it holds any "
                                                 "('dpinfer serve keys create --ledger URL'), else no key is asked "
                                                 "and only loopback is served")
    sp.add_argument("--stores", default=None, help="where the RAG stores are: a folder, one sub-folder per tenant "
                                                   "(default: serve/stores in dpinfer's data folder), or a Chroma "
                                                   "server chroma://HOST:PORT ('chroma run'), shared by replicas")
    sp.add_argument("--upstream", default=None, help="OpenAI-compatible base URL (e.g. http://127.0.0.1:8001/v1) "
                                                     "that dpinfer-protect forwards protected prompts to (its key "
                                                     "from DPINFER_UPSTREAM_KEY)")
    sp.add_argument("--upstream-model", default=None, help="model name sent upstream (default: the first that the "
                                                           "upstream's /models lists)")
    sp.add_argument("--tagger", default=SERVE.tagger, help=f"presidio | regex (default {SERVE.tagger})")
    sp.add_argument("--default-epsilon", type=float, default=None,
                    help="set the ledger's ε budget for new units (default: keep the ledger's; a ledger the server "
                         f"creates gets {show(SERVE.default_epsilon)})")
    sp.add_argument("--default-delta", type=float, default=None,
                    help=f"with --default-epsilon: the δ of new units (a ledger the server creates gets "
                         f"{show(SERVE.default_delta)})")
    sp.add_argument("--replicas", type=int, default=None, metavar="N",
                    help="deploy the service as N replicas on Ray Serve, each with its own model and engine, sharing "
                         "--ledger and the keys in it (give postgresql://USER@HOST/DB beyond one machine) and "
                         "--stores (give chroma://HOST:PORT beyond one machine); needs the ray extra; "
                         "docs/deploy.md")
    sp.add_argument("--ray-address", default=None, metavar="ADDR",
                    help="--replicas: join this Ray cluster (e.g. ray://HOST:10001 or auto); default: a local Ray")
    sp.add_argument("--batch-window", type=float, default=SERVE.batch_window_s,
                    help=f"seconds the batcher waits for more requests to join a batch (default "
                         f"{show(SERVE.batch_window_s)})")
    sp.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                    help="a name the Host header may give besides the bind address, localhost, 127.0.0.1 and [::1] "
                         "(repeatable; '*': any, with keys only). Other Host headers are refused (DNS rebinding)")
    sp.add_argument("--forward", default="", metavar="ROLES",
                    help="roles of messages dpinfer-protect forwards upstream UNPROTECTED for every request, e.g. "
                         "system,assistant (default: none; only the protected prompt goes upstream)")
    sp.add_argument("--docs", action="store_true",
                    help="serve the OpenAPI page /docs (Swagger UI, whose assets the browser loads from a CDN: off "
                         "by default; /openapi.json is always served)")
    add_model_arguments(sp)
    sp.set_defaults(func=run)
    _add_subcommands(sp, common)


def _add_subcommands(sp: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    """``dpinfer serve keys create|list|revoke`` and ``dpinfer serve adopt``."""
    ssub = sp.add_subparsers(dest="serve_command", metavar="keys|adopt")
    kp = ssub.add_parser("keys", help="API keys (a keys file, or the ledger's database)").add_subparsers(
        dest="keys_command", metavar="create|list|revoke", required=True)
    kc = kp.add_parser("create", parents=[common], help="make an API key for a tenant (printed once, stored hashed)")
    kc.add_argument("--tenant", required=True, help="the tenant the key spends for")
    kc.add_argument("--role", default="user", choices=["user", "admin"], help="user (default) or admin (sets budgets)")
    kl = kp.add_parser("list", parents=[common], help="the keys' ids, tenants, roles and dates (never a key)")
    kr = kp.add_parser("revoke", parents=[common], help="revoke a key by its id (from 'keys list'): refused at "
                                                        "once by a server reading the same keys")
    kr.add_argument("key_id", metavar="ID", help="the key's id")
    for kx, func in ((kc, run_keys_create), (kl, run_keys_list), (kr, run_keys_revoke)):
        where = kx.add_mutually_exclusive_group(required=True)
        where.add_argument("--keys", help="a keys file (created if missing, mode 0600): one machine")
        where.add_argument("--ledger", help="the ledger's database, e.g. postgresql://USER@HOST/DB (or a ledger "
                                            "file): every server on that ledger reads its keys")
        kx.set_defaults(func=func)
    ad = ssub.add_parser("adopt", parents=[common], help="give a tenant a unit of the ledger or a store folder made "
                                                         "outside the service (dpinfer budget, dpinfer rag add)",
                         description="Units made by the command line and store folders made by 'dpinfer rag add' "
                                     "are reached by no tenant until the operator adopts them for one, here (no "
                                     "route of the service adopts: a tenant's admin key cannot). Each is adopted by "
                                     "one tenant at most.")
    ad.add_argument("--tenant", required=True, help="the tenant that gets it")
    what = ad.add_mutually_exclusive_group(required=True)
    what.add_argument("--unit", help="a unit of the ledger, by its name there")
    what.add_argument("--store", help="a folder of the stores folder, by its name")
    ad.add_argument("--as", dest="as_name", default=None, help="its name for the tenant (default: the same)")
    ad.add_argument("--ledger", default=None, help="the service's ledger, a file or postgresql://USER@HOST/DB "
                                                   "(default: serve/ledger.db in dpinfer's data folder)")
    ad.add_argument("--stores", default=None, help="the service's stores folder (default: serve/stores in dpinfer's "
                                                   "data folder)")
    ad.set_defaults(func=run_adopt)


def run_adopt(args: argparse.Namespace) -> int:
    from dpinfer.accounting.ledger import Ledger
    from dpinfer.accounting.ledger_store import is_database_url
    from dpinfer.serve.budget import LedgerBudgets, adopt_store, adopt_unit
    from dpinfer.serve.keys import check_name, check_unit_name

    check_name(args.tenant, "--tenant")
    home = default_home()
    ledger: Any = args.ledger if is_database_url(args.ledger) else Path(args.ledger) if args.ledger else \
        home / "ledger.db"
    if not Ledger.exists(ledger):
        raise ConfigurationError(f"no ledger at {ledger if isinstance(ledger, Path) else 'that URL'}; give the "
                                 "service's --ledger")
    budgets = LedgerBudgets(ledger)  # the adoptions go in the ledger's database: every replica sharing it sees them
    if args.unit is not None:
        name = check_unit_name(args.as_name or args.unit)
        adopt_unit(budgets, args.tenant, name, check_unit_name(args.unit))
        out = {"adopted": "unit", "tenant": args.tenant, "unit": name}
    else:
        from dpinfer.rag.server import is_server_url

        if is_server_url(args.stores):
            raise ConfigurationError("stores on a Chroma server are made by the service only (POST "
                                     "/v1/rag/STORE/documents with the tenant's key): there is nothing to adopt")
        name = check_name(args.as_name or args.store, "--as")
        adopt_store(budgets, Path(args.stores) if args.stores else home / "stores", args.tenant, name,
                    check_name(args.store, "--store"))
        out = {"adopted": "store", "tenant": args.tenant, "store": name}
    if args.json:
        print_json(out)
    else:
        print(f"dpinfer: the {out['adopted']} is now tenant {args.tenant}'s, under the name {name}", file=sys.stderr)
    return 0


def _key_store(args: argparse.Namespace, *, create: bool = False) -> Any:
    """``serve keys --keys PATH`` (a file, made only by ``create``) or ``--ledger LOCATION`` (the ledger's database,
    which must exist)."""
    from dpinfer.accounting.ledger import Ledger
    from dpinfer.serve.keys import KeyStore, LedgerKeys

    if args.keys is not None:
        if not create and not Path(args.keys).is_file():
            raise ConfigurationError("no keys file there; make one with: dpinfer serve keys create --keys PATH "
                                     "--tenant T --role user")
        return KeyStore(args.keys)
    if not Ledger.exists(args.ledger):
        raise ConfigurationError("no ledger there; give the service's --ledger (create one with: dpinfer budget init "
                                 "--ledger LOCATION --epsilon E)")
    return LedgerKeys(Ledger(args.ledger))


def run_keys_create(args: argparse.Namespace) -> int:
    store = _key_store(args, create=True)
    key = store.create(args.tenant, args.role)
    where = str(store.path)  # the ledger's URL without its password
    if args.json:
        print_json({"key": key, "tenant": args.tenant, "role": args.role, "keys": where})
    else:
        print(key)
        print(f"dpinfer: key for tenant {args.tenant} ({args.role}) added to {where}; it is shown only this once",
              file=sys.stderr)
    return 0


def run_keys_list(args: argparse.Namespace) -> int:
    keys = _key_store(args).list()
    if args.json:
        print_json({"keys": keys})
        return 0
    if not keys:
        print("dpinfer: no keys", file=sys.stderr)
    for k in keys:
        print(f"{k['id']}  {k['tenant']}  {k['role']}  {k['created']}" + (f"  revoked {k['revoked']}"
                                                                          if k.get("revoked") else ""))
    return 0


def run_keys_revoke(args: argparse.Namespace) -> int:
    from dpinfer.errors import InvalidInputError

    if not _key_store(args).revoke(args.key_id):
        raise InvalidInputError("no key with that id (see: dpinfer serve keys list)")
    if args.json:
        print_json({"revoked": args.key_id})
    else:
        print(f"dpinfer: key {args.key_id} revoked", file=sys.stderr)
    return 0


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def ledger_location(args: argparse.Namespace) -> Any:
    """``--ledger``: a PostgreSQL URL, a file, or serve/ledger.db in dpinfer's data folder."""
    from dpinfer.accounting.ledger_store import is_database_url

    return args.ledger if is_database_url(args.ledger) else Path(args.ledger) if args.ledger else \
        default_home() / "ledger.db"


def _keys_source(args: argparse.Namespace) -> str | None:
    """Where the keys are: ``file`` (--keys), ``ledger`` (no --keys, and the ledger's database holds a key), or None
    (no key anywhere: loopback only)."""
    from dpinfer.accounting.ledger import Ledger
    from dpinfer.serve.keys import KeyStore, LedgerKeys

    if args.keys is not None:
        if not Path(args.keys).exists():
            raise ConfigurationError(f"the keys file {args.keys} does not exist; make a key with: dpinfer serve keys "
                                     f"create --keys {args.keys} --tenant T --role admin")
        if len(KeyStore(args.keys)) == 0:
            raise ConfigurationError(f"the keys file {args.keys} holds no key; add one with dpinfer serve keys create")
        return "file"
    ledger = ledger_location(args)
    if Ledger.exists(ledger) and len(LedgerKeys(Ledger(ledger))) > 0:
        return "ledger"
    return None


def check_serve_args(args: argparse.Namespace) -> Any:
    """Every check before the model loads (the Chroma server of --stores answers, the ledger is reached); returns the
    key store (or None)."""
    from dpinfer.checks import check_delta, non_negative_number, positive_number
    from dpinfer.rag.server import ChromaServer, is_server_url
    from dpinfer.serve.keys import open_keys

    if not 0 < args.port < 65536 and args.port != 0:
        raise ConfigurationError(f"--port must be between 1 and 65535, got {args.port}")
    if args.default_epsilon is not None:
        non_negative_number(args.default_epsilon, "--default-epsilon")
    if args.default_delta is not None:
        check_delta(args.default_delta, "--default-delta")
    positive_number(args.batch_window + 1e-12, "--batch-window")
    if args.tagger not in ("presidio", "regex"):
        raise ConfigurationError(f"--tagger must be presidio or regex, got {args.tagger!r}")
    if is_server_url(args.stores):
        ChromaServer(args.stores)  # a wrong address, a server that is down: one line, before anything is made
    elif args.stores is not None and "://" in args.stores:
        raise ConfigurationError("--stores takes a folder or a Chroma server chroma://HOST:PORT, not another URL")
    args.keys_source = _keys_source(args)
    args.ledger_location = ledger_location(args)  # also what replicas open (the keys in it, when keys_source says)
    keys = open_keys(args.keys_source, args.keys, args.ledger_location)
    if keys is None and not is_loopback(args.host):
        raise ConfigurationError(f"refusing to serve {args.host} without keys: anyone who can reach it would spend "
                                 "every budget; make a key (dpinfer serve keys create --keys PATH, or --ledger URL "
                                 "for keys in the ledger's database) or bind 127.0.0.1")
    if "*" in args.allowed_host and keys is None:
        raise ConfigurationError("--allowed-host '*' needs --keys or keys in the ledger's database: without keys "
                                 "any web page could drive the server")
    from dpinfer.serve.chat import FORWARDABLE

    roles = [r.strip() for r in args.forward.split(",") if r.strip()]
    if any(r not in FORWARDABLE for r in roles):
        raise ConfigurationError(f"--forward takes roles among {', '.join(FORWARDABLE)}, comma-separated (an "
                                 "earlier user turn is never forwarded)")
    args.forward_roles = roles
    if args.upstream is not None and not args.upstream.startswith(("http://", "https://")):
        raise ConfigurationError("--upstream must be an http:// or https:// base URL, e.g. http://127.0.0.1:8001/v1")
    return keys


def build_app(args: argparse.Namespace, keys: Any) -> Any:
    from dpinfer.accounting.ledger import settle_dead
    from dpinfer.models import load_model
    from dpinfer.packed import pack_now
    from dpinfer.rag.server import is_server_url
    from dpinfer.serve.app import create_app
    from dpinfer.serve.budget import LedgerBudgets
    from dpinfer.serve.security import allowed_hosts
    from dpinfer.serve.service import Service

    home = default_home()
    ledger = ledger_location(args)
    budgets = LedgerBudgets(ledger, default_epsilon=args.default_epsilon, default_delta=args.default_delta,
                            create_epsilon=SERVE.default_epsilon, create_delta=SERVE.default_delta)
    settle_dead(budgets.ledger)  # the pending charges a dead server (or replica) left: settled by the ledger's rule
    lm = load_model(args.model, device=args.device, quantize=args.quantize)
    pack_now(lm.model)  # the packed linears' copies now, not during the first request
    stores = args.stores if is_server_url(args.stores) else Path(args.stores) if args.stores else home / "stores"
    runtime = Service(lm, budgets, tagger=args.tagger, stores=stores,
                      window=args.batch_window,  # resumes the synthesis jobs a stopped server left unfinished
                      state=getattr(args, "state", None) or (home / "jobs" if isinstance(ledger, str) else None))
    return create_app(runtime, keys, upstream=args.upstream, upstream_model=args.upstream_model,
                      hosts=allowed_hosts(args.host, args.allowed_host), docs=args.docs, forward=args.forward_roles)


def run(args: argparse.Namespace) -> int:
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError:
        raise MissingDependencyError("dpinfer serve needs the serve extra: pip install -e '.[serve]' (or bash "
                                     "scripts/setup.sh)") from None
    keys = check_serve_args(args)
    if args.replicas is not None or args.ray_address is not None:
        from dpinfer.serve.replicas import check_replica_args, serve_replicas

        args.replicas = 1 if args.replicas is None else args.replicas
        check_replica_args(args)
        serve_replicas(args, build_app, default_home() / "replicas")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    app = build_app(args, keys)
    config = uvicorn.Config(app, host=args.host, port=args.port, access_log=False, log_config=None,
                            log_level="info", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    where = {"file": f"keys from {args.keys}", "ledger": "keys from the ledger's database"}.get(args.keys_source,
                                                                                                 "no keys: loopback")
    print(f"dpinfer: serving on http://{args.host}:{args.port}/ ({where})", file=sys.stderr)
    if not is_loopback(args.host) and not args.allowed_host:
        print("dpinfer: requests must give this server's address in their Host header; add --allowed-host NAME for "
              "each name clients use to reach it", file=sys.stderr)
    server.run()
    app.state.runtime.close()
    return 0
