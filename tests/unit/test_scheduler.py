"""The scheduler on its own (no model): pool shapes from public quantities, first-fit admission in submission order,
own-cache jobs, side rows, draining for a job the pool cannot hold, slots given back."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpinfer.engine.scheduler import CAPACITY_STEP, DEFAULT_MAX_ROWS, Pool, Scheduler, bucket_capacity, public_width
from dpinfer.errors import ConfigurationError


def job(k: int, width: int | None, t_max: int = 10, lengths: list[int] | None = None) -> SimpleNamespace:
    rows = [[1] * n for n in (lengths or [width or 5] * k)]
    return SimpleNamespace(k=k, width=width, max_new_tokens=t_max, rows=rows)


def sched(**kw) -> Scheduler:
    return Scheduler(device_type="cpu", context_window=4096, **kw)


def test_pool_is_planned_from_public_quantities_and_jobs_join_first_fit():
    s = sched(max_rows=5)
    jobs = [job(3, 40), job(3, 30, t_max=100), job(2, 20), job(1, None)]
    for j in jobs:
        s.add(j)
    d = s.schedule()
    assert d.pool == Pool(slots=5, capacity=bucket_capacity(30 + 100))
    admitted = [(a.job, a.slots, a.side_rows) for a in d.admitted]
    # job 1 (3 rows) waits for slots; job 2 (2 rows) fits; the own-cache job runs beside the pool
    assert admitted == [(jobs[0], [0, 1, 2], []), (jobs[2], [3, 4], []), (jobs[3], [], [0])]
    assert s.waiting == [jobs[1]]
    s.finish(jobs[0])
    d = s.schedule()  # job 2 still runs: the pool stays
    assert d.pool is None and [(a.job, a.slots) for a in d.admitted] == [(jobs[1], [0, 1, 2])]
    assert s.free == []


def test_side_rows_are_the_rows_over_the_capacity():
    s = sched()
    j = job(3, 40, t_max=20, lengths=[40, 200, 10])
    s.add(j)
    d = s.schedule()
    assert d.pool == Pool(3, 64) and d.admitted[0].side_rows == [1]


def test_a_job_the_pool_cannot_hold_drains_it_then_the_pool_is_planned_again():
    s = sched()
    first, big, small = job(2, 30), job(4, 30, t_max=200), job(1, 10)
    s.add(first)
    assert s.schedule().pool == Pool(2, 64)
    s.add(big)
    s.add(small)
    assert s.schedule().admitted == []  # big does not fit the pool: nothing after it joins (no starvation)
    s.finish(first)
    d = s.schedule()
    assert d.pool == Pool(5, bucket_capacity(230)) and [a.job for a in d.admitted] == [big, small]


def test_fixed_rows_and_min_capacity_for_a_server():
    s = sched(max_rows=16, fixed_rows=True, min_capacity=500)
    s.add(job(2, 30))
    assert s.schedule().pool == Pool(16, bucket_capacity(500))


def test_own_cache_jobs_are_limited_and_a_runner_without_pool_has_no_pool():
    s = sched(shared_pool=False, own_cache_jobs=2)
    jobs = [job(2, 30), job(1, None), job(3, 40)]
    for j in jobs:
        s.add(j)
    d = s.schedule()
    assert d.pool is None and [(a.job, a.slots) for a in d.admitted] == [(jobs[0], []), (jobs[1], [])]
    s.finish(jobs[1])
    assert [a.job for a in s.schedule().admitted] == [jobs[2]]


def test_public_width_reads_row_zero_only_for_a_public_row():
    joint = SimpleNamespace(mode="joint", public_row=True)
    assert public_width(SimpleNamespace(mechanism=joint, pad_width=None, contexts=[[1] * 7, [2] * 99])) == 7
    assert public_width(SimpleNamespace(mechanism=joint, pad_width=50, contexts=[[1] * 7, [2] * 99])) == 50
    plain = SimpleNamespace(mode="independent", public_row=False)
    assert public_width(SimpleNamespace(mechanism=plain, pad_width=None, contexts=[[1] * 7, [2] * 99])) is None


def test_bad_max_rows():
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ConfigurationError, match="max_rows"):
            sched(max_rows=bad)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.one_of(st.none(), st.integers(1, 300)), st.integers(1, 80)),
                min_size=1, max_size=12), st.one_of(st.none(), st.integers(1, 20)))
def test_every_job_runs_slots_never_overlap_and_shapes_are_public(specs, max_rows):
    s = sched(max_rows=max_rows)
    jobs = [job(k, w, t) for k, w, t in specs]
    for j in jobs:
        s.add(j)
    done, rounds = [], 0
    while s.has_work:
        d = s.schedule()
        if d.pool is not None:
            mixed = [j for j in s.waiting + [a.job for a in d.admitted] if j.width is not None]
            assert d.pool.capacity % CAPACITY_STEP == 0
            assert d.pool.slots <= max(max(j.k for j in mixed), max_rows or DEFAULT_MAX_ROWS["cpu"])
        used = [x for j in s.running for x in s._slots[id(j)]]
        assert len(used) == len(set(used)) and set(used).isdisjoint(s.free)
        for j in list(s.running):  # every running job finishes after one round here
            s.finish(j)
            done.append(j)
        rounds += 1
        assert rounds <= 2 * len(jobs)
    assert sorted(map(id, done)) == sorted(map(id, jobs))
