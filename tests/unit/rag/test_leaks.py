"""What a user's run releases beyond the answer, through the CLI as a user runs it: no timing or other field that
depends on the input next to a release; the context window checked from public settings when a question is planned;
pad-as-published's noise knob never called ε; a NaN in one private row ends nothing; the membership caveat."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch

import dpinfer.eval.embeddings
from dpinfer.accounting.calibration import Budget, Spec
from dpinfer.cli import main
from dpinfer.errors import ContextTooLongError, InvalidInputError
from dpinfer.mechanisms.base import StepInfo
from dpinfer.mechanisms.pad import Pad
from dpinfer.mechanisms.randomness import SeededRandom
from dpinfer.pipelines.rag import PrivateRAG
from dpinfer.release import check_release
from dpinfer.taggers import Span

RELEASE = {"text", "tokens", "finish_reason", "generated_tokens"}
"""The release itself and what is read off it."""
OTHER_DOCS = [
    "Mr Smith, a lawyer practising in London, was born in 1970 and lives in Izmir with his family and dog.",
    "The quick brown fox jumps over the lazy dog. Numbers 0123456789 and symbols /.,;:!?()-",
    "On 20 May 1998 the Court decided to communicate the application to the Government of Turkey.",
]
LONG = " ".join(["The applicant was born in 1970 and lives in Izmir, and the Court decided on 20 May 1998."] * 40)


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Paths where two JSON values differ (keys or values), the release's own fields excepted."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path}: keys {sorted(set(a) ^ set(b))}"]
        return [d for k in a if k not in RELEASE for d in _differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


@pytest.fixture
def offline_embedder(monkeypatch, embedder):
    monkeypatch.setattr(dpinfer.eval.embeddings, "load_embedder", lambda *a, **k: type(embedder)())
    return embedder


def _store(tmp_path, name, lm, embedder, docs, **kw):
    rag = PrivateRAG(tmp_path / name, lm=lm, embedder=embedder, **kw)
    rag.add(docs)
    return tmp_path / name


def _ask_json(capsys, store, question, tiny_model_dir, *extra) -> dict[str, Any]:
    if "pad" not in extra:  # a method without a guarantee: no ledger affords it
        extra = (*extra, "--no-ledger")
    rc = main(["rag", "ask", str(store), question, "--model", str(tiny_model_dir), "--max-new-tokens", "4",
               "--top-k", "2", "--top-n", "1", "--json", *extra])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    return json.loads(captured.out)


@pytest.mark.parametrize("mechanism", ["pad", "pad-as-published", "none"])
def test_rag_ask_json_holds_nothing_input_dependent_beyond_the_release(tmp_path, tiny_lm, tiny_model_dir, docs,
                                                                       offline_embedder, capsys, mechanism):
    a = _store(tmp_path, "a", tiny_lm, offline_embedder, docs)
    b = _store(tmp_path, "b", tiny_lm, offline_embedder, OTHER_DOCS)
    one = _ask_json(capsys, a, "I cough at night and wheeze, what is it?", tiny_model_dir, "--mechanism", mechanism)
    two = _ask_json(capsys, b, "Where does Mr Smith live?", tiny_model_dir, "--mechanism", mechanism)
    assert "seconds" not in json.dumps([one, two])  # timing depends on the retrieved documents
    assert check_release(one) == one and check_release(two) == two  # the printed JSON is the release, as it is
    assert _differences(one, two) == []
    debug = _ask_json(capsys, a, "Why?", tiny_model_dir, "--mechanism", mechanism, "--debug-stats")
    assert "seconds" in debug["diagnostics"] and "warning" in debug["diagnostics"]  # diagnostics only


def test_sanitize_json_holds_nothing_input_dependent_beyond_the_release(tmp_path, tiny_model_dir, capsys):
    runs = []
    for i, (doc, spans) in enumerate([
        ("Mr Smith, a lawyer practising in London, lodged an application.", [Span(3, 8, "PERSON"),
                                                                            Span(33, 39, "LOC")]),
        ("Ms Jones, a doctor living in Paris since 1990, wrote to the Court twice.", [Span(3, 8, "PERSON"),
                                                                                     Span(29, 34, "LOC")]),
    ]):
        path, spans_path = tmp_path / f"d{i}.txt", tmp_path / f"s{i}.json"
        path.write_text(doc)
        spans_path.write_text(json.dumps([s.to_dict() for s in spans]))
        rc = main(["sanitize", str(path), "--spans", str(spans_path), "--model", str(tiny_model_dir),
                   "--max-new-tokens", "6", "--json", "--spans-only"])  # the groups are the guarantee's
        captured = capsys.readouterr()
        assert rc == 0, captured.err
        runs.append(json.loads(captured.out))
    assert "seconds" not in json.dumps(runs)
    assert _differences(*runs) == []


# ------------------------------------------------------------------------------------------------ context window
def test_long_documents_are_cut_to_a_public_budget_that_fits_the_window(tmp_path, tiny_lm, tiny_model_dir,
                                                                        offline_embedder, capsys):
    store = _store(tmp_path, "long", tiny_lm, offline_embedder, [LONG, LONG.replace("Izmir", "Ankara"), LONG[::-1]])
    args = ["rag", "ask", str(store), "Where does the applicant live?", "--model", str(tiny_model_dir), "--json",
            "--seed", "1"]
    assert main(args) == 0, capsys.readouterr().err  # 3 × 256 document tokens + 64 would not fit 512 positions
    out = json.loads(capsys.readouterr().out)
    assert 16 <= out["settings"]["max_doc_tokens"] < 256
    rag = PrivateRAG(store, lm=tiny_lm, embedder=offline_embedder)
    budget = rag.doc_budget("Where does the applicant live?", 64)
    assert budget == out["settings"]["max_doc_tokens"]
    assert rag.pad_width("Where does the applicant live?", budget) + 64 <= tiny_lm.context_window


def test_a_question_that_cannot_fit_is_refused_in_one_line_before_retrieval(tmp_path, tiny_lm, tiny_model_dir,
                                                                            offline_embedder, capsys, monkeypatch):
    errors = []
    for name, docs in (("long", [LONG, LONG[::-1]]), ("short", ["A short note.", "Another one."])):
        store = _store(tmp_path, name, tiny_lm, offline_embedder, docs)
        assert main(["rag", "ask", str(store), "Where?", "--model", str(tiny_model_dir), "--max-new-tokens",
                     "480"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "context window of 512" in err and "--max-new-tokens" in err
        errors.append(err)
    assert errors[0] == errors[1]  # the refusal does not depend on the documents
    rag = PrivateRAG(tmp_path / "long", lm=tiny_lm, embedder=offline_embedder)
    monkeypatch.setattr(rag, "retrieve", lambda q: pytest.fail("retrieved before the window was checked"))
    with pytest.raises(ContextTooLongError):
        rag.plan_ask("Where?", max_new_tokens=480)


def test_a_batch_of_questions_over_long_documents_is_answered(tmp_path, tiny_lm, offline_embedder):
    store = _store(tmp_path, "long", tiny_lm, offline_embedder, [LONG, LONG.replace("Izmir", "Ankara"), "Short."])
    rag = PrivateRAG(store, lm=tiny_lm, embedder=offline_embedder)
    got = list(rag.ask_many(["Where does the applicant live?", "Short?", "When did the Court decide?"],
                            max_new_tokens=8, seed=3))
    assert sorted(i for i, ans, err in got if ans is not None and err is None) == [0, 1, 2]


# ------------------------------------------------------------------------------------------------ NaN in a private row
def test_pad_treats_nan_and_inf_in_the_private_row_as_safe_and_checks_the_public_row_only():
    mech = Pad(clip_norm=1.0, sigma=1.5, top_k=None)
    mech.start(2, 4)
    pub = torch.tensor([2.0, 1.0, 0.0, -1.0], dtype=torch.float64)
    nan = torch.stack([pub, torch.full((4,), math.nan, dtype=torch.float64)])
    _, p, pre = mech.pre_noise_logits(nan)
    assert torch.equal(pre, p)  # NaN counts as the public value: no shift
    inf = torch.stack([pub, torch.tensor([math.inf, math.nan, -math.inf, 0.0], dtype=torch.float64)])
    _, p, pre = mech.pre_noise_logits(inf)
    assert float((pre - p).norm()) == pytest.approx(1.0)  # clipped like any other shift
    info = StepInfo(0, 1, 2)
    assert int(mech.step(nan, info, SeededRandom(1)).tokens) == int(mech.step(torch.stack([pub, pub]), info,
                                                                              SeededRandom(1)).tokens)
    with pytest.raises(InvalidInputError, match="public row"):
        mech.step(torch.stack([pub.clone().fill_(math.nan), pub]), info, SeededRandom(1))


def test_a_nan_in_one_private_row_leaves_the_other_answers_of_a_batch_unaffected(tmp_path, tiny_lm, embedder, docs,
                                                                                 swap_pad_mechanism):
    store = _store(tmp_path, "s", tiny_lm, embedder, docs, top_k=3, top_n=2, max_doc_tokens=24)
    questions = ["What helps a migraine?", "I cough at night and wheeze.", "Knee pain on stairs?"]
    rag = PrivateRAG(store, lm=tiny_lm, embedder=embedder, top_k=3, top_n=2, max_doc_tokens=24)
    clean = {i: ans.token_ids for i, ans, _ in rag.ask_many(questions, max_new_tokens=6, seed=5)}

    class NanRow(Pad):
        def step(self, logits, info, generator):
            logits = logits.clone()
            logits[1, ::3] = math.nan  # a broken private row (e.g. a numerical fault on the retrieved documents)
            return super().step(logits, info, generator)

    built = []

    def build(config, mech):
        built.append(mech)
        if len(built) == 3:  # (the first build checks the options) the second question's sees NaN in its private row
            return NanRow(clip_norm=mech.clip_norm, sigma=mech.sigma, top_k=mech.top_k, delta=mech.delta)
        return mech

    swap_pad_mechanism(build)
    got = {i: (ans, err) for i, ans, err in rag.ask_many(questions, max_new_tokens=6, seed=5)}
    assert all(err is None and ans is not None for ans, err in got.values())
    assert got[0][0].token_ids == clean[0] and got[2][0].token_ids == clean[2]


# ------------------------------------------------------------------------------------------------ the noise knob
def test_pad_as_published_knob_is_never_called_epsilon(tmp_path, tiny_lm, tiny_model_dir, docs, offline_embedder,
                                                        capsys):
    store = _store(tmp_path, "s", tiny_lm, offline_embedder, docs)
    new = _ask_json(capsys, store, "Why?", tiny_model_dir, "--mechanism", "pad-as-published", "--noise-scale", "0.5",
                    "--seed", "1")
    assert new["settings"]["noise_scale"] == 0.5 and new["settings"]["epsilon"] is None
    assert new["guarantee"]["parameters"]["noise_scale"] == 0.5 and "epsilon" not in new["guarantee"]["parameters"]
    assert new["guarantee"]["epsilon"] == "inf"  # the only ε printed: no guarantee
    rc = main(["rag", "ask", str(store), "Why?", "--model", str(tiny_model_dir), "--max-new-tokens", "4", "--top-k",
               "2", "--top-n", "1", "--json", "--mechanism", "pad-as-published", "--epsilon", "0.5", "--seed", "1",
               "--no-ledger"])
    captured = capsys.readouterr()
    assert rc == 0 and "deprecated alias of --noise-scale" in captured.err
    assert json.loads(captured.out) == new  # the old flag still works, and is printed as the knob, not as ε
    assert main(["rag", "ask", str(store), "Why?", "--noise-scale", "0.5"]) == 2  # pad has no such knob
    assert "pad-as-published" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ membership
def test_help_and_guarantee_say_that_membership_needs_replace_one(capsys):
    with pytest.raises(SystemExit):
        main(["rag", "ask", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "membership" in text and "--adjacency replace-one" in text
    g = Pad.calibrated(Budget(16.0, 1e-5), Spec(8)).guarantee(8)
    assert "not whether a document is in the store" in str(g) and "replace-one" in g.adjacency
    one = Pad.calibrated(Budget(16.0, 1e-5), Spec(8, adjacency="replace-one"))
    assert "not whether" not in one.guarantee(8).adjacency
