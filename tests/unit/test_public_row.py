"""Rule 2: a joint mechanism's public row 0 never depends on any private row of any job in the batch, bit for bit.

Enforced once, in the runner (:mod:`dpinfer.engine.runner`; the dynamic-cache runner of :mod:`dpinfer.engine.dynamic`
too), and tested once, here. For every registered joint private mechanism and every model option (float32 / int8,
split output head, prefix sharing, both runners, static / dynamic cache, public padding width), the engine runs a
batch of three jobs twice: job A (the mechanism under test), job B (another public-row mechanism) and a one-row job.
Between the two runs A's private rows AND B's private rows change (other contents, other lengths, shorter and longer
than the public row, one over the batch's capacity); A's and B's public-row logits must be ``torch.equal`` at every
step. A spy wraps each mechanism: it records ``logits[0]``, delegates the step (and the split-head column choice) to
the real mechanism, and then forces a fixed token sequence, so both runs append the same tokens (the mechanisms' own
choices legitimately depend on the private rows).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from dpinfer import models
from dpinfer.engine import Engine, Job
from dpinfer.mechanisms import available_mechanisms, get_mechanism
from dpinfer.mechanisms.base import Mechanism, StepInfo, StepResult
from dpinfer.mechanisms.sampler import Sampler

STEPS = 4
PUBLIC = ("<|im_start|>user\nRewrite the document. The applicant, Mr ____, was born in ____ and lives in ____."
          "<|im_end|>\n<|im_start|>assistant\n")
PRIVATE_SETS = (
    # same prefix as the public row, then other content; one row shorter and one longer than the public row
    ("<|im_start|>user\nRewrite the document. The applicant, Mr Smith, was born in 1970.<|im_end|>\n"
     "<|im_start|>assistant\n",
     "<|im_start|>user\nRewrite the document. The applicant, Mr Smith, a lawyer practising in London, was born in 1970 "
     "and lives in Izmir. On 20 May 1998 the Court decided.<|im_end|>\n<|im_start|>assistant\n"),
    # other lengths and contents; the second row shares no prefix with the public row
    ("<|im_start|>user\nRewrite the document. The applicant, Mr Jones, was born in 1961 and lives in Ankara, Turkey, "
     "with his family; the quick brown fox jumps over the lazy dog.<|im_end|>\n<|im_start|>assistant\n",
     "The quick brown fox"),
)
JOINT_PRIVATE = {
    "dp-fusion": lambda: get_mechanism("dp-fusion", bounds=[0.3, 0.1], group_names=["A", "B"], temperature=0.7,
                                       top_k=7),
    "invisibleink": lambda: get_mechanism("invisibleink", clip_norm=2.0, batch_size=2, top_k=5),
    "amin": lambda: get_mechanism("amin", clip_norm=2.0, batch_size=2, public_top_k=5, max_private_tokens=3),
    "adapmixed": lambda: get_mechanism("adapmixed", batch_size=2, epsilon=4.0, top_k=5),
}
NOT_A_PUBLIC_ROW = {"sampler", "dp-decoding", "dp-prompt", "pad-as-published", "static"}
"""Registered mechanisms without private rows stepped beside a public one (one context, or local DP on it)."""
LONG = " ".join(["The case originated in an application against the Republic of Turkey lodged with the Commission."]
                * 6)
OTHER_PRIVATE = (("Mr Smith, a lawyer practising in London, represented the applicants before the Court.", LONG),
                 ("The quick brown fox", "<|im_start|>user\nThe applicant, Mr Jones, was born in 1961.<|im_end|>\n"))
"""Job B's private rows in the two runs."""
TESTED_ELSEWHERE = {"pad": "tests/unit/rag/test_pipeline.py (K = 2: one private row, through PrivateRAG.ask)"}


class Spy(Mechanism):
    """Records the public row's logits, lets the real mechanism step, then emits a fixed token."""

    name = "spy"
    mode = "joint"

    def __init__(self, inner: Mechanism, tokens: list[int]) -> None:
        self.inner, self.tokens = inner, tokens
        self.public: list[torch.Tensor] = []

    @property
    def public_row(self) -> bool:
        return self.inner.public_row

    @property
    def restricts_private_columns(self) -> bool:
        return self.inner.restricts_private_columns

    def private_columns(self, public_scores: torch.Tensor) -> torch.Tensor | None:
        return self.inner.private_columns(public_scores)

    def start(self, num_contexts: int, vocab_size: int) -> None:
        self.inner.start(num_contexts, vocab_size)

    def step(self, logits: torch.Tensor, info: StepInfo, generator: torch.Generator) -> StepResult:
        self.public.append(logits[0].clone())
        self.inner.step(logits, info, generator)  # the real mechanism's work (its token is overridden)
        return StepResult(tokens=torch.tensor(self.tokens[info.step]))


@pytest.fixture(scope="module")
def lms(tiny_lm, tiny_model_dir):
    return {"float32": tiny_lm, "int8": models.load_model(str(tiny_model_dir), device="cpu", quantize="int8")}


def test_every_registered_joint_private_mechanism_is_covered():
    for name in available_mechanisms():
        assert name in JOINT_PRIVATE or name in NOT_A_PUBLIC_ROW or name in TESTED_ELSEWHERE, \
            f"add {name} to JOINT_PRIVATE"
    for make in JOINT_PRIVATE.values():
        mech = make()
        assert mech.mode == "joint" and mech.public_row


RUNNERS = (("slots", True), ("dynamic", True), ("dynamic", False))
"""(runner, static_cache)."""
OPTIONS = list(itertools.product(["float32", "int8"], [True, False], [True, False], RUNNERS, [None, 128]))


@pytest.mark.parametrize("mechanism", sorted(JOINT_PRIVATE))
@pytest.mark.parametrize(("model", "split_head", "prefix_sharing", "runner", "pad_width"), OPTIONS)
def test_public_logits_never_depend_on_private_rows(lms, mechanism, model, split_head, prefix_sharing, runner,
                                                    pad_width):
    lm = lms[model]
    public = lm.encode(PUBLIC)
    other_public = lm.encode(PUBLIC.replace("document", "judgment"))
    eos = lm.eos_token_ids
    tokens = [t for t in range(5, 400, 7) if t not in eos][:STEPS]
    other = "invisibleink" if mechanism == "dp-fusion" else "dp-fusion"
    runs = []
    for private, other_private in zip(PRIVATE_SETS, OTHER_PRIVATE, strict=True):
        spies = [Spy(JOINT_PRIVATE[mechanism](), tokens), Spy(JOINT_PRIVATE[other](), tokens[:STEPS - 1])]
        jobs = [Job([public, *(lm.encode(p) for p in private)], spies[0], STEPS, pad_width=pad_width),
                Job([other_public, *(lm.encode(p) for p in other_private)], spies[1], STEPS - 1),
                Job([lm.encode(private[0])], Sampler(temperature=0, mode="joint"), 3, pad_width=len(public))]
        engine = Engine(lm, split_head=split_head, prefix_sharing=prefix_sharing, runner=runner[0],
                        static_cache=runner[1], max_rows=8)
        outs = dict(engine.run_jobs(jobs))
        assert outs[0].sequences[0] == tokens and outs[1].sequences[0] == tokens[:STEPS - 1]
        runs.append([spy.public for spy in spies])
    lengths = [[len(lm.encode(p)) for p in private] for private in PRIVATE_SETS]
    assert lengths[0] != lengths[1] and min(map(min, lengths)) < len(public) < max(map(max, lengths))
    assert len(lm.encode(LONG)) > 64  # over the pool's capacity without pad_width: a side row
    for job in range(2):
        a, b = runs[0][job], runs[1][job]
        assert len(a) == len(b) == STEPS - job
        for step, (x, y) in enumerate(zip(a, b, strict=True)):
            assert torch.equal(x, y), f"job {job}: public logits differ at step {step}"


def test_synth_pads_to_a_public_width_that_fits_cut_references(tiny_lm):
    """``synthesize`` gives the engine a padding width from the template and ``max_reference_tokens`` only; references
    cut to that many tokens fit it, so the K rows decode in one batch."""
    import inspect

    from dpinfer.configs.synth import TEMPLATES
    from dpinfer.methods.synthesize import batch_contexts, public_pad_width
    from dpinfer.references import Reference

    assert list(inspect.signature(public_pad_width).parameters) == ["lm", "template", "labels", "max_reference_tokens"]
    template = TEMPLATES["generic"]
    refs = [Reference(t) for t in ("Short.", " ".join(PRIVATE_SETS[1]) * 3, "The quick brown fox " * 20, "é" * 90)]
    for cut in (4, 16, 64):
        width = public_pad_width(tiny_lm, template, refs[0].labels, cut)
        rows = batch_contexts(tiny_lm, template, refs, cut)
        assert max(map(len, rows)) <= width
    assert public_pad_width(tiny_lm, template, refs[0].labels, None) is None
