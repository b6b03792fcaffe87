"""Many documents: :func:`sanitize_many` plans every :class:`Record` of a corpus, runs all planned jobs through ONE
:meth:`Engine.run_jobs <dpinfer.engine.Engine.run_jobs>` call (the engine serves them together) and finishes each as it
completes; a record that cannot be planned is reported in its :class:`RecordOutcome` and the others go on.
``dpinfer sanitize --corpus`` (docs/corpus.md) writes the outcomes to a resumable JSONL file."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dpinfer.configs.sanitize import SanitizeConfig
from dpinfer.errors import DPInferError, InvalidInputError
from dpinfer.jobs.corpus import Record
from dpinfer.pipelines.sanitize_plan import SanitizePlan, finish_sanitize, plan_sanitize
from dpinfer.pipelines.sanitize_result import SanitizeResult
from dpinfer.runtime import Runtime, resolve_runtime
from dpinfer.taggers import Tagger
from dpinfer.validation import check_sanitize_config

if TYPE_CHECKING:
    from dpinfer.accounting import Guarantee
    from dpinfer.engine import Engine
    from dpinfer.models import LM


@dataclass
class RecordOutcome:
    """What :func:`sanitize_many` yields per record: its ``result``, or ``error``, a one-line message that quotes no
    private text (the record was refused and nothing was generated for it)."""

    id: str | int
    result: SanitizeResult | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def record_seed(seed: int | None, record_id: str | int) -> int | None:
    """The seed of one record in a seeded corpus run: a hash of the run's seed and the record's id, so that a record's
    output depends neither on the other records nor on their order, on any backend (tests and benchmarks only).

    >>> record_seed(None, "a") is None, record_seed(7, "a") == record_seed(7, "a")
    (True, True)
    >>> record_seed(7, "a") != record_seed(7, 1) != record_seed(8, 1)
    True
    """
    if seed is None:
        return None
    key = json.dumps([int(seed), record_id], ensure_ascii=False).encode("utf-8")
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") >> 1


def record_error(exc: BaseException) -> str:
    """A per-record error as one line that quotes no input: dpinfer's own messages (they name offsets, indices and
    sizes, never text), or the type of an unexpected error with its message withheld."""
    if isinstance(exc, DPInferError):
        msg = " ".join(str(exc).split())
        return f"{type(exc).__name__}: {msg}"
    return f"unexpected {type(exc).__name__} (message withheld: it may quote the input)"


def sanitize_many(
    records: Iterable[Record],
    config: SanitizeConfig | None = None,
    *,
    runtime: Runtime | None = None,
    lm: LM | str | None = None,
    engine: Engine | None = None,
    on_planned: Callable[[str | int, Guarantee], None] | None = None,
    **options: Any,
) -> Iterator[RecordOutcome]:
    """Sanitise many documents: plan each (:func:`~dpinfer.pipelines.sanitize_plan.plan_sanitize`), run every planned
    job through ONE :meth:`Engine.run_jobs <dpinfer.engine.Engine.run_jobs>` call, and yield a :class:`RecordOutcome`
    per record as it finishes (records refused while planning first, in input order; then in the order the engine
    finishes them).

    Each record's result equals ``sanitize(record.text, config, spans=record.spans)`` with the seed
    :func:`record_seed` ``(config.seed, record.id)``: every record is its own release with its own guarantee (the
    documents are separate; a corpus does not compose them). ``config`` / ``options`` (its fields) are checked once
    before the model loads; a record without spans is tagged by ``config.tagger`` (built once). The model and engine
    are the runtime's (``runtime``, else one on ``lm`` / ``engine``, else the default runtime). A record that cannot
    be planned (empty text, bad spans, nothing tagged, too long for the context window...) is yielded with its
    one-line ``error`` and the others go on. ``on_planned(record_id, guarantee)`` is called once a record is planned,
    before any of its tokens (a ledger prices its charge there:
    :class:`~dpinfer.accounting.charge.RecordCharges`); what it raises is the record's error.
    """
    cfg = SanitizeConfig.merged(config, **options)
    check_sanitize_config(cfg, check_tagger=isinstance(cfg.tagger, str))
    rt = resolve_runtime(runtime, lm=lm, engine=engine)
    tg: Any = cfg.tagger if isinstance(cfg.tagger, Tagger) else None

    def record_tagger() -> Any:  # built once, and only if a record has no spans (presidio takes seconds to load)
        nonlocal tg
        if tg is None and cfg.tagger is not None:
            tg = rt.get_tagger(cfg.tagger, **({"label_map": cfg.label_map} if cfg.label_map else {}))
        return tg

    plans: list[tuple[str | int, SanitizePlan]] = []
    for i, rec in enumerate(records):
        if not isinstance(rec, Record):
            raise InvalidInputError(f"record {i} must be a dpinfer.pipelines.sanitize.Record, got "
                                    f"{type(rec).__name__}")
        # a tagger that cannot be built stops the run (it is not a per-record error: every record would fail)
        record_tg = record_tagger() if needs_tagger([rec], {"tag_uncovered": cfg.tag_uncovered}) else None
        try:
            if isinstance(rec.spans, (str, bytes)):
                raise InvalidInputError("the spans field must be a list of spans or an object (e.g. TAB entity "
                                        "mentions), not a string")
            plan = plan_sanitize(rec.text, cfg.replace(tagger=record_tg, seed=record_seed(cfg.seed, rec.id)),
                                 runtime=rt, spans=rec.spans, checked=True)
            if on_planned is not None:
                on_planned(rec.id, plan.guarantee)
        except Exception as exc:  # a per-record refusal: reported in its record, the run goes on
            yield RecordOutcome(rec.id, error=record_error(exc))
            continue
        plans.append((rec.id, plan))
    if not plans:
        return
    jobs = [p.job for _, p in plans]
    pending = dict(enumerate(plans))
    plans.clear()
    for index, output in rt.engine.run_jobs(jobs):
        rid, done = pending.pop(index)  # the finished job's contexts are freed with it
        yield RecordOutcome(rid, result=finish_sanitize(done, output,
                                                        seconds=output.prefill_seconds + output.decode_seconds))




def needs_tagger(records: Sequence[Any], options: Mapping[str, Any]) -> bool:
    """Whether sanitising ``records`` with ``options`` needs the tagger: a record without spans, or given spans
    completed by it (``tag_uncovered``, the default of the command line: partial spans fail closed). Every backend
    (local, Ray) decides it here, so both release the same records with the same spans and guarantees."""
    return bool(options.get("tag_uncovered")) or any(r.spans is None for r in records)
