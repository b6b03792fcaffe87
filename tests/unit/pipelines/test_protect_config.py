"""ProtectConfig and the prompt method table: settings checked when the config is made (no model), messages spelled
for the API or the command line, the methods read from the table, unknown settings refused like any keyword."""

from __future__ import annotations

import dataclasses

import pytest

from dpinfer.configs.protect import ProtectConfig
from dpinfer.defaults import PROTECT
from dpinfer.errors import ConfigurationError
from dpinfer.methods import method_names, table
from dpinfer.pipelines import protect_prompt as pp


def test_defaults_come_from_defaults_py() -> None:
    c = ProtectConfig()
    for f in dataclasses.fields(c):
        if hasattr(PROTECT, f.name) and f.name not in ("n_rewrites", "temperature"):  # None: the method decides
            assert getattr(c, f.name) == getattr(PROTECT, f.name), f.name
    assert c.n_rewrites is None and c.epsilon is None and c.temperature is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.delta = 0.1  # type: ignore[misc]


@pytest.mark.parametrize(("settings", "match"), [
    ({"epsilon": 1.0, "temperature": 1.0}, "exactly one of epsilon or temperature"),
    ({"epsilon": 0.0}, "epsilon must be > 0"),
    ({"keywords": "tfidf"}, "keywords method"),
    ({"suppress": "filter"}, "suppress"),
    ({"n_exemplars": 0}, "n_exemplars"),
    ({"stage3_int8": "yes"}, "stage3_int8"),
    ({"stage3_quorum": 0}, "stage3_quorum must be an integer ≥ 1"),
    ({"stage3_quorum": True}, "stage3_quorum"),
    ({"stage3_quorum": "3"}, "stage3_quorum"),
    ({"max_input_tokens": 0}, "max_input_tokens"),
    ({"delta": 1.0}, "delta"),
])
def test_bad_settings_are_refused_when_the_config_is_made(settings: dict, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        ProtectConfig(**settings)


def test_messages_are_spelled_for_the_command_line() -> None:
    with pytest.raises(ConfigurationError, match="--n-rewrites"):
        ProtectConfig(n_rewrites=0, spelling="cli")
    with pytest.raises(ConfigurationError, match="drop --n-rewrites or use --method dp-gtr"):
        pp.method_for(ProtectConfig(method="dp-prompt", n_rewrites=4, spelling="cli"))


def test_the_methods_are_the_table() -> None:
    assert method_names("protect-prompt") == ["dp-gtr", "dp-prompt"] == list(pp.METHODS)
    assert table("prompt").baselines() == ["dp-prompt"]
    assert pp.method_for(ProtectConfig()).rewrites == PROTECT.n_rewrites
    assert pp.method_for(ProtectConfig(method="dp-prompt")).rewrites == 1
    with pytest.raises(ConfigurationError, match="unknown method 'dp-fusion'"):
        pp.method_for(ProtectConfig(method="dp-fusion"))
    assert pp.method_for(ProtectConfig(method="dp-gtr", n_rewrites=3)).rewrites == 3


def test_keywords_override_a_config_and_unknown_ones_are_refused() -> None:
    base = ProtectConfig(temperature=0.5)
    assert ProtectConfig.merged(base, n_exemplars=1) == base.replace(n_exemplars=1)
    assert ProtectConfig.merged(None) == ProtectConfig()
    with pytest.raises(ConfigurationError, match=r"unknown setting.*top_k"):
        ProtectConfig.merged(base, top_k=50)
    with pytest.raises(ConfigurationError, match="ProtectConfig"):
        ProtectConfig.merged({"temperature": 0.5})  # type: ignore[arg-type]
