"""Units' budgets and synthesis jobs (kept on disk, resumed after a restart)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from dpinfer.serve import bodies
from dpinfer.serve.deps import Admin, Body, Svc, User
from dpinfer.serve.keys import Principal
from dpinfer.serve.service import Service

router = APIRouter()


@router.get("/v1/budget/{unit}")
def get_budget(unit: str, who: Principal = User, svc: Service = Svc) -> dict[str, Any]:
    return svc.budget(who, unit)


@router.put("/v1/budget/{unit}")
def put_budget(unit: str, who: Principal = Admin, data: dict[str, Any] = Body, svc: Service = Svc) -> Any:
    return svc.set_budget(who, unit, *bodies.budget(data))


@router.post("/v1/synth", status_code=202)
def synth(who: Principal = User, data: dict[str, Any] = Body, svc: Service = Svc) -> Any:
    # parsed and planned now (bad parameters: 422, not a failed job later); charged and run by the job, which is
    # kept on disk and resumed after a restart
    return svc.jobs.submit(who, data)


@router.get("/v1/jobs/{job_id}")
def get_job(job_id: str, who: Principal = User, svc: Service = Svc) -> dict[str, Any]:
    return svc.jobs.get(who, job_id)
