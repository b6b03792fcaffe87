"""The runtime: parts given or built once on first use, a default one per process, and the older keywords resolved to
one runtime (dpinfer.runtime)."""

from __future__ import annotations

import threading

import pytest

from dpinfer.errors import ConfigurationError
from dpinfer.runtime import Runtime, default_runtime, resolve_runtime
from dpinfer.taggers import get_tagger


def test_nothing_is_built_before_it_is_asked_for() -> None:
    rt = Runtime.from_model("/no/such/model")
    assert not rt.loaded and rt.model_name == "/no/such/model"
    assert "built=[]" in repr(rt)


def test_a_model_name_is_loaded_on_first_use_and_refused_then(tmp_path) -> None:
    from dpinfer.errors import ModelNotFoundError

    rt = Runtime(str(tmp_path / "missing"))
    with pytest.raises(ModelNotFoundError):
        _ = rt.lm


def test_parts_are_built_once_and_shared(tiny_lm) -> None:
    rt = Runtime(tiny_lm, tagger="regex")
    assert rt.lm is tiny_lm and rt.loaded
    engines: list[object] = []
    threads = [threading.Thread(target=lambda: engines.append(rt.engine)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(e) for e in engines}) == 1 and rt.engine.lm is tiny_lm
    assert rt.tagger is rt.get_tagger() is rt.get_tagger("regex") and rt.tagger.name == "regex"
    assert rt.get_tagger("regex", label_map={"PERSON": "PERSON"}) is not rt.tagger  # options: a new one


def test_an_engine_brings_its_model(tiny_lm) -> None:
    from dpinfer.engine import Engine

    eng = Engine(tiny_lm)
    rt = Runtime(engine=eng)
    assert rt.lm is tiny_lm and rt.engine is eng
    with pytest.raises(ConfigurationError, match="not both"):
        Runtime(engine=eng, engine_options={"runner": "dynamic"})
    with pytest.raises(ConfigurationError, match="another model"):
        Runtime(object.__new__(type(tiny_lm)), eng)


def test_a_tagger_instance_is_kept() -> None:
    tagger = get_tagger("regex")
    rt = Runtime(tagger=tagger)
    assert rt.tagger is tagger
    with pytest.raises(ConfigurationError, match="tagger must be"):
        Runtime(tagger=3)  # type: ignore[arg-type]


def test_resolve_runtime_keeps_the_older_keywords(tiny_lm) -> None:
    assert resolve_runtime() is default_runtime() is Runtime.default()
    rt = resolve_runtime(lm=tiny_lm)
    assert rt is not default_runtime() and rt.lm is tiny_lm
    assert resolve_runtime(rt) is rt
    assert resolve_runtime(rt, lm=tiny_lm) is rt  # its own part: fine
    with pytest.raises(ConfigurationError, match="not both"):
        resolve_runtime(rt, embedder=object())
    with pytest.raises(ConfigurationError, match="must be a dpinfer Runtime"):
        resolve_runtime("nope")  # type: ignore[arg-type]
    tagged = resolve_runtime(tagger=get_tagger("regex"))
    assert tagged is not default_runtime() and tagged.tagger.name == "regex"
