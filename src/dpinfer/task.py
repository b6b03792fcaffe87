"""The task protocol: every task (sanitize a document, answer from a store, synthesize a corpus, protect a prompt,
plain generation) is two steps around the engine, and every caller (the Python API, the command line, the server,
corpus jobs, the benches) runs it the same way: parse → **plan** → **charge** → **run** → **finish**.

* ``task.plan(config, inputs, runtime) → Plan``: every check, the calibrated mechanism and the engine
  :class:`~dpinfer.engine.Job`\\ s, before any token. A :class:`Plan` holds the ``jobs``, the ``guarantee`` (computed
  once, here, from the parameters and a maximum length alone: ex ante, never from the private data) and the
  ``charges`` (:class:`~dpinfer.accounting.charge.Charges`: the cost from that guarantee, the scope of the units it is
  charged to). A task's own plan (:class:`~dpinfer.pipelines.sanitize_plan.SanitizePlan`,
  :class:`~dpinfer.rag.answer.AskPlan`, :class:`~dpinfer.pipelines.protect_prompt.ProtectPlan`,
  :class:`~dpinfer.pipelines.synthesize.SynthesisJobs`, :class:`~dpinfer.generation.GeneratePlan`) is a
  :class:`Plan` with what its ``finish`` needs besides; each task module has a ``TASK`` object (a :class:`Task`).
  A plan holds private contexts: never log or serialise it.
* **charge**: :func:`dpinfer.accounting.charge.run_charged` (``run_charged(ledger, plan.charges, run)``) settles
  the cost on the caller's units before the jobs run and commits once the result is handed over (the one charge path).
* **run**: the plan's jobs on an engine (:meth:`Engine.run <dpinfer.engine.Engine.run>` /
  :meth:`Engine.stream <dpinfer.engine.Engine.stream>` take a job whole; :func:`run_jobs` here, or a server's
  batcher, which submits the same jobs).
* ``task.finish(plan, outputs) → result``: the release from the jobs' :class:`~dpinfer.engine.EngineOutput`\\ s
  (one per job, in the plan's order). It may run post-processing of released text only (prompt protection's
  stages 2 and 3 read nothing but stage 1's released rewrites).

:func:`perform` is the whole chain for a caller with nothing to add between the steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from dpinfer.accounting.charge import Charges, LedgerLike, Reservation, run_charged

if TYPE_CHECKING:
    from dpinfer.accounting import Guarantee
    from dpinfer.engine import Engine, EngineOutput, Job
    from dpinfer.runtime import Runtime

__all__ = ["Plan", "Task", "perform", "run_jobs"]

ConfigT = TypeVar("ConfigT", contravariant=True)
InputsT = TypeVar("InputsT", contravariant=True)
PlanT = TypeVar("PlanT", bound="Plan")
ResultT = TypeVar("ResultT", covariant=True)


@dataclass(frozen=True, kw_only=True, eq=False)
class Plan:
    """One task planned for the engine, before any token (see the module docstring): its engine ``jobs`` (run in
    this order; outputs are handed to ``finish`` in this order), its ex-ante ``guarantee`` (None: a task without
    privacy, as plain generation) and its ``charges`` (what the charge path settles before the jobs run)."""

    jobs: tuple[Job, ...]
    guarantee: Guarantee | None
    charges: Charges

    @property
    def job(self) -> Job:
        """The plan's only job (a task of one job: a document, a question, a chat completion)."""
        if len(self.jobs) != 1:
            raise ValueError(f"this plan has {len(self.jobs)} jobs, not one")
        return self.jobs[0]


class Task(Protocol[ConfigT, InputsT, PlanT, ResultT]):
    """A task: ``plan`` then ``finish`` around the engine (see the module docstring)."""

    name: str

    def plan(self, config: ConfigT, inputs: InputsT, runtime: Runtime) -> PlanT:
        """Every check, the jobs, the guarantee and the charges; no token generated."""
        ...

    def finish(self, plan: PlanT, outputs: Sequence[EngineOutput]) -> ResultT:
        """The result (the release) from the outputs of ``plan.jobs``, in their order."""
        ...


def run_jobs(engine: Engine, jobs: Sequence[Job]) -> list[EngineOutput]:
    """The outputs of ``jobs`` in their order: one job on :meth:`Engine.run <dpinfer.engine.Engine.run>`, several in
    one :meth:`Engine.run_jobs <dpinfer.engine.Engine.run_jobs>` (they share the engine's steps)."""
    if len(jobs) == 1:
        return [engine.run(jobs[0])]
    outs: dict[int, EngineOutput] = dict(engine.run_jobs(jobs))
    return [outs[i] for i in range(len(jobs))]


def perform(task: Task[ConfigT, InputsT, PlanT, ResultT], config: ConfigT, inputs: InputsT, runtime: Runtime, *,
            ledger: LedgerLike | Reservation = None, units: str | Sequence[str] | None = None,
            default_unit: Callable[[Any], str] | None = None) -> ResultT:
    """plan → charge → run → finish: ``task.plan``, the charge path (:func:`~dpinfer.accounting.charge.run_charged`
    on ``ledger`` and ``units``, before any token), the jobs on ``runtime``'s engine (under its lock), then
    ``task.finish``; the charges are committed once the result exists, cancelled if any step raises."""
    plan = task.plan(config, inputs, runtime)

    def run() -> ResultT:
        with runtime.lock:  # one caller's jobs at a time on a shared engine
            outputs = run_jobs(runtime.engine, plan.jobs)
        return task.finish(plan, outputs)

    return run_charged(ledger, plan.charges, run, units=units, default_unit=default_unit, what=task.name)
