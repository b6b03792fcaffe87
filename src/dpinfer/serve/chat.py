"""The OpenAI-compatible chat completions (``POST /v1/chat/completions``): one model per task, each answered as
parse → plan → charge → run → finish on the service.

- ``dpinfer-plain``: plain generation from the local model (no privacy, said so in the reply);
- ``dpinfer-rag/<store>``: the last user message asked of a private store (its guarantee and budget in the reply;
  streamed token by token as PAD releases them);
- ``dpinfer-protect``: the one user message protected (DP-GTR), then sent upstream. Only the protected prompt is
  forwarded unless the request (``dpinfer.forward``) or the operator (``--forward``) opts roles in; an earlier user
  turn is refused (422). The reply lists what went unprotected and what was dropped.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dpinfer import generation
from dpinfer.accounting.charge import charge
from dpinfer.defaults import SERVE
from dpinfer.pipelines.protect_prompt import finish_protect
from dpinfer.serve import bodies
from dpinfer.serve.deps import Settings
from dpinfer.serve.errors import ApiError
from dpinfer.serve.keys import Principal
from dpinfer.serve.service import Service
from dpinfer.serve.streams import deltas, in_thread, one_piece, sse

PLAIN = "dpinfer-plain"
PROTECT = "dpinfer-protect"
RAG_PREFIX = "dpinfer-rag/"
NO_GUARANTEE = "no privacy guarantee: plain generation from the local model, nothing is protected"
SERVE_PLAIN_TEMPERATURE = 0.7
SERVE_PLAIN_TOP_P = 0.9
ASK_OPTIONS = ("mechanism", "epsilon", "delta", "temperature", "unit")
"""The ``dpinfer`` extension fields a ``dpinfer-rag/`` chat passes to the question."""

FORWARDABLE = ("system", "developer", "assistant", "tool")
"""Roles whose messages dpinfer-protect forwards upstream, unprotected, when the operator (``--forward``) or the
request (``dpinfer.forward``) opts in; by default none is forwarded."""


def check_forward(roles: object, what: str) -> list[str]:
    """A list of roles among :data:`FORWARDABLE` (the message names none of the values)."""
    if not isinstance(roles, list) or not all(isinstance(r, str) and r in FORWARDABLE for r in roles):
        raise ApiError(
            422,
            f"{what} must be a list of roles among {', '.join(FORWARDABLE)} (an earlier user turn is never forwarded)",
        )
    return roles


@dataclass(frozen=True)
class Chat:
    """A parsed chat completion request."""

    model: str
    messages: list[dict[str, str]]
    stream: bool
    max_tokens: int
    temperature: float | None
    top_p: float | None
    ext: dict[str, Any]
    """The ``dpinfer`` extension field (the task's parameters)."""
    data: Mapping[str, Any]
    cid: str = field(default_factory=lambda: "chatcmpl-" + uuid.uuid4().hex)

    def user_turns(self) -> list[int]:
        return [i for i, m in enumerate(self.messages) if m["role"] == "user"]


def parse(data: Mapping[str, Any]) -> Chat:
    model, messages = data.get("model"), data.get("messages")
    if not isinstance(model, str):
        raise ApiError(422, "model must be a string (see GET /v1/models)")
    if (
        not isinstance(messages, list)
        or not messages
        or not all(
            isinstance(m, Mapping) and isinstance(m.get("content"), str) and isinstance(m.get("role"), str)
            for m in messages
        )
    ):
        raise ApiError(422, "messages must be a non-empty list of {role, content} objects with string content")
    ext = data.get("dpinfer") or {}
    if not isinstance(ext, dict):
        raise ApiError(422, "dpinfer (the extension field) must be an object of parameters")
    return Chat(
        model=model,
        messages=[{"role": m["role"], "content": m["content"]} for m in messages],
        stream=bool(data.get("stream", False)),
        max_tokens=data.get("max_completion_tokens", data.get("max_tokens")) or SERVE.chat_max_new_tokens,
        temperature=data.get("temperature"),
        top_p=data.get("top_p"),
        ext=ext,
        data=data,
    )


def models(svc: Service, who: Principal, setup: Settings) -> list[str]:
    return [PLAIN] + ([PROTECT] if setup.upstream else []) + [RAG_PREFIX + s for s in svc.stores(who)]


def reply(svc: Service, who: Principal, chat: Chat, setup: Settings) -> Any:
    """The completion of the request's model (a stream when asked)."""
    if chat.model == PLAIN:
        return plain(svc, chat)
    if chat.model.startswith(RAG_PREFIX):
        return ask(svc, who, chat)
    if chat.model == PROTECT:
        return protect(svc, who, chat, setup)
    raise ApiError(404, f"unknown model; use {PLAIN}, {PROTECT} or {RAG_PREFIX}<store> (GET /v1/models)")


def plain(svc: Service, chat: Chat) -> Any:
    """``dpinfer-plain``: planned (checked before a stream starts: 422, not a broken stream), decoded in the shared
    batch; nothing to charge."""
    plan = svc.plan_generate(
        chat.messages,
        max_new_tokens=chat.max_tokens,
        temperature=SERVE_PLAIN_TEMPERATURE if chat.temperature is None else chat.temperature,
        top_p=SERVE_PLAIN_TOP_P if chat.top_p is None else chat.top_p,
    )
    extension = {"guarantee": None, "note": NO_GUARANTEE}
    if chat.stream:
        return sse(chat.cid, chat.model, in_thread(svc.generate_stream(plan.job)), extension)
    res = generation.TASK.finish(plan, [svc.run(plan.job)])
    finish = "length" if res.finish_reason == "length" else "stop"
    return completion(chat, res.text.strip(), finish, extension, usage=(res.prompt_tokens, len(res.token_ids)))


def ask(svc: Service, who: Principal, chat: Chat) -> Any:
    """``dpinfer-rag/<store>``: the last user message asked of the store (PAD's tokens streamed as released)."""
    question = next((m["content"] for m in reversed(chat.messages) if m["role"] == "user"), None)
    if question is None:
        raise ApiError(422, "the messages have no user message (the question)")
    opts = bodies.ask(
        {
            **{k: v for k, v in chat.ext.items() if k in ASK_OPTIONS},
            "question": question,
            "max_new_tokens": chat.ext.get("max_new_tokens", chat.max_tokens),
        }
    )
    asked = svc.plan_ask(who, chat.model[len(RAG_PREFIX) :], opts)
    held = svc.hold(asked.units, asked.plan.charges)
    if chat.stream:  # PAD releases token by token: each piece leaves as it is released
        extension = {
            "guarantee": asked.plan.guarantee.to_dict(),
            **svc.charged(asked.units),
            "mechanism": asked.plan.mechanism,
        }
        source = deltas(svc.ask_stream(asked, held))
        return sse(chat.cid, chat.model, in_thread(source), extension, held, source)
    with charge(held, None, scope=held.scope):
        out = svc.run(asked.plan.job)
    res = svc.answer(asked, out)
    extension = {k: res[k] for k in ("guarantee", "unit", "budget", "units", "mechanism")}
    return completion(chat, res["text"], "stop", extension)


def protect(svc: Service, who: Principal, chat: Chat, setup: Settings) -> Any:
    """``dpinfer-protect``: the one user message protected, then the chosen messages sent upstream."""
    if not setup.upstream:
        raise ApiError(422, "dpinfer-protect needs an upstream: start the server with --upstream URL")
    roles = set(setup.forward) | set(check_forward(chat.ext.get("forward") or [], "dpinfer.forward"))
    users = chat.user_turns()
    if not users:
        raise ApiError(422, "the messages have no user message (the prompt to protect)")
    if len(users) > 1:
        raise ApiError(
            422,
            "dpinfer-protect protects one user message per request and never forwards an earlier "
            "user turn: send the conversation's context inside that one message (it is protected "
            "whole), one request per prompt",
        )
    prompt, config = bodies.protect(chat.ext, prompt=chat.messages[users[0]]["content"])
    plan, units = svc.plan_protect(who, prompt, config, chat.ext.get("unit"))
    held = svc.hold(units, plan.charges)
    with charge(held, None, scope=held.scope):
        res = finish_protect(plan, [svc.run(plan.job)])[0].release()
    res.update(svc.charged(units))
    forwarded, unprotected, dropped = split_messages(chat.messages, users[0], res["prompt"], roles)
    extension = {
        "protected_prompt": res["prompt"],
        **{k: res[k] for k in ("guarantee", "unit", "budget", "units")},
        "upstream": setup.upstream,
        "unprotected": unprotected,
        "dropped": dropped,
    }
    message = forward_upstream(setup.upstream, setup.upstream_model, forwarded, chat.data)["choices"][0]
    text = message["message"]["content"] or ""
    if chat.stream:
        return sse(chat.cid, chat.model, one_piece(text), extension)
    return completion(chat, text, message.get("finish_reason") or "stop", extension)


def split_messages(
    messages: list[dict[str, str]], user: int, protected: str, roles: set[str]
) -> tuple[list[dict[str, str]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(what is forwarded: the protected prompt in place of message ``user`` and the messages of ``roles``; which
    of them went unprotected; which were dropped), by index and role."""
    forwarded, unprotected, dropped = [], [], []
    for i, m in enumerate(messages):
        if i == user:
            forwarded.append({"role": "user", "content": protected})
        elif m["role"] in roles:
            forwarded.append(m)
            unprotected.append({"index": i, "role": m["role"]})
        else:
            dropped.append({"index": i, "role": m["role"]})
    return forwarded, unprotected, dropped


def completion(
    chat: Chat, text: str, finish: str, extension: dict[str, Any], usage: tuple[int, int] | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": chat.cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": chat.model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
        "dpinfer": extension,
    }
    if usage is not None:
        out["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
    return out


def forward_upstream(
    upstream: str, model: str | None, messages: list[dict[str, Any]], data: Mapping[str, Any]
) -> dict[str, Any]:
    """Send the protected messages to the upstream OpenAI-compatible server (its key from ``DPINFER_UPSTREAM_KEY``)."""
    import os

    import httpx

    base = upstream.rstrip("/")
    headers = {}
    if os.environ.get("DPINFER_UPSTREAM_KEY"):
        headers["Authorization"] = f"Bearer {os.environ['DPINFER_UPSTREAM_KEY']}"
    payload: dict[str, Any] = {"messages": messages, "stream": False}
    for k in ("max_tokens", "max_completion_tokens", "temperature", "top_p"):
        if data.get(k) is not None:
            payload[k] = data[k]
    try:
        with httpx.Client(timeout=600) as client:
            if model is None:
                listed = client.get(f"{base}/models", headers=headers)
                listed.raise_for_status()
                model = listed.json()["data"][0]["id"]
            payload["model"] = model
            reply = client.post(f"{base}/chat/completions", json=payload, headers=headers)
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        raise ApiError(502, f"the upstream did not answer ({type(exc).__name__}); check --upstream") from None
    if reply.status_code != 200:
        raise ApiError(502, f"the upstream answered with status {reply.status_code}")
    try:
        out = reply.json()
        out["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise ApiError(502, "the upstream's reply is not an OpenAI chat completion") from None
    return out
