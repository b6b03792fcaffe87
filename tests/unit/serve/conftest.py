"""Fixtures of the service tests (helpers in serve_helpers.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e '.[serve]')")
pytest.importorskip("uvicorn", reason="the serve extra is not installed (pip install -e '.[serve]')")

from serve_helpers import ThreadServer, cli_server, make_runtime, stop


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    from dpinfer.serve.keys import KeyStore

    path = tmp_path_factory.mktemp("keys") / "keys.json"
    store = KeyStore(path)
    made = {"acme": store.create("acme", "user"), "acme-admin": store.create("acme", "admin"),
            "globex": store.create("globex", "user")}
    return path, made


@pytest.fixture(scope="module")
def server(tiny_lm, tmp_path_factory, keys_file) -> Iterator[ThreadServer]:
    """An in-process server with keys (tenants acme and globex)."""
    from dpinfer.serve.app import create_app
    from dpinfer.serve.keys import KeyStore

    runtime = make_runtime(tiny_lm, tmp_path_factory.mktemp("serve"))
    app = create_app(runtime, KeyStore(keys_file[0]))
    with ThreadServer(app) as srv:
        srv.keys = keys_file[1]
        srv.runtime = runtime
        yield srv
    runtime.close()


@pytest.fixture(scope="session")
def cli_serve(tiny_model_dir, tmp_path_factory):
    """``dpinfer serve`` in a subprocess (keys for tenants acme and globex), its output in ``.log``: the upstream of
    the OpenAI tests and the target of the hostile ones."""
    from dpinfer.serve.keys import KeyStore

    tmp = tmp_path_factory.mktemp("cli-serve")
    log = tmp / "server.log"
    store = KeyStore(tmp / "keys.json")
    keys = {"acme": store.create("acme", "user"), "globex": store.create("globex", "user")}
    proc, url = cli_server(["--model", str(tiny_model_dir), "--tagger", "regex", "--ledger", str(tmp / "ledger.db"),
                            "--stores", str(tmp / "stores"), "--keys", str(tmp / "keys.json")], log,
                           env={"DPINFER_CACHE": str(tmp / "cache")})

    class Served:
        pass

    served = Served()
    served.url, served.log, served.proc, served.keys = url, log, proc, keys
    yield served
    stop(proc)
