"""``dpinfer bench utility``: the fact vocabulary and its matcher, the per-item measures and paired intervals, the
option checks, the report, and a two-question RAG run end to end on the tiny model."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from dpinfer.bench import utility
from dpinfer.bench import utility_rag as urag
from dpinfer.bench import utility_sanitize as usan
from dpinfer.bench import utility_synth as usyn
from dpinfer.bench import utility_vocab as uvoc
from dpinfer.errors import ConfigurationError
from dpinfer.taggers.base import Span

REPLIES = [
    "You may have gout. I will prescribe medications such as Allopurinol, Colchicine (Colcrys), and Prednisone.",
    "We need some tests: a complete blood count (CBC), a lipid panel and a plain x-ray (X ray).",
    "I recommend medications like allopurinol, colchicine and indomethacin. Based on your symptoms, rest.",
    "Tests such as a lipid panel, urinalysis, and an interview and evaluation will be done.",
    "The medications include prednisone, Indomethacin and ibuprofen.",
]


def test_vocabulary_is_computed_from_the_replies_enumerations() -> None:
    terms = uvoc.medical_vocabulary(REPLIES, min_count=2)
    drugs = {t.name for t in terms if t.kind == "drug"}
    tests = {t.name for t in terms if t.kind == "test"}
    assert drugs == {"allopurinol", "colchicine", "prednisone", "indomethacin"}  # ibuprofen: seen once
    assert tests == {"lipid panel"}  # "interview", "evaluation": no test word; CBC and x-ray: once each
    colchicine = next(t for t in terms if t.name == "colchicine")
    assert "colcry" in colchicine.forms  # the parenthesised alias is a form of the same term
    assert uvoc.medical_vocabulary(REPLIES, min_count=2) == terms  # deterministic


def test_matcher_and_targets_leave_out_what_the_question_names() -> None:
    m = uvoc.TermMatcher([uvoc.Term("complete blood count", ("cbc", "complete blood count"), "test"),
                        uvoc.Term("x ray", ("x ray",), "test"), uvoc.Term("prednisone", ("prednisone",), "drug")])
    assert m.named("A CBC, two X-rays and Prednisone.") == {"complete blood count", "x ray", "prednisone"}
    assert m.named("cbcx predni xray") == set()  # whole words only
    records = [{"input": "I took prednisone.", "output": "Keep taking prednisone."},  # nothing new: not an item
               {"input": "Do I need an x-ray?", "output": "An x-ray and a CBC; also prednisone."}]
    items = urag.rag_items(records, m, 5)
    assert [x["index"] for x in items] == [1]
    assert items[0]["targets"] == ["complete blood count", "prednisone"] and items[0]["drug_targets"] == ["prednisone"]


def _item(found: list[str], targets: list[str], drugs: list[str] | None = None) -> dict:
    return {"index": 0, "targets": targets, "drug_targets": drugs or [], "found": found, "named": len(found),
            "tokens": 10, "text": ""}


def test_rows_count_hits_recall_and_the_paired_difference_to_the_floor() -> None:
    t = ["a", "b"]
    floor = urag.summarise_rag_row({"method": "public", "epsilon": 0.0, "seconds": 1.0,
                                  "items": [_item([], t), _item([], t), _item(["a"], t), _item([], t)]})
    pad = urag.summarise_rag_row({"method": "pad", "epsilon": 64.0, "seconds": 1.0,
                                "items": [_item(["a"], t, ["a"]), _item(["a", "b"], t), _item(["a"], t),
                                          _item([], t)]})
    rows = [floor, pad]
    urag.compare_to_floor(rows)
    assert pad["hit"]["count"] == 3 and floor["hit"]["count"] == 1
    assert pad["recall"]["mean"] == pytest.approx((0.5 + 1 + 0.5 + 0) / 4)
    assert pad["drug_hit"] == {**pad["drug_hit"], "count": 1, "n": 1}
    d = pad["vs_floor"]
    assert d["mean"] == pytest.approx(0.5) and d["n"] == 4 and d["ci95"][0] < 0.5 < d["ci95"][1]
    assert "vs_floor" not in floor


def test_sanitize_measures_count_kept_values_and_years() -> None:
    doc = "On 3 May 1999 the applicant, Mr X, moved to Izmir with 3,000 euros."
    spans = [Span(doc.index(v), doc.index(v) + len(v), label) for v, label in
             (("3 May 1999", "DATETIME"), ("Mr X", "PERSON"), ("Izmir", "LOC"), ("3,000 euros", "QUANTITY"))]
    assert usan.value_recall("He moved to izmir in 1999.", doc, spans) == (1, 3)  # PERSON is not counted
    assert usan.years_of(doc) == {"1999"} and usan.years_of("in 2031 and 1850, not 123") == {"2031", "1850"}


def _args(**kw: object) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    utility.add_arguments(p)
    args = p.parse_args([])
    for k, v in kw.items():
        setattr(args, k, v)
    return args


def test_config_checks_before_any_model() -> None:
    cfg = utility.config_from_args(_args(tasks="rag,synth", epsilons="64,4", questions=3, docs=10))
    assert cfg.tasks == ("rag", "synth") and cfg.epsilons == (64.0, 4.0)
    assert utility.config_from_args(_args()).epsilons == utility.RAG_EPSILONS
    with pytest.raises(ConfigurationError, match="unknown task"):
        utility.config_from_args(_args(tasks="ragg"))
    with pytest.raises(ConfigurationError, match="positive"):
        utility.config_from_args(_args(epsilons="64,-1"))
    with pytest.raises(ConfigurationError, match="held-in"):
        utility.config_from_args(_args(questions=30, docs=20))
    with pytest.raises(ConfigurationError, match="--synth-per-class"):
        utility.config_from_args(_args(synth_per_class=0))


def test_rag_methods_run_the_default_epsilon_first() -> None:
    assert urag.rag_methods((4.0, 64.0, 8.0), 64.0) == [("none", None), ("public", None), ("pad", 64.0),
                                                       ("pad", 4.0), ("pad", 8.0)]


class _WordEmbedder:
    """Offline unit vectors from hashed words (no model)."""

    def encode(self, texts, batch_size: int = 32):
        import zlib

        import numpy as np

        out = np.zeros((len(texts), 32), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().split():
                out[i, zlib.crc32(w.encode()) % 32] += 1.0
            out[i, 0] += 1e-3
            out[i] /= np.linalg.norm(out[i])
        return out


def test_rag_end_to_end_on_the_tiny_model(tiny_lm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "medical"
    data.mkdir()
    recs = [{"instruction": "", "input": f"Doctor, my joint {i} hurts.", "output": r} for i, r in enumerate(REPLIES)]
    (data / "genmedgpt_dialogues.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    monkeypatch.setenv("DPINFER_DATA", str(tmp_path))
    cfg = utility.config_from_args(_args(tasks="rag", questions=2, docs=5, epsilons="4", rag_tokens=3))
    res = urag.run_rag(tiny_lm, _WordEmbedder(), cfg, lambda s: None)
    assert res["questions"] == 2 and [r["method"] for r in res["rows"]] == ["none", "public", "pad"]
    eps = [r["epsilon"] for r in res["rows"]]
    assert math.isinf(eps[0]) and eps[1] == 0 and 0 < eps[2] <= 4.0 + 1e-9
    assert all([x["index"] for x in r["items"]] == [x["index"] for x in res["rows"][0]["items"]] for r in res["rows"])
    assert res["rows"][2]["vs_floor"]["n"] == 2 and "vs_floor" not in res["rows"][1]
    text = utility.markdown({"model": "tiny", "seconds": 1.0, "rag": res})
    assert "none (ceiling)" in text and "public (floor)" in text and "| pad | 4 |" in text


def test_report_and_plots_of_every_task(tmp_path: Path) -> None:
    from dpinfer.bench import plots

    t = ["a"]
    rag = {"docs": 5, "questions": 2, "T_max": 8, "vocabulary": {"drugs": 3, "tests": 1}, "targets_per_item": 1.0,
           "items_with_drug": 1,
           "rows": [urag.summarise_rag_row({"method": m, "epsilon": e, "seconds": 1.0,
                                          "items": [_item(f, t), _item([], t)]})
                    for m, e, f in (("none", math.inf, ["a"]), ("public", 0.0, []), ("pad", 64.0, ["a"]))]}
    urag.compare_to_floor(rag["rows"])
    synth_rows = [usyn.summarise_accuracy({"method": m, "epsilon": e, "correct": c, "mauve": 0.5, "mauve_low": 0.4,
                                         "mauve_high": 0.6}, None)
                  for m, e, c in (("real (ceiling)", math.inf, [1.0, 1.0]), ("public", 0.0, [0.0, 1.0]),
                                  ("invisibleink", 10.0, [1.0, 0.0]))]
    synth = {"per_class": 2, "stars": ["1.0", "2.0", "4.0", "5.0"], "test": 2, "T_max": 8, "B": 8,
             "rows": synth_rows}
    s_items = [{"doc": "d", "kept": 1, "values": 2, "years": 1, "years_kept": 1, "ppl": 3.0, "tokens": 8,
                "seconds": 1.0, "text": "", "answered": [1, 0], "role_kept": 1, "role_released": 1}] * 2
    san_rows = [usan.summarise_sanitize_row({"method": m, "epsilon": e, "items": s_items})
                for m, e in (("original", math.inf), ("ner-scrub", 0.0), ("dp-fusion", 40.0))]
    usan.compare_sanitize(san_rows)
    san = {"docs": 2, "chars": 700, "T_max": 8, "types": list(usan.KEPT_TYPES), "rows": san_rows}
    text = utility.markdown({"model": "m", "seconds": 1.0, "rag": rag, "synth": synth, "sanitize": san})
    assert "| invisibleink | 10 | 1/2 (50%" in text and "original (ceiling)" in text and "+0 [+0, +0]" in text
    pytest.importorskip("matplotlib")
    for name, fig, part in (("rag", plots.utility_rag, rag), ("synth", plots.utility_synth, synth),
                            ("sanitize", plots.utility_sanitize, san)):
        assert fig(part, tmp_path / f"{name}.png") == tmp_path / f"{name}.png"
        assert (tmp_path / f"{name}.png").stat().st_size > 1000


def test_classifier_learns_from_its_training_texts_and_scores_each_test_item() -> None:
    pytest.importorskip("sklearn")
    emb = _WordEmbedder()
    train = ["great food lovely staff", "lovely great place", "awful rude slow", "rude awful dirty"]
    labels = ["5", "5", "1", "1"]
    test = ["great lovely", "awful dirty"]
    assert usyn.classify(emb, train, labels, emb.encode(test), ["5", "1"]) == [1.0, 1.0]
    assert usyn.classify(emb, train, labels, emb.encode(test), ["1", "5"]) == [0.0, 0.0]


def test_support_diagnostic_reads_the_public_row_at_the_first_token_of_the_named_fact(tiny_lm) -> None:
    m = uvoc.TermMatcher([uvoc.Term("prednisone", ("prednisone",), "drug")])
    text = "You should take prednisone twice a day."
    ids = tiny_lm.encode(text)
    j = urag.first_target_token(tiny_lm, ids, text, ["prednisone"], m)
    assert j is not None and len(tiny_lm.decode(ids[:j]).strip()) <= text.index("prednisone")
    items = [{"found": ["prednisone"], "text": text}, {"found": [], "text": "nothing"}]
    prompts = [tiny_lm.encode("Doctor, my joint hurts."), tiny_lm.encode("Hello")]
    sup = urag.support_reach(tiny_lm, prompts, items, m, {64.0: 1.43, 4.0: 0.16})
    assert sup["n"] == 1 and sup["gaps"][0] >= 0 and sup["ranks"][0] >= 1
    assert sup["in_top1_plus"]["64"]["count"] >= sup["in_top1_plus"]["4"]["count"]  # a wider C never holds fewer


def test_merge_keeps_the_questions_every_run_asked_and_recomputes_the_paired_figures() -> None:
    t = ["a"]

    def row(method: str, eps: float | None, found: list[list[str]]) -> dict:
        items = [{**_item(f, t), "index": i} for i, f in enumerate(found)]
        return urag.summarise_rag_row({"method": method, "epsilon": eps or 0.0, "target_epsilon": eps,
                                     "seconds": 1.0, "items": items})

    a = {"docs": 5, "T_max": 8, "vocabulary": {},
         "rows": [row("none", None, [t, t, t]), row("public", None, [[], [], t]), row("pad", 64.0, [t, [], t])]}
    b = {"docs": 5, "T_max": 8, "vocabulary": {}, "rows": [row("pad", 4.0, [[], []]), row("pad", 64.0, [[], []])]}
    m = urag.merge_rag([a, b])
    assert m["questions"] == 2 and [(r["method"], r["target_epsilon"]) for r in m["rows"]] == [
        ("none", None), ("public", None), ("pad", 4.0), ("pad", 64.0)]
    pad64 = m["rows"][-1]
    assert pad64["hit"]["count"] == 1 and pad64["hit"]["n"] == 2  # from the first run, on the common questions
    assert pad64["vs_floor"]["mean"] == pytest.approx(0.5) and m["rows"][2]["vs_floor"]["mean"] == 0.0


def test_fact_questions_take_distractors_of_the_same_type_the_document_lacks() -> None:
    doc = "On 3 May 1999 the applicant moved to Izmir, then to Ankara."
    spans = [Span(doc.index(v), doc.index(v) + len(v), label) for v, label in
             (("3 May 1999", "DATETIME"), ("Izmir", "LOC"), ("Ankara", "LOC"), ("applicant", "PERSON"))]
    pool = {"LOC": ["Paris", "Ankara", "Lyon", "Oslo", "Rome"],
            "DATETIME": ["1 June 2001", "2 July 2002", "5 May 2005"]}
    qs = usan.fact_questions(doc, spans, pool, "0:d")
    assert [q["value"] for q in qs] == ["3 May 1999", "Izmir", "Ankara"]  # PERSON is a direct identifier: no question
    for q in qs:
        assert len(q["choices"]) == usan.CHOICES and q["choices"][q["answer"]] == q["value"]
        others = [c for c in q["choices"] if c != q["value"]]
        assert all(c in pool[q["type"]] and c not in doc for c in others)  # same type, not in the document
    assert qs == usan.fact_questions(doc, spans, pool, "0:d")  # a fixed function of the key: the same for every row
    assert usan.fact_questions(doc, spans, {"LOC": ["Paris"]}, "0:d") == []  # too few distractors: no question


def test_answer_facts_scores_the_answerers_picks() -> None:
    class Picks:
        def answer(self, questions, choices):
            assert all(q == "the release" for q in questions)  # the release alone is the question's text
            return [0, 1]

    qs = [{"choices": ["a", "b"], "answer": 0}, {"choices": ["a", "b"], "answer": 0}]
    assert usan.answer_facts(Picks(), "the release", qs) == [1, 0]
    assert usan.answer_facts(Picks(), "the release", []) == []


def test_role_slots_count_a_date_that_stays_a_date() -> None:
    from dpinfer.taggers.regex_tagger import RegexTagger

    doc = "The application was lodged on 10 March 2003 by the applicant."
    spans = [Span(doc.index("10 March 2003"), doc.index("10 March 2003") + 13, "DATETIME")]
    tagger = RegexTagger()
    assert usan.role_slots("It was lodged on 4 June 2010 by him.", doc, spans, tagger) == (1, 1)  # another date
    assert usan.role_slots("It was lodged on [DATETIME] by him.", doc, spans, tagger) == (0, 1)  # a placeholder
    assert usan.role_slots("Someone applied.", doc, spans, tagger) == (0, 0)  # the release never reaches the slot


def test_merge_sanitize_joins_runs_and_pairs_the_fact_questions_to_ner_scrub() -> None:
    def item(kept: int, answered: list[int]) -> dict:
        return {"doc": "d", "kept": kept, "values": 2, "years": 1, "years_kept": 0, "ppl": 3.0, "tokens": 8,
                "seconds": 1.0, "text": "", "answered": answered, "role_kept": 1, "role_released": 2}

    def row(method: str, eps: float | None, answered: list[int]) -> dict:
        return usan.summarise_sanitize_row({"method": method, "epsilon": eps or 0.0, "target_epsilon": eps,
                                            "items": [item(1, answered), item(0, answered)]})

    a = {"docs": 2, "rows": [row("original", None, [1, 1]), row("ner-scrub", None, [0, 1])]}
    b = {"docs": 2, "rows": [row("dp-fusion", 160.0, [1, 0]), row("dp-fusion", 20.0, [0, 0])]}
    m = usan.merge_sanitize([a, b])
    assert [(r["method"], r["target_epsilon"]) for r in m["rows"]] == [
        ("original", None), ("ner-scrub", None), ("dp-fusion", 20.0), ("dp-fusion", 160.0)]
    orig, dp20 = m["rows"][0], m["rows"][2]
    assert orig["facts"]["count"] == 4 and orig["roles"]["count"] == 2 and orig["roles"]["n"] == 4
    assert orig["facts_vs_floor"]["mean"] == pytest.approx(0.5)  # (1-0, 1-1) twice
    assert dp20["facts_vs_floor"]["mean"] == pytest.approx(-0.5)


def test_protect_from_file_tabulates_a_bench_gtr_run(tmp_path: Path) -> None:

    acc = {"minilm-cosine": {"accuracy": 0.3, "low": 0.2, "high": 0.4}}
    gtr = {"settings": {"n": 10, "model": "m"}, "answerers": ["minilm-cosine"], "chance": 0.2,
           "original": {"minilm-cosine": {"accuracy": 0.4, "low": 0.3, "high": 0.5}},
           "rows": [{"method": "dp-gtr-ndp", "tau": 0.5, "epsilon": 100.0, "rouge1": 0.2, "rouge1_low": 0.1,
                     "rouge1_high": 0.3, "accuracy": acc, "rouge1_items": [0.2] * 10}]}
    path = tmp_path / "gtr.json"
    path.write_text(json.dumps(gtr), encoding="utf-8")
    res = utility.run(utility.UtilityBenchConfig(tasks=("protect",), protect_from=str(path), out=str(tmp_path / "o")))
    assert res["protect"]["questions"] == 10 and "rouge1_items" not in res["protect"]["gtr"]["rows"][0]
    assert "| DP-GTR (NDP) | 0.5 | 100 | 0.30 [0.20, 0.40] | 0.20 [0.10, 0.30] |" in res["markdown"]


def test_emission_screen_gives_each_support_a_probability_on_the_tiny_model(
        tiny_lm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "medical"
    data.mkdir()
    recs = [{"instruction": "", "input": f"Doctor, my joint {i} hurts.", "output": r} for i, r in enumerate(REPLIES)]
    (data / "genmedgpt_dialogues.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    monkeypatch.setenv("DPINFER_DATA", str(tmp_path))
    named = {**_item(["prednisone"], ["prednisone"]), "index": 0, "text": "Rest, and take prednisone daily."}
    result = {"docs": 5, "T_max": 8, "rows": [{"method": "none", "items": [named, {**_item([], ["cbc"]), "index": 1}]}]}
    sc = urag.emission_screen(tiny_lm, _WordEmbedder(), result, [4.0, 64.0], draws=500)
    assert sc["n"] == 1 and set(sc["mean"]) == {lab for lab, _, _ in urag.SCREEN_SUPPORTS}  # the item naming a fact
    for by in sc["probability"].values():
        assert set(by) == {"4", "64"} and all(len(v) == 1 and 0.0 <= v[0] <= 1.0 for v in by.values())
    assert 0 <= sc["private_argmax"] <= 1
    text = utility.markdown({"model": "tiny", "rag": {**result, "questions": 2, "targets_per_item": 1.0,
                                                      "items_with_drug": 1, "vocabulary": {"drugs": 1, "tests": 1},
                                                      "rows": [], "screen": sc}})
    assert "| Top-1⁺ alone | " in text
