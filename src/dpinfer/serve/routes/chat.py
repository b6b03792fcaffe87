"""The OpenAI-compatible API: the models, and chat completions (:mod:`dpinfer.serve.chat`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from dpinfer.serve import chat
from dpinfer.serve.deps import Body, Settings, Setup, Svc, User
from dpinfer.serve.keys import Principal
from dpinfer.serve.service import Service

router = APIRouter()


@router.get("/v1/models")
def models(who: Principal = User, svc: Service = Svc, setup: Settings = Setup) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {"id": n, "object": "model", "created": 0, "owned_by": "dpinfer"} for n in chat.models(svc, who, setup)
        ],
    }


@router.post("/v1/chat/completions")
def chat_completions(
    who: Principal = User, data: dict[str, Any] = Body, svc: Service = Svc, setup: Settings = Setup
) -> Any:
    request = chat.parse(data)  # parse
    return chat.reply(svc, who, request, setup)  # plan, charge, run, finish: the model's task
