"""Document sanitisation: rewrite a sensitive document with a per-group (ε, δ) guarantee (DP-Fusion, ALGORITHMS §1).

Steps of :func:`sanitize`, whose settings are one :class:`~dpinfer.configs.sanitize.SanitizeConfig`:

1. **Spans**: the user's spans, checked against this document, or the tagger's (:mod:`dpinfer.taggers.resolve`);
   fail closed: if tagging fails nothing is generated. Labels are TAB's 8 types; by default each type present is
   one privacy group, and ``groups=`` merges types into named groups.
2. **Contexts**: the prompt is tokenised in parts (the template, and each run of untagged text or of one group's
   spans apart), so the public context does not depend on what a span holds; the public context and one private
   context per group have the same length and positions (:mod:`dpinfer.pipelines.sanitize_contexts`).
3. **Decode** with the chosen method (its entry in :data:`dpinfer.methods.sanitize.TABLE`: the rows it decodes,
   its builder, its guarantee) on the engine, ``T_max`` tokens at most, one :meth:`~dpinfer.engine.Engine.step` per
   token (progress comes from the step events).
4. **Release** :meth:`SanitizeResult.release`: the rewrite and the ex-ante guarantee with what it leaves public;
   data-dependent statistics only in :meth:`SanitizeResult.diagnostics`.

Fail closed: no span given or found, spans made for another document, or a chat template that does not keep the
document verbatim are refused before the model loads (the template check needs the tokenizer). Documents longer than
the model's context window raise :class:`~dpinfer.errors.ContextTooLongError` (no silent truncation).

:func:`sanitize` is :func:`plan_sanitize` (steps 1-2 and the calibrated mechanism, as an engine
:class:`~dpinfer.engine.Job`), the engine (step 3) and :func:`finish_sanitize` (step 4); many documents:
:func:`~dpinfer.pipelines.sanitize_many.sanitize_many`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dpinfer.accounting.charge import charge, hold, run_charged
from dpinfer.configs.sanitize import SanitizeConfig
from dpinfer.pipelines.sanitize_plan import (
    estimate_cost,
    finish_sanitize,
    plan_sanitize,
)
from dpinfer.pipelines.sanitize_result import DEBUG_WARNING, SanitizeResult
from dpinfer.runtime import Runtime, resolve_runtime

if TYPE_CHECKING:
    from dpinfer.engine import Engine
    from dpinfer.models import LM


def sanitize(text: str, config: SanitizeConfig | None = None, *, runtime: Runtime | None = None,
             lm: LM | str | None = None, engine: Engine | None = None, spans: Any = None,
             progress: Callable[[int, int], None] | None = None, ledger: Any = None, unit: str | None = None,
             **options: Any) -> SanitizeResult:
    """Rewrite ``text`` with a per-group differential-privacy guarantee (see the module docstring).

    Args:
        text: the private document.
        config: the settings (:class:`~dpinfer.configs.sanitize.SanitizeConfig`); ``options`` are its fields as
            keywords (``epsilon=20, method="ner-scrub"``, ...), applied on top of it (or of the defaults).
        runtime: the :class:`~dpinfer.runtime.Runtime` to run on (its model, engine and taggers); ``lm`` (a model,
            name or path) or ``engine``: a runtime on them; none of the three: the process's default runtime (the
            embedded SmolLM2-135M-Instruct).
        spans: user-given spans (list of :class:`Span`, a spans file path, JSON string or parsed JSON); used instead
            of the tagger unless ``tag_uncovered``. They are checked against this document
            (:func:`resolve_span_source`); overlapping spans are merged.
        progress: called as ``progress(0, T_max)`` once planned, then ``progress(tokens_done, T_max)`` after every
            generated token.
        ledger: a :class:`~dpinfer.Ledger` (or its path) that this rewrite is charged to, per privacy group, before
            the model loads (:func:`dpinfer.accounting.charge.charge`; refused with
            :class:`~dpinfer.errors.BudgetExceededError` when the unit cannot afford it); None: no ledger.
        unit: the document's unit on the ledger (default: a keyed hash of the text, ``ledger.unit_for_text``).

    Choosing ε: see :class:`~dpinfer.configs.sanitize.SanitizeConfig` and docs/sanitize.md.
    """
    cfg = SanitizeConfig.merged(config, **options)
    rt = resolve_runtime(runtime, lm=lm, engine=engine)
    with charge(ledger, unit, scope="document", default_unit=lambda book: book.unit_for_text(text)) as spend:
        # plan: the estimate is held before the model loads (from the settings and the groups alone)
        plan = plan_sanitize(text, cfg, runtime=rt, spans=spans,
                             on_groups=lambda groups: hold(spend, estimate_cost(cfg, groups), mechanism=cfg.method))

        def run() -> SanitizeResult:
            job = plan.job
            if progress is not None:
                progress(0, job.max_new_tokens)  # the total (T_max, public) is known before prefill
            t0 = time.perf_counter()
            with rt.lock:  # one caller's jobs at a time on a shared engine
                events = rt.engine.stream(job)
                for event in events:  # one Engine.step per token
                    if progress is not None:
                        progress(event.step + 1, job.max_new_tokens)
            if cfg.debug:
                print(f"dpinfer: warning: {DEBUG_WARNING}", file=sys.stderr)
            return finish_sanitize(plan, events.output, seconds=time.perf_counter() - t0)

        return run_charged(spend, plan.charges, run)  # the exact cost settled before any token
