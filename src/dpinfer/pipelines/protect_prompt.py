"""Prompt protection: DP-GTR (Li et al. 2025) and its baseline DP-Prompt (Utpala et al. 2023), ALGORITHMS §4.

A user wants to send a question to a remote LLM without revealing its exact wording or identifiers. dpinfer rewrites it
locally with local differential privacy and hands back the protected prompt (docs/prompt-protection.md).

**Stage 1** (the only stage that reads the prompt, run here): ``n`` paraphrases of the chat-templated prompt
(:data:`~dpinfer.clip_bounds.PARAPHRASE_INSTRUCTION`, the instruction the clip bounds were measured with)
decoded in ONE batch on the engine's independent mode with :class:`~dpinfer.mechanisms.dp_prompt.DPPrompt`: logits
clipped to the model's public bounds (:func:`~dpinfer.clip_bounds.clip_bounds`), a token drawn from the full
vocabulary at temperature τ (no top-k or top-p: the mechanism refuses them), at most ``T_max = max_new_tokens`` tokens
each, a number fixed before the prompt is read. Per token ``ε_tok = 2(b_max − b_min)/τ`` against any two prompts;
the ``n`` rewrites compose to ``n·T_max`` tokens, converted to (ε, δ) by the accountant. That is the headline
guarantee, computed before the prompt is read.

**After stage 1** the method of the prompt table (:mod:`dpinfer.methods.prompt`) turns the released rewrites into
the protected prompt: ``dp-gtr`` (:mod:`dpinfer.protect.gtr`: exemplars, keywords, final prompt; stage 3 in
:mod:`dpinfer.protect.stage3`) or ``dp-prompt`` (the first rewrite as it is). It never sees the prompt: the
pipeline drops it after stage 1. Settings: :class:`~dpinfer.configs.protect.ProtectConfig`.

As a task (:mod:`dpinfer.task`): :func:`plan_protect` plans stage 1 of each prompt as one engine job, with the
guarantee and the charges (:class:`ProtectPlan`); the engine (or a server's batcher) runs the jobs; the charge path
settles the cost before they run; :func:`finish_protect` decodes the rewrites and runs the method on them. The stages
themselves live in :mod:`dpinfer.protect`.

What the authors' code got wrong and this implementation does not repeat: top_k = 50 sampling (voids the exponential
mechanism); ``max_new_tokens`` = the private prompt's length + 20 (leaks the length); no clipping on the large model;
JEM with the wrong sensitivity over the observed words only; case-sensitive keywords; only the per-token ε reported.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dpinfer.accounting.charge import Charges, charge, hold, run_charged
from dpinfer.accounting.spend import pure_steps_estimate
from dpinfer.configs.protect import ProtectConfig
from dpinfer.defaults import PROTECT
from dpinfer.errors import ConfigurationError, DPInferError
from dpinfer.methods.prompt import TABLE
from dpinfer.protect.stage1 import capped_paraphrase_ids, check_request_fits, request_bound, stage1_mechanism
from dpinfer.release import DIAGNOSTICS_WARNING
from dpinfer.task import Plan, run_jobs

if TYPE_CHECKING:
    from dpinfer.accounting import Guarantee
    from dpinfer.engine import EngineOutput
    from dpinfer.mechanisms.dp_prompt import DPPrompt
    from dpinfer.mechanisms.randomness import RandomSource
    from dpinfer.models import LM
    from dpinfer.runtime import Runtime

METHODS = tuple(TABLE.names())
ADJACENCY = "any two private prompts (the whole prompt may change; local DP)"

DEFAULT_N_REWRITES = PROTECT.n_rewrites
DEFAULT_N_KEYWORDS = PROTECT.n_keywords
DEFAULT_MAX_NEW_TOKENS = PROTECT.max_new_tokens
DEFAULT_TEMPERATURE = PROTECT.temperature
DEFAULT_JEM_EPSILON = PROTECT.jem_epsilon


@dataclass
class ProtectedPrompt:
    """The result of :func:`protect_prompt`: ``prompt`` (the protected prompt) and the ex-ante ``guarantee``.

    ``exemplar``, ``keywords`` and ``rewrites`` are the intermediate releases (all covered by the same guarantee:
    everything here is post-processing of stage 1's rewrites). ``epsilon_per_token`` is ε_tok = 2(b_max − b_min)/τ;
    the guarantee's ε composes it over ``n_rewrites × T_max`` tokens. ``settings`` never hold the seed or the
    original prompt. :meth:`release` is the public record (nothing in it depends on the prompt beyond the release and
    the guarantee's parameters); the seconds per stage are in :meth:`diagnostics` only (wall time is not protected).
    """

    prompt: str
    exemplar: str
    keywords: list[str]
    rewrites: list[str]
    guarantee: Guarantee
    method: str
    epsilon_per_token: float
    settings: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict, repr=False, compare=False)

    def __str__(self) -> str:
        return self.prompt

    def release(self) -> dict[str, Any]:
        """The public record: the protected prompt, the intermediate releases, ε_tok, the guarantee, the settings."""
        from dpinfer._json import plain

        return plain({
            "prompt": self.prompt, "method": self.method, "exemplar": self.exemplar, "keywords": list(self.keywords),
            "rewrites": list(self.rewrites), "epsilon_per_token": self.epsilon_per_token,
            "guarantee": self.guarantee.to_dict(), "settings": self.settings,
        })

    to_dict = release

    def diagnostics(self) -> dict[str, Any]:
        """Seconds per stage (data-dependent: never released)."""
        return {"warning": DIAGNOSTICS_WARNING, "seconds": dict(self.seconds)}


# ---------------------------------------------------------------------------------------------------------- checks
def method_for(config: ProtectConfig, runtime: Any = None) -> Any:
    """The method ``config`` names, built from the prompt table (an unknown one is refused before the model loads)."""
    return TABLE.build(config.method, config, runtime)


def _check_prompt(prompt: object) -> str:
    from dpinfer.validation import check_text

    return check_text(prompt, "the prompt")


def _release_terms(model: LM, mech: DPPrompt, clip_source: str, config: ProtectConfig,
                   method: Any) -> tuple[Guarantee, dict[str, Any]]:
    """The guarantee and the settings of a release: from the parameters alone (never the prompt, never the seed)."""
    from dpinfer.accounting import Guarantee

    n, t_max = method.rewrites, config.max_new_tokens
    parameters: dict[str, Any] = {
        "clip_min": mech.clip_min, "clip_max": mech.clip_max, "clip_source": clip_source,
        "temperature": mech.temperature, "epsilon_per_token": mech.epsilon_per_token, "num_rewrites": n,
        "T_max": t_max, "composed_tokens": n * t_max,
        "composition": mech.guarantee(t_max).parameters["composition"], **method.parameters(),
    }
    guarantee = Guarantee.from_loss(mech.loss(t_max), delta=config.delta, mechanism=config.method,
                                    adjacency=ADJACENCY, parameters=parameters, max_new_tokens=t_max)
    settings = {"method": config.method, "epsilon": config.epsilon, "temperature": mech.temperature,
                "delta": config.delta, "n_rewrites": n, "max_new_tokens": t_max, **method.settings(),
                "max_input_tokens": config.max_input_tokens, "model": model.name}
    order = ("method", "epsilon", "temperature", "delta", "n_rewrites", "n_keywords", "keywords", "max_new_tokens",
             "jem_epsilon", "suppress", "n_exemplars", "stage3_quorum", "stage3_int8", "max_input_tokens", "model")
    return guarantee, {k: settings[k] for k in order if k in settings}


class _Laps:
    """Seconds per stage (diagnostics only): ``lap(name)`` adds the time since the last lap to ``stages[name]``."""

    def __init__(self, stages: dict[str, float]) -> None:
        self.stages = stages
        self.start = self.clock = time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.stages[name] = self.stages.get(name, 0.0) + now - self.clock
        self.clock = now

    def total(self) -> None:
        self.stages["total"] = time.perf_counter() - self.start


# ---------------------------------------------------------------------------------------------------------- the task
@dataclass(frozen=True, kw_only=True, eq=False)
class ProtectPlan(Plan):
    """Prompts planned for protection (:func:`plan_protect`): a :class:`~dpinfer.task.Plan` whose jobs are stage 1
    of each prompt (``jobs[i]``: prompt ``i``'s ``n`` rewrites, the only computation that reads it), its ex-ante
    ``guarantee`` (one for every prompt: from the settings, the model's public clip bounds and ``T_max`` alone) and
    charges (scope ``prompt-source``: the composed loss of ``n·T_max`` tokens), and what :func:`finish_protect` needs
    for stages 2 and 3 (post-processing of the released rewrites). Its jobs hold the prompts' tokens: never log or
    serialise it."""

    config: ProtectConfig
    method: Any
    runtime: Runtime
    mechanism: DPPrompt
    settings: dict[str, Any]
    seeds: tuple[int | None, ...]
    sources: tuple[RandomSource, ...]
    laps: _Laps


def plan_protect(prompts: Sequence[str], config: ProtectConfig, runtime: Runtime, *,
                 seeds: Sequence[int | None] | None = None, method: Any = None, pooled: bool = True,
                 laps: _Laps | None = None) -> ProtectPlan:
    """Stage 1 of every prompt planned, before any token (prompts and settings already checked): the model's clip
    bounds, the mechanism calibrated once (τ), the guarantee, and one engine job per prompt (``pooled``: every job
    padded to the PUBLIC width :func:`request_bound`, so that prompts share the engine's steps and none's computation
    depends on another's content or length; else one job of the prompt's own rows). ``seeds[i]``: prompt ``i``'s
    randomness (None: a fresh secure source); ``method``: the prompt table's built method (default: the config's)."""
    from dpinfer.clip_bounds import clip_bounds
    from dpinfer.engine import Job
    from dpinfer.mechanisms.randomness import random_source

    method = method_for(config, runtime) if method is None else method
    seeds = (None,) * len(prompts) if seeds is None else tuple(seeds)
    model = runtime.lm
    n, t_max = method.rewrites, config.max_new_tokens
    check_request_fits(model, max_input_tokens=config.max_input_tokens, max_new_tokens=t_max)
    bounds = clip_bounds(model)
    mech = stage1_mechanism(clip=bounds.bounds, n_rewrites=n, max_new_tokens=t_max, delta=config.delta,
                            epsilon=config.epsilon, temperature=config.temperature)
    guarantee, settings = _release_terms(model, mech, bounds.source, config, method)
    sources = tuple(random_source(s) for s in seeds)
    if pooled:
        bound = request_bound(model, config.max_input_tokens)
        jobs = tuple(Job(contexts=[capped_paraphrase_ids(model, p, config.max_input_tokens)] * n,
                         # one mechanism per job (it holds its job's state), τ as calibrated once
                         mechanism=stage1_mechanism(clip=bounds.bounds, n_rewrites=n, max_new_tokens=t_max,
                                                    delta=config.delta, temperature=mech.temperature),
                         max_new_tokens=t_max, generator=src, pad_width=bound)
                     for p, src in zip(prompts, sources, strict=True))
    else:
        jobs = tuple(Job(contexts=[capped_paraphrase_ids(model, p, config.max_input_tokens)] * n, mechanism=mech,
                         max_new_tokens=t_max, generator=src) for p, src in zip(prompts, sources, strict=True))
    return ProtectPlan(jobs=jobs, guarantee=guarantee,
                       charges=Charges(mech.loss(t_max), scope="prompt-source", mechanism=config.method),
                       config=config, method=method, runtime=runtime, mechanism=mech, settings=settings,
                       seeds=seeds, sources=sources, laps=laps or _Laps({}))


def finish_protect(plan: ProtectPlan, outputs: Sequence[EngineOutput]) -> list[ProtectedPrompt]:
    """Each prompt's :class:`ProtectedPrompt` from its stage-1 output: the rewrites decoded, then the method (stages 2
    and 3, post-processing of the released rewrites only, on the runtime's engine: stage 3 in ONE run for every
    prompt; one encoder for every consensus pick)."""
    rt, method, laps, mech = plan.runtime, plan.method, plan.laps, plan.mechanism
    model = rt.lm
    rewrites = [[model.decode(s).strip() for s in out.sequences] for out in outputs]
    for job in plan.jobs:
        job.contexts = ()  # nothing below reads a prompt
    laps("stage1")
    embedder = rt.embedder if method.uses_embedder else None
    stage3_engine = rt.int8_engine if method.uses_stage3 and plan.config.stage3_int8 else None
    finals = method.finish(rt.engine, model, rewrites, list(plan.sources), embedder=embedder, lap=laps,
                           stages=laps.stages, stage3_engine=stage3_engine)
    laps.total()
    settings = dict(plan.settings)
    if "stage3_int8" in settings:  # what stage 3 ran on (no int8 twin on a GPU or in a server's shared batch)
        settings["stage3_int8"] = stage3_engine is not None
    seeded = dataclasses.replace(plan.guarantee, seeded=True)  # the same guarantee, held only while the seed is secret
    return [ProtectedPrompt(prompt=final, exemplar=exemplar, keywords=kws, rewrites=rw,
                            guarantee=plan.guarantee if seed is None else seeded, method=plan.config.method,
                            epsilon_per_token=mech.epsilon_per_token, settings=dict(settings),
                            seconds=dict(laps.stages))
            for rw, (final, exemplar, kws), seed in zip(rewrites, finals, plan.seeds, strict=True)]


@dataclass(frozen=True)
class ProtectInputs:
    """What :data:`TASK` plans: the private prompts and, for tests and benches only, one seed per prompt."""

    prompts: Sequence[str]
    seeds: Sequence[int | None] | None = None


class ProtectTask:
    """Prompt protection as a :class:`~dpinfer.task.Task`: :func:`plan_protect` then :func:`finish_protect`."""

    name = "protect_prompt"

    def plan(self, config: ProtectConfig, inputs: ProtectInputs, runtime: Runtime) -> ProtectPlan:
        return plan_protect(inputs.prompts, config, runtime, seeds=inputs.seeds)

    def finish(self, plan: ProtectPlan, outputs: Sequence[EngineOutput]) -> list[ProtectedPrompt]:
        return finish_protect(plan, outputs)


TASK = ProtectTask()
"""Prompt protection's task object (:mod:`dpinfer.task`)."""


def _run(plan: ProtectPlan) -> list[ProtectedPrompt]:
    rt, method = plan.runtime, plan.method
    _ = rt.engine, rt.embedder if method.uses_embedder else None  # loaded before stage 1 (the "loading" lap)
    if method.uses_stage3 and plan.config.stage3_int8:
        _ = rt.int8_engine
    plan.laps("loading")
    return finish_protect(plan, run_jobs(plan.runtime.engine, plan.jobs))


# ---------------------------------------------------------------------------------------------------------- API
def protect_prompt(prompt: str, config: ProtectConfig | None = None, *, lm: LM | str | None = None,
                   runtime: Runtime | None = None, seed: int | None = None, embedder: Any = None,
                   profile: dict[str, float] | None = None, ledger: Any = None, unit: str | None = None,
                   **settings: Any) -> ProtectedPrompt:
    """Protect ``prompt`` with DP-GTR (default) or DP-Prompt; see the module docstring.

    Args:
        prompt: the private prompt (never logged, never in an error message, never in the result).
        config: a :class:`~dpinfer.configs.protect.ProtectConfig`; ``**settings`` (any of its fields: ``method``,
            ``epsilon`` or ``temperature`` (exactly one; neither: τ = 0.75), ``delta``, ``n_rewrites``,
            ``n_keywords``, ``keywords`` (``"ndp"`` / ``"jem"``), ``max_new_tokens`` (T_max of every rewrite and of
            the final prompt, fixed in advance), ``jem_epsilon``, ``suppress`` (``"ban"`` / ``"instruct"``),
            ``n_exemplars``, ``max_input_tokens`` (a PUBLIC cap: a longer prompt is cut to its first
            ``max_input_tokens`` tokens before stage 1, silently)) are applied to it.
        lm / runtime: the model (default: the embedded SmolLM2-135M-Instruct) or a :class:`~dpinfer.runtime.Runtime`
            (its model, engine and embedder); the clip bounds come from
            :func:`~dpinfer.clip_bounds.clip_bounds` (shipped, stored, or measured once on public text).
        seed: tests and benchmarks only (the guarantee then holds only while the seed is secret; never stored).
        embedder: the sentence encoder of stage 3's consensus pick (default: the runtime's, the offline
            all-MiniLM-L6-v2 loaded once per process).
        profile: diagnostics only: a dict that receives the seconds spent per stage (``loading``, ``stage1``,
            ``ranking``, ``stage2`` (keywords), ``stage3`` (of which ``stage3_prefill``: the final requests'
            prefill), ``embedding``, ``total``; also in
            :meth:`ProtectedPrompt.diagnostics`). Never part of the release.
        ledger / unit: a :class:`~dpinfer.Ledger` (or its path) this release is charged to, and the prompt source on
            it (:func:`dpinfer.accounting.charge.charge`): reserved before the model loads when ``epsilon`` is
            given, else priced once the clip bounds are known, always before any token.

    Raises (before the model loads): :class:`~dpinfer.errors.InvalidInputError` for an empty prompt,
    :class:`~dpinfer.errors.ConfigurationError` for bad settings (ε ≤ 0, both ε and τ, …). After the tokenizer loads
    and before the prompt is read: :class:`~dpinfer.errors.ContextTooLongError` when :func:`request_bound` plus
    ``max_new_tokens`` exceeds the context window (a check on the settings alone).
    """
    from dpinfer.checks import check_seed
    from dpinfer.runtime import resolve_runtime

    with charge(ledger, unit, scope="prompt-source", what="protect_prompt") as spend:
        _check_prompt(prompt)
        config = ProtectConfig.merged(config, **settings)
        check_seed(seed, "seed")
        method = method_for(config, runtime)
        if config.epsilon is not None:  # the cost from the settings alone, before the model
            hold(spend, pure_steps_estimate(config.epsilon, config.delta, method.rewrites * config.max_new_tokens,
                                            bounded_range=True), mechanism=config.method)
        stages: dict[str, float] = {} if profile is None else profile
        stages.clear()
        laps = _Laps(stages)
        rt = resolve_runtime(runtime, lm=lm, embedder=embedder)
        plan = plan_protect([prompt], config, rt, seeds=[seed], method=method, pooled=False, laps=laps)
        del prompt  # nothing after stage 1 reads it
        return run_charged(spend, plan.charges, lambda: _run(plan))[0]  # the exact cost, before any token


def protect_prompts(prompts: Sequence[str], config: ProtectConfig | None = None, *, lm: LM | str | None = None,
                    runtime: Runtime | None = None, seeds: Sequence[int | None] | None = None, embedder: Any = None,
                    **settings: Any) -> list[ProtectedPrompt | DPInferError]:
    """:func:`protect_prompt` for several prompts (each a different person's: separate releases that do not compose)
    sharing the engine's steps: stage 1 of every prompt as one job of :meth:`Engine.run_jobs
    <dpinfer.engine.Engine.run_jobs>` (one forward per step for all prompts' rows; each prompt's rows drawn from its
    own source, ``seeds[i]`` or a fresh secure source; every job padded to the PUBLIC width :func:`request_bound`, so
    no prompt's computation depends on another's content or length), stage 2 per prompt, stage 3 of every prompt in
    ONE engine run (post-processing of released rewrites only), one encoder for every consensus pick. Same settings
    as :func:`protect_prompt`. Returns one item per prompt: its :class:`ProtectedPrompt`, or the
    :class:`~dpinfer.errors.DPInferError` that refused it (an empty prompt; the messages never quote a prompt).
    Settings are checked once, before the model loads (a bad one raises)."""
    from dpinfer.checks import check_seed
    from dpinfer.runtime import resolve_runtime

    config = ProtectConfig.merged(config, **settings)
    method = method_for(config, runtime)
    seeds = [None] * len(prompts) if seeds is None else list(seeds)
    if len(seeds) != len(prompts):
        raise ConfigurationError(f"give one seed per prompt ({len(prompts)}), got {len(seeds)}")
    for s in seeds:
        check_seed(s, "seeds")
    out: list[ProtectedPrompt | DPInferError | None] = [None] * len(prompts)
    ok: list[int] = []
    for i, p in enumerate(prompts):
        try:
            _check_prompt(p)
        except DPInferError as err:
            out[i] = err
        else:
            ok.append(i)
    if ok:
        rt = resolve_runtime(runtime, lm=lm, embedder=embedder)
        done = _run(plan_protect([prompts[i] for i in ok], config, rt, seeds=[seeds[i] for i in ok], method=method))
        for i, res in zip(ok, done, strict=True):
            out[i] = res
    return [o for o in out if o is not None]


def guarantee_lines(res: ProtectedPrompt) -> list[str]:
    """The guarantee for the command line: one plain sentence, a caveat when ε is too large to bound anything useful
    (what e^ε means there, where to choose ε), then the details: per-token ε and composed ε side by side."""
    from dpinfer.accounting.guarantee import epsilon_caveat
    from dpinfer.checks import format_up

    g = res.guarantee
    p = g.parameters
    caveat = epsilon_caveat(g.epsilon, "the prompt")
    lines = [f"Guarantee: the whole prompt is protected with ε = {format_up(g.epsilon)} (δ = {format_up(g.delta)}) "
             "against any other prompt; not protected: that a prompt was protected with these settings, and timing.",
             *([caveat] if caveat else []),
             "Details: " + str(g),
             f"per token: ε_tok = 2(b_max − b_min)/τ = 2·({p['clip_max']:.3g} − {p['clip_min']:.3g})/"
             f"{p['temperature']:.3g} = {res.epsilon_per_token:.4g}; composed over {p['num_rewrites']} rewrites × "
             f"T_max {p['T_max']} = "
             f"{p['composed_tokens']} tokens: ε = {g.epsilon:.4g} at δ = {g.delta:g} ({p['composition']})."]
    if "jem_epsilon" in p:
        lines.append(f"keywords by JEM at ε₂ = {p['jem_epsilon']:g} per rewrite (post-processing here; not added).")
    return lines


__all__ = [
    "ADJACENCY", "METHODS", "TASK", "ProtectInputs", "ProtectPlan", "ProtectedPrompt", "finish_protect",
    "guarantee_lines", "method_for", "plan_protect", "protect_prompt", "protect_prompts",
]
