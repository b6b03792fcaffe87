"""Planning one document for the engine (:func:`plan_sanitize`) and turning its output into a result
(:func:`finish_sanitize`): :func:`dpinfer.pipelines.sanitize.sanitize` and
:func:`dpinfer.pipelines.sanitize_many.sanitize_many` are these two around the engine."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dpinfer.accounting.charge import Charges
from dpinfer.accounting.spend import NO_PRIVACY, single_order_estimate
from dpinfer.configs.sanitize import SanitizeConfig
from dpinfer.engine import Job
from dpinfer.errors import ContextTooLongError
from dpinfer.methods import sanitize as methods
from dpinfer.methods.sanitize import BuildArgs
from dpinfer.pipelines.sanitize_contexts import (
    BASELINE_MAX_NEW_TOKENS,
    DEFAULT_INSTRUCTION,
    cut_document,
    default_max_new_tokens,
    prepare_contexts,
    whole_document_cap,
)
from dpinfer.pipelines.sanitize_result import SanitizeResult
from dpinfer.runtime import Runtime, resolve_runtime
from dpinfer.taggers.base import Span
from dpinfer.taggers.resolve import resolve_group_epsilon, resolve_groups
from dpinfer.taggers.resolve import resolve_span_source as _resolve
from dpinfer.taggers.spans import ResolvedSpans
from dpinfer.task import Plan
from dpinfer.validation import check_sanitize_config, check_text

if TYPE_CHECKING:
    from dpinfer.accounting.costs import Cost
    from dpinfer.engine import EngineOutput
    from dpinfer.models import LM


def resolve_span_source(text: str, *, spans: Any = None, tagger: Any = SanitizeConfig.tagger,
                        label_map: Mapping[str, str | None] | None = None, method: str = SanitizeConfig.method,
                        allow_untagged: bool = False, tag_uncovered: bool = False) -> ResolvedSpans:
    """The private spans of ``text`` for ``method`` (:func:`dpinfer.taggers.resolve.resolve_span_source`; a method
    that protects spans refuses a document with none unless ``allow_untagged``). Needs no model."""
    return _resolve(text, spans=spans, tagger=tagger, label_map=label_map, allow_untagged=allow_untagged,
                    require_spans=methods.method(method).protects == "spans", tag_uncovered=tag_uncovered)


def resolve_spans(text: str, **kwargs: Any) -> list[Span]:
    """The private spans of ``text`` (:func:`resolve_span_source` without where they came from)."""
    return resolve_span_source(text, **kwargs).spans


def estimate_cost(config: SanitizeConfig, group_map: Mapping[str, Sequence[str]]) -> Cost | None:
    """What a rewrite costs its document, from the settings and the groups alone (before the model loads): a
    method without a guarantee ε = ∞ (as a span method with nothing tagged), one that never reads the spans ε = 0,
    DP-Fusion its per-group target at order α; None for the whole-document methods, whose exact cost is settled once
    the release is planned."""
    from dpinfer.accounting import PureDp
    from dpinfer.accounting.costs import Cost

    entry = methods.method(config.method)
    if entry.guarantee == "none" or (entry.protects == "spans" and not group_map):
        return NO_PRIVACY
    if entry.protects != "spans":
        return None
    if entry.guarantee == "zero":
        return Cost({name: PureDp(0.0) for name in group_map})
    targets = resolve_group_epsilon(list(group_map), group_map, config.epsilon, config.group_epsilon)
    return single_order_estimate(targets, alpha=config.alpha, delta=config.delta)


@dataclass(frozen=True, kw_only=True, eq=False)
class SanitizePlan(Plan):
    """One document planned for the engine (:func:`plan_sanitize`): a :class:`~dpinfer.task.Plan` of one engine
    :class:`~dpinfer.engine.Job` (:attr:`job`), its ex-ante guarantee and charges (scope ``document``), and what
    :func:`finish_sanitize` needs to turn its output into a :class:`SanitizeResult`. It holds the private document's
    contexts and spans: never log or serialise it."""

    lm: LM
    method: str
    spans: list[Span]
    groups: dict[str, list[str]]
    prompt_tokens: int
    settings: dict[str, Any]
    debug: bool = False
    opening: list[int] = dataclasses.field(default_factory=list)
    """The public opening the rewrite starts with (forced, identical in every row; part of the released text)."""


def plan_sanitize(text: str, config: SanitizeConfig | None = None, *, runtime: Runtime | None = None,
                  lm: LM | str | None = None, spans: Any = None, checked: bool = False,
                  on_groups: Callable[[dict[str, list[str]]], None] | None = None, **options: Any) -> SanitizePlan:
    """Everything :func:`sanitize` does before the engine runs: every check, the spans, the prompt and its contexts,
    the calibrated mechanism and the ex-ante guarantee, as an engine :class:`~dpinfer.engine.Job` (arguments: see
    :func:`sanitize`). ``checked=True`` skips the checks against the method table that a caller made once for many
    documents. ``on_groups(groups)`` is called with the privacy groups before the model loads (a ledger's
    reservation). The model is the runtime's (``runtime``, else one on ``lm``, else the default runtime), loaded only
    once every check passed. Raises what :func:`sanitize` raises, before any token is generated.
    """
    from dpinfer.clip_bounds import clip_bounds
    from dpinfer.mechanisms.transforms import MinP, NoRepeatNGram

    cfg = SanitizeConfig.merged(config, **options)
    check_text(text, "the document")
    if not checked:  # before the model loads
        check_sanitize_config(cfg, check_tagger=spans is None or cfg.tag_uncovered)
    entry = methods.method(cfg.method)
    instruction = DEFAULT_INSTRUCTION if cfg.instruction is None else cfg.instruction
    rt = resolve_runtime(runtime, lm=lm)
    tagger = cfg.tagger
    if isinstance(tagger, str) and (spans is None or cfg.tag_uncovered) and not isinstance(spans, ResolvedSpans):
        tagger = rt.get_tagger(tagger, **({"label_map": cfg.label_map} if cfg.label_map else {}))  # built once
    # fail closed before the model loads: spans checked against this document, nothing tagged refused
    resolved = resolve_span_source(text, spans=spans, tagger=tagger, label_map=cfg.label_map, method=cfg.method,
                                   allow_untagged=cfg.allow_untagged, tag_uncovered=cfg.tag_uncovered)
    used_spans = resolved.spans
    group_map = resolve_groups(used_spans, cfg.groups)
    targets = resolve_group_epsilon(list(group_map), group_map, cfg.epsilon, cfg.group_epsilon)
    if on_groups is not None:
        on_groups(group_map)
    model = rt.lm
    whole_document = entry.protects == "document"  # any two documents are adjacent: the length is private
    if whole_document:
        t_max = BASELINE_MAX_NEW_TOKENS if cfg.max_new_tokens is None else cfg.max_new_tokens
        cap = whole_document_cap(model, instruction, max_new_tokens=t_max, max_input_tokens=cfg.max_input_tokens)
        text, used_spans = cut_document(model, text, used_spans, cap, instruction)
    prep = prepare_contexts(model, text, used_spans, group_map, instruction)
    # the public opening: read from the PUBLIC context only; never for whole-document methods (every token private)
    opening = [] if whole_document else prep.opening(cfg.opening_tokens)
    if cfg.max_new_tokens is not None:
        t_max, t_max_from = cfg.max_new_tokens, "max_new_tokens"
    elif whole_document:
        t_max_from = "fixed default"
    else:  # the length is public under DP-Fusion's adjacency
        t_max, t_max_from = default_max_new_tokens(prep.document_tokens), "document length"
    if len(prep.original) + len(opening) + t_max > model.context_window:
        raise ContextTooLongError(
            f"the prompt ({len(prep.original)} tokens) plus max_new_tokens={t_max} exceeds the model's context window "
            f"({model.context_window}); split the document into parts and sanitise each (each part's guarantee "
            "composes: charge every part's T_max to the same groups), or lower --max-new-tokens"
        )
    settings: dict[str, Any] = {"temperature": cfg.temperature, "top_k": cfg.top_k, "min_p": cfg.min_p,
                                "alpha": cfg.alpha, "delta": cfg.delta,
                                "instruction": "default" if instruction == DEFAULT_INSTRUCTION else "custom",
                                "model": model.name,  # never the seed (it would let anyone replay the noise)
                                "max_new_tokens_from": t_max_from, "span_source": resolved.to_dict(),
                                "opening_tokens": cfg.opening_tokens if not whole_document else None}
    if whole_document:
        settings["max_input_tokens"] = cap
    if entry.contexts == "fusion":
        settings["adjacency"] = cfg.adjacency
    args = BuildArgs(lm=model, groups=group_map, targets=targets, max_new_tokens=t_max, settings=settings,
                     clip_bounds=lambda: clip_bounds(model).bounds)
    mech = methods.mechanism(entry, cfg, args)
    settings["no_repeat_ngram"] = cfg.no_repeat_ngram
    processors: list[Any] = [NoRepeatNGram(cfg.no_repeat_ngram)] if cfg.no_repeat_ngram else []
    if cfg.min_p is not None and methods.decodes_one_row(entry, group_map):
        processors.append(MinP(cfg.min_p, cfg.temperature))  # one decoded row (the sampler's): its own min-p
    guarantee = methods.guarantee(entry, mech, group_map, cfg, t_max)
    if cfg.seed is not None:
        guarantee = dataclasses.replace(guarantee, seeded=True)
    contexts = methods.rows(entry, prep.public + opening, [p + opening for p in prep.private],
                            prep.original + opening)
    job = Job(contexts=contexts, mechanism=mech,
              max_new_tokens=t_max, min_new_tokens=min(cfg.min_new_tokens, t_max), seed=cfg.seed,
              processors=processors, debug_stats=cfg.debug)
    return SanitizePlan(jobs=(job,), guarantee=guarantee, charges=Charges(guarantee, scope="document"), lm=model,
                        method=cfg.method, spans=used_spans, groups=group_map, prompt_tokens=len(prep.original),
                        settings=settings, debug=cfg.debug, opening=opening)


def finish_sanitize(plan: SanitizePlan, output: EngineOutput, *, seconds: float = 0.0) -> SanitizeResult:
    """The :class:`SanitizeResult` of a planned document (:func:`plan_sanitize`) from its engine output."""
    ids = list(plan.opening) + list(output.sequences[0])
    stats = plan.job.mechanism.diagnostics(output.steps) if plan.debug else {}  # data-dependent: diagnostics only
    return SanitizeResult(
        text=plan.lm.decode(ids).strip(), guarantee=plan.guarantee, token_ids=ids,
        spans=plan.spans, groups=plan.groups, method=plan.method, finish_reason=output.finish_reasons[0],
        prompt_tokens=plan.prompt_tokens, generated_tokens=len(ids) - len(plan.opening),
        max_new_tokens=plan.job.max_new_tokens,
        seconds=seconds, settings=plan.settings, data_dependent=stats, debug=plan.debug,
    )


@dataclass(frozen=True)
class SanitizeInputs:
    """What :data:`TASK` plans: the private document and, optionally, its spans (see :func:`plan_sanitize`)."""

    text: str
    spans: Any = None


class SanitizeTask:
    """Sanitisation as a :class:`~dpinfer.task.Task`: :func:`plan_sanitize` then :func:`finish_sanitize`."""

    name = "sanitize"

    def plan(self, config: SanitizeConfig | None, inputs: SanitizeInputs, runtime: Runtime) -> SanitizePlan:
        return plan_sanitize(inputs.text, config, runtime=runtime, spans=inputs.spans)

    def finish(self, plan: SanitizePlan, outputs: Sequence[EngineOutput]) -> SanitizeResult:
        return finish_sanitize(plan, outputs[0])


TASK = SanitizeTask()
"""Sanitisation's task object (:mod:`dpinfer.task`)."""


def method_plan(method: str) -> methods.Method:
    """The table entry of ``method`` (how it runs: ``mechanism``, ``contexts``, ``protects``, ``baseline``)."""
    return methods.method(method)
