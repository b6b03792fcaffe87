"""One source of defaults: the API, the command line and the checks all read dpinfer.defaults."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from dpinfer.cli import build_parser
from dpinfer.defaults import GENERATE, SANITIZE, SYNTH


def _sub(command: str):
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return action.choices[command]


def _kw_defaults(fn) -> dict:
    return {k: p.default for k, p in inspect.signature(fn).parameters.items() if p.default is not inspect._empty}


def test_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        GENERATE.temperature = 1.0  # type: ignore[misc]


def test_generate_defaults_are_the_same_in_the_api_the_cli_and_the_checks() -> None:
    from dpinfer.generation import generate, generate_many, stream
    from dpinfer.validation import check_generate_params

    want = dataclasses.asdict(GENERATE)
    for fn in (generate, generate_many, stream, check_generate_params):
        got = _kw_defaults(fn)
        assert {k: got[k] for k in want} == want, fn.__name__
    cli = vars(_sub("generate").parse_args(["x"]))
    assert {k: cli[k] for k in want} == want
    assert "(default 0.7)" in _sub("generate").format_help()


def test_sanitize_defaults_are_the_same_in_the_api_the_cli_and_the_checks() -> None:
    from dpinfer.configs.sanitize import SanitizeConfig
    from dpinfer.pipelines.sanitize_contexts import BASELINE_MAX_NEW_TOKENS
    from dpinfer.validation import check_sanitize_budget, check_sanitize_params

    api = {f.name: f.default for f in dataclasses.fields(SanitizeConfig)}  # sanitize(**options) takes its fields
    for name in ("method", "delta", "alpha", "tagger", "accounting", "adjacency"):
        assert api[name] == getattr(SANITIZE, name)
        assert vars(_sub("sanitize").parse_args(["doc.txt"]))[name] == getattr(SANITIZE, name)
    for fn in (check_sanitize_params, check_sanitize_budget):
        got = _kw_defaults(fn)
        assert all(got[k] == getattr(SANITIZE, k) for k in ("method", "delta", "alpha") if k in got)
    assert BASELINE_MAX_NEW_TOKENS == SANITIZE.whole_document_max_new_tokens == 256
    # the values the issue fixes (README, docs/sanitize.md)
    assert (SANITIZE.epsilon, SANITIZE.delta, SANITIZE.temperature, SANITIZE.top_k, SANITIZE.no_repeat_ngram) == (
        40.0, 1e-5, 0.7, 40, 3)
    text = " ".join(_sub("sanitize").format_help().split())
    for phrase in ("default 40: a per-group bound e^40", "δ (default 1e-5)", "(default 0.7)", "default 40; 0 = full",
                   "default 3; 0 = off", "a fixed 256"):
        assert phrase in text


def test_synth_defaults_are_the_same_in_the_api_the_cli_and_the_checks() -> None:
    from dpinfer.configs.synth import TEMPLATES, SynthConfig

    want = {k: v for k, v in dataclasses.asdict(SYNTH).items() if k != "template"}
    got = _kw_defaults(SynthConfig)  # dpinfer.synthesize's settings are SynthConfig's fields
    assert {k: got[k] for k in want} == want
    assert SynthConfig().template == TEMPLATES[SYNTH.template]
    cli = vars(_sub("synth").parse_args(["c.jsonl", "--text-field", "t", "--out", "o.jsonl"]))
    assert {k: cli[k] for k in want} == want
    assert cli["template"] == SYNTH.template
    assert (SYNTH.delta, SYNTH.batch_size, SYNTH.max_new_tokens, SYNTH.temperature, SYNTH.top_k) == (
        1e-6, 8, 200, 1.0, 50)
