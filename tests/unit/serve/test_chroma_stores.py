"""Stores on a Chroma server (``--stores chroma://HOST:PORT``): two services on one server see the same documents,
another tenant's store answers like a missing one, telemetry is off and nothing but the server is reached, no
document word reaches a log, and a wrong address or a server that is down fails closed in one line. Each test starts
its own ``chroma run`` on a loopback port (tests/conftest.py: skipped with a reason when it cannot start, failed with
CI set)."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys

import httpx
import pytest
from serve_helpers import SRC, ThreadServer, free_port, make_runtime

from dpinfer.errors import ConfigurationError
from dpinfer.rag.server import ChromaServer, StoreUnavailableError, collection_name, parse_server_url
from dpinfer.serve.keys import NotFound, Principal

DOCS = ["Patient: I have a migraine. Doctor: Rest in a dark room with quinoxafil.",
        "Patient: My knee hurts. Doctor: See a physiotherapist about the zebracorn brace.",
        "Patient: I cough at night. Doctor: Use an inhaler."]
PRIVATE_WORDS = ("quinoxafil", "zebracorn", "migraine", "physiotherapist")


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def two_services(tiny_lm, tmp_path, chroma_server, keys_file):
    """Two services (two replicas' runtimes) on one ledger and one Chroma server, each behind its own app."""
    from dpinfer.serve.app import create_app
    from dpinfer.serve.keys import KeyStore

    runtimes = [make_runtime(tiny_lm, tmp_path, stores=chroma_server.url) for _ in range(2)]
    apps = [create_app(rt, KeyStore(keys_file[0])) for rt in runtimes]
    with ThreadServer(apps[0]) as one, ThreadServer(apps[1]) as two:
        yield one, two, runtimes, keys_file[1]
    for rt in runtimes:
        rt.close()


def test_two_replicas_on_one_chroma_server_see_the_same_documents(two_services, chroma_server, caplog) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, chromadb's and httpx's included, at its most talkative
    one, two, runtimes, keys = two_services
    acme, globex = auth(keys["acme"]), auth(keys["globex"])
    r = httpx.post(one.url + "/v1/rag/clinic/documents", json={"documents": DOCS}, headers=acme, timeout=60)
    assert r.status_code == 200 and r.json()["added"] == 3, r.text
    # the other replica sees the store and its documents at once: it lists it, retrieves from it, answers from it
    assert httpx.get(two.url + "/v1/rag", headers=acme).json() == {"stores": ["clinic"]}
    rag, _ = runtimes[1].rag(Principal("acme", "user", "k"), "clinic")
    assert rag.store.count() == 3 and "quinoxafil" in rag.retrieve("Which drug for a migraine?")[0].text
    r = httpx.post(two.url + "/v1/rag/clinic/ask", json={"question": "What helps a migraine?", "epsilon": 64,
                                                         "max_new_tokens": 4}, headers=acme, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["unit"] == "store.clinic" and r.json()["budget"]["releases"] == 1
    again = httpx.post(one.url + "/v1/rag/clinic/documents", json={"documents": DOCS[:1]}, headers=acme, timeout=60)
    assert again.json()["added"] == 0 and again.json()["total"] == 3  # the same ids: stored once, whichever replica
    # another tenant's store is a missing one, on either replica: the same status, the same body
    for srv in (one, two):
        theirs = httpx.post(srv.url + "/v1/rag/clinic/ask", json={"question": "x"}, headers=globex)
        missing = httpx.post(srv.url + "/v1/rag/nostore/ask", json={"question": "x"}, headers=acme)
        assert theirs.status_code == missing.status_code == 404 and theirs.json() == missing.json()
        assert httpx.get(srv.url + "/v1/rag/clinic", headers=globex).json() == missing.json()
        assert httpx.get(srv.url + "/v1/rag", headers=globex).json() == {"stores": []}
    with pytest.raises(NotFound):
        runtimes[0].rag(Principal("globex", "user", "k"), "clinic")
    # globex's own store of the same name is another collection: acme's documents are not in it
    r = httpx.post(two.url + "/v1/rag/clinic/documents", json={"documents": ["Globex memo: nothing medical."]},
                   headers=globex, timeout=60)
    assert r.json()["total"] == 1
    assert httpx.get(one.url + "/v1/rag/clinic", headers=acme).json()["unit"] == "store.clinic"
    # everything is on the server, nothing in a folder of either service; the server's collections are named by hash
    server = ChromaServer(chroma_server.url)
    names = {c.name for c in server.client.list_collections()}
    assert names == {collection_name("acme", "clinic"), collection_name("globex", "clinic")}
    assert server.names("acme") == ["clinic"] == server.names("globex") and server.names("initech") == []
    # no document word in any log: the Chroma server's, or ours
    logged = chroma_server.log.read_text(errors="replace") + caplog.text
    assert not [w for w in PRIVATE_WORDS if w in logged]


def test_a_chroma_server_that_stops_answers_503_in_one_line(two_services, chroma_server) -> None:
    one, _, _, keys = two_services
    acme = auth(keys["acme"])
    assert httpx.post(one.url + "/v1/rag/notes/documents", json={"documents": DOCS}, headers=acme,
                      timeout=60).status_code == 200
    chroma_server.proc.terminate()
    chroma_server.proc.wait(timeout=10)
    for r in (httpx.post(one.url + "/v1/rag/notes/ask", json={"question": "What helps a migraine?"}, headers=acme,
                         timeout=60),
              httpx.post(one.url + "/v1/rag/notes/documents", json={"documents": DOCS}, headers=acme, timeout=60),
              httpx.get(one.url + "/v1/rag", headers=acme)):
        assert r.status_code == 503, r.text
        message = r.json()["error"]
        assert "\n" not in message and message.startswith("the Chroma server chroma://127.0.0.1:")
        assert not [w for w in PRIVATE_WORDS if w in r.text]


def test_the_client_has_telemetry_off_and_reaches_the_server_only(chroma_server, monkeypatch, tmp_path) -> None:
    from serve_helpers import HashEmbedder

    reached: list[object] = []
    connect, create = socket.socket.connect, socket.create_connection

    def record_connect(self, address):  # type: ignore[no-untyped-def]
        reached.append(address)
        return connect(self, address)

    def record_create(address, *args, **kwargs):  # type: ignore[no-untyped-def]
        reached.append(address)
        return create(address, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", record_connect)
    monkeypatch.setattr(socket, "create_connection", record_create)
    server = ChromaServer(chroma_server.url)
    assert server.client.get_settings().anonymized_telemetry is False
    store = server.store("acme", "notes", embedder=HashEmbedder())
    assert store.add(DOCS).added == 3 and store.query("a migraine", 1)[0].text == DOCS[0]
    assert store.info()["documents"] == 3 and store.info()["collection"] == collection_name("acme", "notes")
    port = parse_server_url(chroma_server.url)[1]
    assert reached and {(str(a[0]), int(a[1])) for a in reached if isinstance(a, tuple)} <= {
        ("127.0.0.1", port), ("localhost", port)}


def test_a_wrong_address_or_a_server_that_is_down_fails_closed_in_one_line(tmp_path) -> None:
    for bad in ("chroma://127.0.0.1", "chroma://127.0.0.1:99999", "chroma://h:1/a/b", "chroma://u@h:1", "http://h:1",
                "chroma://:8000"):
        with pytest.raises(ConfigurationError, match="chroma://HOST:PORT"):
            parse_server_url(bad)
    down = free_port()
    with pytest.raises(StoreUnavailableError, match="cannot be reached") as err:
        ChromaServer(f"chroma://127.0.0.1:{down}")
    assert "\n" not in str(err.value) and f"chroma run --path DIR --host 127.0.0.1 --port {down}" in str(err.value)
    # something that answers HTTP but is not Chroma
    with ThreadServer(_not_chroma()) as other, pytest.raises(StoreUnavailableError, match="not as a Chroma server"):
        ChromaServer(f"chroma://127.0.0.1:{other.port}")


def _not_chroma():  # type: ignore[no-untyped-def]
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/healthz")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


def test_serve_refuses_a_chroma_server_that_is_down_before_the_model_loads(tmp_path) -> None:
    down = free_port()
    out = subprocess.run([sys.executable, "-m", "dpinfer", "serve", "--model", str(tmp_path / "no-model"),
                          "--ledger", str(tmp_path / "ledger.db"), "--stores", f"chroma://127.0.0.1:{down}",
                          "--port", str(free_port())], capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert out.returncode != 0
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "cannot be reached" in lines[0] and "model" not in lines[0], out.stderr
    assert not (tmp_path / "ledger.db").exists()  # nothing made: the check comes first
    from dpinfer.cli import build_parser
    from dpinfer.cli.serve import check_serve_args

    with pytest.raises(ConfigurationError, match="not another URL"):  # not taken for a folder named "http:"
        check_serve_args(build_parser().parse_args(["serve", "--stores", "http://127.0.0.1:8000"]))
