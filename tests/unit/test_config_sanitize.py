"""SanitizeConfig: defaults from dpinfer.defaults, every scalar checked in __post_init__ (one-line messages naming
the API or CLI spelling), the older "default" spellings read, copies that travel to worker processes, and the one
place the sanitize keyword list is written (sanitize, plan_sanitize and sanitize_many take its fields)."""

from __future__ import annotations

import dataclasses
import inspect
import pickle

import pytest

from dpinfer.configs.sanitize import FIELDS, SanitizeConfig
from dpinfer.defaults import SANITIZE
from dpinfer.errors import ConfigurationError, InvalidInputError


def test_defaults_come_from_the_defaults_module() -> None:
    cfg = SanitizeConfig()
    for name in ("method", "epsilon", "delta", "alpha", "temperature", "top_k", "no_repeat_ngram", "min_p", "tagger",
                 "accounting", "adjacency"):
        assert getattr(cfg, name) == getattr(SANITIZE, name), name
    assert cfg.max_input_tokens == SANITIZE.whole_document_max_input_tokens and cfg.max_new_tokens is None


def test_the_older_spellings_of_the_defaults_are_read() -> None:
    cfg = SanitizeConfig(epsilon=None, temperature=None, top_k="default", no_repeat_ngram="default", min_p="default")
    assert cfg == SanitizeConfig()
    off = SanitizeConfig(top_k=None, no_repeat_ngram=None, min_p=None)
    assert (off.top_k, off.no_repeat_ngram, off.min_p) == (None, None, None)


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"epsilon": -1}, "epsilon must be > 0"),
    ({"delta": 1.0}, "delta must lie strictly between 0 and 1"),
    ({"alpha": 1}, "alpha (the Rényi order) must be a finite number > 1"),
    ({"temperature": -0.1}, "temperature must be a finite number ≥ 0"),
    ({"top_k": 0}, "top_k must be an integer ≥ 1"),
    ({"max_new_tokens": True}, "max_new_tokens must be an integer ≥ 1"),
    ({"seed": -3}, "seed must be an integer ≥ 0"),
    ({"accounting": "nope"}, "unknown accounting 'nope'"),
    ({"adjacency": "replace-one", "accounting": "as_published"}, "use accounting 'dpinfer'"),
    ({"min_p": 0}, "min_p must lie in (0, 1]"),
    ({"group_epsilon": {"PERSON": 0}}, "the ε of group PERSON must be > 0"),
])
def test_every_scalar_is_checked(kwargs: dict, needle: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        SanitizeConfig(**kwargs)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_cli_spelling_and_shape_checks() -> None:
    with pytest.raises(ConfigurationError, match="--max-new-tokens must be"):
        SanitizeConfig(max_new_tokens=0, spelling="cli")
    with pytest.raises(InvalidInputError, match="must list its labels"):
        SanitizeConfig(groups={"ID": "PERSON"})


def test_frozen_copied_and_picklable() -> None:
    given = {"ID": ["PERSON", "CODE"]}
    cfg = SanitizeConfig(groups=given, group_epsilon={"ID": 12})
    given["ID"].append("LOC")
    assert cfg.groups == {"ID": ("PERSON", "CODE")} and cfg.group_epsilon == {"ID": 12.0}
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.epsilon = 1.0  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(cfg)) == cfg  # corpus workers (Ray) receive it
    assert cfg.replace(epsilon=20).epsilon == 20.0 and cfg.epsilon == SANITIZE.epsilon


def test_build_refuses_unknown_options_and_the_pipelines_take_the_fields() -> None:
    with pytest.raises(ConfigurationError, match=r"unknown setting.*spams"):
        SanitizeConfig.merged(spams=[])
    assert SanitizeConfig.merged(SanitizeConfig(epsilon=12), delta=1e-6) == SanitizeConfig(epsilon=12, delta=1e-6)
    from dpinfer.pipelines.sanitize import plan_sanitize, sanitize
    from dpinfer.pipelines.sanitize_many import sanitize_many

    for fn in (sanitize, plan_sanitize, sanitize_many):  # the keyword list is the config's, written once
        params = inspect.signature(fn).parameters
        assert "config" in params and not set(FIELDS) & set(params), fn.__name__
