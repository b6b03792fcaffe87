"""Adding a method to RAG is its module (tests/unit/rag/toy_rag_method.py) plus one table entry: the pipeline, its
checks and its session accountant take it from there, on the tiny model and a tiny store."""

from __future__ import annotations

import math

import pytest
import toy_rag_method

from dpinfer.errors import ConfigurationError
from dpinfer.methods import method_names
from dpinfer.methods.rag import TABLE
from dpinfer.methods.table import Method
from dpinfer.pipelines.rag import PrivateRAG


@pytest.fixture
def toy_entry():
    entry = TABLE.register(Method("first-document", "rag", mechanism="sampler", build=toy_rag_method.build,
                                  contexts="retrieved", protects="nothing", guarantee="none", baseline=True,
                                  summary="the first retrieved document only (no guarantee)"))
    yield entry
    TABLE.unregister(entry.name)


def test_a_toy_method_is_one_table_entry(tmp_path, tiny_lm, embedder, docs, toy_entry):
    assert "first-document" in method_names("rag") and "first-document:" in TABLE.help()
    rag = PrivateRAG(tmp_path / "s", lm=tiny_lm, embedder=embedder, top_k=3, top_n=2, max_doc_tokens=24, ledger=None)
    rag.add(docs)
    ans = rag.ask("I cough at night and wheeze.", mechanism="first-document", max_new_tokens=4, seed=0)
    full = rag.ask("I cough at night and wheeze.", mechanism="none", max_new_tokens=4, seed=0)
    assert len(ans.doc_ids) == 1 and ans.doc_ids == full.doc_ids[:1]  # the toy's selection, through the pipeline
    assert ans.settings["documents_shown"] == 1 and ans.settings["mechanism"] == "first-document"
    assert math.isinf(ans.guarantee.epsilon) and 0 < ans.tokens <= 4
    assert ans.release()["mechanism"] == "first-document"
    assert math.isinf(rag.session_guarantee().epsilon) and rag.answers == 2  # composed: no guarantee voids it
    with pytest.raises(ConfigurationError, match="applies to pad"):
        rag.ask("Why?", mechanism="first-document", epsilon=4.0)  # the base runner's knob check


def test_an_unregistered_method_is_refused(tmp_path, embedder):
    rag = PrivateRAG(tmp_path / "s", lm="/no/such/model", embedder=embedder)
    with pytest.raises(ConfigurationError, match="unknown method 'first-document'"):
        rag.ask("Why?", mechanism="first-document")
