"""Synthetic long-form text from a private corpus, with a per-reference guarantee (InvisibleInk, ALGORITHMS §2).

Steps of :func:`synthesize`:

1. **Partition** the references into disjoint batches of B, data-independently (:func:`dpinfer.references.partition`):
   references are grouped by their public labels (e.g. Yelp's business category and stars, which the prompts show),
   each group is shuffled with the seed and cut into batches of B; a remainder smaller than B is not used (it would
   need its own, larger ρ). The partition never reads the references' text, so the texts of different batches compose
   in parallel: the whole output has the guarantee of one text.
2. **Prompts** from a :class:`~dpinfer.configs.synth.PromptTemplate`: the *public* prompt (instruction and labels, no
   reference) and one *private* prompt per reference (:func:`dpinfer.methods.synthesize.batch_contexts`). An empty
   reference is the null reference ⊥ of the adjacency: its row is the public prompt. A reference longer than
   ``max_reference_tokens`` is cut to that many tokens (a function of that reference alone).
3. **Decode** each batch with the chosen method on the runtime's engine: B + 1 contexts, one KV cache.

The settings are one :class:`~dpinfer.configs.synth.SynthConfig`; the methods are the entries of
:data:`dpinfer.methods.synthesize.TABLE` (``invisibleink``, the default; ``amin``; ``adapmixed``, data-dependent: no
guarantee ex ante; ``public``, the baseline that reads no reference), dispatched through the table only.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpinfer.accounting.charge import Charges, charge, run_charged
from dpinfer.configs.synth import SynthConfig
from dpinfer.engine import Job
from dpinfer.errors import ConfigurationError, InvalidInputError
from dpinfer.io import atomic_open
from dpinfer.methods.synthesize import (
    batch_contexts,
    build,
    check,
    check_corpus_size,
    guarantee,
    public_pad_width,
    reads_references,
)
from dpinfer.references import Reference, as_references, partition, partition_sha256
from dpinfer.release import check_release, with_warning
from dpinfer.runtime import resolve_runtime
from dpinfer.task import Plan

if TYPE_CHECKING:
    from dpinfer.accounting import Guarantee
    from dpinfer.engine import EngineOutput
    from dpinfer.models import LM
    from dpinfer.runtime import Runtime

__all__ = ["SynthesisPlan", "SynthesisResult", "SyntheticText", "plan_synthesis", "synthesize", "synthesize_iter"]


@dataclass
class SyntheticText:
    """One synthetic text (from one batch): :meth:`release` is its line in an output file; the figures read off the
    references while decoding it (private tokens, AdaPMixED's realised spend, the Top-k⁺ expansion share) are
    :meth:`diagnostics` only."""

    text: str
    labels: Mapping[str, str]
    batch: int
    tokens: int
    finish_reason: str
    private_tokens: int | None = None
    data_dependent: Mapping[str, Any] = field(default_factory=dict)

    def release(self) -> dict[str, Any]:
        """The public record: the text, the batch's public labels and index, its length and why it ended
        (:func:`~dpinfer.release.check_release`: no forbidden key)."""
        return check_release({"text": self.text, "labels": dict(self.labels), "batch": self.batch,
                              "tokens": self.tokens, "finish_reason": self.finish_reason})

    def diagnostics(self) -> dict[str, Any]:
        """DATA-DEPENDENT figures of this text (from :meth:`dpinfer.mechanisms.base.Mechanism.diagnostics`)."""
        out: dict[str, Any] = {"batch": self.batch}
        if self.private_tokens is not None:
            out["private_tokens"] = self.private_tokens
        return {**out, **dict(self.data_dependent)}

    def to_dict(self) -> dict[str, Any]:
        """:meth:`release` (the line of an output file)."""
        return self.release()


@dataclass
class SynthesisResult:
    """Output of :func:`synthesize`: the texts, the ex-ante guarantee (per reference), settings and timing.

    :meth:`release` is public by construction (the texts, the guarantee, the public settings and counts);
    :meth:`diagnostics` holds the rest (timing, per-text data-dependent figures)."""

    texts: list[SyntheticText]
    guarantee: Guarantee
    method: str
    settings: dict[str, Any]
    references_used: int
    references_left_out: int
    seconds: float
    lm_calls_per_token: int

    @property
    def generated_tokens(self) -> int:
        return sum(t.tokens for t in self.texts)

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0

    def header(self) -> dict[str, Any]:
        """The record written first in an output file: guarantee, settings and counts (no private text, no timing;
        :func:`~dpinfer.release.check_release`)."""
        return {"dpinfer": check_release({
            "kind": "synthesis", "method": self.method, "guarantee": self.guarantee.to_dict(),
            "settings": self.settings, "references_used": self.references_used,
            "references_left_out": self.references_left_out, "texts": len(self.texts),
            "lm_calls_per_token": self.lm_calls_per_token})}

    def release(self) -> dict[str, Any]:
        """The header's fields and the texts' :meth:`SyntheticText.release`, checked
        (:func:`~dpinfer.release.check_release`: a forbidden key is refused, never published)."""
        return check_release({**self.header()["dpinfer"], "texts": [t.release() for t in self.texts]})

    def diagnostics(self) -> dict[str, Any]:
        """Timing (it depends on the references' lengths) and each text's data-dependent figures, with a warning."""
        return with_warning({"seconds": self.seconds, "generated_tokens": self.generated_tokens,
                             "tokens_per_second": self.tokens_per_second,
                             "texts": [t.diagnostics() for t in self.texts]})

    def to_dict(self) -> dict[str, Any]:
        """:meth:`release`."""
        return self.release()

    def jsonl_lines(self) -> list[str]:
        """The lines of the output file: the header, then one released text per line (each ending in a newline)."""
        from dpinfer._json import plain

        return [json.dumps(plain(rec), ensure_ascii=False) + "\n"
                for rec in (self.header(), *(t.release() for t in self.texts))]

    def write_jsonl(self, path: str | Path) -> None:
        """Write :meth:`jsonl_lines` to ``path`` atomically (a temporary file in the same folder, then a rename)."""
        lines = self.jsonl_lines()
        with atomic_open(path) as f:
            f.writelines(lines)


@dataclass
class SynthesisPlan:
    """What :func:`plan_synthesis` decides before any model loads: the checked references, the partition into batches
    (after ``max_texts``), the config, the calibrated mechanism and the ex-ante guarantee.

    The seed stays in the config for the sampling only: :meth:`header` and :attr:`settings` never carry it."""

    references: list[Reference]
    batches: list[list[int]]
    config: SynthConfig
    mechanism: Any
    guarantee: Guarantee

    method = property(lambda self: self.config.method)
    template = property(lambda self: self.config.template)
    seed = property(lambda self: self.config.seed)
    batch_size = property(lambda self: self.config.batch_size)
    max_new_tokens = property(lambda self: self.config.max_new_tokens)
    max_reference_tokens = property(lambda self: self.config.max_reference_tokens)

    @property
    def public(self) -> bool:
        """The method reads no reference (it decodes the public prompt alone)."""
        return not reads_references(self.config.method)

    @property
    def settings(self) -> dict[str, Any]:
        """The public settings, in output order, without the model (:meth:`settings_for` adds it)."""
        return self.config.settings()

    @property
    def references_used(self) -> int:
        return 0 if self.public else sum(len(m) for m in self.batches)

    @property
    def references_left_out(self) -> int:
        return len(self.references) - self.references_used

    @property
    def lm_calls_per_token(self) -> int:
        return 1 if self.public else self.config.batch_size + 1

    def settings_for(self, model: str) -> dict[str, Any]:
        """:attr:`settings` with the model's name (``lm.name``) after the temperature."""
        return self.config.settings(model)

    def header(self, model: str, extra_settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The first line of an output file, without the throughput (timing is a side channel): the guarantee, the
        settings (with ``extra_settings``, e.g. the command's label fields and ``--limit``), the number of references
        read, used and left out, the number of texts planned (one per batch). Never a reference or the seed."""
        return {"dpinfer": {"kind": "synthesis", "method": self.method, "guarantee": self.guarantee.to_dict(),
                            "settings": {**self.settings_for(model), **dict(extra_settings or {})},
                            "references": len(self.references), "references_used": self.references_used,
                            "references_left_out": self.references_left_out, "texts": len(self.batches),
                            "lm_calls_per_token": self.lm_calls_per_token}}

    @property
    def charges(self) -> Charges:
        """What the run is charged (:func:`~dpinfer.accounting.charge.run_charged`): its ex-ante guarantee, once, on
        the corpus's units."""
        return Charges(self.guarantee, scope="corpus")

    def partition_sha256(self) -> str:
        """:func:`dpinfer.references.partition_sha256` of this plan: PRIVATE, never in a release."""
        return partition_sha256(self.references, self.batches)

    def job(self, lm: LM, b: int, debug_stats: bool = False) -> Job:
        """Batch ``b``'s engine job: its contexts, its own copy of the calibrated mechanism (jobs share no state), a
        public padding width and a sampling seed from the plan's seed and ``b`` alone (``debug_stats``: record the
        mechanism's DATA-DEPENDENT per-step statistics, ``--debug-stats``)."""
        refs = [self.references[i] for i in self.batches[b]]
        contexts = batch_contexts(lm, self.template, refs, self.max_reference_tokens)
        seed = self.seed
        return Job(contexts=contexts[:1] if self.public else contexts,
                         mechanism=copy.deepcopy(self.mechanism), max_new_tokens=self.max_new_tokens,
                         pad_width=public_pad_width(lm, self.template, refs[0].labels, self.max_reference_tokens),
                         seed=None if seed is None else int(seed) * 1_000_003 + b, debug_stats=debug_stats)


def plan_synthesis(references: Sequence[Reference | str], config: SynthConfig | None = None,
                   **settings: Any) -> SynthesisPlan:
    """Every check, the partition, the calibrated mechanism and the guarantee of :func:`synthesize`, without a model.
    ``settings``: :class:`SynthConfig`'s fields (over ``config`` when given)."""
    cfg = SynthConfig.merged(config, **settings)
    check(cfg)
    refs = as_references(references)
    check_corpus_size(cfg, len(refs))
    missing = cfg.template.fields() - set(refs[0].labels)
    if missing:
        raise ConfigurationError(f"the prompt template uses label field(s) {sorted(missing)} that the records do not "
                                 "carry; pass them with --label-fields / label_fields")
    # ``public`` reads no reference but writes one text per would-be batch, for a like-for-like number of texts
    batches, _ = partition(refs, cfg.batch_size, cfg.seed)
    if not batches:
        raise InvalidInputError(f"no label group holds B = {cfg.batch_size} references; lower --batch-size")
    if cfg.max_texts is not None:
        batches = batches[:cfg.max_texts]
    mech = build(cfg)  # calibrated from the parameters alone, before the model loads
    return SynthesisPlan(references=refs, batches=batches, config=cfg, mechanism=mech, guarantee=guarantee(cfg, mech))


def synthesize_iter(plan: SynthesisPlan, *, lm: LM | str | None = None, runtime: Runtime | None = None,
                    skip_batches: Iterable[int] = (),
                    progress: Callable[[int, int], None] | None = None, debug_stats: bool = False
                    ) -> Iterator[SyntheticText]:
    """The texts of ``plan``'s batches, each as soon as its batch finishes (not in batch order), but for the batch
    indices in ``skip_batches`` (already released: a resumed job plans only the missing batches).

    Every batch still to do is one engine job (:meth:`SynthesisPlan.job`), all through one ``Engine.run_jobs`` call
    of the runtime's engine. A batch's sampling seed comes from the plan's seed and its index, so a batch draws the
    same randomness whichever other batches run with it (the engine's batched rounding aside). ``progress(done,
    total)`` counts the skipped batches as done. ``debug_stats``: the mechanism's per-step statistics are fetched and
    summarised in each text's ``data_dependent`` (a mechanism deciding on the device fetches them only then)."""
    skip = set()
    for b in skip_batches:
        if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < len(plan.batches):
            raise ConfigurationError(f"skip_batches holds {b!r}, not a batch index of this plan (0 to "
                                     f"{len(plan.batches) - 1})")
        skip.add(b)
    todo = [b for b in range(len(plan.batches)) if b not in skip]
    if not todo:
        return
    rt = resolve_runtime(runtime, lm=lm)
    model = rt.lm
    jobs = [plan.job(model, b, debug_stats) for b in todo]
    finished = len(skip)
    if progress is not None:
        progress(finished, len(plan.batches))  # the total is known before the first batch runs
    for j, out in rt.engine.run_jobs(jobs):
        text = _text(plan, model, todo[j], jobs[j], out)
        jobs[j] = dataclasses.replace(jobs[j], contexts=())  # free the finished batch's private contexts
        finished += 1
        yield text
        if progress is not None:
            progress(finished, len(plan.batches))


def _text(plan: SynthesisPlan, model: LM, b: int, job: Job, out: EngineOutput) -> SyntheticText:
    """Batch ``b``'s text from its job's output (the mechanism's data-dependent figures apart, diagnostics only)."""
    ids = out.sequences[0]
    dd = job.mechanism.diagnostics(out.steps)
    private = dd.pop("private_tokens", None)
    return SyntheticText(text=model.decode(ids).strip(), labels=dict(plan.references[plan.batches[b][0]].labels),
                         batch=b, tokens=len(ids), finish_reason=out.finish_reasons[0], private_tokens=private,
                         data_dependent=dd)


@dataclass(frozen=True, kw_only=True, eq=False)
class SynthesisJobs(Plan):
    """A synthesis run planned for the engine (:data:`TASK`): a :class:`~dpinfer.task.Plan` of one job per batch
    still to do (``batches``), the run's ex-ante guarantee and charges (scope ``corpus``), over the model-free
    :class:`SynthesisPlan` (``synthesis``). Its jobs hold the private references: never log or serialise it."""

    synthesis: SynthesisPlan
    batches: tuple[int, ...]
    lm: LM
    t0: float


@dataclass(frozen=True)
class SynthesisInputs:
    """What :data:`TASK` plans: the private references and the batches already released (not run again)."""

    references: Sequence[Reference | str]
    skip_batches: frozenset[int] = frozenset()


class SynthesisTask:
    """Synthesis as a :class:`~dpinfer.task.Task`: :func:`plan_synthesis` and one job per batch, then the texts."""

    name = "synthesize"

    def plan(self, config: SynthConfig | None, inputs: SynthesisInputs, runtime: Runtime) -> SynthesisJobs:
        t0 = time.perf_counter()
        sp = plan_synthesis(inputs.references, config)
        todo = tuple(b for b in range(len(sp.batches)) if b not in inputs.skip_batches)
        model = runtime.lm
        return SynthesisJobs(jobs=tuple(sp.job(model, b) for b in todo), guarantee=sp.guarantee,
                             charges=sp.charges, synthesis=sp, batches=todo, lm=model, t0=t0)

    def finish(self, plan: SynthesisJobs, outputs: Sequence[EngineOutput]) -> SynthesisResult:
        sp = plan.synthesis
        texts = [_text(sp, plan.lm, b, job, out) for b, job, out in zip(plan.batches, plan.jobs, outputs, strict=True)]
        return SynthesisResult(texts=texts, guarantee=sp.guarantee, method=sp.method,
                               settings=sp.settings_for(plan.lm.name), references_used=sp.references_used,
                               references_left_out=sp.references_left_out, seconds=time.perf_counter() - plan.t0,
                               lm_calls_per_token=sp.lm_calls_per_token)


TASK = SynthesisTask()
"""Synthesis's task object (:mod:`dpinfer.task`)."""


def synthesize(references: Sequence[Reference | str], config: SynthConfig | None = None, *,
               lm: LM | str | None = None, runtime: Runtime | None = None,
               progress: Callable[[int, int], None] | None = None, skip_batches: Iterable[int] = (),
               on_text: Callable[[SyntheticText], None] | None = None, ledger: Any = None, unit: str | None = None,
               **settings: Any) -> SynthesisResult:
    """Generate one synthetic text per disjoint batch of ``batch_size`` references (see the module docstring):
    :func:`plan_synthesis` (every check, the partition, the guarantee; no model), then :func:`synthesize_iter`.

    Args:
        references: the private records (:class:`Reference`, or plain strings without labels).
        config: a :class:`SynthConfig`; ``settings`` are its fields, given as keywords (over ``config``):
            ``method`` (``invisibleink`` | ``amin`` | ``adapmixed`` | ``public``), ``epsilon`` (target ε per
            reference; for ``adapmixed`` the budget of its data-dependent accounting), ``delta``, ``batch_size`` (B
            references per text: B + 1 LM calls per token), ``max_new_tokens`` (``T_max`` per text, the guarantee is
            computed for it), ``top_k`` (Top-k⁺ k; None = full vocabulary), ``temperature``, ``prompt_template`` (a
            :class:`PromptTemplate` or a name of :data:`TEMPLATES`), ``seed`` (tests and benchmarks only: seeds the
            partition and the sampling; never written into the result), ``max_texts``, ``max_reference_tokens``,
            ``options`` (extra mechanism parameters, e.g. ``{"svt_noise": 0.3}`` for ``amin``).
        lm: model (default: the embedded SmolLM2-135M-Instruct); or ``runtime``: a :class:`~dpinfer.runtime.Runtime`.
        progress: called as ``progress(batches_done, batches_total)``.
        skip_batches: batch indices already released (by an earlier, interrupted run of the same plan): not run
            again, not in the result (rerunning a batch would release its references twice).
        on_text: called with each text as soon as its batch finishes (in the order they finish).
        ledger: a :class:`~dpinfer.Ledger` (or its path) this run is charged to, once, at its guarantee, before the
            model loads (:func:`dpinfer.accounting.charge.charge`); a resumed run (``skip_batches`` not empty) is not
            charged again. ``unit``: the corpus's unit on the ledger (required with a ledger).

    Returns:
        The texts of the batches run, in batch order (:meth:`SynthesisResult.release`).
    """
    skip_batches = set(skip_batches)
    with charge(ledger, unit, scope="corpus", what="synthesize") as spend:
        plan = plan_synthesis(references, config, **settings)

        def run() -> SynthesisResult:
            rt = resolve_runtime(runtime, lm=lm)
            t0 = time.perf_counter()
            done: dict[int, SyntheticText] = {}
            for text in synthesize_iter(plan, runtime=rt, skip_batches=skip_batches, progress=progress):
                done[text.batch] = text
                if on_text is not None:
                    on_text(text)
            return SynthesisResult(texts=[done[b] for b in sorted(done)], guarantee=plan.guarantee,
                                   method=plan.method, settings=plan.settings_for(rt.lm.name),
                                   references_used=plan.references_used,
                                   references_left_out=plan.references_left_out, seconds=time.perf_counter() - t0,
                                   lm_calls_per_token=plan.lm_calls_per_token)

        # the run's cost, from its parameters, before the model loads; a resumed run was charged by the one it resumes
        return run_charged(None if skip_batches else spend, plan.charges, run)
