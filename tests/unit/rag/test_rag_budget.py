"""A store's answers charged to its own ledger: the budget holds across objects and processes, the composition agrees
with the session guarantee, baselines without a guarantee are refused, the CLI refuses before the model loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpinfer.accounting import Zcdp
from dpinfer.accounting.calibration import Budget, Spec
from dpinfer.accounting.ledger import Ledger
from dpinfer.defaults import RAG
from dpinfer.errors import BudgetExceededError
from dpinfer.mechanisms.pad import Pad
from dpinfer.pipelines.rag import PrivateRAG

QUESTION = "What helps a migraine?"


def _rag(path: Path, lm, embedder, docs, **kw) -> PrivateRAG:
    rag = PrivateRAG(path, lm=lm, embedder=embedder, top_k=3, top_n=2, max_doc_tokens=24, **kw)
    rag.add(docs)
    return rag


def test_the_store_keeps_its_ledger_beside_it_and_the_budget_holds_across_objects(tmp_path, tiny_lm, embedder,
                                                                                  docs) -> None:
    store = tmp_path / "s"
    rag = _rag(store, tiny_lm, embedder, docs)
    a = rag.ask(QUESTION, epsilon=8.0, max_new_tokens=4, seed=0)
    rag.ask(QUESTION, epsilon=8.0, max_new_tokens=4, seed=1)
    ledger = Ledger(store / "budget.db")
    status = ledger.status("store")
    assert (status.releases, status.scope, status.epsilon) == (2, "store", RAG.store_epsilon)
    rho = Pad.calibrated(Budget(8.0, 1e-5), Spec(4)).rho(4)
    assert status.spent == Zcdp(2 * rho).to_epsilon(1e-5) == rag.session_guarantee().epsilon
    assert a.guarantee.epsilon <= 8.0
    ledger.set_budget("store", epsilon=(Zcdp(3 * rho).to_epsilon(1e-5) + Zcdp(4 * rho).to_epsilon(1e-5)) / 2)
    other = PrivateRAG(store, lm=tiny_lm, embedder=embedder, top_k=3, top_n=2, max_doc_tokens=24)  # "a new process"
    other.ask(QUESTION, epsilon=8.0, max_new_tokens=4, seed=2)

    def no_generation(*args: object, **kwargs: object) -> None:
        raise AssertionError("generated although refused")

    other._engine = type("NoEngine", (), {"generate": no_generation})()
    with pytest.raises(BudgetExceededError, match="unit 'store'"):
        other.ask(QUESTION, epsilon=8.0, max_new_tokens=4, seed=3)
    assert [c.state for c in ledger.history("store")] == ["committed"] * 3


def test_a_baseline_without_guarantee_is_refused_unless_no_ledger(tmp_path, tiny_lm, embedder, docs) -> None:
    rag = _rag(tmp_path / "s", tiny_lm, embedder, docs)
    with pytest.raises(BudgetExceededError, match="no privacy guarantee"):
        rag.ask(QUESTION, mechanism="none", max_new_tokens=4, seed=0)
    assert rag.ask(QUESTION, mechanism="public", max_new_tokens=4, seed=0).guarantee.epsilon == 0.0
    assert rag.ask(QUESTION, mechanism="none", max_new_tokens=4, seed=0, ledger=None).text is not None
    status = Ledger(tmp_path / "s" / "budget.db").status("store")
    assert (status.releases, status.spent) == (1, 0.0)  # the public answer costs nothing


def test_ask_many_charges_each_answer_and_reports_the_refused(tmp_path, tiny_lm, embedder, docs) -> None:
    ledger = Ledger.init(tmp_path / "b.db")
    rho = Pad.calibrated(Budget(8.0, 1e-5), Spec(4)).rho(4)
    ledger.set_budget("tenant", epsilon=(Zcdp(2 * rho).to_epsilon(1e-5) + Zcdp(3 * rho).to_epsilon(1e-5)) / 2)
    rag = _rag(tmp_path / "s", tiny_lm, embedder, docs, ledger=ledger, unit="tenant")
    got = {i: (ans, err) for i, ans, err in rag.ask_many(["q one?", "q two?", "q three?"], epsilon=8.0,
                                                          max_new_tokens=4, seed=0)}
    assert [got[i][0] is not None for i in range(3)] == [True, True, False]
    assert "budget exceeded for unit 'tenant'" in got[2][1]
    assert [c.state for c in ledger.history("tenant")] == ["committed", "committed"]
    assert not (tmp_path / "s" / "budget.db").exists()  # the given ledger, not the store's


def test_cli_rag_ask_is_refused_before_the_model_loads(model_gate, tmp_path, tiny_model_dir, embedder, docs, capsys,
                                                       monkeypatch) -> None:
    from dpinfer.cli import main

    store = tmp_path / "s"
    _rag(store, None, embedder, docs)
    Ledger.init(store / "budget.db").set_budget("store", epsilon=1.0)  # less than one answer at ε = 8

    model_gate.forbid()
    assert main(["rag", "ask", str(store), QUESTION, "--epsilon", "8", "--max-new-tokens", "4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dpinfer: error: budget exceeded for unit 'store': budget ε = 1 ") and err.count("\n") == 1
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"id": "a", "question": QUESTION}) + "\n")
    assert main(["rag", "ask", str(store), "--questions", str(questions), "--out", str(tmp_path / "o.jsonl"),
                 "--epsilon", "8", "--max-new-tokens", "4"]) == 2
    assert "budget exceeded for unit 'store'" in capsys.readouterr().err
    assert Ledger(store / "budget.db").history("store") == []  # a refused spend leaves no row
