"""Engine tests on a tiny random-weight Llama built in the session (see conftest)."""

from __future__ import annotations

import importlib
import itertools

import pytest
import torch

from dpinfer.engine import Engine
from dpinfer.engine.prefill import common_prefix_length
from dpinfer.errors import ConfigurationError, ContextTooLongError, InvalidInputError
from dpinfer.mechanisms.base import Mechanism, StepInfo, StepResult
from dpinfer.mechanisms.sampler import Sampler

PROMPTS = [
    "The applicant was born in 1970 and lives in Izmir. On 20 May 1998 the Court decided",
    "Mr Smith, a lawyer practising in London,",
    "The quick brown fox",
]
RUNNERS = ("slots", "dynamic")


class Recorder(Mechanism):
    """Joint mechanism that records every row's logits and emits row 0's argmax."""

    name = "recorder"
    mode = "joint"

    def __init__(self) -> None:
        self.logits: list[torch.Tensor] = []

    def step(self, logits: torch.Tensor, info: StepInfo, generator: torch.Generator) -> StepResult:
        assert logits.dtype == torch.float64
        self.logits.append(logits.clone())
        return StepResult(tokens=logits[0].argmax(), stats={"step": float(info.step)})


def hf_greedy(lm, ids: list[int], n: int) -> list[int]:
    x = torch.tensor([ids])
    with torch.inference_mode():
        out = lm.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                                min_new_tokens=n, pad_token_id=lm.pad_token_id)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_matches_hf_generate(tiny_lm, tiny_hf_lm, prompt):
    """The engine on dpinfer's own model code, greedy, against transformers' generate on the same weights."""
    assert (tiny_lm.backend, tiny_hf_lm.backend) == ("own", "hf")
    ids = tiny_lm.encode(prompt)
    out = Engine(tiny_lm).generate([ids], Sampler(temperature=0), max_new_tokens=24, min_new_tokens=24)
    assert out.sequences[0] == hf_greedy(tiny_hf_lm, ids, 24)
    hf = Engine(tiny_hf_lm).generate([ids], Sampler(temperature=0), max_new_tokens=24, min_new_tokens=24)
    assert hf.sequences[0] == out.sequences[0]
    assert out.finish_reasons == ["length"]


@pytest.mark.parametrize("sharing", [True, False])
def test_identical_contexts_joint_give_identical_rows(tiny_lm, sharing):
    ids = tiny_lm.encode(PROMPTS[0])
    rec = Recorder()
    out = Engine(tiny_lm, prefix_sharing=sharing).generate([ids] * 4, rec, max_new_tokens=12, min_new_tokens=12)
    assert out.shared_prefix == (len(ids) - 1 if sharing else 0)
    for step_logits in rec.logits:
        p = torch.softmax(step_logits, -1)
        torch.testing.assert_close(p, p[:1].expand_as(p), atol=1e-6, rtol=0)
    assert len(out.steps) == 12 and out.steps[3] == {"step": 3.0}


def test_left_padding_matches_each_row_alone(tiny_lm):
    rows = [tiny_lm.encode(p) for p in PROMPTS]
    assert len({len(r) for r in rows}) == 3
    batched = Recorder()
    Engine(tiny_lm, prefix_sharing=False).generate(rows, batched, max_new_tokens=6, min_new_tokens=6)
    for i, r in enumerate(rows):
        # feed row i the same tokens the batch appended (row 0's choices) to compare like with like
        forced = _Forced([int(s[0].argmax()) for s in batched.logits])
        Engine(tiny_lm).generate([r], forced, max_new_tokens=6, min_new_tokens=6)
        for a, b in zip(forced.logits, batched.logits, strict=True):
            torch.testing.assert_close(a[0], b[i], atol=1e-4, rtol=1e-4)


class _Forced(Recorder):
    def __init__(self, tokens: list[int]) -> None:
        super().__init__()
        self.tokens = tokens

    def step(self, logits, info, generator):
        self.logits.append(logits.clone())
        return StepResult(tokens=torch.tensor(self.tokens[info.step]))


def test_prefix_sharing_is_exact(tiny_lm):
    base = tiny_lm.encode(PROMPTS[0])
    rows = [base + tiny_lm.encode(" in Izmir"), base + tiny_lm.encode(" and the Government"), base]
    assert common_prefix_length(rows) == len(base)
    shared, unshared = Recorder(), Recorder()
    o1 = Engine(tiny_lm, prefix_sharing=True).generate(rows, shared, max_new_tokens=8, min_new_tokens=8)
    o2 = Engine(tiny_lm, prefix_sharing=False).generate(rows, unshared, max_new_tokens=8, min_new_tokens=8)
    assert o1.shared_prefix == len(base) - 1 and o2.shared_prefix == 0
    for a, b in zip(shared.logits, unshared.logits, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_independent_rows_stop_at_their_own_eos(tiny_lm):
    eos = next(iter(tiny_lm.eos_token_ids))

    class EosAt(Mechanism):
        name, mode = "eos-at", "independent"

        def step(self, logits, info, generator):
            toks = torch.full((info.num_contexts,), 5, dtype=torch.long)
            toks[0] = eos if info.step == 2 else 5
            toks[1] = eos if info.step == 4 else 6
            return StepResult(tokens=toks)

    ids = tiny_lm.encode(PROMPTS[2])
    out = Engine(tiny_lm).generate([ids, ids, ids], EosAt(), max_new_tokens=7)
    assert out.sequences[0] == [5, 5] and out.sequences[1] == [6] * 4 and len(out.sequences[2]) == 7
    assert out.finish_reasons == ["eos", "eos", "length"]


def test_joint_stops_at_eos_and_min_new_tokens_masks_it(tiny_lm):
    eos = next(iter(tiny_lm.eos_token_ids))

    class PreferEos(Mechanism):
        name, mode = "prefer-eos", "joint"

        def step(self, logits, info, generator):
            return StepResult(tokens=torch.tensor(eos) if torch.isfinite(logits[0, eos]) else logits[0].argmax())

    ids = tiny_lm.encode(PROMPTS[1])
    out = Engine(tiny_lm).generate([ids, ids], PreferEos(), max_new_tokens=10)
    assert out.sequences == [[], []] and out.finish_reasons == ["eos", "eos"]
    out = Engine(tiny_lm).generate([ids, ids], PreferEos(), max_new_tokens=10, min_new_tokens=3)
    assert len(out.sequences[0]) == 3 and out.finish_reasons[0] == "eos"


def test_seed_reproducible_and_stream_matches(tiny_lm):
    ids = tiny_lm.encode(PROMPTS[0])
    eng = Engine(tiny_lm)
    mech = Sampler(temperature=1.0, top_k=50)
    a = eng.generate([ids, ids], mech, max_new_tokens=20, seed=123)
    b = eng.generate([ids, ids], mech, max_new_tokens=20, seed=123)
    c = eng.generate([ids, ids], mech, max_new_tokens=20, seed=124)
    assert a.sequences == b.sequences
    assert a.sequences != c.sequences
    box = []
    streamed = [ev.tokens for ev in eng.stream([ids, ids], mech, max_new_tokens=20, seed=123, result=box)]
    assert box[0].sequences == a.sequences
    assert [t[0] for t in streamed if t[0] >= 0][: len(a.sequences[0])] == a.sequences[0]


def test_stream_returns_its_output_cleanly(tiny_lm):
    """``Engine.stream`` yields the events and, once exhausted, holds the same EngineOutput ``generate`` returns
    (the generator's return value); reading it early is refused, and the deprecated ``result=`` list still fills."""
    ids = tiny_lm.encode(PROMPTS[0])
    eng = Engine(tiny_lm)
    mech = Sampler(temperature=1.0, top_k=50)
    expected = eng.generate([ids, ids], mech, max_new_tokens=12, seed=5)
    run = eng.stream([ids, ids], mech, max_new_tokens=12, seed=5)
    with pytest.raises(RuntimeError, match="has not finished"):
        _ = run.output
    events = list(run)
    assert run.finished and run.output.sequences == expected.sequences
    assert run.output.finish_reasons == expected.finish_reasons
    assert len(events) == run.output.num_generated or "eos" in run.output.finish_reasons
    box = []
    list(eng.stream([ids], Recorder(), max_new_tokens=5, result=box))
    assert len(box) == 1 and len(box[0].steps) == len(box[0].sequences[0]) + (box[0].finish_reasons[0] == "eos")


def test_processors_are_typed_and_checked_before_the_model_runs(tiny_lm):
    from dpinfer.mechanisms.transforms import LogitsProcessor, NoRepeatNGram, TopK

    ids = tiny_lm.encode(PROMPTS[2])
    assert isinstance(NoRepeatNGram(2), LogitsProcessor) and isinstance(TopK(3), LogitsProcessor)
    eng = Engine(tiny_lm)
    with pytest.raises(ConfigurationError, match="sequence of logits processors"):
        eng.stream([ids], Sampler(), max_new_tokens=4, processors=NoRepeatNGram(2))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="processor"):
        eng.stream([ids], Sampler(), max_new_tokens=4, processors=[42])  # type: ignore[list-item]
    # a stateless processor (one signature for all): TopK(1) before plain sampling is greedy decoding
    greedy = eng.generate([ids], Sampler(temperature=0.0), max_new_tokens=8, seed=0)
    topk1 = eng.generate([ids], Sampler(temperature=1.0), max_new_tokens=8, seed=0, processors=[TopK(1)])
    assert topk1.sequences == greedy.sequences


def test_bad_inputs(tiny_lm):
    eng = Engine(tiny_lm)
    with pytest.raises(InvalidInputError):
        eng.generate([], Sampler(), max_new_tokens=4)
    with pytest.raises(InvalidInputError):
        eng.generate([[]], Sampler(), max_new_tokens=4)
    with pytest.raises(ConfigurationError):
        eng.generate([[1, 2]], Sampler(), max_new_tokens=0)
    with pytest.raises(ContextTooLongError, match="context window"):
        eng.generate([[5] * 500], Sampler(), max_new_tokens=100)


def test_no_repeat_ngram_processor_applies_to_every_row(tiny_lm):
    from dpinfer.mechanisms.transforms import NoRepeatNGram

    ids = tiny_lm.encode(PROMPTS[2])
    rec = Recorder()
    out = Engine(tiny_lm).generate([ids, ids], rec, max_new_tokens=40, min_new_tokens=40,
                                   processors=[NoRepeatNGram(2)])
    seq = out.sequences[0]
    bigrams = list(itertools.pairwise(seq))
    assert len(bigrams) == len(set(bigrams))
    for logits in rec.logits:  # the same tokens are banned in every row
        assert torch.equal(logits[0].isfinite(), logits[1].isfinite())


class _SameTokenEveryRow(Recorder):
    """Independent-mode recorder (the engine's batched/per-row prefill path): row 0's argmax for every row."""

    mode = "independent"

    def step(self, logits, info, generator):
        self.logits.append(logits.clone())
        return StepResult(tokens=logits[0].argmax().repeat(logits.shape[0]))


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("with_prefix", [False, True])
def test_per_row_prefill_of_uneven_rows_is_exact(tiny_lm, monkeypatch: pytest.MonkeyPatch, with_prefix: bool,
                                                 runner: str):
    """Rows of very different lengths are prefilled one at a time into the static cache; the logits of every step
    equal the batched, left-padded run."""
    import dpinfer.engine.prefill as engine_module

    head = tiny_lm.encode(PROMPTS[1]) if with_prefix else []
    rows = [head + tiny_lm.encode(PROMPTS[2]), head + tiny_lm.encode(PROMPTS[0] * 3), head + tiny_lm.encode("The")]
    assert sum(map(len, rows)) < engine_module.PER_ROW_PREFILL * 3 * max(map(len, rows))
    per_row, batched = _SameTokenEveryRow(), _SameTokenEveryRow()  # independent mode: no public row 0
    calls = []
    original = engine_module._prefill_one_by_one
    monkeypatch.setattr(engine_module, "_prefill_one_by_one", lambda *a: calls.append(1) or original(*a))
    o1 = Engine(tiny_lm, runner=runner).generate(rows, per_row, max_new_tokens=8, min_new_tokens=8)
    assert calls
    monkeypatch.setattr(engine_module, "PER_ROW_PREFILL", 0.0)  # never per row: one left-padded batch
    o2 = Engine(tiny_lm, runner=runner).generate(rows, batched, max_new_tokens=8, min_new_tokens=8)
    assert len(calls) == 1
    assert o1.shared_prefix == o2.shared_prefix and (o1.shared_prefix > 0) == with_prefix
    assert o1.sequences == o2.sequences
    for a, b in zip(per_row.logits, batched.logits, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


class _Columns(Recorder):
    """Records the logits and asks for the public top-5 columns of the private rows."""

    def private_columns(self, public_scores):
        return torch.topk(public_scores, 5).indices.sort().values


@pytest.mark.parametrize("runner", RUNNERS)
def test_split_head_computes_the_requested_private_columns_exactly(tiny_lm, runner):
    rows = [tiny_lm.encode(p) for p in PROMPTS]
    split, full = _Columns(), _Columns()
    o1 = Engine(tiny_lm, split_head=True, runner=runner).generate(rows, split, max_new_tokens=8, min_new_tokens=8)
    o2 = Engine(tiny_lm, split_head=False, runner=runner).generate(rows, full, max_new_tokens=8, min_new_tokens=8)
    assert o1.sequences == o2.sequences
    torch.testing.assert_close(split.logits[0], full.logits[0])  # prefill: every column
    for a, b in zip(split.logits[1:], full.logits[1:], strict=True):
        torch.testing.assert_close(a[0], b[0], atol=1e-5, rtol=1e-5)
        cols = torch.topk(a[0], 5).indices
        torch.testing.assert_close(a[1:, cols], b[1:, cols], atol=1e-5, rtol=1e-5)
        outside = torch.ones(a.shape[1], dtype=torch.bool)
        outside[cols] = False
        assert bool(torch.isinf(a[1:, outside]).all())


def test_invisibleink_is_the_same_with_and_without_the_split_head(tiny_lm):
    from dpinfer.mechanisms.invisibleink import InvisibleInk

    rows = [tiny_lm.encode(p) for p in PROMPTS]
    outs = []
    for split in (True, False):
        mech = InvisibleInk(clip_norm=2.0, batch_size=2, top_k=5)
        outs.append(Engine(tiny_lm, split_head=split).generate(rows, mech, max_new_tokens=12, min_new_tokens=12,
                                                               seed=3).sequences[0])
    assert outs[0] == outs[1]


@pytest.mark.parametrize("runner", RUNNERS)
def test_dp_fusion_is_the_same_with_and_without_the_split_head(tiny_lm, monkeypatch: pytest.MonkeyPatch, runner):
    """DP-Fusion with a public top-k support reads the private rows on S only: the split head gives the same tokens
    and mixing weights; without truncation it does not split (one head call for every row is cheaper)."""
    from dpinfer.mechanisms.dp_fusion import DPFusion
    from dpinfer.mechanisms.transforms import NoRepeatNGram

    rows = [tiny_lm.encode(p) for p in PROMPTS]
    runs, calls = [], []
    module = importlib.import_module(f"dpinfer.engine.{'runner' if runner == 'slots' else 'dynamic'}")
    name = "split_logits_many" if runner == "slots" else "split_logits"  # the slot runner: all jobs' columns at once
    original = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a: calls.append(1) or original(*a))
    for split in (True, False):
        mech = DPFusion(bounds=[0.3, 0.1], group_names=["A", "B"], temperature=0.7, top_k=7)
        assert mech.restricts_private_columns
        calls.clear()
        out = Engine(tiny_lm, split_head=split, runner=runner).generate(
            rows, mech, max_new_tokens=12, min_new_tokens=12, seed=5, processors=[NoRepeatNGram(2)], debug_stats=True)
        assert bool(calls) == split and len(out.steps) == 12
        runs.append(out)
    assert runs[0].sequences == runs[1].sequences
    for a, b in zip(runs[0].steps, runs[1].steps, strict=True):
        assert a["lambda"] == pytest.approx(b["lambda"], abs=1e-4)  # float32 head rounding, λ tolerance 1e-6
    assert not DPFusion(bounds=[0.3], group_names=["A"]).restricts_private_columns


@pytest.mark.parametrize(("pad_width", "sharing", "static", "runner"),
                         [(None, True, True, "dynamic"), (None, False, False, "dynamic"), (200, True, False, "dynamic"),
                          (200, False, True, "dynamic"), (None, True, True, "slots"), (200, False, True, "slots")])
def test_public_row_layout_matches_each_row_alone(tiny_lm, pad_width, sharing, static, runner):
    """With a public row (joint mode) the rows are prefilled one by one and decoded at the public width: rows longer
    than it (here row 1 when ``pad_width`` is None) go to a second batch. Every row still gets its own logits."""
    head = tiny_lm.encode(PROMPTS[0])
    rows = [head + tiny_lm.encode(" in Izmir"), head + tiny_lm.encode(PROMPTS[1] * 2), head + tiny_lm.encode(" The")]
    assert len(rows[1]) > len(rows[0]) > len(rows[2])
    batched = Recorder()
    out = Engine(tiny_lm, prefix_sharing=sharing, static_cache=static, runner=runner).generate(
        rows, batched, max_new_tokens=6, min_new_tokens=6, pad_width=pad_width)
    assert out.shared_prefix == (len(head) if sharing else 0)
    for i, r in enumerate(rows):
        forced = _Forced([int(s[0].argmax()) for s in batched.logits])
        Engine(tiny_lm).generate([r], forced, max_new_tokens=6, min_new_tokens=6)
        for a, b in zip(forced.logits, batched.logits, strict=True):
            torch.testing.assert_close(a[0], b[i], atol=1e-4, rtol=1e-4)


def test_bad_pad_width(tiny_lm):
    ids = tiny_lm.encode(PROMPTS[2])
    for bad in (-1, 2.5, True):
        with pytest.raises(ConfigurationError, match="pad_width"):
            Engine(tiny_lm).generate([ids, ids], Recorder(), max_new_tokens=2, pad_width=bad)


def test_run_jobs_matches_one_run_per_job(tiny_lm):
    """``run_jobs`` gives each job the output ``generate`` gives it alone (same seed), and checks every job first."""
    from dpinfer.engine import Job

    jobs = [Job([[1, 2, 3, 4]], Sampler(temperature=1.0, mode="joint"), max_new_tokens=6, seed=s)
            for s in (0, 1, 2)]
    jobs.append(Job([[5, 6, 7], [5, 6, 8, 9]], Sampler(temperature=1.0, mode="independent"),
                          max_new_tokens=5, seed=3))
    got = dict(Engine(tiny_lm).run_jobs(jobs))
    assert sorted(got) == [0, 1, 2, 3]
    for i, job in enumerate(jobs):
        alone = Engine(tiny_lm).generate(job.contexts, job.mechanism, max_new_tokens=job.max_new_tokens, seed=job.seed)
        assert got[i].sequences == alone.sequences
    bad = [jobs[0], Job([[1]], Sampler(temperature=1.0, mode="joint"), max_new_tokens=0)]
    with pytest.raises(ConfigurationError, match=r"^job 1: max_new_tokens"):
        next(Engine(tiny_lm).run_jobs(bad))
