"""The guarantee as a privacy officer reads it: one plain sentence (what is protected, ε, what is not), details and
caveats apart, every clause true for the run that printed it (T_max fixed or following the document; gold, tagged or
completed spans); partial spans completed by the tagger (fail closed), with a note on stderr and in the release."""

from __future__ import annotations

import json

import pytest

from dpinfer.accounting.guarantee import epsilon_caveat, odds_factor
from dpinfer.accounting.sanitize_text import guarantee_caveats, guarantee_details, guarantee_sentence
from dpinfer.cli import main
from dpinfer.pipelines.sanitize import sanitize
from dpinfer.pipelines.sanitize_many import Record, sanitize_many
from dpinfer.taggers import Span
from dpinfer.taggers.regex_tagger import RegexTagger
from dpinfer.taggers.spans import fill_uncovered

DOC = "Mr Smith, a lawyer practising in London, lodged application no. 36244/06 on 20 May 1998."
GOLD = [Span(3, 8, "PERSON"), Span(33, 39, "LOC"), Span(64, 72, "CODE"), Span(76, 87, "DATETIME")]
PERSON_ONLY = [Span(3, 8, "PERSON")]


def _sentence_is_plain(sentence: str) -> None:
    assert sentence.startswith("Guarantee: ") and sentence.endswith(".")
    assert sentence.count(". ") == 0 and len(sentence.split()) <= 45 + 12  # one sentence, not a paragraph of jargon
    # (45 words, and 12 for the clause that says the rewrite starts with the document's first untagged words)
    assert "ε = 40" in sentence and "not protected" in sentence


def test_fixed_t_max_is_said_to_be_fixed(tiny_lm):
    res = sanitize(DOC, lm=tiny_lm, spans=GOLD, max_new_tokens=4, seed=0)
    details = guarantee_details(res)
    assert res.settings["max_new_tokens_from"] == "max_new_tokens"
    assert "a limit of 4 generated tokens, set with max-new-tokens" in details
    assert "follows the document" not in details


def test_document_following_t_max_is_said_to_follow_the_document(tiny_lm):
    res = sanitize(DOC, lm=tiny_lm, spans=GOLD, seed=0)
    details = guarantee_details(res)
    assert res.settings["max_new_tokens_from"] == "document length"
    assert f"a limit of {res.guarantee.max_new_tokens} generated tokens that follows the document's length" in details
    assert "set with max-new-tokens" not in details


def test_gold_spans_do_not_mention_a_tagger(tiny_lm):
    res = sanitize(DOC, lm=tiny_lm, spans=GOLD, max_new_tokens=3, seed=0)
    sentence = guarantee_sentence(res)
    _sentence_is_plain(sentence)
    everything = " ".join([sentence, guarantee_details(res), *res.not_protected, json.dumps(res.to_dict())])
    assert "tagger" not in everything.replace('"span_source": {"from": "given"}', "")
    assert "anything the given spans do not cover" in sentence
    assert res.settings["span_source"] == {"from": "given"}


def test_tagged_spans_say_what_the_tagger_missed(tiny_lm):
    res = sanitize(DOC, lm=tiny_lm, tagger="regex", max_new_tokens=3, seed=0)
    sentence = guarantee_sentence(res)
    assert "anything the tagger missed" in sentence and "given spans" not in sentence
    assert "found by the regex tagger" in guarantee_details(res)
    assert res.settings["span_source"] == {"from": "tagger", "tagger": "regex"}


def test_large_epsilon_carries_a_caveat_with_what_e_to_the_epsilon_means(tiny_lm):
    res = sanitize(DOC, lm=tiny_lm, spans=GOLD, max_new_tokens=3, seed=0, epsilon=40.0)
    caveats = guarantee_caveats(res)
    assert any("e^40 ≈ 2.4·10^17" in c and "docs/threat-model.md" in c for c in caveats)
    assert any("seed" in c for c in caveats)  # a seeded run says the guarantee needs the seed to stay secret
    assert res.to_dict()["guarantee"]["caveats"] == caveats
    assert epsilon_caveat(1.0) is None and "10^12247" in epsilon_caveat(28200.0)
    assert odds_factor(40) == "2.4·10^17"


def test_partial_spans_are_completed_by_the_tagger(tiny_lm):
    res = sanitize(DOC, lm=tiny_lm, spans=PERSON_ONLY, tagger="regex", tag_uncovered=True, max_new_tokens=3, seed=0)
    labels = {s.label for s in res.spans}
    assert "PERSON" in labels and {"CODE", "DATETIME"} <= labels  # the regex tagger found the number and the date
    info = res.settings["span_source"]
    assert info["from"] == "given+tagger" and info["tagger"] == "regex" and info["tagger_added"] >= 2
    assert "PERSON" not in info["tagged_for"] and "DATETIME" in info["tagged_for"]
    assert "anything the spans and the tagger missed" in guarantee_sentence(res)
    # without tag_uncovered (the API default; the CLI's --spans-only) the given spans are used alone
    alone = sanitize(DOC, lm=tiny_lm, spans=PERSON_ONLY, tagger="regex", max_new_tokens=3, seed=0)
    assert [s.label for s in alone.spans] == ["PERSON"] and alone.settings["span_source"] == {"from": "given"}


def test_full_gold_spans_do_not_run_the_tagger():
    class Boom(RegexTagger):
        def _tag(self, text):
            raise AssertionError("the tagger ran although every type it knows was covered")

    tagger = Boom()
    tagger.labels = ("PERSON", "LOC", "CODE", "DATETIME")
    resolved = fill_uncovered(DOC, GOLD, tagger)
    assert resolved.source == "given" and resolved.spans == GOLD and resolved.note() is None


def test_partial_spans_in_a_corpus_are_completed(tiny_lm):
    records = [Record("a", DOC, PERSON_ONLY), Record("b", DOC, GOLD)]
    out = {o.id: o for o in sanitize_many(records, lm=tiny_lm, tagger="regex", tag_uncovered=True,
                                          max_new_tokens=3, seed=1)}
    assert out["a"].result.settings["span_source"]["from"] == "given+tagger"
    assert {"CODE", "DATETIME"} <= {s.label for s in out["a"].result.spans}


def test_cli_partial_spans_are_merged_with_a_note(tiny_model_dir, tmp_path, capsys):
    doc = tmp_path / "doc.txt"
    doc.write_text(DOC, encoding="utf-8")
    spans = tmp_path / "spans.json"
    spans.write_text(json.dumps([{"start": 3, "end": 8, "label": "PERSON"}]))
    base = ["sanitize", str(doc), "--spans", str(spans), "--tagger", "regex", "--model", str(tiny_model_dir),
            "--max-new-tokens", "3", "--seed", "0", "--json"]
    assert main(base) == 0
    cap = capsys.readouterr()
    release = json.loads(cap.out)
    assert release["settings"]["span_source"]["from"] == "given+tagger"
    assert "the spans given cover PERSON only: the regex tagger tagged the document for" in cap.err
    assert "--spans-only" in cap.err and "Smith" not in cap.err
    assert main([*base, "--spans-only"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["settings"]["span_source"] == {"from": "given"} and "tagged the document" not in cap.err


def test_cli_corpus_partial_spans_are_merged_with_a_note(tiny_model_dir, tmp_path, capsys):
    corpus = tmp_path / "in.jsonl"
    corpus.write_text(json.dumps({"id": 1, "text": DOC, "spans": [{"start": 3, "end": 8, "label": "PERSON"}]}) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["sanitize", "--corpus", str(corpus), "--out", str(out), "--tagger", "regex", "--model",
                 str(tiny_model_dir), "--max-new-tokens", "3", "--seed", "0"]) == 0
    err = capsys.readouterr().err
    record = json.loads(out.read_text().splitlines()[-1])
    assert record["settings"]["span_source"]["from"] == "given+tagger"
    assert "1 records had spans that left entity types uncovered" in err


@pytest.mark.parametrize("explain", [False, True])
def test_cli_prints_the_sentence_first_and_details_with_explain(tiny_model_dir, tmp_path, capsys, explain):
    doc = tmp_path / "doc.txt"
    doc.write_text(DOC, encoding="utf-8")
    argv = ["sanitize", str(doc), "--tagger", "regex", "--model", str(tiny_model_dir), "--max-new-tokens", "3"]
    assert main(argv + (["--explain"] if explain else [])) == 0
    statement = capsys.readouterr().out.split("\n\n")[-1].splitlines()
    assert statement[0].startswith("Guarantee: ") and statement[1].startswith("Caveat: at ε = ")
    assert any(line.startswith("Details: ") for line in statement) == explain


def test_protect_prompt_states_a_plain_sentence_and_a_caveat_for_its_composed_epsilon(tiny_model_dir, capsys):
    args = ["protect-prompt", "Why is the sky blue?", "--model", str(tiny_model_dir), "--device", "cpu",
            "--temperature", "1", "--n-rewrites", "2", "--max-new-tokens", "4", "--seed", "1"]
    assert main(args) == 0
    lines = capsys.readouterr().err.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("Guarantee: "))
    assert "the whole prompt is protected with ε = " in lines[first]
    assert lines[first + 1].startswith("Caveat: at ε = ") and "≈" in lines[first + 1]  # e^ε spelled out
    assert "docs/threat-model.md" in lines[first + 1]
    assert lines[first + 2].startswith("Details: ")


def test_progress_knows_its_total_before_the_first_token(tiny_lm):
    seen: list[tuple[int, int]] = []
    res = sanitize(DOC, lm=tiny_lm, spans=GOLD, max_new_tokens=5, seed=0, progress=lambda d, n: seen.append((d, n)))
    assert seen[0] == (0, 5) and all(total == 5 for _, total in seen)  # never "0/?": T_max from the start
    stopped = res.finish_reason == "eos"  # the end-of-text step is a step, not a released token
    assert seen[-1][0] == res.generated_tokens + stopped
