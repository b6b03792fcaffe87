"""The service keeps the command line's promises (issue 32), each finding through HTTP against a live loopback server:
budgets no request can sidestep, tenants that cannot touch each other, nothing private forwarded, a local server no
web page can drive, no traceback for a client's error, error messages that quote no client value."""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import time
from pathlib import Path

import httpx
import pytest
from fastapi import Request
from serve_helpers import DOC, SECRET, HashEmbedder, ThreadServer, make_runtime

SPANS = [{"start": DOC.index("John Smith"), "end": DOC.index("John Smith") + len("John Smith"), "label": "PERSON"}]
SHORT = {"n_rewrites": 2, "max_new_tokens": 4, "n_exemplars": 1, "n_keywords": 2}


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def local(tiny_lm, tmp_path_factory):
    """A server without keys (the default: every request is the local admin), as ``dpinfer serve`` binds it."""
    from dpinfer.serve.app import create_app
    from dpinfer.serve.security import allowed_hosts

    runtime = make_runtime(tiny_lm, tmp_path_factory.mktemp("local"))
    with ThreadServer(create_app(runtime, None, hosts=allowed_hosts("127.0.0.1"))) as srv:
        srv.runtime = runtime
        yield srv
    runtime.close()


# ---------------------------------------------------------------------------------------------------- finding 2, 13
def test_a_web_page_cannot_drive_a_local_server(local) -> None:
    url = local.url
    evil = {"Host": "rebind.evil.example"}  # DNS rebinding: the page's name resolves to 127.0.0.1
    for r in (httpx.get(url + "/v1/rag", headers=evil),
              httpx.put(url + "/v1/budget/u1", json={"epsilon": 1e15}, headers=evil),
              httpx.post(url + "/v1/rag/s/ask", json={"question": "x", "epsilon": 1e9}, headers=evil),
              httpx.get(url + "/", headers=evil)):
        assert r.status_code == 403 and "Host" in r.json()["error"]
    assert httpx.get(url + "/v1/budget/u1").json()["budget"]["epsilon"] == 1000.0  # the PUT did nothing
    # a cross-site form: text/plain needs no preflight, so it is refused as such
    form = httpx.post(url + "/v1/sanitize", content=json.dumps({"text": DOC, "spans": SPANS}),
                      headers={"Content-Type": "text/plain"})
    assert form.status_code == 415 and "application/json" in form.json()["error"]
    assert httpx.post(url + "/v1/sanitize", content=json.dumps({"text": DOC})).status_code == 415  # no type
    foreign = httpx.post(url + "/v1/tag", json={"text": DOC}, headers={"Origin": "http://rebind.evil.example"})
    assert foreign.status_code == 403 and "cross-origin" in foreign.json()["error"]
    same = httpx.post(url + "/v1/tag", json={"text": DOC}, headers={"Origin": url})
    assert same.status_code == 200  # the page's own requests
    for host in ("localhost", f"127.0.0.1:{local.port}", f"[::1]:{local.port}"):
        assert httpx.get(url + "/healthz", headers={"Host": host}).status_code == 200
    page = httpx.get(url + "/")
    csp = page.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp and "default-src 'none'" in csp and "http" not in csp
    assert page.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in httpx.get(url + "/healthz").headers["content-security-policy"]
    assert httpx.get(url + "/docs").status_code == 404  # Swagger UI's assets would come from a CDN: off
    assert "cdn" not in page.text.lower() and "https://" not in page.text


# ---------------------------------------------------------------------------------------------------- finding 6
def test_metrics_need_an_admin_key_and_hold_no_per_release_figure(server) -> None:
    assert httpx.get(server.url + "/metrics").status_code == 401
    assert httpx.get(server.url + "/metrics", headers=auth(server.keys["acme"])).status_code == 403
    r = httpx.post(server.url + "/v1/sanitize", headers=auth(server.keys["acme"]), timeout=120,
                   json={"text": DOC, "spans": SPANS, "max_new_tokens": 3})
    assert r.status_code == 200, r.text
    text = httpx.get(server.url + "/metrics", headers=auth(server.keys["acme-admin"])).text
    assert "dpinfer_requests_total" in text
    for figure in ("tokens", "seconds", "steps"):  # realised lengths and times: data-dependent
        assert figure not in text


# ---------------------------------------------------------------------------------------------------- finding 3
def test_naming_a_fresh_unit_does_not_sidestep_a_stores_or_a_documents_unit(server) -> None:
    acme, admin = auth(server.keys["acme"]), auth(server.keys["acme-admin"])
    r = httpx.post(server.url + "/v1/rag/budgeted/documents", headers=acme, timeout=60,
                   json={"documents": ["Opening hours are nine to five.", "Parking is free."]})
    assert r.status_code == 200, r.text
    info = httpx.get(server.url + "/v1/rag/budgeted", headers=acme).json()
    assert info["unit"] == "store.budgeted" and info["budget"]["releases"] == 0
    ask = {"question": "When does it open?", "epsilon": 8, "max_new_tokens": 3}
    assert httpx.put(server.url + "/v1/budget/store.budgeted", json={"epsilon": 9}, headers=admin).status_code == 200
    first = httpx.post(server.url + "/v1/rag/budgeted/ask", json=ask, headers=acme, timeout=120)
    assert first.status_code == 200, first.text
    assert httpx.post(server.url + "/v1/rag/budgeted/ask", json=ask, headers=acme, timeout=120).status_code == 402
    for i in range(3):  # a fresh unit is charged in addition, never instead
        r = httpx.post(server.url + "/v1/rag/budgeted/ask", json={**ask, "unit": f"fresh-{i}"}, headers=acme,
                       timeout=120)
        assert r.status_code == 402 and r.json()["budget"]["unit"] == "store.budgeted"
        assert httpx.get(server.url + f"/v1/budget/fresh-{i}", headers=acme).json()["pending"] == 0  # cancelled
    # a document: its own unit (a keyed hash of its text) is charged whatever unit the request names
    body = {"text": DOC, "spans": SPANS, "epsilon": 30, "max_new_tokens": 3, "unit": "doc-a"}
    r = httpx.post(server.url + "/v1/sanitize", json=body, headers=acme, timeout=120)
    assert r.status_code == 200, r.text
    doc_unit = r.json()["units"][0]["unit"]
    assert doc_unit.startswith("h-") and r.json()["unit"] == "doc-a" and [u["unit"] for u in r.json()["units"]] == [
        doc_unit, "doc-a"]
    assert httpx.put(server.url + f"/v1/budget/{doc_unit}", json={"epsilon": 35}, headers=admin).status_code == 200
    r = httpx.post(server.url + "/v1/sanitize", json={**body, "unit": "doc-b"}, headers=acme, timeout=120)
    assert r.status_code == 402 and r.json()["budget"]["unit"] == doc_unit


# ---------------------------------------------------------------------------------------------------- finding 4, 5
def test_tenants_cannot_claim_reach_or_probe_each_others_names(server) -> None:
    acme, globex, admin = auth(server.keys["acme"]), auth(server.keys["globex"]), auth(server.keys["acme-admin"])
    url = server.url
    # globex uses names that acme will use: nothing is claimed, acme's are its own
    doc = DOC + " Tenancy."
    r = httpx.post(url + "/v1/sanitize", headers=globex, timeout=120,
                   json={"text": doc, "spans": SPANS, "max_new_tokens": 2, "unit": "acme-claims"})
    assert r.status_code == 200, r.text
    r = httpx.post(url + "/v1/sanitize", headers=acme, timeout=120,
                   json={"text": doc, "spans": SPANS, "max_new_tokens": 2, "unit": "acme-claims"})
    assert r.status_code == 200 and r.json()["budget"]["releases"] == 1  # acme's own unit, not globex's
    assert httpx.post(url + "/v1/rag/shared-name/documents", json={"documents": ["Globex notes."]}, headers=globex,
                      timeout=60).status_code == 200
    assert httpx.post(url + "/v1/rag/shared-name/documents", json={"documents": ["Acme notes."]}, headers=acme,
                      timeout=60).status_code == 200
    assert httpx.get(url + "/v1/rag", headers=acme).json()["stores"].count("shared-name") == 1
    # probing: another tenant's store answers as a missing one; a unit name tells nothing
    theirs = httpx.post(url + "/v1/rag/budgeted/ask", json={"question": "x"}, headers=globex)
    missing = httpx.post(url + "/v1/rag/no-such-store/ask", json={"question": "x"}, headers=globex)
    assert (theirs.status_code, theirs.json()) == (missing.status_code, missing.json()) == (404, missing.json())
    used = httpx.get(url + "/v1/budget/doc-a", headers=globex).json()
    unused = httpx.get(url + "/v1/budget/never-used-xyz", headers=globex).json()
    assert {k: v for k, v in used.items() if k not in ("unit", "guarantee")} == \
        {k: v for k, v in unused.items() if k not in ("unit", "guarantee")}
    # a unit made outside the service (the command line on the shared ledger): unreachable until the operator adopts
    # it; no route adopts (a tenant's admin who could adopt case-42 could then raise it to ε = 1e9)
    from dpinfer.cli import main

    ledger = server.runtime.budgets.ledger
    ledger.set_budget("case-42", 5.0)
    assert httpx.put(url + "/v1/budget/case-42", json={"epsilon": 1e9}, headers=admin).status_code == 200
    assert ledger.status("case-42").epsilon == 5.0  # acme's own case-42, not the command line's
    for who in (admin, acme):
        r = httpx.post(url + "/v1/admin/adopt", json={"unit": "case-42", "as": "case-42-cli"}, headers=who)
        assert r.status_code == 404, r.text  # no such route, for an admin key too
    assert server.runtime.budgets.tenancy.names("unit", "acme") == {}
    assert httpx.put(url + "/v1/budget/case-42-cli", json={"epsilon": 1e9}, headers=admin).status_code == 200
    assert ledger.status("case-42").epsilon == 5.0  # still the operator's budget
    stores = server.runtime.stores_dir
    operator = ["serve", "adopt", "--ledger", str(ledger.path), "--stores", str(stores), "--tenant", "acme"]
    assert main([*operator, "--unit", "case-42", "--as", "case-42-cli2"]) == 0  # beside the running server
    assert httpx.get(url + "/v1/budget/case-42-cli2", headers=acme).json()["budget"]["epsilon"] == 5.0
    assert httpx.get(url + "/v1/budget/case-42-cli2", headers=globex).json()["budget"]["epsilon"] != 5.0
    # a store folder made by `dpinfer rag add`: no tenant reaches it until the operator adopts it
    from dpinfer.pipelines.rag import PrivateRAG

    PrivateRAG(stores / "cli-notes", embedder=HashEmbedder()).add(["The clinic opens at nine."])
    for who in (acme, globex):
        assert httpx.post(url + "/v1/rag/cli-notes/ask", json={"question": "x"}, headers=who).status_code == 404
        assert "cli-notes" not in httpx.get(url + "/v1/rag", headers=who).json()["stores"]
    assert httpx.post(url + "/v1/admin/adopt", json={"store": "cli-notes"}, headers=admin).status_code == 404
    assert "cli-notes" not in httpx.get(url + "/v1/rag", headers=acme).json()["stores"]
    assert main([*operator, "--store", "cli-notes"]) == 0
    assert "cli-notes" in httpx.get(url + "/v1/rag", headers=acme).json()["stores"]
    assert "cli-notes" not in httpx.get(url + "/v1/rag", headers=globex).json()["stores"]
    r = httpx.post(url + "/v1/rag/cli-notes/ask", json={"question": "When?", "max_new_tokens": 2}, headers=acme,
                   timeout=120)
    assert r.status_code == 200, r.text


# ---------------------------------------------------------------------------------------------------- finding 12, 14
def test_store_folders_are_private_and_long_names_fit(server) -> None:
    acme = auth(server.keys["acme"])
    long_store = "s" * 64  # the store's unit, store.<64 characters>, still fits the ledger
    r = httpx.post(server.url + f"/v1/rag/{long_store}/documents", json={"documents": ["Private note."]},
                   headers=acme, timeout=60)
    assert r.status_code == 200, r.text
    r = httpx.post(server.url + f"/v1/rag/{long_store}/ask", json={"question": "x", "max_new_tokens": 2},
                   headers=acme, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["unit"] == f"store.{long_store}"
    from dpinfer.serve.keys import Principal

    folder = server.runtime.store_path(Principal(tenant="acme", role="user", key_id="k"), long_store)
    for above in (folder.parent, folder.parent.parent):  # STORES/tenants/acme: the tenants' names are private too
        assert stat.S_IMODE(os.stat(above).st_mode) == 0o700
    for root, dirs, files in os.walk(folder):
        assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
        for name in files:
            assert stat.S_IMODE(os.stat(Path(root) / name).st_mode) == 0o600, name
        del dirs


# ---------------------------------------------------------------------------------------------------- finding 7, 8
def raw(port: int, request: bytes, wait: float = 0.0) -> None:
    """Send ``request`` on a fresh connection and hang up (after ``wait`` seconds)."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(request)
        time.sleep(wait)


def test_malformed_bodies_and_hang_ups_leave_no_traceback(server, caplog) -> None:
    caplog.set_level(logging.INFO)
    acme = auth(server.keys["acme"])
    jacme = {**acme, "Content-Type": "application/json"}
    deep = httpx.post(server.url + "/v1/sanitize", content=b"[" * 100_000, headers=jacme)
    assert deep.status_code == 422 and "nested too deeply" in deep.json()["error"]
    lone = httpx.post(server.url + "/v1/sanitize", content=b'{"text": "a\\ud800b ' + SECRET.encode() + b'"}',
                      headers={**acme, "Content-Type": "application/json"})
    assert lone.status_code == 422 and "surrogate" in lone.json()["error"] and SECRET not in lone.text
    key = server.keys["acme"]
    body = json.dumps({"text": DOC, "spans": SPANS}).encode()
    head = (f"POST /v1/sanitize HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body) + 100}\r\n\r\n").encode()
    raw(server.port, head + body[:20], wait=0.3)  # hangs up mid-body
    time.sleep(0.5)
    assert httpx.get(server.url + "/healthz").status_code == 200
    bad = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert bad == [], [r.getMessage() for r in bad]


def test_a_stream_whose_client_left_before_it_started_leaves_nothing_pending(server, monkeypatch, request) -> None:
    import gc
    import threading

    from dpinfer.errors import LedgerError

    svc, key = server.runtime, server.keys["acme"]
    hold, reserved, gone = svc.hold, threading.Event(), threading.Event()

    def held(*args, **kw):  # the reservation is made, then the client hangs up before the stream starts
        out = hold(*args, **kw)
        reserved.set()
        gone.wait(30)
        time.sleep(0.3)
        return out

    monkeypatch.setattr(svc, "hold", held)
    gc.disable()  # settled by the response itself, not by a garbage collection that may come late or never
    request.addfinalizer(gc.enable)
    body = json.dumps({"text": DOC + " Hang-up.", "spans": SPANS, "max_new_tokens": 4, "stream": True,
                       "unit": "hang-up"}).encode()
    head = (f"POST /v1/sanitize HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(head + body)
        assert reserved.wait(60)
        assert svc.budgets.ledger.status("acme/hang-up").pending == 1
    gone.set()

    ledger, states = server.runtime.budgets.ledger, []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # the reservation made, then settled
        try:
            states = [c.state for c in ledger.history("acme/hang-up")]
        except LedgerError:  # not reserved yet
            states = []
        if states and "pending" not in states:
            break
        time.sleep(0.2)
    assert states == ["cancelled"], states  # nothing left the server: cancelled, not pending forever


# ---------------------------------------------------------------------------------------------------- finding 11
def test_error_messages_quote_no_client_value(server) -> None:
    acme = auth(server.keys["acme"])
    r = httpx.post(server.url + "/v1/sanitize", headers=acme,
                   json={"text": DOC, "spans": SPANS, "group_epsilon": {SECRET: 1.0}})
    assert r.status_code == 422 and SECRET not in r.text
    r = httpx.post(server.url + "/v1/protect-prompt", headers=acme,
                   json={"prompt": "x", "epsilon": 100, "stage3_quorum": -7919})
    assert r.status_code == 422 and "7919" not in r.text
    r = httpx.post(server.url + "/v1/sanitize", headers=acme, json={"text": DOC, "groups": {SECRET: ["PERSON"]},
                                                                    "spans": SPANS, "group_epsilon": {"X": 1}})
    assert r.status_code == 422 and SECRET not in r.text
    r = httpx.post(server.url + "/v1/rag/dups/documents", headers=acme, timeout=60,
                   json={"documents": [{"text": "one", "id": SECRET}, {"text": "two", "id": SECRET}]})
    assert r.status_code == 422 and "same id" in r.text and SECRET not in r.text
    r = httpx.post(server.url + f"/v1/rag/{SECRET}/ask", headers=acme, json={"question": "x"})
    assert r.status_code == 404 and SECRET not in r.text


# ---------------------------------------------------------------------------------------------------- finding 1
class Recorder:
    """A recording OpenAI-compatible upstream on loopback: every chat request's JSON kept, a fixed answer."""

    def __init__(self) -> None:
        from fastapi import FastAPI

        self.seen: list[dict] = []
        app = FastAPI()

        @app.get("/v1/models")
        def models() -> dict:
            return {"object": "list", "data": [{"id": "rec", "object": "model"}]}

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> dict:
            self.seen.append(await request.json())
            return {"id": "c", "object": "chat.completion", "created": 0, "model": "rec",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                 "finish_reason": "stop"}]}

        @app.get("/healthz")
        def healthz() -> dict:
            return {"status": "ok"}

        self.app = app


def test_protect_forwards_the_protected_prompt_and_nothing_else(tiny_lm, tmp_path_factory, keys_file) -> None:
    openai = pytest.importorskip("openai", reason="the openai client is not installed")
    from dpinfer.serve.app import create_app
    from dpinfer.serve.keys import KeyStore

    rec = Recorder()
    runtime = make_runtime(tiny_lm, tmp_path_factory.mktemp("protect-front"))
    with ThreadServer(rec.app) as upstream, \
            ThreadServer(create_app(runtime, KeyStore(keys_file[0]), upstream=upstream.url + "/v1")) as front:
        c = openai.OpenAI(base_url=front.url + "/v1", api_key=keys_file[1]["acme"], max_retries=0, timeout=300)
        ssn, hiv, system = "my SSN is 078-05-1120", "HIV positive", "You are the clinic's assistant Qwertyuiop."
        chat = [{"role": "system", "content": system},
                {"role": "user", "content": f"Hello, {ssn}"},
                {"role": "assistant", "content": "Noted."},
                {"role": "tool", "content": hiv, "tool_call_id": "t1"},
                {"role": "user", "content": "Which clinic should I go to?"}]
        with pytest.raises(openai.UnprocessableEntityError) as refused:  # a second turn: refused
            c.chat.completions.create(model="dpinfer-protect", messages=chat, max_tokens=4,
                                      extra_body={"dpinfer": {**SHORT, "epsilon": 200.0}})
        assert "earlier user turn" in refused.value.response.text and "078-05" not in refused.value.response.text
        assert rec.seen == []  # nothing went upstream
        last = [m for i, m in enumerate(chat) if i != 1]
        r = c.chat.completions.create(model="dpinfer-protect", messages=last, max_tokens=4,
                                      extra_body={"dpinfer": {**SHORT, "epsilon": 200.0}})
        ext = r.model_extra["dpinfer"]
        sent = rec.seen[-1]["messages"]
        assert sent == [{"role": "user", "content": ext["protected_prompt"]}]  # the protected prompt, nothing else
        blob = json.dumps(rec.seen)
        assert hiv not in blob and "Qwertyuiop" not in blob and "Noted." not in blob
        assert ext["unprotected"] == [] and [d["role"] for d in ext["dropped"]] == ["system", "assistant", "tool"]
        assert ext["units"][0]["unit"].startswith("prompts.")  # the key's prompt source, always charged
        # opted in per request: the system message goes upstream, unprotected, and the reply says so
        r = c.chat.completions.create(model="dpinfer-protect", messages=last, max_tokens=4,
                                      extra_body={"dpinfer": {**SHORT, "epsilon": 200.0, "forward": ["system"]}})
        ext = r.model_extra["dpinfer"]
        assert rec.seen[-1]["messages"] == [{"role": "system", "content": system},
                                            {"role": "user", "content": ext["protected_prompt"]}]
        assert ext["unprotected"] == [{"index": 0, "role": "system"}]
        assert hiv not in json.dumps(rec.seen)
        # opted in by the operator (--forward assistant) for every request
        with ThreadServer(create_app(runtime, KeyStore(keys_file[0]), upstream=upstream.url + "/v1",
                                     forward=["assistant"])) as front2:
            c2 = openai.OpenAI(base_url=front2.url + "/v1", api_key=keys_file[1]["acme"], max_retries=0,
                               timeout=300)
            r = c2.chat.completions.create(model="dpinfer-protect", messages=last, max_tokens=4,
                                           extra_body={"dpinfer": {**SHORT, "epsilon": 200.0}})
            ext = r.model_extra["dpinfer"]
            assert rec.seen[-1]["messages"] == [{"role": "assistant", "content": "Noted."},
                                                {"role": "user", "content": ext["protected_prompt"]}]
            assert ext["unprotected"] == [{"index": 1, "role": "assistant"}]
    runtime.close()


# ---------------------------------------------------------------------------------------------------- adoption, CLI
def test_serve_adopt_gives_one_tenant_a_cli_unit_and_a_rag_add_folder(tmp_path, capsys) -> None:
    from dpinfer.accounting.ledger import Ledger
    from dpinfer.cli import main
    from dpinfer.serve.budget import LedgerBudgets

    ledger = tmp_path / "ledger.db"
    Ledger.init(ledger, epsilon=10).set_budget("case-42", 5.0)
    (tmp_path / "stores" / "notes").mkdir(parents=True)
    (tmp_path / "stores" / "notes" / "chroma.sqlite3").write_text("x")
    common = ["serve", "adopt", "--ledger", str(ledger), "--stores", str(tmp_path / "stores")]
    assert main([*common, "--tenant", "acme", "--unit", "case-42"]) == 0
    assert main([*common, "--tenant", "globex", "--unit", "case-42"]) != 0  # one tenant at most
    assert "case-42" not in capsys.readouterr().err.split("error:")[-1]  # the name is not quoted back
    assert main([*common, "--tenant", "acme", "--store", "notes", "--as", "cli-notes"]) == 0
    tenancy = LedgerBudgets(ledger).tenancy
    assert tenancy.adopted("unit", "acme", "case-42") == "case-42" and tenancy.adopted("unit", "globex", "case-42") \
        is None
    assert tenancy.adopted("store", "acme", "cli-notes") == "notes"
    assert stat.S_IMODE(os.stat(tmp_path / "stores" / "notes").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "stores" / "notes" / "chroma.sqlite3").st_mode) == 0o600
    assert main([*common, "--tenant", "acme", "--unit", "no-such-unit"]) != 0


def test_the_command_line_checks_forward_and_allowed_host_before_the_model_loads() -> None:
    from dpinfer.cli import build_parser
    from dpinfer.cli.serve import check_serve_args
    from dpinfer.errors import ConfigurationError

    parse = build_parser().parse_args
    with pytest.raises(ConfigurationError, match="--forward takes roles"):
        check_serve_args(parse(["serve", "--forward", "system,user"]))  # an earlier user turn is never forwarded
    with pytest.raises(ConfigurationError, match="needs --keys"):
        check_serve_args(parse(["serve", "--allowed-host", "*"]))
    args = parse(["serve", "--forward", "system, assistant", "--allowed-host", "box.lan"])
    check_serve_args(args)
    assert args.forward_roles == ["system", "assistant"]
    from dpinfer.serve.security import allowed_hosts

    assert allowed_hosts(args.host, args.allowed_host) == {"127.0.0.1", "localhost", "::1", "box.lan"}
