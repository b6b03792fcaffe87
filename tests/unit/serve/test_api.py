"""The service's JSON API against a live server on a loopback port (tiny model, regex tagger)."""

from __future__ import annotations

import json

import httpx
import pytest
from serve_helpers import DOC

from dpinfer.defaults import PROTECT, SERVE
from dpinfer.engine import Engine

SPANS = [{"start": DOC.index("John Smith"), "end": DOC.index("John Smith") + len("John Smith"), "label": "PERSON"},
         {"start": DOC.index("12 March 1961"), "end": DOC.index("12 March 1961") + 13, "label": "DATETIME"}]


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_health_metrics_and_methods(server) -> None:
    assert httpx.get(server.url + "/healthz").json()["status"] == "ok"
    assert "dpinfer_budget_refusals_total" in httpx.get(server.url + "/metrics",
                                                        headers=auth(server.keys["acme-admin"])).text
    methods = httpx.get(server.url + "/v1/methods", headers=auth(server.keys["acme"])).json()
    assert "dp-fusion" in methods["sanitize"]["methods"]
    assert httpx.get(server.url + "/docs").status_code == 404  # off without --docs (its assets come from a CDN)
    assert httpx.get(server.url + "/openapi.json").status_code == 200


def test_sanitize_returns_the_release_its_guarantee_and_the_budget_left(server) -> None:
    key = auth(server.keys["acme-admin"])
    r = httpx.put(server.url + "/v1/budget/acme-case-1", json={"epsilon": 100, "delta": 1e-3}, headers=key)
    assert r.status_code == 200, r.text
    body = {"text": DOC, "spans": SPANS, "epsilon": 40, "max_new_tokens": 8, "unit": "acme-case-1"}
    r = httpx.post(server.url + "/v1/sanitize", json=body, headers=auth(server.keys["acme"]), timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["method"] == "dp-fusion" and isinstance(out["text"], str)
    eps = out["guarantee"]["epsilon"]
    assert 0 < eps <= 40 + 1e-9 and out["guarantee"]["sentence"]
    assert set(out["groups"]) == {"PERSON", "DATETIME"}
    budget = out["budget"]
    assert budget["unit"] == "acme-case-1" and budget["budget"] == {"epsilon": 100, "delta": 1e-3}
    assert 0 < budget["spent"] and budget["left"] == pytest.approx(100 - budget["spent"])
    assert budget["releases"] == 1 and budget["pending"] == 0
    assert "debug" not in out and "spans" not in out  # the release only
    # again until the unit's composed ε would pass 100: refused with the budget left, nothing generated
    for _ in range(8):
        before = server.runtime.metrics.tokens
        r = httpx.post(server.url + "/v1/sanitize", json=body, headers=auth(server.keys["acme"]), timeout=120)
        if r.status_code != 200:
            break
    assert r.status_code == 402, r.text
    refused = r.json()
    assert refused["error"].startswith("budget exceeded for the unit:") and "\n" not in refused["error"]
    assert "nothing was generated" in refused["error"] and "acme-case-1" not in refused["error"]
    assert refused["budget"]["unit"] == "acme-case-1"
    assert refused["budget"]["left"] < 100 and refused["budget"]["pending"] == 0
    assert server.runtime.metrics.tokens == before  # refused before the engine
    got = httpx.get(server.url + "/v1/budget/acme-case-1", headers=auth(server.keys["acme"])).json()
    assert got == refused["budget"]


def test_tag_endpoint_finds_spans_with_the_regex_tagger(server) -> None:
    r = httpx.post(server.url + "/v1/tag", json={"text": DOC}, headers=auth(server.keys["acme"]))
    assert r.status_code == 200
    labels = {s["label"] for s in r.json()["spans"]}
    assert labels  # email / phone / date found by the regex tagger


def test_budget_put_needs_an_admin_and_units_belong_to_one_tenant(server) -> None:
    r = httpx.put(server.url + "/v1/budget/x1", json={"epsilon": 5}, headers=auth(server.keys["acme"]))
    assert r.status_code == 403 and "admin" in r.json()["error"]
    assert httpx.put(server.url + "/v1/budget/acme-owned", json={"epsilon": 5},
                     headers=auth(server.keys["acme-admin"])).status_code == 200
    # globex's unit of that name is its own (names are per tenant): the default budget, nothing of acme's
    r = httpx.get(server.url + "/v1/budget/acme-owned", headers=auth(server.keys["globex"]))
    assert r.status_code == 200 and r.json()["budget"]["epsilon"] == 1000.0 and r.json()["releases"] == 0


def test_rag_documents_and_ask_with_the_pad_guarantee(server) -> None:
    key = auth(server.keys["acme"])
    docs = ["Patient: I have a migraine. Doctor: Rest in a dark room.",
            "Patient: My knee hurts. Doctor: See a physiotherapist.",
            "Patient: I cough at night. Doctor: Use an inhaler."]
    r = httpx.post(server.url + "/v1/rag/clinic/documents", json={"documents": docs}, headers=key, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["added"] == 3
    r = httpx.post(server.url + "/v1/rag/clinic/ask", json={"question": "What helps a migraine?", "epsilon": 64,
                                                           "max_new_tokens": 6}, headers=key, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["mechanism"] == "pad" and out["guarantee"]["epsilon"] <= 64 + 1e-9
    assert out["unit"] == "store.clinic" and out["budget"]["releases"] == 1
    assert "doc_ids" not in out and "seconds" not in out
    # streamed: PAD's tokens leave one by one as they are released, then the answer (charged once)
    events = []
    with httpx.stream("POST", server.url + "/v1/rag/clinic/ask", headers=key, timeout=120,
                      json={"question": "What helps a cough?", "max_new_tokens": 8, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    final = events[-1]
    assert final.get("done") is True, final
    assert final["mechanism"] == "pad" and final["budget"]["releases"] == 2
    assert "".join(e["delta"] for e in events[:-1]).strip() == final["text"]
    assert len(events) - 1 >= min(2, len(final["text"].split()))  # token by token, not one chunk at the end
    theirs = httpx.post(server.url + "/v1/rag/clinic/ask", json={"question": "x"}, headers=auth(server.keys["globex"]))
    missing = httpx.post(server.url + "/v1/rag/nostore/ask", json={"question": "x"}, headers=key)
    assert theirs.status_code == missing.status_code == 404 and theirs.json() == missing.json()  # one answer
    assert "nostore" not in missing.text
    info = httpx.get(server.url + "/v1/rag/clinic", headers=key).json()
    assert info["unit"] == "store.clinic" and info["budget"]["releases"] == 2
    models = httpx.get(server.url + "/v1/models", headers=key).json()
    assert "dpinfer-rag/clinic" in {m["id"] for m in models["data"]}


def test_synth_job_is_submitted_then_polled(server) -> None:
    import time

    key = auth(server.keys["acme"])
    refs = [f"Record {i}: the patient reported a headache and was given rest." for i in range(4)]
    r = httpx.post(server.url + "/v1/synth", json={"references": refs, "epsilon": 8, "batch_size": 2,
                                                  "max_new_tokens": 4}, headers=key)
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        got = httpx.get(server.url + f"/v1/jobs/{job}", headers=key).json()
        if got["status"] in ("done", "failed", "refused"):
            break
        time.sleep(0.3)
    assert got["status"] == "done", got
    assert len(got["result"]["texts"]) == 2 and got["result"]["guarantee"]["epsilon"] <= 8 + 1e-9
    assert httpx.get(server.url + f"/v1/jobs/{job}", headers=auth(server.keys["globex"])).status_code == 404
    r = httpx.post(server.url + "/v1/synth", json={"references": refs, "epsilon": -1}, headers=key)
    assert r.status_code == 422


def test_sanitize_streams_the_released_tokens_then_the_release(server) -> None:
    body = {"text": DOC, "spans": SPANS, "max_new_tokens": 6, "unit": "acme-stream", "stream": True}
    events = []
    with httpx.stream("POST", server.url + "/v1/sanitize", json=body, headers=auth(server.keys["acme"]),
                      timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    final = events[-1]
    assert final["done"] is True and final["budget"]["releases"] == 1 and final["budget"]["pending"] == 0
    pieces = "".join(e["delta"] for e in events[:-1])
    assert pieces.strip() == final["text"]
    assert final["guarantee"]["sentence"]
    # a refusal comes before the stream: a plain 402
    httpx.put(server.url + "/v1/budget/acme-stream-small", json={"epsilon": 1},
              headers=auth(server.keys["acme-admin"])).raise_for_status()
    r = httpx.post(server.url + "/v1/sanitize", json={**body, "unit": "acme-stream-small"},
                   headers=auth(server.keys["acme"]))
    assert r.status_code == 402 and "budget" in r.json()


def test_protect_prompt_decodes_stage3_in_the_int8_batch(server, monkeypatch) -> None:
    svc = server.runtime
    assert svc.int8_batcher is not None and svc.int8_batcher.engine.lm.quantize == "int8"
    assert svc.int8_batcher.engine.lm.model is not svc.lm.model and svc.batcher.engine.lm.quantize is None
    assert svc.int8_batcher.engine.scheduler.max_rows == SERVE.stage3_rows  # a small pool, not the main batch's
    steps: dict[str | None, int] = {}
    step = Engine.step

    def count(self):
        steps[self.lm.quantize] = steps.get(self.lm.quantize, 0) + 1
        return step(self)

    monkeypatch.setattr(Engine, "step", count)
    acme = auth(server.keys["acme"])
    r = httpx.post(server.url + "/v1/protect-prompt", headers=acme, timeout=120,
                   json={"prompt": "Where would I find a kettle in Kettleborough?", "epsilon": 200.0,
                         "n_rewrites": 2, "n_keywords": 3, "max_new_tokens": 5, "n_exemplars": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["settings"]["stage3_int8"] is True
    assert steps.get(None, 0) > 0 and steps.get("int8", 0) > 0  # stage 1 in the main batch, stage 3 in the twin's
    assert body["settings"]["stage3_quorum"] == PROTECT.stage3_quorum
    r = httpx.post(server.url + "/v1/protect-prompt", headers=acme, timeout=120,
                   json={"prompt": "Where is the kettle?", "epsilon": 200.0, "n_rewrites": 2, "n_keywords": 3,
                         "max_new_tokens": 5, "n_exemplars": 2, "stage3_quorum": "All"})
    assert r.status_code == 200, r.text
    assert r.json()["settings"]["stage3_quorum"] is None  # every final decoded to its end
    r = httpx.post(server.url + "/v1/protect-prompt", headers=acme, timeout=120,
                   json={"prompt": "Where is the kettle?", "epsilon": 200.0, "stage3_quorum": 0})
    assert r.status_code == 422 and "stage3_quorum must be an integer" in r.text and "kettle" not in r.text
    assert "in a service request" in r.text  # the message names the service's spelling of "every final"


def test_the_queue_gauge_sums_every_shared_batch(server) -> None:
    svc = server.runtime
    assert svc.batcher.queue in svc.metrics.queues and svc.int8_batcher.queue in svc.metrics.queues
    text = httpx.get(server.url + "/metrics", headers=auth(server.keys["acme-admin"])).text
    assert f"dpinfer_queue_length {svc.metrics.queue_length}" in text
