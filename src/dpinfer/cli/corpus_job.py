"""Corpus mode of a command: ``--corpus IN.jsonl --out OUT.jsonl`` (``dpinfer sanitize --corpus``).

Not a command module: the commands add these options with :func:`add_corpus_arguments` and hand over to
:func:`run_sanitize_corpus`. Record format, resume semantics and the Ray backend: :mod:`dpinfer.jobs.corpus`,
:mod:`dpinfer.pipelines.corpus_ray` and docs/corpus.md. Each output line is the id and the record's ``release()``
(:func:`dpinfer.jobs.corpus.release_record`), never its diagnostics. Every refusal (paths, fields, duplicate
ids, a file that is not JSONL, Ray not installed) comes before the model loads. Standard output stays empty but for
``--json`` (the summary); the releases go to ``--out`` only.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from dpinfer.checks import int_at_least
from dpinfer.cli.budget import ledger_path
from dpinfer.cli.output import console, print_json, progress_bar
from dpinfer.configs.sanitize import SanitizeConfig
from dpinfer.defaults import SANITIZE
from dpinfer.errors import ConfigurationError, LedgerError
from dpinfer.jobs import check_corpus_paths, id_key, per_record_budget, read_corpus, run_corpus_job
from dpinfer.jobs.corpus import release_record
from dpinfer.pipelines.corpus_ray import check_ray, sanitize_corpus_ray
from dpinfer.runtime import Runtime
from dpinfer.taggers.base import TAB_LABELS, Span

CHUNK_RECORDS = 256
"""Records planned and handed to one ``Engine.run_jobs`` call at a time by the local backend: enough jobs to keep a
batching engine's slots full, while the planned contexts of a large corpus stay bounded in memory and the first
records are written after one chunk is planned, not the whole corpus."""

PLAIN_PROGRESS_SECONDS = 10.0
"""Seconds between two plain progress lines when standard error is not a terminal."""


def add_corpus_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("corpus jobs (one release per JSONL record; resumable)")
    g.add_argument("--corpus", default=None, metavar="IN.jsonl",
                   help="sanitise every record of this JSONL file (one JSON object per line) instead of FILE; "
                        "--out OUT.jsonl gets one record per input id; rerunning skips the ids already in OUT")
    g.add_argument("--text-field", default="text", help="--corpus: the field holding the document (default text)")
    g.add_argument("--spans-field", default="spans",
                   help="--corpus: the field holding the record's spans, in any format --spans accepts (e.g. TAB's "
                        "entity_mentions); a record without it is tagged by --tagger, and entity types its spans "
                        "leave uncovered are tagged and merged in unless --spans-only (default spans)")
    g.add_argument("--id-field", default="id", help="--corpus: the field holding the record's unique id (default id)")
    add_rerelease_argument(g)
    g.add_argument("--backend", default="local", choices=["local", "ray"],
                   help="--corpus: run here (local, default) or on Ray Data (ray; needs the ray extra)")
    g.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="--backend ray: join this Ray cluster (e.g. ray://HOST:10001); default: a local Ray")
    g.add_argument("--ray-batch-size", type=int, default=8,
                   help="--backend ray: records per batch sent to an engine actor (default 8)")
    g.add_argument("--ray-actors", type=int, default=None,
                   help="--backend ray: engine actors, each loading the model once (default: one per GPU of the "
                        "cluster when the model runs on CUDA, else 1)")


def check_corpus_args(args: argparse.Namespace) -> None:
    """The corpus options that conflict with the one-document options, checked before anything is read."""
    if args.corpus is None:
        for option, value in (("--backend", args.backend != "local"), ("--ray-address", args.ray_address),
                              ("--allow-rerelease", args.allow_rerelease)):
            if value:
                raise ConfigurationError(f"{option} applies to --corpus only")
        return
    if args.file is not None:
        raise ConfigurationError("give a document FILE or --corpus IN.jsonl, not both")
    if not args.out:
        raise ConfigurationError("--corpus needs --out OUT.jsonl (the releases are appended there, one per id)")
    for option, value in (("--spans", args.spans), ("--show-input", args.show_input),
                          ("--debug-stats", args.debug_stats)):
        if value:
            raise ConfigurationError(f"{option} does not apply to --corpus (give spans in each record's "
                                     f"{args.spans_field!r} field; a corpus record never holds debug statistics)")
    if args.ray_address and args.backend != "ray":
        raise ConfigurationError("--ray-address needs --backend ray")
    int_at_least(args.ray_batch_size, "--ray-batch-size", 1)
    if args.ray_actors is not None:
        int_at_least(args.ray_actors, "--ray-actors", 1)
    for option, value in (("--text-field", args.text_field), ("--id-field", args.id_field),
                          ("--spans-field", args.spans_field)):
        if not value:
            raise ConfigurationError(f"{option} is empty; name a field of the records")
    if len({args.text_field, args.id_field, args.spans_field}) < 3:
        raise ConfigurationError("--text-field, --id-field and --spans-field must name three different fields")


@contextmanager
def record_progress(label: str, total: int, *, interval: float = PLAIN_PROGRESS_SECONDS
                    ) -> Iterator[Callable[[int, int], None]]:
    """Progress of a corpus job on standard error; yields ``update(done, errors)``. On a terminal: a bar with the
    rate and the ETA. Otherwise: a plain line every ``interval`` seconds (and none for a run shorter than that)."""
    err = console(stderr=True)
    if err.is_terminal:
        with progress_bar(label, "records", "rate", "errors") as prog:
            task = prog.add_task(label, total=total, rate="", errors="")
            t0 = time.monotonic()

            def update(done: int, errors: int) -> None:
                elapsed = time.monotonic() - t0
                prog.update(task, completed=done, rate=f"{done / elapsed * 60:.1f}/min" if elapsed > 0 else "",
                            errors=f"{errors} errors" if errors else "")

            yield update
        return
    t0 = last = time.monotonic()

    def plain(done: int, errors: int) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last < interval and done < total:
            return
        if done >= total and now - t0 < interval:
            return
        last = now
        elapsed = now - t0
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = f"{(total - done) / rate:.0f} s" if rate > 0 else "unknown"
        print(f"dpinfer: {label}: {done}/{total} records ({errors} errors), {rate * 60:.1f} records/min, "
              f"{elapsed:.0f} s elapsed, ETA {eta}", file=sys.stderr, flush=True)

    yield plain


def sanitize_options(args: argparse.Namespace, *, group_epsilon: Any, groups: Any, top_k: Any,
                     no_repeat_ngram: Any) -> dict[str, Any]:
    """The :func:`~dpinfer.pipelines.sanitize_many.sanitize_many` options of parsed ``dpinfer sanitize`` arguments."""
    options: dict[str, Any] = {
        "method": args.method, "epsilon": args.epsilon, "group_epsilon": group_epsilon, "delta": args.delta,
        "groups": groups, "max_new_tokens": args.max_new_tokens, "alpha": args.alpha,
        "temperature": args.temperature, "accounting": args.accounting, "adjacency": args.adjacency,
        "allow_untagged": args.allow_untagged, "tag_uncovered": not getattr(args, "spans_only", False),
    }
    if getattr(args, "no_opening", False):
        options["opening_tokens"] = 0
    if args.top_k is not None:
        options["top_k"] = top_k
    if args.no_repeat_ngram is not None:
        options["no_repeat_ngram"] = no_repeat_ngram
    return options


def run_sanitize_corpus(args: argparse.Namespace, options: dict[str, Any]) -> int:
    """``dpinfer sanitize --corpus IN --out OUT``: refusals first, then the records not yet in OUT, appended one by
    one as they finish (:func:`~dpinfer.jobs.corpus.run_corpus_job`); a summary line on standard error (and the
    summary as JSON with ``--json``)."""
    check_corpus_paths(args.corpus, args.out)
    if args.backend == "ray":
        check_ray()
    records = read_corpus(args.corpus, id_field=args.id_field, text_field=args.text_field,
                          spans_field=args.spans_field)
    charge = corpus_charges(args, records, options)
    run = run_corpus_job(records, args.out, lambda todo: _releases(args, list(todo), options, charge),
                         job="dpinfer sanitize --corpus", source=f"--corpus {args.corpus}",
                         allow_rerelease=args.allow_rerelease, progress=_progress("sanitize --corpus"), warn=warn,
                         charge=charge)
    if charge is not None:  # charges a killed run left pending: its released lines committed, its errors dropped
        charge.reconcile([str(id_key(r["id"])) for r in run.held if "error" not in r],
                         [str(id_key(r["id"])) for r in run.held if "error" in r])
    # records whose spans left entity types uncovered, completed by the tagger
    completed = sum(1 for rec in run.new if "error" not in rec
                    and rec.get("settings", {}).get("span_source", {}).get("from") == "given+tagger")
    if completed:
        print(f"dpinfer: sanitize --corpus: {completed} records had spans that left entity types uncovered: the "
              f"{args.tagger} tagger tagged them for those types and its spans were merged in "
              "(settings.span_source of each record says which; --spans-only: use the given spans alone)",
              file=sys.stderr)
    return print_job_summary(args, "sanitize --corpus", run, per_record_budget(run.held),
                             records=len(records))


def warn(line: str) -> None:
    print(f"dpinfer: {line}", file=sys.stderr)


def _progress(label: str) -> Callable[[int], Any]:
    return lambda total: record_progress(label, total)


def add_rerelease_argument(g: Any, *, composes: bool = False) -> None:
    """``--allow-rerelease``, the one flag that lets a resumed corpus job release a record a second time."""
    if composes:
        g.add_argument("--allow-rerelease", action="store_true",
                       help="resume even when a released answer's line was deleted from OUT (refused otherwise: the "
                            "summary composes the answers in OUT, and a deleted one would no longer be counted)")
        return
    g.add_argument("--allow-rerelease", action="store_true",
                   help="resume even when OUT holds ids the input does not have, an input record's text was "
                        "already released to OUT under another id, or a released record's line was deleted from "
                        "OUT (refused otherwise): those texts are released again and their privacy loss adds up")


def print_job_summary(args: argparse.Namespace, label: str, run: Any, budget: str, *, records: int) -> int:
    """The summary line of a corpus job on standard error (and as JSON on standard output with ``--json``)."""
    line = f"{run.head(args.out)}; {budget}"
    print(f"dpinfer: {label}: {line}", file=sys.stderr)
    if args.json:
        print_json({"done": run.done, "skipped": run.skipped, "errors": run.errors, "out": args.out,
                    "records": records, "out_records": run.out_records, "out_errors": run.out_errors,
                    "summary": line})
    return 0


def corpus_charges(args: argparse.Namespace, records: list[Any], options: dict[str, Any]) -> Any:
    """The per-record charge hook of ``sanitize --corpus`` on ``--ledger`` (None without a ledger): each record
    charges its document's unit (a keyed hash of its text, or ``--unit NAME`` for every record) once; a resumed job
    takes over the pending charge its killed run left (:class:`~dpinfer.accounting.charge.RecordCharges`)."""
    import os

    from dpinfer.accounting.charge import RecordCharges, open_ledger
    from dpinfer.accounting.costs import ApproxDp, Cost
    from dpinfer.pipelines.sanitize import estimate_cost
    from dpinfer.taggers.resolve import resolve_groups

    ledger = open_ledger(ledger_path(args))
    if ledger is None:
        if args.unit is not None:
            raise LedgerError("--unit was given without a ledger: give --ledger PATH or DPINFER_LEDGER")
        return None
    texts = {str(id_key(r.id)): r.text for r in records}
    # an upper bound of any record's cost, from the parameters alone: every group a record could have
    every = resolve_groups([Span(0, 1, label) for label in TAB_LABELS], options.get("groups"))
    bound = estimate_cost(SanitizeConfig(**options), every)
    if bound is None:  # a whole-document mechanism, calibrated to its target
        bound = Cost.of(ApproxDp(options.get("epsilon") or SANITIZE.epsilon, options["delta"]))
    return RecordCharges(ledger, job=os.path.abspath(args.out), scope="document", mechanism=options["method"],
                         unit_of=lambda key: args.unit or ledger.unit_for_text(texts[key]),
                         bound_of=lambda key: bound, priced_elsewhere=args.backend == "ray")


def _releases(args: argparse.Namespace, todo: list[Any], options: dict[str, Any],
              charge: Any = None) -> Iterator[dict[str, Any]]:
    """The output records of ``todo``, as they finish, on the chosen backend (``charge``: the ledger's hook, which
    prices each record when it is planned)."""
    tagger = args.tagger
    if args.backend == "ray":  # each actor prices its records on the ledger, under the keys reserved here
        charged = {} if charge is None else {"ledger": charge.ledger.location, "charge_of": lambda r: (
            charge.unit_of(str(id_key(r.id))), charge.ledger.resume_key(charge.job, str(id_key(r.id))))}
        yield from sanitize_corpus_ray(todo, model=args.model, device=args.device, quantize=args.quantize,
                                       tagger=tagger, seed=args.seed, options=options, address=args.ray_address,
                                       batch_size=args.ray_batch_size, actors=args.ray_actors, **charged)
        return
    from dpinfer.pipelines.sanitize_many import needs_tagger, sanitize_many

    # one runtime for the run; the tagger (when a record has no spans) is built first, before the model loads: a
    # tagger that cannot be built stops the run here instead of failing every record
    runtime = Runtime.from_model(args.model, device=args.device, quantize=args.quantize)
    tg = runtime.get_tagger(tagger) if tagger and needs_tagger(todo, options) else None
    for start in range(0, len(todo), CHUNK_RECORDS):
        chunk = todo[start:start + CHUNK_RECORDS]
        planned = None if charge is None else (lambda rid, g: charge.price(str(id_key(rid)), g))
        for outcome in sanitize_many(chunk, runtime=runtime, tagger=tg, seed=args.seed, on_planned=planned, **options):
            yield release_record(outcome)
