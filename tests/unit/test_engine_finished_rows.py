"""Finished rows leave the decode steps (independent mode): the other rows' tokens are those of a run that computes
every row to the end, and the steps compute fewer rows (own cache and shared pool, tiny random-weight Llama)."""

from __future__ import annotations

import pytest
import torch

from dpinfer.engine import DecodeStep, Engine, Job
from dpinfer.mechanisms.base import Mechanism, StepInfo, StepResult

PROMPTS = ("The quick brown fox", "Mr Smith, a lawyer practising in London, represented the applicants.",
           "Where do you keep a violin?", "A long sentence about the weather in Ankara and the sea near it, again.")


class StopsEarly(Mechanism):
    """Greedy per row, except that row ``i`` releases EOS at step ``stops[i]`` (rows then finish at different steps)."""

    name = "stops-early"
    mode = "independent"

    def __init__(self, stops: list[int], eos: int) -> None:
        self.stops, self.eos = stops, eos

    def start(self, num_contexts: int, vocab_size: int) -> None:
        assert num_contexts == len(self.stops)

    def step(self, logits: torch.Tensor, info: StepInfo, generator) -> StepResult:
        tokens = logits.argmax(dim=-1)
        for i, stop in enumerate(self.stops):
            if info.step == stop:
                tokens[i] = self.eos
        return StepResult(tokens=tokens)


@pytest.fixture
def widths(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    seen: list[int] = []
    original = DecodeStep.__call__

    def spy(self, ids):
        seen.append(ids.shape[0])
        return original(self, ids)

    monkeypatch.setattr(DecodeStep, "__call__", spy)
    return seen


def _jobs(lm, pad_width):
    eos = min(lm.eos_token_ids)
    rows = [lm.encode(p) for p in PROMPTS]
    return [Job(contexts=rows, mechanism=StopsEarly([3, 9, 1, 6], eos), max_new_tokens=12, pad_width=pad_width),
            Job(contexts=rows[:2], mechanism=StopsEarly([5, 2], eos), max_new_tokens=12, pad_width=pad_width)]


@pytest.mark.parametrize("pad_width", [None, 40], ids=["own-cache", "pool"])
def test_finished_rows_leave_and_the_others_are_unchanged(tiny_lm, widths: list[int], pad_width) -> None:
    def run(drop: bool) -> dict[int, list[list[int]]]:
        engine = Engine(tiny_lm, compile=False)
        engine.runner.drop_finished = drop
        return {i: out.sequences for i, out in engine.run_jobs(_jobs(tiny_lm, pad_width))}

    full = run(False)
    computed_all = sum(widths)
    widths.clear()
    dropped = run(True)
    assert dropped == full
    assert [len(s) for s in dropped[0]] == [3, 9, 1, 6] and [len(s) for s in dropped[1]] == [5, 2]
    assert sum(widths) < computed_all  # the finished rows were not computed
    if pad_width is None:  # own caches: each job's step computes its unfinished rows only
        assert max(widths) == 4 and min(widths) == 1


def test_generate_drops_finished_rows_of_one_job(tiny_lm, widths: list[int]) -> None:
    eos = min(tiny_lm.eos_token_ids)
    rows = [tiny_lm.encode(p) for p in PROMPTS]
    out = Engine(tiny_lm).generate(rows, StopsEarly([2, 7, 4, 0], eos), max_new_tokens=10)
    assert [len(s) for s in out.sequences] == [2, 7, 4, 0]
    assert out.finish_reasons == ["eos"] * 4
    assert widths == [3, 3, 2, 2, 1, 1, 1]  # row 3 leaves at step 0, row 0 at 2, row 2 at 4
