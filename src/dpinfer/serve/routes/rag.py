"""Private stores: list, describe, add documents, ask (an answer charged to the store's unit)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from dpinfer.accounting.charge import charge
from dpinfer.serve import bodies
from dpinfer.serve.deps import Body, Svc, User
from dpinfer.serve.keys import Principal
from dpinfer.serve.service import Service
from dpinfer.serve.streams import event_stream

router = APIRouter()


@router.get("/v1/rag")
def list_stores(who: Principal = User, svc: Service = Svc) -> dict[str, Any]:
    return {"stores": svc.stores(who)}


@router.get("/v1/rag/{store}")
def get_store(store: str, who: Principal = User, svc: Service = Svc) -> dict[str, Any]:
    return svc.store_info(who, store)


@router.post("/v1/rag/{store}/documents")
def rag_add(store: str, who: Principal = User, data: dict[str, Any] = Body, svc: Service = Svc) -> Any:
    return svc.rag_add(who, store, bodies.documents(data))


@router.post("/v1/rag/{store}/ask")
def rag_ask(store: str, who: Principal = User, data: dict[str, Any] = Body, svc: Service = Svc) -> Any:
    opts = bodies.ask(data)  # parse
    asked = svc.plan_ask(who, store, opts)  # plan: retrieval, mechanism, guarantee
    held = svc.hold(asked.units, asked.plan.charges)  # charge: every unit or none (402, nothing generated)
    if data.get("stream") is True:  # server-sent events: PAD's released tokens, then the answer
        return event_stream(svc.ask_stream(asked, held), held)
    with charge(held, None, scope=held.scope):  # committed once released, cancelled if it fails
        out = svc.run(asked.plan.job)  # run: in the shared batch
    return svc.answer(asked, out)  # finish
