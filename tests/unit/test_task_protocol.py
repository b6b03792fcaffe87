"""The task protocol (:mod:`dpinfer.task`): a task's plan is a frozen :class:`Plan` holding its jobs, its ex-ante
guarantee and its charges; :meth:`Engine.run` / :meth:`Engine.stream` take a job whole."""

from __future__ import annotations

import dataclasses

import pytest

from dpinfer.accounting.charge import Charges
from dpinfer.engine import Job
from dpinfer.errors import ConfigurationError
from dpinfer.task import Plan


def test_plan_is_frozen_and_names_its_one_job() -> None:
    job = Job(contexts=[[1, 2]], mechanism=None, max_new_tokens=3)  # type: ignore[arg-type]
    plan = Plan(jobs=(job,), guarantee=None, charges=Charges(None))
    assert plan.job is job
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.jobs = ()  # type: ignore[misc]
    with pytest.raises(ValueError, match="2 jobs"):
        _ = Plan(jobs=(job, job), guarantee=None, charges=Charges(None)).job


def test_engine_stream_takes_a_job_whole_or_its_arguments_not_both() -> None:
    from dpinfer.engine.core import Engine

    engine = Engine.__new__(Engine)  # no model: the arguments are refused before anything runs
    job = Job(contexts=[[1]], mechanism=None, max_new_tokens=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="whole"):
        engine.stream(job, max_new_tokens=2)
    with pytest.raises(ConfigurationError, match="needs a job"):
        engine.stream([[1]])
