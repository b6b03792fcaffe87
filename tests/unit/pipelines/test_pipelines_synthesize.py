"""The synthesis pipeline (dpinfer.synthesize) on the tiny random-weight model (``dpinfer synth``: tests/unit/cli)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dpinfer.accounting.calibration import Budget, Spec
from dpinfer.configs.synth import TEMPLATES, PromptTemplate
from dpinfer.errors import ConfigurationError, DataNotFoundError, InvalidInputError
from dpinfer.pipelines.synthesize import synthesize
from dpinfer.references import Reference, load_references, partition
from dpinfer.release import check_release

REVIEWS = [
    ("The pasta was fresh and the staff were kind.", "Restaurants", "5.0"),
    ("Slow service, cold fries, never again.", "Restaurants", "1.0"),
    ("Great haircut, friendly barber.", "Beauty", "5.0"),
    ("Lovely pizza and a quiet room.", "Restaurants", "5.0"),
    ("They lost my booking twice.", "Hotels", "2.0"),
    ("Best tacos in town.", "Restaurants", "5.0"),
    ("Clean rooms and a good breakfast.", "Hotels", "4.0"),
    ("The soup was salty but the bread was great.", "Restaurants", "5.0"),
    ("", "Restaurants", "5.0"),
]
TEMPLATE = PromptTemplate(private='Review ({cat}, {stars}): "{reference}". Write another.',
                          public="Write a review ({cat}, {stars}).")


def _refs() -> list[Reference]:
    return [Reference(t, {"cat": c, "stars": s}) for t, c, s in REVIEWS]


def test_partition_is_disjoint_label_pure_seeded_and_text_independent() -> None:
    refs = _refs()
    batches, left = partition(refs, 2, seed=3)
    flat = [i for b in batches for i in b]
    assert len(flat) == len(set(flat)) and len(flat) + left == len(refs)
    for b in batches:
        assert len(b) == 2 and len({tuple(sorted(refs[i].labels.items())) for i in b}) == 1
    assert partition(refs, 2, seed=3) == (batches, left)
    other_text = [Reference("x" * (i + 1), r.labels) for i, r in enumerate(refs)]
    assert partition(other_text, 2, seed=3) == (batches, left)  # the texts play no part


def test_templates_render_and_validate() -> None:
    assert "{reference}" in TEMPLATES["yelp"].private and "{reference}" not in TEMPLATES["yelp"].public
    assert TEMPLATES["yelp"].fields() == {"label1", "label2"}
    with pytest.raises(ConfigurationError, match="reference"):
        PromptTemplate(private="no slot", public="p")
    with pytest.raises(ConfigurationError, match="must not"):
        PromptTemplate(private="{reference}", public="{reference}")
    with pytest.raises(ConfigurationError, match="label field"):
        PromptTemplate(private="{reference} {x}", public="p").render_private("r", {})


def test_load_references_jsonl_and_csv(tmp_path: Path) -> None:
    j = tmp_path / "c.jsonl"
    j.write_text("\n".join(json.dumps({"body": t, "cat": c}) for t, c, _ in REVIEWS[:3]) + "\n", encoding="utf-8")
    refs = load_references(j, text_field="body", label_fields=["cat"])
    assert [r.text for r in refs] == [t for t, _, _ in REVIEWS[:3]] and refs[0].labels == {"cat": "Restaurants"}
    c = tmp_path / "c.csv"
    c.write_text('text,stars\n"a, b",5\nc,4\n', encoding="utf-8")
    assert [r.text for r in load_references(c, text_field="text", label_fields=["stars"])] == ["a, b", "c"]
    assert len(load_references(c, text_field="text", limit=1)) == 1


@pytest.mark.parametrize(
    "content,suffix,field,error,match",
    [
        ("", ".csv", "text", InvalidInputError, "empty"),
        ("\n\n", ".jsonl", "text", InvalidInputError, "no records"),
        ('{"body": "secret words"}\n', ".jsonl", "text", InvalidInputError, "no field 'text'"),
        ("not json\n", ".jsonl", "text", InvalidInputError, "line 1: not valid JSON"),
        ('{"text": 3}\n', ".jsonl", "text", InvalidInputError, "not a string"),
        ("x", ".txt", "text", InvalidInputError, ".jsonl or .csv"),
    ],
)
def test_load_references_errors_name_the_place_not_the_content(tmp_path: Path, content: str, suffix: str,
                                                               field: str, error: type, match: str) -> None:
    p = tmp_path / f"c{suffix}"
    p.write_text(content, encoding="utf-8")
    with pytest.raises(error, match=match) as exc:
        load_references(p, text_field=field)
    assert "secret" not in str(exc.value)


def test_load_references_missing_file() -> None:
    with pytest.raises(DataNotFoundError):
        load_references("/nonexistent/c.csv", text_field="text")


@pytest.mark.parametrize("method", ["invisibleink", "amin", "adapmixed", "public"])
def test_synthesize_runs_every_method(tiny_lm, method: str, tmp_path: Path) -> None:
    res = synthesize(_refs(), lm=tiny_lm, method=method, epsilon=8.0, batch_size=2, max_new_tokens=6,
                     prompt_template=TEMPLATE, seed=1, max_reference_tokens=8)
    assert len(res.texts) == 2  # Restaurants 5.0 has 5 records (one empty): 2 batches of 2; the others none
    assert all(t.tokens <= 6 and t.labels == {"cat": "Restaurants", "stars": "5.0"} for t in res.texts)
    assert res.lm_calls_per_token == (1 if method == "public" else 3)
    g = res.guarantee
    if method in ("invisibleink", "amin"):
        assert g.epsilon <= 8.0 + 1e-9 and g.ex_ante and g.max_new_tokens == 6
    elif method == "public":
        assert g.epsilon == 0.0 and res.references_used == 0
    else:
        assert math.isinf(g.epsilon) and all("spent" in t.data_dependent for t in res.texts)
    release = check_release(res.release())  # public by construction: no timing, seed, statistics
    assert len(release["texts"]) == 2 and release["guarantee"] == g.to_dict()
    diagnostics = res.diagnostics()
    assert "warning" in diagnostics and diagnostics["seconds"] >= 0 and len(diagnostics["texts"]) == 2
    if method == "adapmixed":
        assert all("spent" in t for t in diagnostics["texts"])
    out = tmp_path / "o.jsonl"
    res.write_jsonl(out)
    lines = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert lines[0]["dpinfer"]["guarantee"]["mechanism"] == method
    assert lines[0]["dpinfer"]["settings"]["batch_size"] == 2 and len(lines) == 3
    assert all("text" in x and "data_dependent" not in x and "private_tokens" not in x for x in lines[1:])


def test_a_synthesis_release_refuses_a_forbidden_key() -> None:
    from dpinfer.accounting import Guarantee
    from dpinfer.pipelines.synthesize import SynthesisResult, SyntheticText
    from dpinfer.release import ReleaseError

    text = SyntheticText("a text", {"cat": "x"}, 0, 2, "eos", data_dependent={"spent": 1.0})
    res = SynthesisResult([text], Guarantee.no_privacy("public"), "public", {"batch_size": 2}, 0, 0, 0.5, 1)
    assert check_release(res.release())["texts"] == [text.release()]
    res.settings = {"batch_size": 2, "seed": 7}  # a seed never sits next to a release
    with pytest.raises(ReleaseError, match=r"settings\.seed"):
        res.release()
    with pytest.raises(ReleaseError, match=r"settings\.seed"):
        res.jsonl_lines()


def test_synthesize_is_reproducible_with_a_seed(tiny_lm) -> None:
    kw = {"lm": tiny_lm, "epsilon": 5.0, "batch_size": 2, "max_new_tokens": 8, "prompt_template": TEMPLATE,
          "seed": 4}
    assert [t.text for t in synthesize(_refs(), **kw).texts] == [t.text for t in synthesize(_refs(), **kw).texts]


def test_the_null_reference_uses_the_public_prompt(tiny_lm, monkeypatch: pytest.MonkeyPatch) -> None:
    """Replace-by-null: an empty reference's context IS the public prompt, so its clipped difference is 0 and a batch
    of null references releases the public distribution."""
    import torch

    from dpinfer.engine import Engine
    from dpinfer.mechanisms.invisibleink import InvisibleInk

    seen: list[list[list[int]]] = []
    real_run_jobs = Engine.run_jobs

    def spy(self, jobs):
        seen.extend([list(c) for c in job.contexts] for job in jobs)
        return real_run_jobs(self, jobs)

    monkeypatch.setattr(Engine, "run_jobs", spy)
    refs = [Reference("", {"cat": "R", "stars": "5"}), Reference("Tasty soup.", {"cat": "R", "stars": "5"})]
    synthesize(refs, lm=tiny_lm, epsilon=5.0, batch_size=2, max_new_tokens=3, prompt_template=TEMPLATE, seed=2)
    (contexts,) = seen
    assert len(contexts) == 3
    assert contexts.count(contexts[0]) == 2  # the public row and the null reference's row
    mech = InvisibleInk.calibrated(Budget(5.0, 1e-6), Spec(6, batch_size=2, top_k=None))
    z = torch.randn(1, 7, dtype=torch.float64).expand(3, 7)
    p, _ = mech.distribution(z)
    assert torch.allclose(p, torch.softmax(z[0], -1))


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"references": []}, InvalidInputError, "empty"),
        ({"batch_size": 20}, InvalidInputError, "fewer than one batch"),
        ({"epsilon": 0.0}, ConfigurationError, "epsilon"),
        ({"epsilon": -1.0}, ConfigurationError, "epsilon"),
        ({"method": "nope"}, ConfigurationError, "unknown method"),
        ({"prompt_template": "nope"}, ConfigurationError, "unknown prompt template"),
        ({"prompt_template": "yelp"}, ConfigurationError, "label field"),
        ({"max_new_tokens": 0}, ConfigurationError, "max_new_tokens"),
    ],
)
def test_synthesize_rejects_bad_input(tiny_lm, kwargs: dict, error: type, match: str) -> None:
    args = {"references": _refs(), "lm": tiny_lm, "epsilon": 5.0, "batch_size": 2, "max_new_tokens": 4,
            "prompt_template": TEMPLATE, **kwargs}
    refs = args.pop("references")
    with pytest.raises(error, match=match):
        synthesize(refs, **args)


def test_response_prefix_opens_every_context(tiny_lm) -> None:
    from dpinfer.methods.synthesize import batch_contexts

    tpl = PromptTemplate(private=TEMPLATE.private, public=TEMPLATE.public, response_prefix="Review ({stars}):\n")
    rows = batch_contexts(tiny_lm, tpl, _refs()[:2])
    tail = tiny_lm.encode("Review (5.0):\n")
    assert len(rows) == 3 and all(r[-len(tail):] == tail for r in rows)
    assert tpl.fields() == {"cat", "stars"}
    with pytest.raises(ConfigurationError, match="response prefix"):
        PromptTemplate(private="{reference}", public="p", response_prefix="{reference}")


def test_skip_batches_and_on_text_release_each_batch_once(tiny_lm) -> None:
    """A resumed run plans only the batches not yet released; each text is handed out as its batch finishes; with a
    seed a batch's text does not depend on which other batches run with it."""
    kw = {"lm": tiny_lm, "epsilon": 5.0, "batch_size": 2, "max_new_tokens": 6, "prompt_template": TEMPLATE,
          "seed": 4, "max_reference_tokens": 8}
    full = synthesize(_refs(), **kw)
    assert [t.batch for t in full.texts] == [0, 1]
    handed: list[int] = []
    rest = synthesize(_refs(), skip_batches={0}, on_text=lambda t: handed.append(t.batch), **kw)
    assert handed == [1] and [t.batch for t in rest.texts] == [1]
    assert rest.texts[0].to_dict() == full.texts[1].to_dict()
    assert rest.guarantee == full.guarantee and rest.references_used == full.references_used
    assert synthesize(_refs(), skip_batches={0, 1}, **kw).texts == []
    with pytest.raises(ConfigurationError, match="not a batch index"):
        synthesize(_refs(), skip_batches={2}, **kw)


def test_synthesize_iter_yields_texts_as_batches_finish(tiny_lm) -> None:
    from dpinfer.pipelines.synthesize import plan_synthesis, synthesize_iter

    plan = plan_synthesis(_refs(), epsilon=5.0, batch_size=2, max_new_tokens=4, prompt_template=TEMPLATE, seed=1)
    seen: list[tuple[int, int]] = []
    texts = list(synthesize_iter(plan, lm=tiny_lm, skip_batches=[1], progress=lambda d, n: seen.append((d, n))))
    assert [t.batch for t in texts] == [0] and seen == [(1, 2), (2, 2)]  # the skipped batch counts as done; total first


def test_plan_header_and_partition_digest_hold_no_reference() -> None:
    from dpinfer.pipelines.synthesize import plan_synthesis

    kw = {"epsilon": 5.0, "batch_size": 2, "max_new_tokens": 4, "prompt_template": TEMPLATE, "seed": 1}
    plan = plan_synthesis(_refs(), **kw)
    head = plan.header("m", {"limit": None})["dpinfer"]
    assert head["texts"] == len(plan.batches) == 2 and head["references"] == len(REVIEWS)
    assert head["settings"]["model"] == "m" and '"seed"' not in json.dumps(head)
    digest = plan.partition_sha256()
    assert len(digest) == 64 and digest == plan_synthesis(_refs(), **kw).partition_sha256()
    blob = json.dumps(head) + digest
    assert not any(text and text in blob for text, _, _ in REVIEWS)
    used = next(i for b in plan.batches for i in b if REVIEWS[i][0])
    edited = _refs()
    edited[used] = Reference(edited[used].text + " Edited.", edited[used].labels)
    assert plan_synthesis(edited, **kw).partition_sha256() != digest  # one reference edited: refused on resume
    assert plan_synthesis(edited, **kw).header("m") == plan.header("m")  # which the header alone cannot see
    assert plan_synthesis(_refs(), **{**kw, "seed": 2}).partition_sha256() != digest
    left_out = next(i for i in range(len(REVIEWS)) if all(i not in b for b in plan.batches))
    other = _refs()
    other[left_out] = Reference("changed", other[left_out].labels)  # a reference in no batch: same partition
    assert plan_synthesis(other, **kw).partition_sha256() == digest


def test_a_toy_method_is_one_table_entry(tiny_lm, monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding a method is a builder and one entry of the synthesize table: the pipeline dispatches through the table,
    a SynthConfig carries the settings once."""
    from dpinfer.configs.synth import SynthConfig
    from dpinfer.methods import Method
    from dpinfer.methods.synthesize import TABLE

    monkeypatch.setattr(TABLE, "_entries", dict(TABLE._entries))
    TABLE.register(Method("toy", "synthesize", build=_toy_build, mechanism="invisibleink", contexts="batch",
                          protects="references", summary="a toy"))
    config = SynthConfig(method="toy", epsilon=8.0, batch_size=2, max_new_tokens=4, prompt_template=TEMPLATE, seed=1)
    res = synthesize(_refs(), config, lm=tiny_lm)
    assert res.method == "toy" and len(res.texts) == 2 and res.guarantee.epsilon <= 4.0 + 1e-9
    assert synthesize(_refs(), config, lm=tiny_lm, max_texts=1).settings["max_texts"] == 1  # keywords over config
    with pytest.raises(ConfigurationError, match="unknown setting"):
        synthesize(_refs(), config, lm=tiny_lm, max_txts=1)


def _toy_build(config, runtime=None):
    from dpinfer.methods.synthesize import build_invisibleink

    return build_invisibleink(config.replace(epsilon=config.epsilon / 2))
