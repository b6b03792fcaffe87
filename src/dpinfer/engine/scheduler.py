"""Admission: which waiting jobs join the batch at the next step, where their rows go, and the batch's shapes.

Plain Python on public quantities (no model, no tensors); :class:`~dpinfer.engine.runner.SlotRunner` allocates what
it decides. Two kinds of jobs:

* **mixed** jobs have a *public width* (:func:`public_width`): ``max(len(row 0), pad_width)`` when the mechanism has
  a public row 0 (:attr:`Mechanism.public_row <dpinfer.mechanisms.base.Mechanism.public_row>`, K > 1), else
  ``pad_width``. They share one batch of ``S`` row slots (the *pool*) whose cache holds ``C`` positions per slot.
* **own-cache** jobs (no public width: the batch shapes would otherwise depend on a private length) decode in a cache
  of their own, beside the pool, never mixed with other jobs' rows.

Privacy rules for batching (rule 2, across jobs)
------------------------------------------------
* **Public shapes.** ``S`` and ``C`` are planned when no mixed job is running, from the waiting mixed jobs' K, public
  widths and ``max_new_tokens`` (and the settings): ``S = max(largest K, min(total K, max_rows))`` (``max_rows`` alone
  with ``fixed_rows``), ``C`` = the largest ``width + max_new_tokens`` rounded up to a multiple of
  :data:`CAPACITY_STEP`. Jobs join first fit, in submission order, and leave after a released token (EOS, ``T_max``)
  or their mechanism's stop: the batch composition over time is a function of public parameters and DP releases.
* **Side rows.** A private row whose length plus ``T_max`` exceeds ``C`` keeps its slot as an idle filler (same
  shapes) and is decoded in a side batch of its own job (:meth:`Scheduler.side_rows`); whether a row fits changes
  nothing any other row computes.
* A waiting mixed job the pool cannot hold (more rows than ``S``, or ``width + max_new_tokens > C``) stops further
  admissions until the pool drains; the pool is then planned again (a public decision: K, widths, ``T_max``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dpinfer.errors import ConfigurationError

CAPACITY_STEP = 64
"""The shared cache capacity is rounded up to a multiple of this (fewer compiled shapes across calls)."""

DEFAULT_MAX_ROWS = {"cpu": 64, "cuda": 144}
"""Default slot count per device type (capped by the jobs' total K, at least the largest K). CPU: 8 TAB documents
(DP-Fusion, 7 rows each) through ``sanitize_many`` on the embedded model took 63 s with 64 slots against 91 s with
16 on an idle 2-core machine; ``dpinfer bench sanitize --corpus 8 --repeats 2``: 2.24× one by one with 64."""

OWN_CACHE_JOBS = 4
"""Own-cache jobs decoded at once beside the pool (each is one more forward per step)."""


def bucket_capacity(need: int) -> int:
    """The cache capacity for ``need`` positions, rounded up to a multiple of :data:`CAPACITY_STEP`.

    >>> bucket_capacity(1), bucket_capacity(64), bucket_capacity(65)
    (64, 64, 128)
    """
    return -(-need // CAPACITY_STEP) * CAPACITY_STEP


def public_width(job: Any, rows: Sequence[Sequence[int]] | None = None) -> int | None:
    """The job's public width (module docstring); ``None``: the job decodes in a cache of its own.

    Reads the length of row 0 only when the mechanism declares it public."""
    rows = job.contexts if rows is None else rows
    mech = job.mechanism
    if mech.mode == "joint" and len(rows) > 1 and mech.public_row:
        return max(len(rows[0]), job.pad_width or 0)
    return job.pad_width


def check_max_rows(max_rows: int | None) -> int | None:
    if max_rows is not None and (isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1):
        raise ConfigurationError(f"max_rows must be an integer ≥ 1 or None, got {max_rows!r}")
    return max_rows


@dataclass(frozen=True)
class Pool:
    """The shared batch's shapes: ``slots`` rows × ``capacity`` cache positions."""

    slots: int
    capacity: int


@dataclass
class Admission:
    """One job admitted: its pool slots (``[]`` for an own-cache job) and the rows decoded outside the pool."""

    job: Any
    slots: list[int]
    side_rows: list[int]


@dataclass
class Decision:
    """What :meth:`Scheduler.schedule` decided for the next step: the pool planned now (None: the running one stays),
    the admissions."""

    pool: Pool | None
    admitted: list[Admission] = field(default_factory=list)


class Scheduler:
    """First-fit admission of submitted jobs into a pool of row slots (module docstring).

    Args:
        device_type: picks the default slot count (:data:`DEFAULT_MAX_ROWS`).
        context_window: the model's positions (caps the capacity).
        max_rows: slot count (public), or None for the device default.
        fixed_rows: ``S = max_rows`` (or the default) whatever the waiting jobs' total K (a server: jobs that arrive
            later join the running batch instead of waiting for it to drain).
        min_capacity: the least capacity planned (a server: room for longer jobs that arrive later).
        shared_pool: False for a runner without a pool (every job in its own cache).
        own_cache_jobs: own-cache jobs running at once.
    """

    def __init__(self, *, device_type: str, context_window: int, max_rows: int | None = None,
                 fixed_rows: bool = False, min_capacity: int = 0, shared_pool: bool = True,
                 own_cache_jobs: int = OWN_CACHE_JOBS) -> None:
        self.device_type = device_type
        self.context_window = context_window
        self.max_rows = check_max_rows(max_rows)
        self.fixed_rows = fixed_rows
        self.min_capacity = min_capacity
        self.shared_pool = shared_pool
        self.own_cache_jobs = own_cache_jobs
        self.waiting: list[Any] = []
        self.running: list[Any] = []
        self.pool: Pool | None = None
        self.free: list[int] = []
        self._slots: dict[int, list[int]] = {}

    def add(self, job: Any) -> None:
        self.waiting.append(job)

    def mixed(self, job: Any) -> bool:
        return self.shared_pool and job.width is not None

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def plan(self, jobs: Sequence[Any]) -> Pool:
        """The pool for these mixed jobs (public quantities only)."""
        largest = max(j.k for j in jobs)
        default = self.max_rows or DEFAULT_MAX_ROWS.get(self.device_type, DEFAULT_MAX_ROWS["cpu"])
        slots = max(largest, default if self.fixed_rows else min(sum(j.k for j in jobs), default))
        need = max(self.min_capacity, *(j.width + j.max_new_tokens for j in jobs))
        capacity = min(bucket_capacity(need), max(need, self.context_window))
        return Pool(slots, capacity)

    def fits(self, job: Any) -> bool:
        """Whether the current pool can ever hold ``job``."""
        pool = self.pool
        return pool is not None and job.k <= pool.slots and job.width + job.max_new_tokens <= pool.capacity

    def side_rows(self, job: Any) -> list[int]:
        """A mixed job's rows too long for the pool's capacity (decoded in a side batch of their own job)."""
        room = self.pool.capacity - job.max_new_tokens
        return [i for i, r in enumerate(job.rows) if len(r) > room]

    def schedule(self) -> Decision:
        """Admit what fits, in submission order (module docstring)."""
        decision = Decision(pool=None)
        mixed_waiting = [j for j in self.waiting if self.mixed(j)]
        if mixed_waiting and not any(self.mixed(j) for j in self.running):
            decision.pool = self.pool = self.plan(mixed_waiting)
            self.free = list(range(self.pool.slots))
        own = sum(not self.mixed(j) for j in self.running)
        blocked = False
        for job in list(self.waiting):
            if self.mixed(job):
                if blocked or not self.fits(job):
                    blocked = True  # drain the pool, then plan it again
                    continue
                if job.k > len(self.free):
                    continue
                slots, self.free = self.free[:job.k], self.free[job.k:]
                decision.admitted.append(Admission(job, slots, self.side_rows(job)))
            else:
                if own >= self.own_cache_jobs:
                    continue
                own += 1
                decision.admitted.append(Admission(job, [], list(range(job.k))))
            self.waiting.remove(job)
            self.running.append(job)
            self._slots[id(job)] = decision.admitted[-1].slots
        return decision

    def finish(self, job: Any) -> None:
        """A job has left: its slots are free again."""
        self.running.remove(job)
        slots = self._slots.pop(id(job))
        if slots:
            self.free = sorted(self.free + slots)

    def cancel(self, job: Any) -> None:
        """Forget a job that never started."""
        if job in self.waiting:
            self.waiting.remove(job)
