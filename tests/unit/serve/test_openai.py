"""The OpenAI-compatible API with the real ``openai`` client: ``dpinfer-plain``, ``dpinfer-rag/<store>`` and
``dpinfer-protect`` (upstream: a second ``dpinfer serve`` in a subprocess on another loopback port), streaming
included."""

from __future__ import annotations

import pytest

openai = pytest.importorskip("openai", reason="the openai client is not installed (pip install -e '.[serve]')")

from serve_helpers import ThreadServer, make_runtime  # noqa: E402

SHORT = {"n_rewrites": 2, "max_new_tokens": 6, "n_exemplars": 1, "n_keywords": 3}
"""Prompt protection kept short for the tiny model."""


@pytest.fixture(scope="module")
def front(tiny_lm, tmp_path_factory, cli_serve, keys_file, monkeypatch_module):
    from dpinfer.serve.app import create_app
    from dpinfer.serve.keys import KeyStore

    monkeypatch_module.setenv("DPINFER_CACHE", str(tmp_path_factory.mktemp("cache")))
    monkeypatch_module.setenv("DPINFER_UPSTREAM_KEY", cli_serve.keys["acme"])
    runtime = make_runtime(tiny_lm, tmp_path_factory.mktemp("front"))
    app = create_app(runtime, KeyStore(keys_file[0]), upstream=cli_serve.url + "/v1")
    with ThreadServer(app) as srv:
        srv.keys = keys_file[1]
        yield srv
    runtime.close()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def client(srv, who: str = "acme"):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=srv.keys[who], max_retries=0, timeout=300)


def test_models_lists_the_three_kinds(front) -> None:
    c = client(front)
    c.post("/rag/faq/documents", cast_to=object, body={"documents": ["The clinic opens at nine on weekdays.",
                                                                     "Parking is free for patients."]})
    ids = {m.id for m in c.models.list()}
    assert {"dpinfer-plain", "dpinfer-protect", "dpinfer-rag/faq"} <= ids


def test_plain_chat_and_stream_say_there_is_no_guarantee(front) -> None:
    c = client(front)
    r = c.chat.completions.create(model="dpinfer-plain", messages=[{"role": "user", "content": "Hello"}],
                                  max_tokens=5)
    assert isinstance(r.choices[0].message.content, str)
    assert r.model_extra["dpinfer"]["guarantee"] is None and "no privacy" in r.model_extra["dpinfer"]["note"]
    assert r.usage.completion_tokens <= 5
    chunks = list(c.chat.completions.create(model="dpinfer-plain", messages=[{"role": "user", "content": "Hi"}],
                                            max_tokens=6, stream=True))
    assert chunks[0].model_extra["dpinfer"]["guarantee"] is None
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    assert isinstance(text, str) and chunks[-1].choices[0].finish_reason == "stop"


def test_rag_chat_answers_with_the_pad_guarantee(front) -> None:
    c = client(front)
    c.post("/rag/faq/documents", cast_to=object, body={"documents": ["The clinic opens at nine on weekdays."]})
    r = c.chat.completions.create(model="dpinfer-rag/faq", messages=[{"role": "user", "content": "When does it open?"}],
                                  max_tokens=6)
    ext = r.model_extra["dpinfer"]
    assert ext["mechanism"] == "pad" and 0 < ext["guarantee"]["epsilon"] <= 64 + 1e-9
    assert ext["budget"]["releases"] >= 1
    chunks = list(c.chat.completions.create(model="dpinfer-rag/faq", stream=True, max_tokens=6,
                                            messages=[{"role": "user", "content": "Is parking free?"}]))
    assert chunks[0].model_extra["dpinfer"]["mechanism"] == "pad"
    assert chunks[0].model_extra["dpinfer"]["budget"]["pending"] == 1  # reserved before the first token left
    pieces = [ch.choices[0].delta.content for ch in chunks[1:-1]]
    assert all(pieces) and chunks[-1].choices[0].finish_reason == "stop"
    text = "".join(pieces)
    assert len(pieces) >= min(2, len(text.split()))  # PAD's tokens as they are released, not one chunk
    after = c.get("/budget/store.faq", cast_to=object)
    assert after["releases"] == ext["budget"]["releases"] + 1 and after["pending"] == 0
    with pytest.raises(openai.NotFoundError):  # another tenant's store is a missing one
        client(front, "globex").chat.completions.create(model="dpinfer-rag/faq", max_tokens=4,
                                                        messages=[{"role": "user", "content": "x"}])


def test_protect_rewrites_the_prompt_and_forwards_it_upstream(front) -> None:
    c = client(front)
    secret = "Zanzibarquux Oduya owes 4,000 euros to the Kettleborough bank"
    r = c.chat.completions.create(model="dpinfer-protect", max_tokens=6, extra_body={"dpinfer": SHORT},
                                  messages=[{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": f"Should {secret} refinance?"}])
    ext = r.model_extra["dpinfer"]
    assert isinstance(ext["protected_prompt"], str) and secret not in ext["protected_prompt"]
    assert ext["guarantee"]["mechanism"] == "dp-gtr" and ext["guarantee"]["epsilon"] > 0
    assert ext["upstream"].endswith("/v1") and isinstance(r.choices[0].message.content, str)
    chunks = list(c.chat.completions.create(model="dpinfer-protect", max_tokens=6, stream=True,
                                            extra_body={"dpinfer": SHORT},
                                            messages=[{"role": "user", "content": "Is it safe to fly?"}]))
    assert "protected_prompt" in chunks[0].model_extra["dpinfer"]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_unknown_model_and_missing_key_are_refused(front) -> None:
    with pytest.raises(openai.NotFoundError):
        client(front).chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    bad = openai.OpenAI(base_url=front.url + "/v1", api_key="dpk_wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
