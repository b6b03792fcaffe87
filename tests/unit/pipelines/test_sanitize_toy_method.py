"""Adding a method to sanitisation is a module (here: :func:`build_toy` in this test module) plus one entry in
:data:`dpinfer.methods.sanitize.TABLE`; the pipeline, the checks, ``--help`` and the command line offer it with no
other change, and the pipeline dispatches to it through the table."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from dpinfer.cli import main
from dpinfer.configs.sanitize import SanitizeConfig
from dpinfer.defaults import SANITIZE
from dpinfer.methods import method_names, methods_help
from dpinfer.methods.sanitize import TABLE, BuildArgs
from dpinfer.methods.table import Method
from dpinfer.pipelines.sanitize import plan_sanitize, sanitize
from dpinfer.pipelines.sanitize_contexts import DEFAULT_INSTRUCTION, prepare_contexts
from dpinfer.taggers import Span
from dpinfer.taggers.resolve import resolve_groups
from dpinfer.validation import check_sanitize_params

DOC = "Mr Smith, a lawyer practising in London, lodged application no. 36244/06 on 20 May 1998."
SPANS = [Span(3, 8, "PERSON"), Span(33, 39, "LOC"), Span(64, 72, "CODE"), Span(76, 87, "DATETIME")]


def build_toy(config: SanitizeConfig, args: BuildArgs):
    """The toy method's builder: the plain sampler at a temperature set from ε, on the public context (it never reads
    the spans, so its guarantee is ε = 0 for their content, as NER scrubbing's)."""
    from dpinfer.mechanisms.sampler import Sampler

    args.settings["toy_temperature"] = 1.0 + 1.0 / config.epsilon
    return Sampler(temperature=args.settings["toy_temperature"], mode="joint")


@pytest.fixture
def toy() -> Iterator[str]:
    """The one table entry, taken out again after the test."""
    TABLE.register(Method("toy-scrub", "sanitize", build=f"{__name__}:build_toy", mechanism="sampler",
                          contexts="public", protects="spans", guarantee="zero",
                          summary="a toy registered by the table test"))
    yield "toy-scrub"
    TABLE.unregister("toy-scrub")


def test_a_toy_method_runs_through_the_pipeline(toy: str, tiny_lm) -> None:
    assert toy in method_names("sanitize") and "toy-scrub: a toy registered by the table test" in methods_help(
        "sanitize")
    check_sanitize_params(method=toy, epsilon=2.0)  # accepted by the checks
    plan = plan_sanitize(DOC, lm=tiny_lm, method=toy, epsilon=4.0, spans=SPANS, max_new_tokens=6, seed=0)
    prep = prepare_contexts(tiny_lm, DOC, SPANS, resolve_groups(SPANS, None), DEFAULT_INSTRUCTION)
    assert plan.job.contexts == [prep.public + prep.opening(SANITIZE.opening_tokens)]  # the public row (+ its opening)
    res = sanitize(DOC, lm=tiny_lm, method=toy, epsilon=4.0, spans=SPANS, max_new_tokens=6, seed=0)
    assert res.method == toy and 1 <= res.generated_tokens <= 6 == res.max_new_tokens
    assert res.settings["toy_temperature"] == pytest.approx(1.25)  # its builder ran, with the config's ε
    assert res.guarantee.epsilon == 0 and {g.name for g in res.guarantee.groups} == set(res.groups)
    assert "reveals nothing about what the tagged" in res.release()["guarantee"]["sentence"]


def test_a_toy_method_on_the_command_line(toy: str, tiny_model_dir, tmp_path, capsys) -> None:
    doc = tmp_path / "doc.txt"
    doc.write_text(DOC, encoding="utf-8")
    spans = tmp_path / "spans.json"
    spans.write_text(json.dumps([s.to_dict() for s in SPANS]), encoding="utf-8")
    assert main(["sanitize", str(doc), "--spans", str(spans), "--spans-only", "--method", toy, "--model",
                 str(tiny_model_dir), "--max-new-tokens", "4", "--seed", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == toy and out["guarantee"]["epsilon"] == 0


def test_the_table_is_restored_after_the_toy() -> None:
    assert "toy-scrub" not in TABLE and "toy-scrub" not in method_names("sanitize")
