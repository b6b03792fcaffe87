"""The sanitize pipeline on the tiny model: contexts, groups, methods, guarantees, errors."""

from __future__ import annotations

import json
import math

import pytest

from dpinfer.cli import main
from dpinfer.errors import ConfigurationError, ContextTooLongError, InvalidInputError, TaggingError
from dpinfer.pipelines.sanitize import (
    placeholder_id,
    prepare_contexts,
    resolve_group_epsilon,
    resolve_groups,
    sanitize,
)
from dpinfer.taggers import Span, Tagger

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
    a = sanitize(DOC, **kw)
    b = sanitize(DOC, **kw)
    assert a.text == b.text
    g = a.guarantee
    per = {gr.name: gr.epsilon for gr in g.groups}
    assert set(per) == {"PERSON", "CODE", "LOC", "DATETIME"}
    assert per["PERSON"] <= 20.0 + 1e-9 and per["PERSON"] == pytest.approx(20.0, rel=1e-6)
    assert per["LOC"] == pytest.approx(30.0, rel=1e-6)
    assert g.epsilon == max(per.values()) and g.max_new_tokens == 12 and g.order == 2.0
    dd = a.to_dict()["data_dependent"]
    assert "not a privacy guarantee" in dd["note"]
    assert set(dd["groups"]) == set(per)
    assert all(0.0 <= lam <= 1.0 for row in dd["lambda_per_step"] for lam in row)


def test_infeasible_epsilon_is_a_clear_error(tiny_lm):
    with pytest.raises(ConfigurationError, match="smallest reachable"):
        sanitize(DOC, lm=tiny_lm, spans=SPANS, epsilon=1.0, max_new_tokens=8)


def test_too_long_document_is_refused_not_truncated(tiny_lm):
    with pytest.raises(ContextTooLongError, match="context window"):
        sanitize(DOC * 20, lm=tiny_lm, spans=[], max_new_tokens=8)


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


def test_cli_sanitize_json_and_errors(tiny_model_dir, tmp_path, capsys):
    doc = tmp_path / "doc.txt"
    doc.write_text(DOC)
    spans = tmp_path / "spans.json"
    spans.write_text(json.dumps([s.to_dict() for s in SPANS]))
    rc = main(["sanitize", str(doc), "--spans", str(spans), "--model", str(tiny_model_dir), "--max-new-tokens", "6",
               "--seed", "1", "--json", "--group-epsilon", "PERSON=25"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert {"text", "guarantee"} <= set(out)
    assert {"epsilon", "delta", "groups"} <= set(out["guarantee"])
    bad = [
        (["--epsilon", "0"], "must be > 0"),
        (["--epsilon", "-3"], "must be > 0"),
        (["--group-epsilon", "PERSON"], "NAME=EPSILON"),
        (["--group-epsilon", "NAMES=3"], "neither a group nor a label"),
    ]
    for extra, needle in bad:
        rc = main(["sanitize", str(doc), "--spans", str(spans), "--model", str(tiny_model_dir), *extra])
        err = capsys.readouterr().err
        assert rc == 2 and needle in err and err.count("\n") == 1, (extra, err)
    spans.write_text(json.dumps([{"start": 0, "end": 999, "label": "PERSON"}]))
    assert main(["sanitize", str(doc), "--spans", str(spans), "--model", str(tiny_model_dir)]) == 2
    assert "ends beyond" in capsys.readouterr().err
    spans.write_text(json.dumps([{"start": 0, "end": 2, "label": "NAME"}]))
    assert main(["sanitize", str(doc), "--spans", str(spans), "--model", str(tiny_model_dir)]) == 2
    assert "unknown label" in capsys.readouterr().err


def test_guarantee_is_ex_ante(tiny_lm):
    """Same groups, targets and T_max: the same guarantee whatever the document says and whatever was generated."""
    other = "Ms Brown, a judge sitting in Oslo, heard case no. 11111/01 on 1 June 2001 and closed it the same day."
    other_spans = [Span(3, 8, "PERSON"), Span(29, 33, "LOC"), Span(50, 58, "CODE"), Span(62, 73, "DATETIME")]
    assert [other[s.start:s.end] for s in other_spans] == ["Brown", "Oslo", "11111/01", "1 June 2001"]
    a = sanitize(DOC, lm=tiny_lm, spans=SPANS, max_new_tokens=10, seed=1, epsilon=25.0)
    b = sanitize(other, lm=tiny_lm, spans=other_spans, max_new_tokens=10, seed=2, epsilon=25.0)
    assert a.guarantee.to_dict() == b.guarantee.to_dict()
    assert "before" in str(a.guarantee)


@pytest.mark.parametrize(("content", "needle"), [(b"", "is empty"), (b"  \n\t", "is empty"),
                                                 (b"\x00\x01binary", "binary"), (b"\xff\xfe\xfa", "UTF-8")])
def test_cli_sanitize_rejects_bad_files(content, needle, tiny_model_dir, tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(content)
    rc = main(["sanitize", str(bad), "--tagger", "regex", "--model", str(tiny_model_dir)])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and err.count("\n") == 1 and "Traceback" not in err


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
            max_new_tokens=24, seed=seed, processors=[NoRepeatNGram(3)])
        assert max(max(s["lambda"]) for s in fusion.steps if s["divergence"] != [0.0] * len(s["lambda"])) < 1e-100
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
    assert rc == 0 and "compared with any other values" in " ".join(out.split())
