"""Every benchmark takes a typed config: the command line converts its options and calls run(config, progress)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from dpinfer.bench import engine, sanitize, synth, tagger
from dpinfer.cli import build_parser, main
from dpinfer.errors import ConfigurationError

BENCHES = {"engine": engine, "sanitize": sanitize, "synth": synth, "tagger": tagger}
CONFIGS = {"engine": engine.EngineBenchConfig, "sanitize": sanitize.SanitizeBenchConfig,
           "synth": synth.SynthBenchConfig, "tagger": tagger.TaggerBenchConfig}


@pytest.mark.parametrize("name", sorted(BENCHES))
def test_default_options_give_the_default_config(name: str) -> None:
    """The parser's defaults and the dataclass's defaults are the same settings (no drift between them)."""
    args = build_parser().parse_args(["bench", name])
    config = BENCHES[name].config_from_args(args)
    assert isinstance(config, CONFIGS[name]) and dataclasses.is_dataclass(config)
    assert config == CONFIGS[name]()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.seed = 1  # type: ignore[misc]


@pytest.mark.parametrize("name", ["engine", "sanitize", "synth"])
def test_cli_converts_the_options_and_calls_run(name: str, monkeypatch, capsys) -> None:
    seen: dict = {}

    def fake_run(config, progress=None):
        seen["config"] = config
        progress("stage")  # the spinner's update takes a stage name
        return {"settings": {}, "rows": [], "markdown": "| table |", "plot": None}

    monkeypatch.setattr(BENCHES[name], "run", fake_run)
    monkeypatch.setattr(engine, "format_markdown", lambda res: "| table |")
    assert main(["bench", name, "--repeats", "3"]) == 0
    assert seen["config"].repeats == 3
    assert capsys.readouterr().out == "| table |\n"
    assert main(["--json", "bench", name]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == []


def test_option_lists_are_parsed_and_checked_before_any_model() -> None:
    args = build_parser().parse_args(["bench", "sanitize", "--epsilons", "5,10", "--methods", "original,dp-fusion",
                                      "--top-k", "0"])
    config = sanitize.config_from_args(args)
    assert config.epsilons == (5.0, 10.0) and config.methods == ("original", "dp-fusion") and config.top_k == 0
    for bad in (["--epsilons", "a,b"], ["--methods", "nope"]):
        with pytest.raises(ConfigurationError):
            sanitize.config_from_args(build_parser().parse_args(["bench", "sanitize", *bad]))
    config = synth.config_from_args(build_parser().parse_args(["bench", "synth", "--top-k", "0", "--batch-sizes",
                                                               "2,3", "--label-fields", ""]))
    assert config.top_k is None and config.batch_sizes == (2, 3) and config.label_fields == ()
    for bad in (["--batch-sizes", "x"], ["--methods", "public,nope"]):
        with pytest.raises(ConfigurationError):
            synth.config_from_args(build_parser().parse_args(["bench", "synth", *bad]))


def test_a_bench_module_on_the_older_main_protocol_still_runs(monkeypatch, capsys) -> None:
    """Command modules written against the one-file CLI call ``_run_bench_module(name, args)`` for a bench whose
    module has ``main(args, progress)`` returning its markdown: kept working."""
    import argparse
    import sys
    import types

    from dpinfer.cli import _run_bench_module

    old = types.ModuleType("dpinfer.bench.oldstyle")
    old.main = lambda args, progress=None: {"markdown": f"| n = {args.n} |", "plot": "p.png"}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "dpinfer.bench.oldstyle", old)
    assert _run_bench_module("oldstyle", argparse.Namespace(n=2, json=False)) == 0
    assert capsys.readouterr().out == "| n = 2 |\n\nplot: p.png\n"
    assert _run_bench_module("oldstyle", argparse.Namespace(n=2, json=True)) == 0
    assert json.loads(capsys.readouterr().out)["markdown"] == "| n = 2 |"
