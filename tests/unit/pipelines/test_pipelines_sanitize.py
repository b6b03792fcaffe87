"""The sanitize pipeline on the tiny model: contexts, groups, methods, guarantees, errors."""

from __future__ import annotations

import json
import math

import pytest

from dpinfer.cli import main
from dpinfer.errors import ConfigurationError, ContextTooLongError, InvalidInputError, TaggingError
from dpinfer.pipelines.sanitize import sanitize
from dpinfer.pipelines.sanitize_contexts import (
    DEFAULT_INSTRUCTION,
    default_max_new_tokens,
    placeholder_id,
    prepare_contexts,
)
from dpinfer.taggers import Span, Tagger
from dpinfer.taggers.resolve import resolve_group_epsilon, resolve_groups

DOC = "Mr Smith, a lawyer practising in London, lodged application no. 36244/06 on 20 May 1998."
SPANS = [Span(3, 8, "PERSON"), Span(33, 39, "LOC"), Span(64, 72, "CODE"), Span(76, 87, "DATETIME")]


def test_spans_fixture_is_right():
    assert [DOC[s.start:s.end] for s in SPANS] == ["Smith", "London", "36244/06", "20 May 1998"]


def test_contexts_have_equal_length_and_differ_only_on_group_tokens(tiny_lm):
    groups = resolve_groups(SPANS, None)
    assert list(groups) == ["PERSON", "CODE", "LOC", "DATETIME"]
    prep = prepare_contexts(tiny_lm, DOC, SPANS, groups, "Rewrite:")
    ph = placeholder_id(tiny_lm)
    n = len(prep.original)
    assert len(prep.public) == n and all(len(p) == n for p in prep.private)
    replaced = {i for i in range(n) if prep.public[i] != prep.original[i]}
    assert replaced and all(prep.public[i] == ph for i in replaced)
    assert sum(prep.private_tokens.values()) >= len(replaced)
    for gi, name in enumerate(prep.group_names):
        own = {i for i in range(n) if prep.private[gi][i] != prep.public[i]}
        # private_i equals the original on group i's tokens and the public context elsewhere
        assert len(own) == prep.private_tokens[name]
        for i in own:
            assert prep.private[gi][i] == prep.original[i]
    # the public context reveals nothing of the tagged strings
    decoded = tiny_lm.decode(prep.public)
    for s in SPANS:
        assert DOC[s.start:s.end] not in decoded


def test_groups_can_be_merged_and_validated():
    g = resolve_groups(SPANS, {"ID": ["PERSON", "CODE"]})
    assert g == {"ID": ["PERSON", "CODE"], "LOC": ["LOC"], "DATETIME": ["DATETIME"]}
    with pytest.raises(InvalidInputError, match="unknown label"):
        resolve_groups(SPANS, {"X": ["NAME"]})
    with pytest.raises(InvalidInputError, match="two groups"):
        resolve_groups(SPANS, {"A": ["PERSON"], "B": ["PERSON"]})
    eps = resolve_group_epsilon(list(g), g, 5.0, {"PERSON": 1.0, "LOC": 3.0})
    assert eps == {"ID": 1.0, "LOC": 3.0, "DATETIME": 5.0}
    with pytest.raises(InvalidInputError, match="neither a group nor a label"):
        resolve_group_epsilon(list(g), g, 5.0, {"NAMES": 1.0})
    with pytest.raises(ConfigurationError, match="> 0"):
        resolve_group_epsilon(list(g), g, 5.0, {"LOC": -1.0})


@pytest.mark.parametrize("method", ["original", "ner-scrub"])
def test_non_private_and_scrub_methods(tiny_lm, method):
    res = sanitize(DOC, lm=tiny_lm, method=method, spans=SPANS, max_new_tokens=8, seed=0)
    assert res.generated_tokens <= 8 and res.method == method
    if method == "original":
        assert math.isinf(res.guarantee.epsilon)
    else:
        assert res.guarantee.epsilon == 0 and {g.name for g in res.guarantee.groups} == set(res.groups)


def test_dp_fusion_per_group_guarantee_and_reproducibility(tiny_lm):
    kw = {"lm": tiny_lm, "spans": SPANS, "max_new_tokens": 12, "seed": 3,
          "group_epsilon": {"PERSON": 20.0}, "epsilon": 30.0}
    a = sanitize(DOC, **kw, debug=True)
    b = sanitize(DOC, **kw)
    assert a.text == b.text
    g = a.guarantee
    per = {gr.name: gr.epsilon for gr in g.groups}
    assert set(per) == {"PERSON", "CODE", "LOC", "DATETIME"}
    assert per["PERSON"] <= 20.0 + 1e-9 and per["PERSON"] == pytest.approx(20.0, rel=1e-6)
    assert per["LOC"] == pytest.approx(30.0, rel=1e-6)
    assert g.epsilon == max(per.values()) and g.max_new_tokens == 12 and g.order == 2.0
    dd = a.diagnostics()
    assert "not covered by the guarantee" in dd["warning"]
    assert set(dd["groups"]) == set(per)
    assert all(0.0 <= lam <= 1.0 for row in dd["lambda_per_step"] for lam in row)


def test_infeasible_epsilon_is_a_clear_error(tiny_lm):
    with pytest.raises(ConfigurationError, match="smallest reachable"):
        sanitize(DOC, lm=tiny_lm, spans=SPANS, epsilon=1.0, max_new_tokens=8)


def test_too_long_document_is_refused_not_truncated(tiny_lm):
    with pytest.raises(ContextTooLongError, match="context window"):
        sanitize(DOC * 20, lm=tiny_lm, spans=[], max_new_tokens=8, allow_untagged=True)


def test_bad_inputs(tiny_lm):
    with pytest.raises(InvalidInputError, match="empty"):
        sanitize("   ", lm=tiny_lm, spans=[])
    with pytest.raises(InvalidInputError, match="ends beyond"):
        sanitize(DOC, lm=tiny_lm, spans=[Span(0, 500, "PERSON")])
    with pytest.raises(InvalidInputError, match="unknown label"):
        sanitize(DOC, lm=tiny_lm, spans=[Span(0, 2, "NAME")])
    with pytest.raises(ConfigurationError, match="unknown method"):
        sanitize(DOC, lm=tiny_lm, spans=SPANS, method="magic")


def test_failing_tagger_releases_nothing(tiny_lm):
    class Broken(Tagger):
        name = "broken"

        def _tag(self, text):
            raise RuntimeError(text)  # would leak the text if it were passed on

    with pytest.raises(TaggingError) as exc:
        sanitize(DOC, lm=tiny_lm, tagger=Broken())
    assert "Smith" not in str(exc.value)


def test_guarantee_is_ex_ante(tiny_lm):
    """Same groups, targets and T_max: the same guarantee whatever the document says and whatever was generated."""
    other = "Ms Brown, a judge sitting in Oslo, heard case no. 11111/01 on 1 June 2001 and closed it the same day."
    other_spans = [Span(3, 8, "PERSON"), Span(29, 33, "LOC"), Span(50, 58, "CODE"), Span(62, 73, "DATETIME")]
    assert [other[s.start:s.end] for s in other_spans] == ["Brown", "Oslo", "11111/01", "1 June 2001"]
    a = sanitize(DOC, lm=tiny_lm, spans=SPANS, max_new_tokens=10, seed=1, epsilon=25.0)
    b = sanitize(other, lm=tiny_lm, spans=other_spans, max_new_tokens=10, seed=2, epsilon=25.0)
    assert a.guarantee.to_dict() == b.guarantee.to_dict()
    assert "before" in str(a.guarantee)


def test_ner_scrub_is_dp_fusion_at_lambda_zero_on_common_random_numbers(tiny_lm):
    """ALGORITHMS §5: NER scrubbing is DP-Fusion with λ = 0. Both draw one uniform per token from the seeded stream
    (inverse CDF), so with b_i → 0 (λ_i → 0; b = 0 itself is refused) and the same seed they release the same tokens;
    benchmarks compare the two on common random numbers."""
    from dpinfer.engine import Engine
    from dpinfer.mechanisms.dp_fusion import DPFusion
    from dpinfer.mechanisms.sampler import Sampler
    from dpinfer.mechanisms.transforms import NoRepeatNGram

    groups = resolve_groups(SPANS, None)
    prep = prepare_contexts(tiny_lm, DOC, SPANS, groups, "Rewrite:")
    for seed, top_k in [(0, 40), (1, None), (2, 5)]:
        fusion = Engine(tiny_lm).generate(
            [prep.public, *prep.private], DPFusion(bounds=[1e-300] * len(prep.group_names),
                                                   group_names=prep.group_names, temperature=0.7, top_k=top_k),
            max_new_tokens=24, seed=seed, processors=[NoRepeatNGram(3)], debug_stats=True)
        assert fusion.steps  # the statistics asked for
        # where a private row moves the mixture at all, λ ≈ 0 (the batched search may land on λ = 0 exactly, so that
        # every step's divergence is 0: then no step constrains λ and the token equality below is the whole check)
        assert max((max(s["lambda"]) for s in fusion.steps if s["divergence"] != [0.0] * len(s["lambda"])),
                   default=0.0) < 1e-100
        scrub = Engine(tiny_lm).generate([prep.public], Sampler(temperature=0.7, top_k=top_k, mode="joint"),
                                         max_new_tokens=24, seed=seed, processors=[NoRepeatNGram(3)])
        assert fusion.sequences[0] == scrub.sequences[0]
        assert len(scrub.sequences[0]) > 0


def test_replace_one_adjacency_end_to_end(tiny_lm, tiny_model_dir, tmp_path, capsys):
    res = sanitize(DOC, lm=tiny_lm, spans=SPANS, max_new_tokens=10, seed=0, epsilon=30.0, adjacency="replace-one")
    g = res.guarantee
    assert "replace-one" in g.adjacency and res.settings["adjacency"] == "replace-one"
    assert g.parameters["enforced_order"] == 4.0
    assert all(gr.epsilon == pytest.approx(30.0, rel=1e-6) for gr in g.groups)
    null = sanitize(DOC, lm=tiny_lm, spans=SPANS, max_new_tokens=10, seed=0, epsilon=30.0)
    # the same ε under the stronger adjacency needs smaller bounds
    assert all(a < b for a, b in zip(g.parameters["bounds"].values(), null.guarantee.parameters["bounds"].values(),
                                     strict=True))
    with pytest.raises(ConfigurationError, match="adjacency"):
        sanitize(DOC, lm=tiny_lm, spans=SPANS, max_new_tokens=4, adjacency="swap")
    doc = tmp_path / "doc.txt"
    doc.write_text(DOC, encoding="utf-8")
    spans = tmp_path / "spans.json"
    spans.write_text(json.dumps([{"start": s.start, "end": s.end, "label": s.label} for s in SPANS]))
    rc = main(["sanitize", str(doc), "--spans", str(spans), "--model", str(tiny_model_dir), "--max-new-tokens", "6",
               "--epsilon", "30", "--adjacency", "replace-one", "--seed", "0"])
    out = capsys.readouterr().out
    assert rc == 0 and "against any other values in the same spans" in " ".join(out.split())


# ---------------------------------------------------------------------------------------------------------- issue 10
SMOL_TEMPLATE = (  # SmolLM2-Instruct's template: a default system prompt that names "Hugging Face"
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def test_spans_are_placed_by_construction_not_by_searching_the_prompt(tiny_lm, monkeypatch):
    """Hole 3: the document "Hugging Face" also occurs in the default system prompt; prompt.find(document) put the
    placeholders there and left the real document in the public context."""
    monkeypatch.setattr(tiny_lm.tokenizer, "chat_template", SMOL_TEMPLATE)
    doc = "Hugging Face"
    spans = [Span(0, len(doc), "ORG")]
    prep = prepare_contexts(tiny_lm, doc, spans, resolve_groups(spans, None), "Rewrite:")
    public = tiny_lm.decode(prep.public)
    system, _, user = public.partition("Rewrite:")
    assert "trained by Hugging Face" in system  # the template is public and stays intact
    assert "Hugging" not in user and "Face" not in user  # no private character in the public context
    assert prep.private_tokens["ORG"] > 0
    # the private context of the group holds the document where the user message is, and only there
    private = tiny_lm.decode(prep.private[0])
    assert private.partition("Rewrite:")[2].count("Hugging Face") == 1


def test_chat_template_that_does_not_keep_the_document_verbatim_is_refused(tiny_lm, monkeypatch):
    monkeypatch.setattr(tiny_lm.tokenizer, "chat_template",
                        "{% for m in messages %}{{ m['content'] | upper }}{% endfor %}")
    with pytest.raises(ConfigurationError, match="verbatim"):
        prepare_contexts(tiny_lm, DOC, SPANS, resolve_groups(SPANS, None), "Rewrite:")


def test_baselines_take_a_fixed_t_max_not_the_documents_length(tiny_lm):
    """Hole 2: dp-decoding / dp-prompt (adjacency: any two documents) must not read T_max from the document."""
    short, long = "The applicant lives in Izmir.", DOC + " The applicant was born in 1970."
    for method in ("dp-decoding", "dp-prompt"):
        a = sanitize(short, lm=tiny_lm, method=method, tagger="regex", seed=0)
        b = sanitize(long, lm=tiny_lm, method=method, tagger="regex", seed=0)
        assert a.max_new_tokens == b.max_new_tokens == 256  # BASELINE_MAX_NEW_TOKENS, documented
        assert a.guarantee.to_dict() == b.guarantee.to_dict()
        assert "fixed limit of 256" in a.to_dict()["guarantee"]["details"]
    # DP-Fusion keeps T_max following the length (public under its adjacency), and says so
    fusion = sanitize(DOC, lm=tiny_lm, spans=SPANS, seed=0, epsilon=40.0)
    prep = prepare_contexts(tiny_lm, DOC, SPANS, resolve_groups(SPANS, None), DEFAULT_INSTRUCTION)
    assert fusion.max_new_tokens == default_max_new_tokens(prep.document_tokens)
    assert "follows the document's length" in fusion.to_dict()["guarantee"]["details"]


def test_whole_document_methods_cut_to_a_public_cap_and_say_nothing_about_the_length(tiny_model_dir, tmp_path,
                                                                                       capsys):
    """dp-decoding / dp-prompt: the length of the document is private, so a document longer than the context window
    is cut to a public cap (not refused with "the prompt (N tokens) …"), and a refusal names the settings only."""
    from dpinfer.cli import main

    docs = []
    for i, n in enumerate((120, 160)):  # both far beyond the tiny model's 512-token window
        doc = tmp_path / f"long{i}.txt"
        doc.write_text("The applicant Zanzibarquux lives in Izmir. " * n, encoding="utf-8")
        docs.append(doc)
    for method in ("dp-decoding", "dp-prompt"):
        records = []
        for doc in docs:
            rc = main(["sanitize", str(doc), "--method", method, "--model", str(tiny_model_dir), "--max-new-tokens",
                       "3", "--tagger", "regex", "--seed", "0", "--json"])
            out, err = capsys.readouterr()
            assert rc == 0, err
            records.append(json.loads(out))
        a, b = records
        assert set(a) == set(b) and a["guarantee"] == b["guarantee"] and a["settings"] == b["settings"]
        assert a["settings"]["max_input_tokens"] >= 1
        messages = set()
        for doc in docs:  # settings that cannot fit: refused by the settings alone, the same line for any document
            rc = main(["sanitize", str(doc), "--method", method, "--model", str(tiny_model_dir), "--max-new-tokens",
                       "3", "--max-input-tokens", "600", "--tagger", "regex"])
            out, err = capsys.readouterr()
            assert rc == 2 and out == "" and err.count("\n") == 1 and "Zanzibarquux" not in err
            messages.add(err)
        assert len(messages) == 1 and "max_input_tokens=600" in messages.pop()
    assert main(["sanitize", str(docs[0]), "--max-input-tokens", "10"]) == 2  # dp-fusion: the option does not apply
    assert "--max-input-tokens applies to" in capsys.readouterr().err


def test_release_holds_no_data_dependent_statistic_unless_debug(tiny_lm, tiny_model_dir, tmp_path, capsys):
    """Hole 4: per-step λ and divergences (exact functions of the private content) are not released."""
    from dpinfer.release import Release, check_release

    res = sanitize(DOC, lm=tiny_lm, spans=SPANS, max_new_tokens=6, seed=0, epsilon=30.0)
    out = res.to_dict()
    assert isinstance(res, Release) and out == res.release() == check_release(res.release())  # public by construction
    assert {"spans", "prompt_tokens", "seconds"} <= set(res.diagnostics()) and "warning" in res.diagnostics()

    def keys(obj):
        if isinstance(obj, dict):
            for k, v in obj.items():
                yield k
                yield from keys(v)
        elif isinstance(obj, list):
            for v in obj:
                yield from keys(v)

    released = set(keys(out))
    for key in ("lambda_per_step", "divergence_per_step", "data_dependent", "debug", "spans", "seconds",
                "prompt_tokens", "mean_lambda", "max_divergence"):
        assert key not in released, key
    assert "lambda" not in json.dumps(out) and "seed" not in released
    assert capsys.readouterr().err == ""
    dbg = sanitize(DOC, lm=tiny_lm, spans=SPANS, max_new_tokens=6, seed=0, epsilon=30.0, debug=True)
    err = capsys.readouterr().err
    assert "data-dependent" in err and "reveal" in err and err.count("\n") == 1
    d = dbg.diagnostics()
    steps = dbg.generated_tokens + (dbg.finish_reason == "eos")  # the step that sampled EOS has its statistics too
    assert len(d["lambda_per_step"]) == steps and "data-dependent" in d["warning"]
    doc = tmp_path / "doc.txt"
    doc.write_text(DOC, encoding="utf-8")
    spans = tmp_path / "spans.json"
    spans.write_text(json.dumps([s.to_dict() for s in SPANS]))
    base = ["sanitize", str(doc), "--spans", str(spans), "--model", str(tiny_model_dir), "--max-new-tokens", "4",
            "--seed", "1", "--json"]
    assert main(base) == 0
    captured = capsys.readouterr()
    assert "lambda" not in captured.out and "divergence" not in captured.out
    assert main([*base, "--debug-stats"]) == 0
    captured = capsys.readouterr()
    assert "lambda_per_step" in captured.out and "data-dependent" in captured.err


def _result(epsilon: float, method: str = "dp-fusion"):
    from dpinfer.accounting import GroupGuarantee, Guarantee
    from dpinfer.pipelines.sanitize import SanitizeResult

    g = Guarantee(epsilon=epsilon, delta=1e-5, mechanism="dp-fusion", adjacency="replace-by-null of a group",
                  max_new_tokens=100, order=2.0, groups=(GroupGuarantee("PERSON", epsilon, 1e-5),
                                                         GroupGuarantee("LOC", 12.3401, 1e-5)))
    return SanitizeResult(text="x", guarantee=g, spans=[], token_ids=[], groups={"PERSON": ["PERSON"]},
                          method=method, finish_reason="eos", prompt_tokens=0, generated_tokens=1,
                          max_new_tokens=100, seconds=1.0)


def test_guarantee_sentence_rounds_epsilon_up_and_says_what_stays_public():
    """Hole 7: 15.2516 was printed 15.25 (rounded down); what the adjacency leaves public was not said."""
    from dpinfer.cli.sanitize import guarantee_sentence as _guarantee_sentence

    res = _result(15.2516)
    from dpinfer.accounting.sanitize_text import guarantee_details

    for make in (_guarantee_sentence, _pipeline_sentence):
        sentence = make(res)
        assert "15.25" not in sentence and "ε = 15.3" in sentence and "LOC ε = 12.4" in sentence  # 12.3401 → 12.4
        assert "where the spans are and how long they are" in sentence and "tagger missed" in sentence
    assert "position and token length of each tagged span" in guarantee_details(res)
    g = res.to_dict()["guarantee"]
    assert any("position" in item for item in g["not_protected"])
    assert any("tagger missed" in item for item in g["not_protected"])
    assert "15.3" in str(res.guarantee) and "15.25" not in str(res.guarantee)


def _pipeline_sentence(res):
    from dpinfer.accounting.sanitize_text import guarantee_sentence

    return guarantee_sentence(res)


def test_zero_spans_are_refused_before_the_model_loads(tiny_lm):
    class Nothing(Tagger):
        name = "nothing"

        def _tag(self, text):
            return []

    for kw in ({"spans": []}, {"spans": "[]"}, {"tagger": Nothing()}):
        for method in ("dp-fusion", "ner-scrub"):
            with pytest.raises(InvalidInputError, match="allow-untagged") as exc:
                sanitize(DOC, lm="/nonexistent/model", method=method, **kw)
            assert "\n" not in str(exc.value) and "Smith" not in str(exc.value)
    res = sanitize(DOC, lm=tiny_lm, spans=[], max_new_tokens=4, seed=0, allow_untagged=True)
    assert res.to_dict()["guarantee"]["sentence"].startswith("Guarantee: none")
    assert math.isinf(res.guarantee.epsilon) and res.to_dict()["guarantee"]["not_protected"].startswith("everything")


def test_spans_from_another_document_are_refused():
    other = "Ms Brown, a judge sitting in Oslo, heard case no. 11111/01 on 1 June 2001 and closed it the same day."
    tab = {"text": other, "entity_mentions": [{"start_offset": 3, "end_offset": 8, "entity_type": "PERSON",
                                               "span_text": "Brown"}]}
    with pytest.raises(InvalidInputError, match="another document") as exc:
        sanitize(DOC, lm="/nonexistent/model", spans=json.dumps(tab))
    assert "Brown" not in str(exc.value) and "Smith" not in str(exc.value)
    del tab["text"]  # span_text alone is checked against THIS document's text
    with pytest.raises(InvalidInputError, match="span_text does not match") as exc:
        sanitize(DOC, lm="/nonexistent/model", spans=json.dumps(tab))
    assert "Brown" not in str(exc.value) and "Smith" not in str(exc.value)


def test_overlapping_user_spans_are_merged(tiny_lm):
    spans = [Span(3, 8, "PERSON"), Span(0, 5, "ORG"), Span(33, 39, "LOC")]
    res = sanitize(DOC, lm=tiny_lm, spans=spans, method="ner-scrub", max_new_tokens=2, seed=0)
    assert [(s.start, s.end) for s in res.spans] == [(0, 8), (33, 39)]
