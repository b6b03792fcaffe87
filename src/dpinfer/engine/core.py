"""The engine: jobs are submitted, and every :meth:`Engine.step` advances each admitted job by one token.

The engine owns the model; a :class:`~dpinfer.mechanisms.Mechanism` owns the choice of tokens. Its parts, apart:

* :class:`~dpinfer.engine.job.Job`: one job's arguments and state (its status, released tokens, randomness);
* :class:`~dpinfer.engine.scheduler.Scheduler`: admission, public widths, the pool's shapes, side rows (plain Python);
* a runner: prefill, KV cache, decode step and the ONE split output head. :class:`~dpinfer.engine.runner.SlotRunner`
  (every job's rows in one forward per step) where the model supports the slot cache
  (:attr:`LM.supports_slot_cache <dpinfer.models.LM.supports_slot_cache>`), else
  :class:`~dpinfer.engine.dynamic.DynamicRunner` (each job on its own Hugging Face cache).

One step: the scheduler admits what fits (each admitted job is prefilled alone); each running job's mechanism turns
its pending logits (float64, unclamped) into its token(s), which are recorded (joint mode: one token for every row,
the job stops at EOS or ``T_max``; independent mode: one token per row, a row stops at its own EOS); finished jobs
leave; one forward computes the next logits of the others. Jobs whose mechanisms share a
:meth:`~dpinfer.mechanisms.base.Mechanism.batch_key` decide together (:meth:`Engine._decide`,
:attr:`Engine.batched_decisions`): one :meth:`~dpinfer.mechanisms.base.Mechanism.step_batch` call, one host transfer,
the same tokens as each job alone. :meth:`Engine.stream`, :meth:`Engine.generate` and
:meth:`Engine.run_jobs` are loops over :meth:`Engine.step`; jobs may be submitted between steps (a server). An engine
is not thread-safe: one thread (or one lock) calls ``submit``, ``step`` and ``cancel``; a server's loop steps while
:attr:`Engine.busy` and hands each request its events (:attr:`StepOutput.events`) and output (:attr:`Job.output`).

Randomness comes only from each job's :class:`~dpinfer.mechanisms.randomness.RandomSource`: the operating system's
CSPRNG by default, a whole-seed PCG64 stream with ``seed`` (tests and benchmarks: the same seed reproduces a run).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dpinfer.engine.cache import resolve_compile
from dpinfer.engine.dynamic import DynamicRunner
from dpinfer.engine.job import EngineOutput, Job, JobStatus, StepEvent, Vocabulary, checked_copies
from dpinfer.engine.prefill import PrefixKV
from dpinfer.engine.runner import SlotRunner
from dpinfer.engine.scheduler import Scheduler, check_max_rows, public_width
from dpinfer.errors import ConfigurationError
from dpinfer.mechanisms.base import Mechanism
from dpinfer.mechanisms.randomness import Randomness
from dpinfer.mechanisms.transforms import LogitsProcessor
from dpinfer.models import LM

RUNNERS = ("auto", "slots", "dynamic")


@dataclass
class StepOutput:
    """What one :meth:`Engine.step` did: each job's event (in admission order) and the jobs that finished (their
    :attr:`Job.output` is set)."""

    events: list[tuple[Job, StepEvent]] = field(default_factory=list)
    finished: list[Job] = field(default_factory=list)


@dataclass
class StepTimes:
    """Where the decode steps' wall-clock time goes (:attr:`Engine.timing`, for benchmarks): summed over the steps
    that admitted no job (an admission includes a prefill), with the device synchronised between the phases (which
    a run without timing does not do).

    ``schedule``: the scheduler (and the pool planning); ``decide``: every job's mechanism, from its logits to its
    recorded token(s); ``forward``: the decode forward and the output head. ``syncs``: what ``host_reads`` (a counter,
    e.g. :class:`dpinfer.bench.speed.HostReads`) counted during the decisions and the forward."""

    steps: int = 0
    schedule: float = 0.0
    decide: float = 0.0
    forward: float = 0.0
    syncs: int = 0
    host_reads: Callable[[], int] | None = None

    def per_step(self) -> dict[str, float]:
        """Milliseconds per step of each phase, and the host reads per step."""
        n = max(self.steps, 1)
        total = self.schedule + self.decide + self.forward
        return {"schedule_ms": 1000 * self.schedule / n, "decide_ms": 1000 * self.decide / n,
                "forward_ms": 1000 * self.forward / n, "step_ms": 1000 * total / n,
                "syncs": self.syncs / n, "steps": self.steps}


class Engine:
    """Decodes submitted jobs together, one token per :meth:`step`.

    >>> # engine = Engine(dpinfer.load_model())
    >>> # out = engine.generate([ids_a, ids_b], mechanism, max_new_tokens=64, seed=0)
    >>> # job = engine.submit(Job([ids], mechanism, max_new_tokens=64)); while engine.busy: engine.step()

    Args:
        lm: the loaded model.
        prefix_sharing: prefill a prefix common to a job's rows once (exact: same positions, same cache values).
        static_cache: dynamic-cache runner and batched prefill: pre-allocate the KV cache of K > 1 rows for prompt +
            ``max_new_tokens`` (written in place) instead of growing it by concatenation.
        split_head: let mechanisms read their private rows on some columns only (:mod:`dpinfer.engine.head`).
        max_rows: slot count of the shared batch (public; default per device,
            :data:`~dpinfer.engine.scheduler.DEFAULT_MAX_ROWS`, capped by the waiting jobs' total K unless
            ``fixed_rows``, at least their largest K).
        compile: compile the pooled decode step (``torch.compile``, once per slot-count and capacity bucket): ``True``,
            ``False`` or ``"auto"`` (on CUDA; on CPU :data:`~dpinfer.engine.cache.COMPILE_CPU_DEFAULT`).
        fixed_rows, min_capacity: for a server (:class:`~dpinfer.engine.scheduler.Scheduler`).
        runner: ``"auto"`` (the slot runner where :attr:`LM.supports_slot_cache`), ``"slots"`` or ``"dynamic"``.
    """

    def __init__(self, lm: LM, *, prefix_sharing: bool = True, static_cache: bool = True, split_head: bool = True,
                 max_rows: int | None = None, compile: bool | str = "auto", fixed_rows: bool = False,
                 min_capacity: int = 0, runner: str = "auto") -> None:
        if runner not in RUNNERS:
            raise ConfigurationError(f"runner must be one of {', '.join(RUNNERS)}, got {runner!r}")
        self.lm = lm
        self.prefix_sharing = prefix_sharing
        self.static_cache = static_cache
        self.split_head = split_head
        device = torch.device(lm.device)
        slots = runner == "slots" or (runner == "auto" and lm.supports_slot_cache)
        self.runner: SlotRunner | DynamicRunner = (
            SlotRunner(lm, prefix_sharing=prefix_sharing, static_cache=static_cache, split_head=split_head,
                       compile=resolve_compile(compile, device)) if slots else
            DynamicRunner(lm, prefix_sharing=prefix_sharing, static_cache=static_cache, split_head=split_head))
        self.scheduler = Scheduler(device_type=device.type, context_window=lm.context_window, max_rows=max_rows,
                                   fixed_rows=fixed_rows, min_capacity=min_capacity,
                                   shared_pool=self.runner.shared_pool)
        self.batched_decisions = True
        """Let the jobs whose mechanisms decide in batches (:meth:`Mechanism.step_batch
        <dpinfer.mechanisms.base.Mechanism.step_batch>`) decide together; False: every job alone (the per-job path,
        which releases the same tokens)."""
        self.timing: StepTimes | None = None
        """Set to a :class:`StepTimes` to time each phase of the decode steps (benchmarks; synchronises the device)."""
        self.vocab = Vocabulary(vocab_size=lm.vocab_size, eos_ids=frozenset(lm.eos_token_ids), eos=self.runner.eos,
                                pad_id=lm.pad_token_id, device=lm.device, context_window=lm.context_window)

    # ------------------------------------------------------------------ the core: submit and step
    def submit(self, job: Job) -> Job:
        """Check ``job`` (before the model runs; refused with :class:`~dpinfer.errors.ConfigurationError` or
        :class:`~dpinfer.errors.InvalidInputError`) and queue it; it joins the batch at a later :meth:`step`."""
        job.check(self.lm.context_window, self.lm.model.config.num_hidden_layers)
        job.width = public_width(job, job.rows)
        job.status = JobStatus.WAITING
        self.scheduler.add(job)
        return job

    @property
    def busy(self) -> bool:
        """Whether a submitted job has not finished yet."""
        return self.scheduler.has_work

    def step(self) -> StepOutput:
        """Admit what fits, then advance every running job by one token (module docstring). A mechanism that raises
        fails its job only (:attr:`Job.error`); the error is raised once every other job has advanced."""
        out = StepOutput()
        if not self.scheduler.has_work:
            return out
        error: BaseException | None = None
        timing = self.timing
        if timing is not None:
            marks = [self._mark()]
        with torch.inference_mode():
            decision = self.scheduler.schedule()
            if timing is not None:
                marks.append(self._mark())
            if decision.pool is not None:
                self.runner.use_pool(decision.pool)
            for adm in decision.admitted:
                adm.job.start(self.vocab, self.runner.split_head)
                self.runner.admit(adm.job, adm.slots, adm.side_rows)
            if timing is not None:
                marks.append(self._mark())
            going = []
            running = list(self.scheduler.running)
            decided = self._decide(running)
            for job in running:
                event, next_ids, err = decided[id(job)]
                if err is not None:
                    error = error or err
                    job.error = err
                if event is not None:
                    out.events.append((job, event))
                    if job.events is not None:
                        job.events.append(event)
                if next_ids is None:
                    self._leave(job)
                    out.finished.append(job)
                else:
                    going.append((job, next_ids))
            if timing is not None:
                marks.append(self._mark())
            if going:
                self.runner.forward(going)
            if timing is not None and not decision.admitted:
                end = self._mark()
                timing.steps += 1
                timing.schedule += marks[1][0] - marks[0][0]
                timing.decide += marks[3][0] - marks[2][0]
                timing.forward += end[0] - marks[3][0]
                timing.syncs += end[1] - marks[2][1]
        if error is not None:
            raise error
        return out

    def _decide(self, jobs: Sequence[Job]) -> dict[int, tuple[StepEvent | None, torch.Tensor | None,
                                                               BaseException | None]]:
        """Every running job's decision of this step: (event, next ids, error) by ``id(job)``. With
        :attr:`batched_decisions`, the jobs whose mechanisms share a
        :meth:`~dpinfer.mechanisms.base.Mechanism.batch_key` decide in one
        :meth:`~dpinfer.mechanisms.base.Mechanism.step_batch` call (the same tokens as alone); the others, one by
        one."""
        out: dict[int, tuple[StepEvent | None, torch.Tensor | None, BaseException | None]] = {}
        groups: dict[Any, list[Job]] = {}
        if self.batched_decisions:
            for job in jobs:
                key = job.batch_key()
                if key is not None:
                    groups.setdefault(key, []).append(job)
        for members in groups.values():
            try:
                logits = [job.batch_logits(self.vocab) for job in members]
                results = type(members[0].mechanism).step_batch(
                    [job.mechanism for job in members], logits, [job.info() for job in members],
                    [job.source for job in members])
            except Exception as err:
                results = [err] * len(members)
            for job, res in zip(members, results, strict=True):
                if isinstance(res, Exception):
                    out[id(job)] = (None, None, res)
                    continue
                try:
                    out[id(job)] = (*job.record(res, self.vocab), None)
                except Exception as err:
                    out[id(job)] = (None, None, err)
        for job in jobs:
            if id(job) not in out:
                try:
                    out[id(job)] = (*job.decide(self.vocab), None)
                except Exception as err:
                    out[id(job)] = (None, None, err)
        return out

    def _mark(self) -> tuple[float, int]:
        """(time, host reads so far), the device synchronised first (:attr:`timing` only)."""
        if torch.device(self.lm.device).type == "cuda":
            torch.cuda.synchronize()
        reads = self.timing.host_reads if self.timing is not None else None
        return time.perf_counter(), reads() if reads is not None else 0

    def _leave(self, job: Job) -> None:
        self.runner.release(job)
        self.scheduler.finish(job)
        job.finish()

    def cancel(self, job: Job) -> None:
        """Stop a submitted job (a client gone): it leaves the batch at once; its :attr:`Job.output` stays unset."""
        if job.status is JobStatus.WAITING:
            self.scheduler.cancel(job)
        elif job.status is JobStatus.RUNNING:
            with torch.inference_mode():
                self.runner.release(job)
            self.scheduler.finish(job)
        job.status = JobStatus.FINISHED
        job.placement = job.logits = None

    def _wait(self, job: Job) -> EngineOutput:
        """Step until ``job`` has finished (other jobs advance too); its output."""
        while job.status is not JobStatus.FINISHED:
            self.step()
        if job.error is not None:
            raise job.error
        return job.output

    # ------------------------------------------------------------------ loops over step()
    def run(self, job: Job) -> EngineOutput:
        """Run ``job`` (a planned task's :class:`~dpinfer.engine.job.Job`, taken whole) to the end; its output
        (other submitted jobs advance meanwhile). Checked before the model runs, as :meth:`submit`."""
        return self._wait(self.submit(job))

    def stream(
        self,
        contexts: Sequence[Sequence[int]] | Job,
        mechanism: Mechanism | None = None,
        *,
        max_new_tokens: int | None = None,
        min_new_tokens: int = 0,
        seed: int | None = None,
        generator: Randomness | None = None,
        stop_on_eos: bool = True,
        processors: Sequence[LogitsProcessor] = (),
        pad_width: int | None = None,
        prefix_kv: Sequence[PrefixKV | None] | None = None,
        result: list[EngineOutput] | None = None,
        debug_stats: bool = False,
    ) -> EngineStream:
        """Generate step by step: an :class:`EngineStream` that yields a :class:`StepEvent` per token and, once
        exhausted, holds the :class:`EngineOutput` in :attr:`EngineStream.output`. Arguments are checked here, before
        the model runs. ``engine.stream(job)`` takes a planned :class:`~dpinfer.engine.job.Job` whole (no other
        argument then); the arguments below build one.

        Args:
            contexts: K token-id sequences (already tokenised; no special tokens are added), or a whole job.
            mechanism: turns the K rows of logits into token(s); its ``mode`` picks joint or independent decoding.
            max_new_tokens: ``T_max``.
            min_new_tokens: EOS is masked out (for every row alike) before this many tokens (benchmarks).
            seed / generator: source of all randomness: by default a secure source (``os.urandom``); ``seed`` (tests
                and benchmarks only) a reproducible one; ``generator`` a source or ``torch.Generator`` to use as is.
            stop_on_eos: stop at EOS (else always run ``max_new_tokens`` steps; EOS is then an ordinary token).
            processors: :class:`~dpinfer.mechanisms.transforms.LogitsProcessor` objects, each called as
                ``processor(generated, logits)`` before the mechanism, where ``generated`` holds the tokens generated
                so far (one list in joint mode, applied to every row alike; one list per row in independent mode).
                They see released tokens only, never a prompt.
            pad_width: a PUBLIC bound on the private rows' lengths (from parameters, never from the private rows).
                With a public row (:attr:`Mechanism.public_row`, K > 1) the job's public width is
                ``max(len(row 0), pad_width)``; without one, ``pad_width`` lets the job share the batch with others.
                A private row longer than it is decoded in a side batch (slower, still exact).
            prefix_kv: per row, the keys and values of its first tokens already computed by this model's prompt
                processing (:class:`~dpinfer.engine.prefill.PrefixKV`), or None: those tokens are not run again
                (:func:`~dpinfer.engine.prefill.prefill_seeded`). Public text only; not for a job with a public row.
            result: deprecated; the output is also appended to this list when the stream ends (use
                :attr:`EngineStream.output`).
            debug_stats: record the mechanism's DATA-DEPENDENT per-step statistics (:attr:`Job.debug_stats`).
        """
        if isinstance(contexts, Job):
            if mechanism is not None or max_new_tokens is not None:
                raise ConfigurationError("Engine.stream(job) takes the job whole: give no other argument")
            job = contexts
        else:
            if mechanism is None or max_new_tokens is None:
                raise ConfigurationError("Engine.stream needs a job, or contexts, a mechanism and max_new_tokens")
            job = Job(contexts, mechanism, max_new_tokens, min_new_tokens, seed, generator, stop_on_eos, processors,
                      pad_width, prefix_kv, debug_stats)
        self.submit(job)
        job.events = deque()
        return EngineStream(self._events(job), result)

    def _events(self, job: Job) -> Generator[StepEvent, None, EngineOutput]:
        try:
            while True:
                while job.events:
                    yield job.events.popleft()
                if job.status is JobStatus.FINISHED:
                    break
                self.step()
        finally:
            if job.status is not JobStatus.FINISHED:
                self.cancel(job)  # the stream was closed early
        if job.error is not None:
            raise job.error
        return job.output

    def generate(self, contexts: Sequence[Sequence[int]], mechanism: Mechanism, **kwargs: Any) -> EngineOutput:
        """Run :meth:`stream` to the end and return the :class:`EngineOutput` (same arguments)."""
        kwargs.pop("result", None)
        job = self.submit(Job(contexts, mechanism, **kwargs))
        return self._wait(job)

    def run_jobs(self, jobs: Sequence[Job], *, max_rows: int | None = None, compile: bool | str | None = None,
                 slots: bool = True) -> Iterator[tuple[int, EngineOutput]]:
        """Run several independent jobs; yield ``(index in jobs, output)`` as each job finishes (not necessarily in
        order). Every job is checked before any runs (a bad job raises, naming its index); each runs as a fresh copy
        (:meth:`Job.fresh`), so a job may be passed again.

        Args:
            jobs: the jobs; each keeps its own mechanism, processors, randomness and ``max_new_tokens``.
            max_rows, compile: the engine's settings (see :class:`Engine`) for the pools planned during this call.
            slots: submit every job at once (they share the batch); False: one job after another.
        """
        check_max_rows(max_rows)
        compiled = None if compile is None else resolve_compile(compile, self.lm.device)
        copies = checked_copies(jobs, self.lm.context_window)
        saved = self.scheduler.max_rows, getattr(self.runner, "compile", None)
        if max_rows is not None:
            self.scheduler.max_rows = max_rows
        if compiled is not None and isinstance(self.runner, SlotRunner):
            self.runner.compile = compiled
        try:
            if not slots:
                for i, copy in enumerate(copies):
                    yield i, self._wait(self.submit(copy))
                return
            index = {id(self.submit(copy)): i for i, copy in enumerate(copies)}
            pending = set(index)
            while pending:
                for job in copies:
                    if id(job) in pending and job.status is JobStatus.FINISHED:
                        pending.discard(id(job))
                        if job.error is not None:
                            raise job.error
                        yield index[id(job)], job.output
                if pending:
                    self.step()
        finally:
            self.scheduler.max_rows = saved[0]
            if isinstance(self.runner, SlotRunner):
                self.runner.compile = saved[1]
            for job in copies:
                if job.status is not JobStatus.FINISHED:
                    self.cancel(job)


class EngineStream(Iterator[StepEvent]):
    """The events of one :meth:`Engine.stream` run; :attr:`output` holds the :class:`EngineOutput` once the stream
    is exhausted (the return value of the underlying generator).

    >>> # run = engine.stream([ids], mechanism, max_new_tokens=32, seed=0)
    >>> # tokens = [event.tokens for event in run]; run.output.finish_reasons
    """

    def __init__(self, gen: Generator[StepEvent, None, EngineOutput], result: list[EngineOutput] | None = None):
        self._gen = gen
        self._result = result
        self._output: EngineOutput | None = None

    def __iter__(self) -> EngineStream:
        return self

    def __next__(self) -> StepEvent:
        try:
            return next(self._gen)
        except StopIteration as stop:
            if self._output is None:
                self._output = stop.value
                if self._result is not None:
                    self._result.append(stop.value)
            raise

    def close(self) -> None:
        """Stop the run early (the output stays unset)."""
        self._gen.close()

    @property
    def finished(self) -> bool:
        """Whether the run has ended (and :attr:`output` is set)."""
        return self._output is not None

    @property
    def output(self) -> EngineOutput:
        """The :class:`EngineOutput` of the finished run; refused before the stream is exhausted."""
        if self._output is None:
            raise RuntimeError("the stream has not finished: iterate it to the end before reading its output")
        return self._output
