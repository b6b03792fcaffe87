"""The config base (issue 33): one merge (``Config.merged``), one reading of a request body or parsed options
(``Config.from_mapping``), one ``spelling`` for messages, and the fields a service request may set declared on the
configs (they were lists in serve/params.py)."""

from __future__ import annotations

import pytest

from dpinfer.configs.ask import AskConfig
from dpinfer.configs.protect import ProtectConfig
from dpinfer.configs.sanitize import SanitizeConfig
from dpinfer.configs.synth import SynthConfig
from dpinfer.errors import ConfigurationError, InvalidInputError

SECRET = "Zacharias Oberholzer, born 1961"


def test_the_request_fields_are_the_ones_the_server_took() -> None:
    assert set(SanitizeConfig.request_fields()) == {
        "epsilon",
        "group_epsilon",
        "groups",
        "method",
        "max_new_tokens",
        "delta",
        "alpha",
        "temperature",
        "top_k",
        "allow_untagged",
        "adjacency",
    }
    assert set(AskConfig.request_fields()) == {"mechanism", "epsilon", "delta", "max_new_tokens", "temperature"}
    assert set(SynthConfig.request_fields()) == {
        "method",
        "epsilon",
        "delta",
        "batch_size",
        "max_new_tokens",
        "max_texts",
    }
    assert set(ProtectConfig.request_fields()) == {
        "method",
        "epsilon",
        "delta",
        "n_rewrites",
        "n_keywords",
        "keywords",
        "max_new_tokens",
        "n_exemplars",
        "stage3_quorum",
    }


@pytest.mark.parametrize("config", [SanitizeConfig, AskConfig, SynthConfig, ProtectConfig])
def test_an_unknown_key_is_refused_in_one_line_without_its_name(config) -> None:
    with pytest.raises(InvalidInputError) as err:
        config.from_mapping({SECRET: 1, "unit": "u"}, allowed=config.request_fields(), extra=("unit",))
    msg = str(err.value)
    assert "\n" not in msg and SECRET not in msg and msg.startswith("1 unknown field(s); allowed: unit, ")


def test_a_value_of_the_wrong_type_names_the_type_never_the_value() -> None:
    for body, words in (
        ({"epsilon": SECRET}, "epsilon must be a number, got str"),
        ({"max_new_tokens": 2.5}, "max_new_tokens must be a number, got float"),
        ({"groups": [SECRET]}, "groups must be a dict, got list"),
        ({"allow_untagged": "yes"}, "allow_untagged must be a bool, got str"),
        ({"top_k": True}, "top_k must be int, got a boolean"),
    ):
        with pytest.raises(InvalidInputError) as err:
            SanitizeConfig.from_mapping(body)
        assert str(err.value) == words and SECRET not in str(err.value)
    with pytest.raises(InvalidInputError, match="--epsilon must be a number"):
        SynthConfig.from_mapping({"epsilon": "8"}, spelling="cli")


def test_null_keeps_the_default_words_stand_for_values_and_spelling_names_options() -> None:
    assert SanitizeConfig.from_mapping({"epsilon": None, "top_k": None}) == SanitizeConfig()
    assert ProtectConfig.from_mapping({"stage3_quorum": "all"}).stage3_quorum is None
    assert ProtectConfig.from_mapping({"stage3_quorum": 3}).stage3_quorum == 3
    with pytest.raises(ConfigurationError, match="stage3_quorum must be an integer"):
        ProtectConfig.from_mapping({"stage3_quorum": "some"})
    with pytest.raises(ConfigurationError, match=r"^--n-keywords must be"):
        ProtectConfig.from_mapping({"n_keywords": 0}, spelling="cli")
    with pytest.raises(ConfigurationError, match=r"^n_keywords must be"):
        ProtectConfig.from_mapping({"n_keywords": 0})
    assert AskConfig(spelling="cli").name("max_new_tokens") == "--max-new-tokens"
    with pytest.raises(ConfigurationError, match="spelling"):
        AskConfig(spelling="shell")


def test_merged_is_the_one_merge_and_spelling_is_not_a_setting() -> None:
    base = SynthConfig(epsilon=10)
    assert SynthConfig.merged(base, batch_size=4) == base.replace(batch_size=4)
    assert SynthConfig.merged(None) == SynthConfig() and SynthConfig.merged(base) is base
    for config in (SanitizeConfig, AskConfig, SynthConfig, ProtectConfig):
        assert "spelling" not in config.field_names() and "spelling" not in config().to_kwargs()
        with pytest.raises(ConfigurationError, match=f"unknown setting\\(s\\) for {config.__name__}: spams"):
            config.merged(None, spams=1)
    with pytest.raises(ConfigurationError, match="config must be a SynthConfig"):
        SynthConfig.merged(AskConfig())  # type: ignore[arg-type]
    cli = ProtectConfig(spelling="cli")
    assert cli == ProtectConfig() and cli.replace(n_keywords=3).spelling == "cli" and cli.api().spelling == "api"
