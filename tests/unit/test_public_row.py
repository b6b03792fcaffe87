"""Rule 2: a joint mechanism's public row 0 never depends on the private rows, bit for bit.

For every registered joint private mechanism and every model option (float32 / int8, split output head, prefix
sharing, static / dynamic cache, public padding width), the engine runs the same public row with two different sets
of private rows (other contents AND other lengths, shorter and longer than the public row) and the public row's logits
must be ``torch.equal`` at every step. A spy wraps the mechanism: it records ``logits[0]``, delegates the step (and the
split-head column choice) to the real mechanism, and then forces a fixed token sequence, so both runs append the same
tokens (the mechanisms' own choices legitimately depend on the private rows).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from dpinfer import models
from dpinfer.engine import Engine
from dpinfer.mechanisms import available_mechanisms, get_mechanism
from dpinfer.mechanisms.base import Mechanism, StepInfo, StepResult

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


OPTIONS = list(itertools.product(["float32", "int8"], [True, False], [True, False], [True, False], [None, 128]))


@pytest.mark.parametrize("mechanism", sorted(JOINT_PRIVATE))
@pytest.mark.parametrize(("model", "split_head", "prefix_sharing", "static_cache", "pad_width"), OPTIONS)
def test_public_logits_never_depend_on_private_rows(lms, mechanism, model, split_head, prefix_sharing, static_cache,
                                                    pad_width):
    lm = lms[model]
    public = lm.encode(PUBLIC)
    eos = lm.eos_token_ids
    tokens = [t for t in range(5, 400, 7) if t not in eos][:STEPS]
    runs = []
    for private in PRIVATE_SETS:
        rows = [public, *(lm.encode(p) for p in private)]
        spy = Spy(JOINT_PRIVATE[mechanism](), tokens)
        engine = Engine(lm, split_head=split_head, prefix_sharing=prefix_sharing, static_cache=static_cache)
        out = engine.generate(rows, spy, max_new_tokens=STEPS, pad_width=pad_width)
        assert out.sequences[0] == tokens
        runs.append(spy.public)
    lengths = [[len(lm.encode(p)) for p in private] for private in PRIVATE_SETS]
    assert lengths[0] != lengths[1] and min(map(min, lengths)) < len(public) < max(map(max, lengths))
    assert len(runs[0]) == len(runs[1]) == STEPS
    for step, (a, b) in enumerate(zip(*runs, strict=True)):
        assert torch.equal(a, b), f"public logits differ at step {step}"


def test_synth_pads_to_a_public_width_that_fits_cut_references(tiny_lm):
    """``synthesize`` gives the engine a padding width from the template and ``max_reference_tokens`` only; references
    cut to that many tokens fit it, so the K rows decode in one batch."""
    import inspect

    from dpinfer.pipelines.synthesize import TEMPLATES, Reference, batch_contexts, public_pad_width

    assert list(inspect.signature(public_pad_width).parameters) == ["lm", "template", "labels", "max_reference_tokens"]
    template = TEMPLATES["generic"]
    refs = [Reference(t) for t in ("Short.", " ".join(PRIVATE_SETS[1]) * 3, "The quick brown fox " * 20, "é" * 90)]
    for cut in (4, 16, 64):
        width = public_pad_width(tiny_lm, template, refs[0].labels, cut)
        rows = batch_contexts(tiny_lm, template, refs, cut)
        assert max(map(len, rows)) <= width
    assert public_pad_width(tiny_lm, template, refs[0].labels, None) is None
