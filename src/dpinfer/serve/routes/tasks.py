"""Health, metrics, the methods, tagging, sanitisation and prompt protection."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from dpinfer import __version__
from dpinfer.accounting.charge import charge
from dpinfer.errors import DPInferError
from dpinfer.pipelines.protect_prompt import finish_protect
from dpinfer.pipelines.sanitize_plan import finish_sanitize
from dpinfer.serve import bodies
from dpinfer.serve.deps import Admin, Body, Svc, User
from dpinfer.serve.keys import Principal
from dpinfer.serve.service import Service
from dpinfer.serve.streams import event_stream

router = APIRouter()

TASKS = ("sanitize", "synthesize", "rag", "protect-prompt")


@router.get("/healthz")
def healthz(svc: Service = Svc) -> dict[str, Any]:
    return {"status": "ok", "model": svc.lm.name, "version": __version__}


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(who: Principal = Admin, svc: Service = Svc) -> str:  # an admin key (keyless: the local admin, loopback)
    return svc.metrics.text()


@router.get("/v1/methods")
def methods(who: Principal = User) -> dict[str, Any]:
    from dpinfer.methods import method_names, summaries

    out = {}
    for task in TASKS:
        try:
            out[task] = {"methods": method_names(task), "summaries": summaries(task)}
        except DPInferError:
            continue
    return out


@router.post("/v1/tag")
def tag(who: Principal = User, data: dict[str, Any] = Body, svc: Service = Svc) -> Any:
    return svc.tag(bodies.tag(data))


@router.post("/v1/sanitize")
def sanitize(who: Principal = User, data: dict[str, Any] = Body, svc: Service = Svc) -> Any:
    opts = bodies.sanitize(data)  # parse: every check before anything is tagged or charged
    plan, units = svc.plan_sanitize(who, opts)  # plan: spans, contexts, mechanism, guarantee
    held = svc.hold(units, plan.charges)  # charge: every unit or none (402, nothing generated)
    if data.get("stream") is True:  # server-sent events: the released tokens, then the release
        return event_stream(svc.sanitize_stream(plan, units, held), held)
    with charge(held, None, scope=held.scope):  # committed once released, cancelled if it fails
        out = svc.run(plan.job)  # run: in the shared batch
        release = finish_sanitize(plan, out, seconds=out.prefill_seconds + out.decode_seconds).release()
    return {**release, **svc.charged(units)}  # finish


@router.post("/v1/protect-prompt")
def protect(who: Principal = User, data: dict[str, Any] = Body, svc: Service = Svc) -> Any:
    prompt, config = bodies.protect(data)  # parse
    plan, units = svc.plan_protect(who, prompt, config, data.get("unit"))  # plan: stage 1's job, the guarantee
    held = svc.hold(units, plan.charges)  # charge: every unit or none (402, nothing generated)
    with charge(held, None, scope=held.scope):  # committed once released, cancelled if it fails
        out = svc.run(plan.job)  # run: stage 1 (the only step that reads the prompt) in the shared batch
        release = finish_protect(plan, [out])[0].release()  # finish: stages 2 and 3 on the released rewrites
    return {**release, **svc.charged(units)}
