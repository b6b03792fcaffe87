"""Releases charged to a privacy-budget ledger: reserved before the model loads, settled to the exact guarantee,
committed after the release, cancelled when nothing was released."""

from __future__ import annotations

from pathlib import Path

import pytest

import dpinfer.generation
from dpinfer.accounting.costs import Cost, composed_epsilon
from dpinfer.accounting.dp_fusion import conversion_cost
from dpinfer.accounting.ledger import Ledger
from dpinfer.errors import BudgetExceededError, LedgerError
from dpinfer.pipelines.sanitize import sanitize
from dpinfer.taggers import Span

DOC = "Mr Smith, a lawyer practising in London, lodged application no. 36244/06 on 20 May 1998."
SPANS = [Span(3, 8, "PERSON"), Span(33, 39, "LOC"), Span(64, 72, "CODE"), Span(76, 87, "DATETIME")]


def _no_model(*args: object, **kwargs: object) -> None:
    raise AssertionError("the model was loaded")


def test_sanitize_charges_the_document_per_group_and_refuses_before_the_model_loads(tiny_lm, tmp_path: Path,
                                                                                    monkeypatch) -> None:
    ledger = Ledger.init(tmp_path / "b.db")
    unit = ledger.unit_for_text(DOC)
    c = conversion_cost(2.0, 1e-5)
    two = 2 * (20.0 - c) + c  # two rewrites at ε = 20 per group compose at α = 2
    ledger.set_budget(unit, epsilon=two + 1.0)
    kw = dict(lm=tiny_lm, spans=SPANS, epsilon=20.0, max_new_tokens=4, seed=0, ledger=ledger)
    first = sanitize(DOC, **kw)
    assert "budget" not in first.to_dict()["settings"]  # the release says nothing about the ledger
    sanitize(DOC, **kw)
    status = ledger.status(unit)
    assert (status.releases, status.pending, status.scope) == (2, 0, "document")
    assert set(status.groups) == {"PERSON", "LOC", "CODE", "DATETIME"}
    exact = composed_epsilon([Cost.of(first.guarantee)] * 2, 1e-5)
    assert status.groups == exact and status.spent <= two + 1e-9
    assert ledger.history(unit)[0].parameters["T_max"] == 4  # settled to the planned guarantee
    monkeypatch.setattr(dpinfer.generation, "resolve_lm", _no_model)
    with pytest.raises(BudgetExceededError, match=f"unit '{unit}'"):
        sanitize(DOC, **{**kw, "lm": "no-such-model"})
    assert [c.state for c in ledger.history(unit)] == ["committed", "committed"]


def test_sanitize_cancels_when_generation_fails(tiny_lm, tmp_path: Path, monkeypatch) -> None:
    import dpinfer.engine

    ledger = Ledger.init(tmp_path / "b.db", epsilon=1000.0)

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("engine failure")

    monkeypatch.setattr(dpinfer.engine.Engine, "stream", broken)
    with pytest.raises(RuntimeError):
        sanitize(DOC, lm=tiny_lm, spans=SPANS, max_new_tokens=4, ledger=ledger, unit="case-1")
    assert [c.state for c in ledger.history("case-1")] == ["cancelled"]


def test_a_unit_without_a_ledger_and_original_on_a_ledger_are_refused(tiny_lm, tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match="without a ledger"):
        sanitize(DOC, lm=tiny_lm, spans=SPANS, max_new_tokens=4, unit="case-1")
    ledger = Ledger.init(tmp_path / "b.db", epsilon=1000.0)
    with pytest.raises(BudgetExceededError, match="costs ε = ∞"):
        sanitize(DOC, lm=tiny_lm, method="original", max_new_tokens=4, ledger=ledger, unit="case-1")


def test_protect_prompt_and_synthesize_charge_their_units(tiny_lm, tmp_path: Path) -> None:
    from dpinfer.pipelines.protect_prompt import protect_prompt
    from dpinfer.pipelines.synthesize import synthesize

    ledger = Ledger.init(tmp_path / "b.db", epsilon=1000.0)
    res = protect_prompt("What is a kettle for?", lm=tiny_lm, method="dp-prompt", epsilon=500.0, max_new_tokens=4,
                         seed=0, ledger=ledger, unit="alice")
    [charge] = ledger.history("alice")
    assert (charge.state, ledger.status("alice").scope) == ("committed", "prompt-source")
    assert charge.epsilon == pytest.approx(res.guarantee.epsilon, rel=1e-9)  # settled to the exact loss
    with pytest.raises(LedgerError, match="needs unit="):
        protect_prompt("What is a kettle for?", lm=tiny_lm, method="dp-prompt", epsilon=500.0, ledger=ledger)
    texts = synthesize(["one review", "two reviews", "three reviews", "four"], lm=tiny_lm, epsilon=6.0,
                       batch_size=2, max_new_tokens=3, seed=0, ledger=ledger, unit="corpus-1")
    [run] = ledger.history("corpus-1")
    assert (run.state, run.mechanism, ledger.status("corpus-1").scope) == ("committed", "invisibleink", "corpus")
    assert run.epsilon == texts.guarantee.loss.to_epsilon(1e-5)  # at the unit's δ, not the release's 1e-6
    synthesize(["one review", "two reviews", "three reviews", "four"], lm=tiny_lm, epsilon=6.0, batch_size=2,
               max_new_tokens=3, seed=0, ledger=ledger, unit="corpus-1", skip_batches={0})
    assert len(ledger.history("corpus-1")) == 1  # a resumed run is not charged again


def test_ledger_charges_hook_reserves_prices_commits_and_takes_over_after_a_kill(tmp_path: Path) -> None:
    from dpinfer.accounting import Zcdp
    from dpinfer.accounting.charge import RecordCharges

    ledger = Ledger.init(tmp_path / "b.db", epsilon=100.0)
    bound = Cost.of(Zcdp(1.0))
    exact = Zcdp(0.25)

    def hook() -> RecordCharges:
        return RecordCharges(ledger, job="/jobs/out.jsonl", scope="document", mechanism="dp-fusion",
                             unit_of=lambda key: f"doc-{key}", bound_of=lambda key: bound)

    first = hook()
    a, b, c = first.open("1"), first.open("2"), first.open("3")
    first.price("1", exact)
    first.close(a, released=True)  # record 1's line is durable
    first.price("2", exact)
    # the run is killed here: record 2 planned and pending, record 3 reserved only
    resumed = hook()
    b2, c2 = resumed.open("2"), resumed.open("3")
    assert (b2.charge.id, c2.charge.id) == (b.charge.id, c.charge.id)  # taken over, not reserved twice
    resumed.price("2", exact)
    resumed.close(b2, released=True)
    resumed.close(c2, released=True)  # released without being priced (a torn line): the bound
    resumed.close(resumed.open("4"), released=False)  # an error record: nothing released
    spent = {u.unit: (u.releases, u.pending, u.spent) for u in ledger.units()}
    assert spent == {"doc-1": (1, 0, exact.to_epsilon(1e-5)), "doc-2": (1, 0, exact.to_epsilon(1e-5)),
                     "doc-3": (1, 0, Zcdp(1.0).to_epsilon(1e-5)), "doc-4": (0, 0, 0.0)}
