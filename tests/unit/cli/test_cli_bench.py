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


def test_every_manifest_entry_is_a_sub_command_with_the_bench_protocol(capsys) -> None:
    """``dpinfer bench`` is built from the manifest alone: each entry's module has the protocol's members (checked
    here, not guessed at run time) and its sub-command's --help shows its description."""
    from dpinfer.bench.harness import MANIFEST, Bench

    names = [e.name for e in MANIFEST]
    assert names == ["engine", "sanitize", "synth", "serving", "quality", "utility", "tagger", "rag", "gtr", "load",
                     "ledger", "serve"]
    for e in MANIFEST:
        bench = e.load()
        for member in ("DESCRIPTION", *(n for n in vars(Bench) if not n.startswith("_"))):
            assert hasattr(bench, member), (e.name, member)
        with pytest.raises(SystemExit) as exit_:
            main(["bench", e.name, "--help"])
        assert exit_.value.code == 0
        out = capsys.readouterr().out
        assert f"dpinfer bench {e.name}" in out and bench.DESCRIPTION.split()[0] in out


def test_a_bench_added_to_the_manifest_is_run_through_its_protocol(monkeypatch, capsys) -> None:
    """A toy benchmark: one module and one manifest entry give ``dpinfer bench toy`` (options, config, run, render,
    --json without the Markdown)."""
    import argparse
    import sys
    import types

    from dpinfer.bench import harness

    toy = types.ModuleType("dpinfer_toy_bench")
    toy.DESCRIPTION = "A toy benchmark."  # type: ignore[attr-defined]
    toy.add_arguments = lambda p: p.add_argument("--n", type=int, default=1)  # type: ignore[attr-defined]
    toy.config_from_args = lambda args: {"n": args.n}  # type: ignore[attr-defined]
    toy.run = lambda config, progress=None: {"n": config["n"], "markdown": f"| n = {config['n']} |"}  # type: ignore
    toy.render = lambda res: res["markdown"]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "dpinfer_toy_bench", toy)
    monkeypatch.setattr(harness, "MANIFEST", (*harness.MANIFEST, harness.BenchEntry("toy", "dpinfer_toy_bench",
                                                                                   "a toy")))
    monkeypatch.setattr("dpinfer.cli.bench.MANIFEST", harness.MANIFEST)
    assert main(["bench", "toy", "--n", "2"]) == 0
    assert capsys.readouterr().out == "| n = 2 |\n"
    assert main(["--json", "bench", "toy"]) == 0
    assert json.loads(capsys.readouterr().out) == {"n": 1}
    from dpinfer.cli.bench import run_bench

    assert run_bench("toy", argparse.Namespace(n=3, json=False)) == 0
    assert capsys.readouterr().out == "| n = 3 |\n"
