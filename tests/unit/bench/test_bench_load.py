"""``dpinfer bench load``: fresh processes, stage by stage, the median printed with the machine's load."""

from __future__ import annotations

import pytest

from dpinfer.bench import load
from dpinfer.errors import ConfigurationError


def test_runs_must_be_positive() -> None:
    with pytest.raises(ConfigurationError, match="--runs"):
        load.LoadBenchConfig(runs=0)


@pytest.mark.full
def test_one_run_measures_every_stage_in_a_fresh_process(tiny_model_dir) -> None:
    res = load.run(load.LoadBenchConfig(runs=1, model=str(tiny_model_dir), device="cpu", compare=True))
    (only,) = res["runs"]
    assert [s["stage"] for s in only["stages"]] == [*load.STAGES, load.REST]
    assert all(s["wall"] > 0 and s["cpu"] >= 0 for s in only["stages"])
    # the rest is the interpreter's start and exit: the stages add up to the whole process
    assert sum(s["wall"] for s in only["stages"]) == pytest.approx(only["wall"])
    assert sum(s["cpu"] for s in only["stages"]) == pytest.approx(only["cpu"])
    text = load.render(res)
    assert "median of 1 runs" in text and "load_model()" in text and f"{only['wall']:.2f}" in text
    assert "paused until the model is ready" in text and "every packed copy made during the load" in text
    assert [s["stage"] for s in res["baseline"]["stages"]] == [*load.STAGES, load.REST]
    assert "against the baseline" in text
    assert only["backend"] == "own" and res["backend"] == "own"
    assert res["import_torch"]["median"]["wall"] > 0 and 'python -c "import torch" alone' in text
    assert "whole process against importing torch alone" in text
