"""Hostile requests against ``dpinfer serve`` (a subprocess with keys): each gets its status and a one-line message,
the server stays up, and no private text reaches its log (the captured output is grepped)."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from serve_helpers import DOC, SECRET

PRIVATE = f"{DOC} {SECRET}"


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def check(r: httpx.Response, status: int, words: str) -> None:
    assert r.status_code == status, (r.status_code, r.text[:300])
    msg = r.json()["error"]
    assert "\n" not in msg and words in msg
    assert SECRET not in r.text and "John Smith" not in r.text


@pytest.fixture(scope="module")
def hostile(cli_serve):
    url, acme, globex = cli_serve.url, auth(cli_serve.keys["acme"]), auth(cli_serve.keys["globex"])
    # a store and a unit of acme's, for the other-tenant cases
    r = httpx.post(url + "/v1/rag/acme-notes/documents", json={"documents": ["Opening hours are nine to five."]},
                   headers=acme, timeout=120)
    assert r.status_code == 200, r.text
    return url, acme, globex


def test_no_key_and_a_wrong_key_are_401(hostile) -> None:
    url, _, _ = hostile
    check(httpx.post(url + "/v1/sanitize", json={"text": PRIVATE}), 401, "API key")
    check(httpx.post(url + "/v1/sanitize", json={"text": PRIVATE}, headers=auth("dpk_" + SECRET)), 401, "API key")
    check(httpx.post(url + "/v1/sanitize", json={"text": PRIVATE}, headers={"Authorization": SECRET}), 401, "API key")


def test_another_tenants_store_is_a_missing_one_and_units_are_per_tenant(hostile) -> None:
    url, acme, globex = hostile
    theirs = httpx.post(url + "/v1/rag/acme-notes/ask", json={"question": PRIVATE}, headers=globex)
    check(theirs, 404, "no store of that name")
    assert theirs.json() == httpx.post(url + "/v1/rag/globex-none/ask", json={"question": PRIVATE},
                                       headers=globex).json()  # the same answer as a store that does not exist
    ok = httpx.post(url + "/v1/sanitize", headers=acme, timeout=120,
                    json={"text": DOC, "spans": [{"start": 3, "end": 13, "label": "PERSON"}], "max_new_tokens": 2,
                          "unit": "acme-unit-7"})
    assert ok.status_code == 200, ok.text
    mine = httpx.get(url + "/v1/budget/acme-unit-7", headers=acme).json()
    seen = httpx.get(url + "/v1/budget/acme-unit-7", headers=globex).json()  # globex's own unit of that name
    assert mine["releases"] == 1 and seen["releases"] == 0 and seen["pending"] == 0
    check(httpx.put(url + "/v1/budget/acme-unit-7", headers=acme, json={"epsilon": 1e9}), 403, "admin")


def test_malformed_bodies_are_422(hostile) -> None:
    url, acme, _ = hostile
    jacme = {**acme, "Content-Type": "application/json"}
    check(httpx.post(url + "/v1/sanitize", content=b"{" + SECRET.encode(), headers=jacme), 422, "not valid JSON")
    check(httpx.post(url + "/v1/sanitize", content=json.dumps([PRIVATE]), headers=jacme), 422, "JSON object")
    check(httpx.post(url + "/v1/sanitize", content=b"[" * 200_000, headers=jacme), 422, "nested too deeply")
    check(httpx.post(url + "/v1/sanitize", content=b'{"text": "\\udc00' + SECRET.encode() + b'"}', headers=jacme),
          422, "surrogate")
    check(httpx.post(url + "/v1/sanitize", content=json.dumps({"text": PRIVATE}), headers=acme), 415,
          "application/json")
    # a client that hangs up mid-body: not an error (the last test greps the log for a traceback)
    host = url.removeprefix("http://")
    body = json.dumps({"text": PRIVATE}).encode()
    with socket.create_connection(tuple(host.split(":"))) as s:
        s.sendall(f"POST /v1/sanitize HTTP/1.1\r\nHost: {host}\r\nAuthorization: {acme['Authorization']}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(body) + 50}\r\n\r\n".encode() + body)
        time.sleep(0.3)
    check(httpx.post(url + "/v1/sanitize", json={"text": 42}, headers=acme), 422, "text must be")
    check(httpx.post(url + "/v1/sanitize", json={"text": PRIVATE, SECRET: 1}, headers=acme), 422, "unknown field")
    check(httpx.post(url + "/v1/sanitize", content=b"\xff\xfe" + SECRET.encode(), headers=jacme), 422, "JSON")
    check(httpx.post(url + "/v1/chat/completions", json={"model": "dpinfer-plain", "messages": SECRET},
                     headers=acme), 422, "messages must be")


def test_a_5_mib_body_is_413(hostile) -> None:
    url, acme, _ = hostile
    big = json.dumps({"text": (SECRET + " ") * (5 * 1024 * 1024 // (len(SECRET) + 1))})
    jacme = {**acme, "Content-Type": "application/json"}
    check(httpx.post(url + "/v1/sanitize", content=big, headers=jacme), 413, "over the limit")

    def chunks():  # no Content-Length: counted as it arrives
        for _ in range(6):
            yield (SECRET * 60_000).encode()[: 1024 * 1024]

    check(httpx.post(url + "/v1/sanitize", content=chunks(), headers=jacme), 413, "over the limit")


def test_bad_parameters_get_the_command_lines_messages(hostile) -> None:
    url, acme, _ = hostile
    check(httpx.post(url + "/v1/sanitize", json={"text": PRIVATE, "epsilon": -1}, headers=acme), 422, "epsilon")
    out_of_text = [{"start": len(PRIVATE) - 3, "end": len(PRIVATE) + 40, "label": "PERSON"}]
    check(httpx.post(url + "/v1/sanitize", json={"text": PRIVATE, "spans": out_of_text}, headers=acme), 422, "span")
    check(httpx.post(url + "/v1/sanitize", json={"text": PRIVATE, "method": "nope"}, headers=acme), 422, "method")
    check(httpx.post(url + "/v1/protect-prompt", json={"prompt": PRIVATE, "epsilon": -2}, headers=acme), 422,
          "epsilon")
    check(httpx.post(url + "/v1/rag/acme-notes/ask", json={"question": PRIVATE, "epsilon": 0}, headers=acme), 422,
          "epsilon")
    check(httpx.post(url + "/v1/sanitize", json={"text": PRIVATE, "unit": "../" + SECRET}, headers=acme), 422,
          "the unit must be")


def test_a_question_to_a_missing_store_is_404(hostile) -> None:
    url, acme, _ = hostile
    r = httpx.post(url + "/v1/rag/no-such-store/ask", json={"question": PRIVATE}, headers=acme)
    check(r, 404, "no store of that name")
    assert "no-such-store" not in r.text  # the name is not quoted back


def test_an_overspend_is_402_with_the_budget_left(hostile) -> None:
    url, acme, _ = hostile
    body = {"text": PRIVATE, "spans": [{"start": 3, "end": 13, "label": "PERSON"}], "epsilon": 150,
            "max_new_tokens": 2, "unit": "acme-big"}
    assert httpx.post(url + "/v1/sanitize", json=body, headers=acme, timeout=120).status_code == 200
    r = httpx.post(url + "/v1/sanitize", json=body, headers=acme, timeout=120)
    check(r, 402, "budget exceeded")
    budget = r.json()["budget"]
    assert budget["left"] == pytest.approx(budget["budget"]["epsilon"] - budget["spent"]) and budget["releases"] == 1


def test_the_server_stays_up_and_its_log_holds_no_private_text(hostile, cli_serve) -> None:
    url, acme, _ = hostile
    # its own bad requests (under pytest-xdist the module's other tests may run against another worker's server)
    jacme = {**acme, "Content-Type": "application/json"}
    check(httpx.post(url + "/v1/sanitize", content=b"{" + SECRET.encode(), headers=jacme), 422, "not valid JSON")
    big = json.dumps({"text": (SECRET + " ") * (5 * 1024 * 1024 // (len(SECRET) + 1))})
    check(httpx.post(url + "/v1/sanitize", content=big, headers=jacme), 413, "over the limit")
    assert httpx.get(url + "/healthz").status_code == 200
    assert cli_serve.proc.poll() is None
    time.sleep(0.2)  # the access log line is written after the reply
    log = cli_serve.log.read_text(encoding="utf-8", errors="replace")
    # the access log is on (a body refused before routing is logged without its route) ...
    assert "POST /v1/sanitize 422" in log and "POST (no route) 413" in log
    for private in (SECRET, "John Smith", "Baker Street", "john.smith@example.com", "Opening hours"):
        assert private not in log  # ... and carries no body
    assert "Traceback" not in log
