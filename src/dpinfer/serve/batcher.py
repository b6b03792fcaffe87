"""Continuous batching across HTTP requests: one thread owns the one engine; every request thread reaches it through
:class:`SharedEngine`.

:class:`Batcher` is the only caller of :meth:`Engine.submit <dpinfer.engine.Engine.submit>`, :meth:`Engine.step
<dpinfer.engine.Engine.step>` and :meth:`Engine.cancel <dpinfer.engine.Engine.cancel>`. Request threads hand it jobs
(:meth:`Batcher.submit` returns a :class:`Ticket` at once); its loop submits the queued jobs between steps and steps
the engine while any job runs: one forward pass per decode step for every admitted job, a job joining when the
scheduler has room and leaving when it finishes. When the engine is idle, the first job waits ``window`` seconds for
others, so that requests sent together are planned into one pool. A job's step events go to its ticket as they
happen (streaming); its output or its error settles the ticket's future.

:class:`SharedEngine` has the engine's calling surface (``lm``, ``generate``, ``run_jobs``, ``stream``) on top of the
batcher, so a pipeline handed it (``Runtime(engine=SharedEngine(...))``) decodes in the shared batch: a sanitisation,
the three stages of a prompt protection, a synthesis job's batches, a RAG answer and a chat completion all advance in
the same forward passes. Batches are made of jobs and their public settings only; what the engine guarantees about
public rows and shapes across jobs (rule 2) is stated and tested in :mod:`dpinfer.engine.scheduler` and
:mod:`dpinfer.engine.runner`.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, as_completed
from typing import Any

from dpinfer.engine import Engine, EngineOutput, Job, JobStatus, StepEvent
from dpinfer.engine.job import checked_copies
from dpinfer.errors import DPInferError
from dpinfer.serve.metrics import Metrics

_DONE = object()
"""End of a ticket's event stream."""


class Cancelled(DPInferError):
    """The job was cancelled (its client went away, or the server is stopping) before it finished."""


class Ticket:
    """One job handed to the batcher: its future (the :class:`EngineOutput`) and, when listened to, its step events
    as they happen (:meth:`events`)."""

    def __init__(self, job: Job, listen: bool) -> None:
        self.job = job
        self.future: Future[EngineOutput] = Future()
        self.queue: queue.Queue[Any] | None = queue.Queue() if listen else None
        self.cancelled = False

    def result(self) -> EngineOutput:
        return self.future.result()

    def events(self) -> Iterator[StepEvent]:
        """The job's step events until it finishes (its error, if it failed, is raised at the end)."""
        if self.queue is None:
            raise RuntimeError("this ticket was submitted without listen=True")
        while True:
            event = self.queue.get()
            if event is _DONE:
                break
            yield event
        self.future.result()  # raises the job's error

    def _settle(self, output: EngineOutput | None = None, error: BaseException | None = None) -> None:
        if not self.future.done():
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(output)  # type: ignore[arg-type]
        if self.queue is not None:
            self.queue.put(_DONE)


class Batcher:
    """The thread that owns the engine (module docstring). ``lock`` is held for each step (and by anything else that
    runs the model outside the engine, e.g. a first clip-bound calibration)."""

    def __init__(self, engine: Engine, lock: threading.Lock, metrics: Metrics, *, window: float = 0.02,
                 batching: bool = True) -> None:
        self.engine = engine
        self.lock = lock
        self.metrics = metrics
        self.window = float(window)
        self.batching = batching
        self.queue: queue.Queue[Ticket | None] = queue.Queue()
        self.cancels: queue.Queue[Ticket] = queue.Queue()
        metrics.queues.append(self.queue)
        self.thread = threading.Thread(target=self._loop, name="dpinfer-batcher", daemon=True)
        self.thread.start()

    def submit(self, job: Job, *, listen: bool = False) -> Ticket:
        """Queue ``job`` for the engine; returns at once."""
        ticket = Ticket(job, listen)
        self.queue.put(ticket)
        return ticket

    def run(self, job: Job) -> EngineOutput:
        """Submit ``job`` and wait for its output (its error is raised)."""
        return self.submit(job).result()

    def cancel(self, ticket: Ticket) -> None:
        """Stop a job (a client gone): it leaves the batch before the next step; its future raises
        :class:`Cancelled`."""
        if not ticket.future.done():
            ticket.cancelled = True
            self.cancels.put(ticket)

    def close(self) -> None:
        self.queue.put(None)

    # ---------------------------------------------------------------- the loop
    def _first(self) -> list[Ticket] | None:
        """Idle: wait for a job, then ``window`` seconds for others to start with it (one planned pool)."""
        first = self.queue.get()
        if first is None:
            return None
        items = [first]
        deadline = time.monotonic() + self.window
        while self.batching:
            timeout = deadline - time.monotonic()
            try:
                item = self.queue.get(timeout=timeout) if timeout > 0 else self.queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self.queue.put(None)
                break
            items.append(item)
        return items

    def _drain(self) -> list[Ticket]:
        items = []
        while True:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                return items
            if item is None:
                self.queue.put(None)
                return items
            items.append(item)

    def _loop(self) -> None:
        active: dict[int, Ticket] = {}
        while True:
            items = self._drain() if active else self._first()
            if items is None:
                for ticket in active.values():
                    ticket._settle(error=Cancelled("the server is stopping"))
                return
            for ticket in items:
                if ticket.cancelled:
                    ticket._settle(error=Cancelled("the job was cancelled before it started"))
                    continue
                try:
                    with self.lock:
                        self.engine.submit(ticket.job)
                except Exception as exc:  # refused before the model ran (its request gets the one-line error)
                    ticket._settle(error=exc)
                    continue
                active[id(ticket.job)] = ticket
            if items:
                with self.metrics.lock:
                    self.metrics.batched_jobs += len(items)
            while not self.cancels.empty():
                ticket = self.cancels.get_nowait()
                if active.pop(id(ticket.job), None) is not None:
                    with self.lock:
                        self.engine.cancel(ticket.job)
                    ticket._settle(error=Cancelled("the job was cancelled"))
            if not active:
                continue
            t0 = time.perf_counter()
            failure: BaseException | None = None
            events: list[tuple[Job, StepEvent]] = []
            try:
                with self.lock:
                    events = self.engine.step().events
            except BaseException as exc:
                if not any(t.job.error is not None for t in active.values()):  # not one job's failure: all of them
                    failure = exc
            tokens = 0
            for job, event in events:
                ticket = active.get(id(job))
                if ticket is not None and ticket.queue is not None:
                    ticket.queue.put(event)
                tokens += sum(1 for t in event.tokens if t >= 0)
            for key, ticket in list(active.items()):
                job = ticket.job
                if failure is not None and job.status is not JobStatus.FINISHED:
                    with self.lock:
                        self.engine.cancel(job)
                    ticket._settle(error=failure)
                elif job.status is not JobStatus.FINISHED:
                    continue
                elif job.error is not None:
                    ticket._settle(error=job.error)
                elif job.output is None:
                    ticket._settle(error=Cancelled("the job was cancelled before it finished"))
                else:
                    ticket._settle(job.output)
                del active[key]
            with self.metrics.lock:
                self.metrics.batches += 1
            self.metrics.generated(tokens, time.perf_counter() - t0)


class SharedStream(Iterator[StepEvent]):
    """The events of one job decoded in the shared batch (:meth:`SharedEngine.stream`); :attr:`output` once
    exhausted; :meth:`close` cancels the job (the caller stopped reading)."""

    def __init__(self, batcher: Batcher, ticket: Ticket) -> None:
        self.batcher = batcher
        self.ticket = ticket
        self._events = ticket.events()

    def __iter__(self) -> SharedStream:
        return self

    def __next__(self) -> StepEvent:
        return next(self._events)

    def close(self) -> None:
        self.batcher.cancel(self.ticket)
        self._events.close()

    @property
    def finished(self) -> bool:
        return self.ticket.future.done()

    @property
    def output(self) -> EngineOutput:
        if not self.ticket.future.done():
            raise RuntimeError("the stream has not finished: iterate it to the end before reading its output")
        return self.ticket.future.result()


class SharedEngine:
    """The engine's calling surface (``lm``, ``run``, ``generate``, ``stream``, ``run_jobs``) for any thread: each
    job goes to the :class:`Batcher` and is decoded in the shared batch (module docstring)."""

    def __init__(self, batcher: Batcher) -> None:
        self.batcher = batcher
        self.lm = batcher.engine.lm

    def submit(self, job: Job, *, listen: bool = False) -> Ticket:
        return self.batcher.submit(job, listen=listen)

    def run(self, job: Job) -> EngineOutput:
        """A planned job, taken whole (:meth:`Engine.run <dpinfer.engine.Engine.run>`), in the shared batch."""
        return self.batcher.run(job)

    def generate(self, contexts: Sequence[Sequence[int]], mechanism: Any, **kwargs: Any) -> EngineOutput:
        kwargs.pop("result", None)
        return self.batcher.run(Job(contexts, mechanism, **kwargs))

    def stream(self, contexts: Sequence[Sequence[int]] | Job, mechanism: Any = None, **kwargs: Any) -> SharedStream:
        kwargs.pop("result", None)
        job = contexts if isinstance(contexts, Job) else Job(contexts, mechanism, **kwargs)
        return SharedStream(self.batcher, self.submit(job, listen=True))

    def run_jobs(self, jobs: Sequence[Job], *, max_rows: int | None = None, compile: bool | str | None = None,
                 slots: bool = True) -> Iterator[tuple[int, EngineOutput]]:
        """Like :meth:`Engine.run_jobs <dpinfer.engine.Engine.run_jobs>` (every job checked first, each run as a
        fresh copy, ``(index, output)`` as each finishes), in the shared batch; the engine's pool settings
        (``max_rows``, ``compile``) are the server's."""
        del max_rows, compile
        copies = checked_copies(jobs, self.lm.context_window)
        if not slots:
            for i, copy in enumerate(copies):
                yield i, self.batcher.run(copy)
            return
        tickets = [self.submit(copy) for copy in copies]
        index = {ticket.future: i for i, ticket in enumerate(tickets)}
        try:
            for fut in as_completed(index):
                yield index[fut], fut.result()
        finally:  # the caller stopped early (or a job failed): the others leave the batch
            for ticket in tickets:
                self.batcher.cancel(ticket)
