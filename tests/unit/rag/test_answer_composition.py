"""An answer file's budget composes each answer as a session does (one place: ``compose_answer``), from the method
rebuilt through the method table out of the answer's released settings; a release whose settings do not give back
its guarantee, or that has none, composes to none."""

from __future__ import annotations

import dataclasses

from dpinfer.accounting import PrivacyAccountant
from dpinfer.configs.ask import AskConfig
from dpinfer.pipelines.rag import answer_method, compose_answer, released_answer_method


def _release(mechanism: str, **settings: object) -> dict:
    method = answer_method(AskConfig.merged(None, mechanism=mechanism, **settings))
    c = method.config
    return {"text": "…", "mechanism": mechanism, "guarantee": method.guarantee().to_dict(),
            "settings": {"mechanism": mechanism, "epsilon": None, "delta": c.delta, "max_new_tokens": c.max_new_tokens,
                         "temperature": c.temperature, "top_k": 5, **method.settings()}}


def test_a_released_answer_composes_like_the_session_that_answered_it() -> None:
    rel = _release("pad", epsilon=6.0, max_new_tokens=24)
    original = answer_method(AskConfig.merged(None, mechanism="pad", epsilon=6.0, max_new_tokens=24))
    rebuilt = released_answer_method(rel)
    assert rebuilt is not None and rebuilt.loss_event() == original.loss_event()
    session, from_file = PrivacyAccountant(), PrivacyAccountant()
    for acc, method in ((session, original), (from_file, rebuilt)):
        compose_answer(acc, method)
        compose_answer(acc, method)
    assert from_file.epsilon(1e-5) == session.epsilon(1e-5)
    seeded = dict(rel, guarantee=dict(rel["guarantee"], seeded=True))
    assert released_answer_method(seeded) is not None  # a seeded test run keeps its guarantee
    public = released_answer_method(_release("public"))
    assert public is not None and public.guarantee().epsilon == 0


def test_a_release_without_a_guarantee_or_with_other_settings_composes_to_none() -> None:
    rel = _release("pad", epsilon=6.0, max_new_tokens=24)
    tampered = dict(rel, settings=dict(rel["settings"], max_new_tokens=48))  # not the T_max it was charged for
    assert released_answer_method(tampered) is None
    assert released_answer_method(_release("static", static_sigma=1.0)) is None
    assert released_answer_method({"mechanism": "pad", "guarantee": "?", "settings": {}}) is None
    assert dataclasses.is_dataclass(released_answer_method(rel))
