"""Many jobs through one engine (``run_jobs``, ``submit``/``step``), on the tiny random-weight Llama.

* greedy outputs through ``run_jobs`` equal :meth:`Engine.generate` per job, for mixed jobs (different K and lengths,
  joint / independent, public-row mechanisms with and without a split head, a solo job, a row over the capacity),
  with fewer slots than rows (jobs wait, join late, take freed slots);
* a seed reproduces a run (same jobs, order, max_rows); every registered mechanism runs through ``run_jobs``;
* the compiled decode step gives the eager step's greedy tokens (``slow``).
"""

from __future__ import annotations

import pytest
import torch

from dpinfer import models
from dpinfer.engine import Engine, Job, SlotCache, bucket_capacity, public_width
from dpinfer.errors import ConfigurationError
from dpinfer.mechanisms import REGISTRY, get_mechanism
from dpinfer.mechanisms.base import Mechanism, StepInfo, StepResult
from dpinfer.mechanisms.sampler import Sampler

PUBLIC = ("<|im_start|>user\nRewrite the document. The applicant, Mr ____, was born in ____ and lives in ____."
          "<|im_end|>\n<|im_start|>assistant\n")
PRIVATE = (
    "<|im_start|>user\nRewrite the document. The applicant, Mr Smith, was born in 1970.<|im_end|>\n"
    "<|im_start|>assistant\n",
    "<|im_start|>user\nRewrite the document. The applicant, Mr Jones, was born in 1961 and lives in Ankara, "
    "Turkey.<|im_end|>\n<|im_start|>assistant\n",
    "The quick brown fox",
    "Mr Smith, a lawyer practising in London, represented the applicants before the Court.",
)
LONG = " ".join(["The case originated in an application against the Republic of Turkey lodged with the Commission."]
                * 6)


class Greedy(Mechanism):
    """Wraps a mechanism: lets it step (its real work and checks), then emits a deterministic token read from every
    row: joint, the argmax of the rows' mean logits (private rows count too); independent, each row's argmax."""

    name = "greedy"

    def __init__(self, inner: Mechanism) -> None:
        self.inner = inner
        self.mode = inner.mode

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

    def step(self, logits: torch.Tensor, info: StepInfo, generator) -> StepResult:
        res = self.inner.step(logits, info, generator)
        if self.mode == "joint":
            finite = torch.where(torch.isfinite(logits), logits, torch.zeros_like(logits))
            score = torch.where(torch.isfinite(logits).all(0), finite.mean(0), logits[0])
            return StepResult(tokens=score.argmax(), stats=res.stats)
        return StepResult(tokens=logits.argmax(-1), stats=res.stats)


class Spy(Greedy):
    """Records the public row's logits, lets the real mechanism step, then emits a fixed token sequence."""

    def __init__(self, inner: Mechanism, tokens: list[int]) -> None:
        super().__init__(inner)
        self.tokens, self.public = tokens, []

    def step(self, logits: torch.Tensor, info: StepInfo, generator) -> StepResult:
        self.public.append(logits[0].clone())
        self.inner.step(logits, info, generator)
        return StepResult(tokens=torch.tensor(self.tokens[info.step]))


def fusion() -> Mechanism:
    return get_mechanism("dp-fusion", bounds=[0.3, 0.1], group_names=["A", "B"], temperature=0.7, top_k=7)


def ink() -> Mechanism:
    return get_mechanism("invisibleink", clip_norm=2.0, batch_size=2, top_k=5)


def mixed_jobs(lm) -> list[Job]:
    pub = lm.encode(PUBLIC)
    priv = [lm.encode(p) for p in PRIVATE]
    long = lm.encode(LONG)
    assert len(long) > 64 > len(pub)
    return [
        Job([pub, priv[0], priv[1]], Greedy(fusion()), max_new_tokens=10, seed=1),   # public row, full head
        Job([pub, priv[2], priv[3]], Greedy(ink()), max_new_tokens=7, seed=2),       # public row, split head
        Job([priv[1], priv[3]], Greedy(get_mechanism("dp-prompt", clip_min=-2.0, clip_max=2.0,
                                                           num_rewrites=2)), max_new_tokens=9, pad_width=40, seed=3),
        Job(priv[:3], Sampler(temperature=0, mode="independent"), max_new_tokens=8, pad_width=40),
        Job([priv[2]], Sampler(temperature=0, mode="joint"), max_new_tokens=12, pad_width=16),
        Job([priv[0], priv[2]], Sampler(temperature=0, mode="independent"), max_new_tokens=6),  # solo
        Job([pub, long, priv[2]], Greedy(fusion()), max_new_tokens=5, seed=4),  # a row over the capacity
    ]


def fresh(job: Job, mechanism: Mechanism) -> Job:
    return Job(job.contexts, mechanism, job.max_new_tokens, job.min_new_tokens, job.seed, job.generator,
                     job.stop_on_eos, job.processors, job.pad_width)


def renew(mech: Mechanism) -> Mechanism:
    """A fresh copy of a (not yet started) mechanism, so that each run starts from the same state."""
    import copy

    return copy.deepcopy(mech)


@pytest.mark.parametrize("max_rows", [3, None])
def test_greedy_jobs_match_generate_one_by_one(tiny_lm, max_rows):
    jobs = mixed_jobs(tiny_lm)
    engine = Engine(tiny_lm)
    order = []
    got = {}
    for i, out in engine.run_jobs([fresh(j, renew(j.mechanism)) for j in jobs], max_rows=max_rows, compile=False):
        order.append(i)
        got[i] = out
    assert sorted(order) == list(range(len(jobs)))
    for i, job in enumerate(jobs):
        ref = engine.generate(job.contexts, renew(job.mechanism), max_new_tokens=job.max_new_tokens,
                              pad_width=job.pad_width, seed=job.seed)
        assert got[i].sequences == ref.sequences, f"job {i}"
        assert got[i].finish_reasons == ref.finish_reasons
        assert got[i].prompt_lengths == ref.prompt_lengths
        assert len(got[i].steps) == len(ref.steps)
    if max_rows == 3:  # 3 slots for 20 rows: jobs waited for freed slots and finished out of order
        assert order != sorted(order)


def test_public_width_is_public(tiny_lm):
    jobs = mixed_jobs(tiny_lm)
    n_pub = len(tiny_lm.encode(PUBLIC))
    assert public_width(jobs[0], jobs[0].contexts) == n_pub
    assert public_width(jobs[2], jobs[2].contexts) == 40
    assert public_width(jobs[5], jobs[5].contexts) is None
    jobs[0].pad_width = 100
    assert public_width(jobs[0], jobs[0].contexts) == 100
    assert bucket_capacity(100 + 10) == 128


@pytest.fixture(scope="module")
def lms(tiny_lm, tiny_model_dir):
    return {"float32": tiny_lm, "int8": models.load_model(str(tiny_model_dir), device="cpu", quantize="int8")}


def test_a_seed_reproduces_a_run_and_sampling_agrees_with_generate(tiny_lm):
    ids = [tiny_lm.encode(p) for p in PRIVATE]
    pub = tiny_lm.encode(PUBLIC)

    def jobs():
        out = [Job([pub, ids[0], ids[1]], fusion(), max_new_tokens=12, seed=s) for s in range(3)]
        out += [Job(ids[:2], Sampler(temperature=1.0, mode="independent"), max_new_tokens=12, pad_width=40,
                          seed=10 + s) for s in range(3)]
        return out

    engine = Engine(tiny_lm)
    a = dict(engine.run_jobs(jobs(), max_rows=5, compile=False))
    b = dict(engine.run_jobs(jobs(), max_rows=5, compile=False))
    assert [a[i].sequences for i in range(6)] == [b[i].sequences for i in range(6)]
    c = dict(engine.run_jobs([fresh(j, j.mechanism) for j in jobs()[:3]] + [
        Job(j.contexts, j.mechanism, j.max_new_tokens, seed=j.seed + 100, pad_width=40) for j in jobs()[3:]],
        max_rows=5, compile=False))
    assert [a[i].sequences for i in range(3, 6)] != [c[i].sequences for i in range(3, 6)]
    # the same seeds one job at a time: logits differ from the batched ones by float rounding only, so a sampled
    # token differs only where a uniform draw falls within ~1e-7 of a CDF boundary: all but a rare row agree
    agree = total = 0
    for i, job in enumerate(jobs()):
        ref = engine.generate(job.contexts, job.mechanism, max_new_tokens=job.max_new_tokens, seed=job.seed,
                              pad_width=job.pad_width)
        for x, y in zip(a[i].sequences, ref.sequences, strict=True):
            total += 1
            agree += x == y
    assert agree >= total - 1, f"{agree}/{total} rows agree"


ENGINE_FACTORIES = {
    # name: (mechanism factory (V = vocab size), K)
    "sampler": (lambda v: get_mechanism("sampler", temperature=1.0, mode="joint"), 1),
    "dp-fusion": (lambda v: fusion(), 3),
    "dp-decoding": (lambda v: get_mechanism("dp-decoding", lam=0.5, vocab_size=v), 1),
    "dp-prompt": (lambda v: get_mechanism("dp-prompt", clip_min=-2.0, clip_max=2.0, num_rewrites=2), 2),
    "invisibleink": (lambda v: ink(), 3),
    "amin": (lambda v: get_mechanism("amin", clip_norm=2.0, batch_size=2, public_top_k=5, max_private_tokens=3), 3),
    "adapmixed": (lambda v: get_mechanism("adapmixed", batch_size=2, epsilon=4.0, top_k=5), 3),
    "pad": (lambda v: get_mechanism("pad", clip_norm=0.5, sigma=1.5, top_k=5), 2),
    "pad-as-published": (lambda v: get_mechanism("pad-as-published"), 1),
    "static": (lambda v: get_mechanism("static", sigma=1.0), 1),
}


def test_every_registered_mechanism_runs_through_run_jobs(tiny_lm):
    assert set(REGISTRY.names()) <= set(ENGINE_FACTORIES), "add the new mechanism to ENGINE_FACTORIES"
    pub = tiny_lm.encode(PUBLIC)
    rows = [pub] + [tiny_lm.encode(p) for p in PRIVATE]
    v = tiny_lm.vocab_size
    jobs = []
    for s, name in enumerate(sorted(REGISTRY.names())):
        make, k = ENGINE_FACTORIES[name]
        jobs.append(Job(rows[:k] if k > 1 else [rows[1]], make(v), max_new_tokens=6, seed=s, pad_width=40))
    outs = dict(Engine(tiny_lm).run_jobs(jobs, max_rows=6, compile=False))
    assert sorted(outs) == list(range(len(jobs)))
    for i, job in enumerate(jobs):
        out = outs[i]
        assert len(out.sequences) == len(job.contexts)
        assert all(len(s) <= 6 for s in out.sequences)
        assert all(r in ("eos", "length", "budget") for r in out.finish_reasons)
        assert all(0 <= t < v for s in out.sequences for t in s)
        if job.mechanism.mode == "joint":
            assert all(s == out.sequences[0] for s in out.sequences)
    again = dict(Engine(tiny_lm).run_jobs([fresh(j, ENGINE_FACTORIES[n][0](v)) for j, n in
                                           zip(jobs, sorted(REGISTRY.names()), strict=True)], max_rows=6,
                                          compile=False))
    assert [outs[i].sequences for i in range(len(jobs))] == [again[i].sequences for i in range(len(jobs))]


def test_bad_options_are_refused_before_any_run(tiny_lm):
    job = Job([[1, 2, 3]], Sampler(temperature=0), max_new_tokens=2)
    with pytest.raises(ConfigurationError, match="max_rows"):
        next(Engine(tiny_lm).run_jobs([job], max_rows=0))
    with pytest.raises(ConfigurationError, match="compile"):
        next(Engine(tiny_lm).run_jobs([job], compile="yes"))
    sequential = dict(Engine(tiny_lm).run_jobs([job], slots=False))
    assert sequential[0].sequences == dict(Engine(tiny_lm).run_jobs([job]))[0].sequences


def test_slot_cache_writes_each_row_at_its_own_length():
    cache = SlotCache(num_layers=1, slots=3, capacity=8, device="cpu")
    k = torch.arange(2 * 3 * 4, dtype=torch.float32).view(2, 3, 4)
    cache.write(0, [(k, k + 100)], 3)
    cache.write(2, [(k[:, :1] - 1, k[:, :1] - 1)], 1)
    assert cache.lengths.tolist() == [3, 0, 1]
    mask = cache.mask(torch.float32)
    assert mask.shape == (3, 1, 1, 8) and (mask[0, 0, 0, :4] == 0).all() and (mask[0, 0, 0, 4:] < -1e30).all()
    new = torch.full((3, 2, 1, 4), 7.0)
    keys, values = cache.layers[0].update(new, new + 1)
    assert keys.shape == values.shape == (3, 2, 8, 4)
    assert torch.equal(values[0, :, 3], new[0, :, 0] + 1) and torch.equal(values[0, :, :3], k + 100)
    assert torch.equal(keys[0, :, 3], new[0, :, 0]) and torch.equal(keys[0, :, :3], k)
    assert torch.equal(keys[2, :, 1], new[2, :, 0]) and torch.equal(keys[1, :, 0], new[1, :, 0])
    assert keys[0, :, 4:].abs().sum() == 0
    cache.write(0, [(k[:, :1], k[:, :1])], 1)  # a new job in slot 0: nothing of the old one stays
    assert cache.layers[0].keys[0, :, 1:].abs().sum() == 0


@pytest.mark.slow
def test_compiled_decode_step_gives_the_eager_tokens(tiny_lm):
    if not hasattr(torch, "compile"):
        pytest.skip("torch.compile is unavailable in this torch build")
    import shutil

    if torch.device(tiny_lm.device).type == "cpu" and shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("torch.compile on CPU needs a C++ compiler (none on PATH)")
    jobs = mixed_jobs(tiny_lm)[:5]
    engine = Engine(tiny_lm)
    eager = dict(engine.run_jobs([fresh(j, renew(j.mechanism)) for j in jobs], max_rows=8, compile=False))
    compiled = dict(engine.run_jobs([fresh(j, renew(j.mechanism)) for j in jobs], max_rows=8, compile=True))
    for i in range(len(jobs)):
        assert compiled[i].sequences == eager[i].sequences, f"job {i}"


def test_two_interleaved_run_jobs_on_one_engine_do_not_share_a_cache(tiny_lm):
    jobs = mixed_jobs(tiny_lm)[:5]
    engine = Engine(tiny_lm)
    alone = dict(engine.run_jobs([fresh(j, renew(j.mechanism)) for j in jobs], max_rows=6, compile=False))
    first = engine.run_jobs([fresh(j, renew(j.mechanism)) for j in jobs], max_rows=6, compile=False)
    second = engine.run_jobs([fresh(j, renew(j.mechanism)) for j in jobs], max_rows=6, compile=False)
    got_a, got_b = dict([next(first)]), dict([next(second)])
    got_a.update(first)
    got_b.update(second)
    for i in range(len(jobs)):
        assert got_a[i].sequences == got_b[i].sequences == alone[i].sequences


def test_jobs_submitted_between_steps_join_the_running_batch(tiny_lm):
    """``submit``/``step``, as a server drives them: a job submitted while another runs joins the batch; each step
    gives one event per running job and the jobs that finished; outputs are those each job gets alone."""
    from dpinfer.engine import JobStatus

    pub = tiny_lm.encode(PUBLIC)
    priv = [tiny_lm.encode(p) for p in PRIVATE]
    engine = Engine(tiny_lm, max_rows=8, fixed_rows=True, min_capacity=128)
    first = engine.submit(Job([pub, priv[0], priv[1]], Greedy(fusion()), max_new_tokens=8, seed=1))
    assert first.status is JobStatus.WAITING and engine.busy
    out = engine.step()
    assert [j for j, _ in out.events] == [first] and not out.finished and first.status is JobStatus.RUNNING
    engine.step()
    second = engine.submit(Job([priv[2]], Sampler(temperature=0, mode="joint"), max_new_tokens=5, pad_width=40))
    third = engine.submit(Job([priv[3], priv[0]], Sampler(temperature=0, mode="independent"), max_new_tokens=4))
    seen: dict[int, list[int]] = {id(first): [], id(second): [], id(third): []}
    finished = []
    while engine.busy:
        out = engine.step()
        for job, event in out.events:
            seen[id(job)].append(event.step)
        finished += out.finished
    assert finished[-1] is first and {id(j) for j in finished} == set(seen)
    assert seen[id(second)] == list(range(5)) and seen[id(third)] == list(range(4))
    assert seen[id(first)] == list(range(2, 8))
    for job in (first, second, third):
        alone = Engine(tiny_lm).generate(job.contexts, renew(job.mechanism) if job is first else job.mechanism,
                                         max_new_tokens=job.max_new_tokens, pad_width=job.pad_width, seed=job.seed)
        assert job.output.sequences == alone.sequences
    with pytest.raises(ConfigurationError, match="runs once"):
        engine.submit(first)
    assert engine.step().events == []


def test_interleaved_streams_and_cancel(tiny_lm):
    ids = [tiny_lm.encode(p) for p in PRIVATE]
    engine = Engine(tiny_lm)
    a = engine.stream([ids[0]], Sampler(temperature=0, mode="joint"), max_new_tokens=6, min_new_tokens=6,
                      pad_width=40)
    b = engine.stream([ids[1]], Sampler(temperature=0, mode="joint"), max_new_tokens=4, min_new_tokens=4,
                      pad_width=40)
    got_a, got_b = [next(a)], [next(b)]
    got_a += list(a)
    got_b += list(b)
    assert [e.step for e in got_a] == list(range(6)) and [e.step for e in got_b] == list(range(4))
    assert a.output.sequences[0] == [e.tokens[0] for e in got_a]
    assert b.output.sequences[0] == [e.tokens[0] for e in got_b]
    c = engine.stream([ids[2]], Sampler(temperature=0, mode="joint"), max_new_tokens=6, pad_width=40)
    next(c)
    c.close()  # the job leaves the batch
    assert not engine.busy and not c.finished
