"""Method entries and tables (dpinfer.methods.table) and the configs' shared base (dpinfer.configs.base)."""

from __future__ import annotations

import argparse
from dataclasses import FrozenInstanceError, dataclass

import pytest

from dpinfer.configs import Config, add_options, option
from dpinfer.errors import ConfigurationError
from dpinfer.methods import Method, MethodTable, load_target, table


def _toy(config: object, runtime: object) -> tuple[object, object]:
    return config, runtime


def test_a_table_lists_the_default_then_mechanisms_then_baselines() -> None:
    t = MethodTable("rag", [Method("b", "rag", baseline=True, guarantee="none", summary="base"),
                            Method("m1", "rag", summary="one"), Method("m2", "rag")], default="m2")
    assert t.names() == ["m2", "m1", "b"] and t.baselines() == ["b"] and t.mechanisms() == ["m2", "m1"]
    assert t.help() == "m2 (default); m1: one; b: base" and t.get("b").mechanism == "b"
    with pytest.raises(ConfigurationError, match="unknown method 'x' for rag; choose one of m2, m1, b"):
        t.get("x")
    with pytest.raises(ConfigurationError, match="already registered"):
        t.register(Method("m1", "rag", summary="another"))
    with pytest.raises(ConfigurationError, match="not 'rag'"):
        t.register(Method("s", "sanitize"))
    with pytest.raises(FrozenInstanceError):
        t.get("m1").name = "y"  # type: ignore[misc]
    with t.registered(Method("toy", "rag", summary="a toy")):
        assert "toy" in t and t.names()[-2:] == ["toy", "b"]
    assert "toy" not in t


def test_build_is_resolved_lazily_from_module_callable() -> None:
    t = MethodTable("sanitize", [Method("toy", "sanitize", build=f"{__name__}:_toy"), Method("none", "sanitize")])
    assert t.build("toy", "cfg", "rt") == ("cfg", "rt")
    assert load_target(f"{__name__}:_toy") is _toy
    with pytest.raises(ConfigurationError, match="has no builder"):
        t.build("none", None, None)
    with pytest.raises(ConfigurationError, match="module:callable"):
        load_target("no_colon")


def test_entries_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="unknown task"):
        Method("x", "nope")
    with pytest.raises(ConfigurationError, match="unknown guarantee kind"):
        Method("x", "rag", guarantee="maybe")  # type: ignore[arg-type]


def test_every_task_has_a_table_with_its_default_first() -> None:
    from dpinfer.methods import DEFAULT_METHODS, TABLE_MODULES

    for task in TABLE_MODULES:
        t = table(task)
        assert t.task == task and len(t) >= 1
        if DEFAULT_METHODS[task] in t:
            assert t.names()[0] == DEFAULT_METHODS[task]
    assert table("synth") is table("synthesize") or table("synth").names() == table("synthesize").names()


@dataclass(frozen=True)
class Toy(Config):
    epsilon: float = option(2.0, help="the ε budget")
    top_k: int | None = option(None, type=int, help="Top-k")
    greedy: bool = option(False, help="greedy decoding")
    hidden: str = option("x", cli=False)

    def __post_init__(self) -> None:
        if self.epsilon <= 0:
            raise ConfigurationError("epsilon must be > 0")


def test_config_options_come_from_the_fields() -> None:
    p = argparse.ArgumentParser()
    add_options(p, Toy)
    assert Toy.from_args(p.parse_args([])) == Toy()
    assert Toy.from_args(p.parse_args(["--epsilon", "3", "--greedy", "--top-k", "4"])) == Toy(3.0, 4, True)
    assert "--hidden" not in p.format_help() and "the ε budget" in p.format_help()
    assert Toy().replace(top_k=2).to_kwargs() == {"epsilon": 2.0, "top_k": 2, "greedy": False, "hidden": "x"}
    with pytest.raises(ConfigurationError, match="epsilon must be"):
        Toy().replace(epsilon=0)
    with pytest.raises(ConfigurationError, match="unknown setting"):
        Toy.from_kwargs({"nope": 1})
    assert Toy.from_kwargs({"nope": 1}, strict=False) == Toy()


def test_config_options_with_explicit_defaults_and_shown_defaults() -> None:
    """What ``dpinfer sanitize`` and ``dpinfer synth`` ask of add_options: every field in the namespace (the field's
    default, or the command's), ``{default}`` filled in the help, a bool as a plain ``--flag``."""

    @dataclass(frozen=True)
    class Shown(Config):
        epsilon: float = option(2.0, help="ε (default {default})")
        top_k: int | None = option(None, type=int, help="k (default {default}; 0 = none)")
        greedy: bool = option(False, help="greedy")

    p = argparse.ArgumentParser()
    add_options(p, Shown, defaults={"top_k": 0}, show=lambda v: f"<{v}>", store_true=True)
    assert vars(p.parse_args([])) == {"epsilon": 2.0, "top_k": 0, "greedy": False}
    assert vars(p.parse_args(["--greedy"]))["greedy"] is True
    with pytest.raises(SystemExit):
        p.parse_args(["--no-greedy"])
    text = " ".join(p.format_help().split())
    assert "ε (default <2.0>)" in text and "k (default <0>; 0 = none)" in text
