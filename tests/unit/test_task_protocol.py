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


def test_every_task_runs_through_perform_as_its_own_entry_point_does(tiny_lm, tmp_path) -> None:
    """plan → charge → run → finish (:func:`dpinfer.task.perform`) gives what each task's function gives, with the
    same seed; the ledger is charged the plan's ex-ante cost, once."""
    from dpinfer.accounting.ledger import Ledger
    from dpinfer.configs.protect import ProtectConfig
    from dpinfer.configs.synth import SynthConfig
    from dpinfer.generation import TASK as GENERATE
    from dpinfer.generation import GenerateInputs, GenerateSettings, generate
    from dpinfer.pipelines.protect_prompt import TASK as PROTECT
    from dpinfer.pipelines.protect_prompt import ProtectInputs, protect_prompts
    from dpinfer.pipelines.synthesize import TASK as SYNTH
    from dpinfer.pipelines.synthesize import SynthesisInputs, synthesize
    from dpinfer.runtime import Runtime
    from dpinfer.task import perform

    rt = Runtime(tiny_lm)
    got = perform(GENERATE, GenerateSettings(max_new_tokens=4, seed=3), GenerateInputs("a b c"), rt)
    assert got.token_ids == generate("a b c", lm=tiny_lm, max_new_tokens=4, seed=3).token_ids and got.guarantee

    cfg = ProtectConfig(method="dp-prompt", temperature=1.0, max_new_tokens=3)
    ledger = Ledger.init(tmp_path / "b.db", epsilon=1e9)
    (mine,) = perform(PROTECT, cfg, ProtectInputs(["where is it?"], seeds=[5]), rt, ledger=ledger, units="src")
    (theirs,) = protect_prompts(["where is it?"], cfg, runtime=rt, seeds=[5])
    assert mine.prompt == theirs.prompt and mine.guarantee.epsilon == theirs.guarantee.epsilon
    (spent,) = ledger.history("src")
    assert spent.state == "committed"

    refs = [f"record {i} text" for i in range(4)]
    synth = SynthConfig(method="invisibleink", epsilon=8.0, batch_size=2, max_new_tokens=3, seed=1)
    res = perform(SYNTH, synth, SynthesisInputs(refs), rt)
    assert [t.text for t in res.texts] == [t.text for t in synthesize(refs, synth, runtime=rt).texts]


def test_engine_run_and_stream_take_a_job_whole(tiny_lm) -> None:
    from dpinfer.engine import Engine
    from dpinfer.mechanisms.sampler import Sampler

    engine = Engine(tiny_lm)

    def job() -> Job:
        return Job(contexts=[[1, 2, 3]], mechanism=Sampler(temperature=1.0, mode="independent"), max_new_tokens=5,
                   seed=7)

    by_args = engine.generate([[1, 2, 3]], Sampler(temperature=1.0, mode="independent"), max_new_tokens=5, seed=7)
    assert engine.run(job()).sequences == by_args.sequences
    events = engine.stream(job())
    assert [e.tokens[0] for e in events][: len(by_args.sequences[0])] == by_args.sequences[0]
    assert events.output.sequences == by_args.sequences
