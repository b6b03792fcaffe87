"""``dpinfer synth FILE``: synthetic texts from a private corpus, with an (ε, δ) guarantee per reference."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dpinfer import models
from dpinfer.checks import int_at_least
from dpinfer.cli.budget import add_ledger_options, ledger_path, report_charge
from dpinfer.cli.output import (
    EXIT_ERROR,
    SEED_HELP,
    LazyHelpFormatter,
    add_method_argument,
    add_model_arguments,
    cli_k,
    console,
    count_progress,
    print_json,
    show,
)
from dpinfer.configs import add_options
from dpinfer.configs.synth import TEMPLATES, PromptTemplate, SynthConfig
from dpinfer.defaults import SYNTH
from dpinfer.errors import ConfigurationError, InvalidInputError
from dpinfer.io import MAX_TEXT_BYTES, check_output_path, input_file
from dpinfer.jobs import ReleaseDigests, check_rerelease
from dpinfer.jobs.synth import SynthesisOutput, partition_path
from dpinfer.methods.synthesize import TABLE, check
from dpinfer.model_files import model_name
from dpinfer.references import load_references

if TYPE_CHECKING:
    from dpinfer.pipelines.synthesize import SynthesisPlan, SynthesisResult, SyntheticText


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    sy = sub.add_parser("synth", parents=[common], help="synthetic texts from a private corpus, (ε, δ) per reference",
                        description="Generate synthetic texts that resemble a private corpus (InvisibleInk by "
                                    "default), one text per disjoint batch of B references. The (ε, δ) guarantee per "
                                    "reference is computed before the corpus is read and written into the output "
                                    "file's first line, with the settings; each text is appended as its batch "
                                    "finishes, and rerunning the same command resumes an interrupted run.",
                        formatter_class=LazyHelpFormatter)
    sy.add_argument("file", help="the private corpus: a .jsonl or .csv file")
    sy.add_argument("--text-field", required=True, help="the field holding each reference's text")
    sy.add_argument("--label-fields", action="append", metavar="F1,F2",
                    help="public label fields shown in the prompts (e.g. label1,label2 for Yelp); references are "
                         "batched within equal labels")
    add_config_options(sy)
    add_method_argument(sy, "synthesize")
    sy.add_argument("--template", default=SYNTH.template, choices=list(TEMPLATES),
                    help=f"built-in prompt pair (default {SYNTH.template}; yelp uses {{label1}} and {{label2}})")
    sy.add_argument("--template-file", default=None,
                    help='JSON {"private": "... {reference} ...", "public": "...", "response_prefix": "..."} '
                         "(the prefix is optional); {field} names a label field")
    sy.add_argument("--limit", type=int, default=None, help="read only the first N records")
    sy.add_argument("--seed", type=int, default=None, help=SEED_HELP)
    add_model_arguments(sy, quantize=False)
    sy.add_argument("--out", required=True, metavar="OUT.jsonl",
                    help="output .jsonl: a first line with the guarantee and the settings, then one line per text, "
                         "appended as its batch finishes; rerunning the same command resumes an interrupted run "
                         "(only the missing batches are generated; other settings or a changed corpus are refused). "
                         "While unfinished, OUT has private sidecars OUT.partition and OUT.digests (never publish "
                         "them; deleted at the end). See docs/corpus.md")
    sy.add_argument("--debug-stats", action="store_true",
                    help="also print the run's diagnostics (timing, each text's data-dependent figures such as "
                         "private tokens or AdaPMixED's realised spend): computed from the references, not covered by "
                         "the guarantee, never written to OUT")
    sy.add_argument("--allow-rerelease", action="store_true",
                    help="resume even when a text line of an unfinished OUT was deleted (refused otherwise: its batch "
                         "would be released a second time, and the privacy loss of its references adds up)")
    add_ledger_options(sy, "the corpus's unit on the ledger (name it, e.g. yelp-2024); required with a ledger. "
                              "The run is charged once, before the model loads; a resumed run is not charged again")
    sy.set_defaults(func=run)


def add_config_options(parser: argparse.ArgumentParser) -> None:
    """One option per :class:`SynthConfig` field declared with ``option(...)`` (its help text, its default; for
    ``--top-k`` and ``--max-reference-tokens`` 0 stands for None: :func:`config_of` maps it back):
    :func:`dpinfer.configs.add_options`."""
    zero = {f.name: 0 for f in dataclasses.fields(SynthConfig) if f.name in ZERO_IS_NONE and f.default is None}
    add_options(parser, SynthConfig, defaults=zero, show=show)


ZERO_IS_NONE = ("top_k", "max_reference_tokens")
"""Fields whose option takes 0 for None (the full vocabulary, no cut)."""


def label_fields(items: Sequence[str] | None) -> list[str]:
    """``--label-fields`` options (repeatable, comma-separated) as one list."""
    fields: list[str] = []
    for item in items or ():
        fields.extend(f.strip() for f in item.split(",") if f.strip())
    return fields


def template_arg(args: argparse.Namespace) -> Any:
    """The prompt template: a built-in name, or a :class:`PromptTemplate` read from ``--template-file``."""
    if not args.template_file:
        return args.template
    p = input_file(args.template_file, "template")
    if p.stat().st_size > MAX_TEXT_BYTES:
        raise InvalidInputError(f"{p} is too large for a template file")
    try:
        data = json.loads(p.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InvalidInputError(f"{p} is not a JSON file") from None
    if not (isinstance(data, dict) and isinstance(data.get("private"), str) and isinstance(data.get("public"), str)):
        raise ConfigurationError(f'{p} must hold {{"private": "... {{reference}} ...", "public": "..."}}')
    prefix = data.get("response_prefix", "")
    if not isinstance(prefix, str):
        raise ConfigurationError(f"{p}: response_prefix must be a string")
    return PromptTemplate(private=data["private"], public=data["public"], response_prefix=prefix)


def config_of(args: argparse.Namespace) -> SynthConfig:
    """The run's :class:`SynthConfig` from the options (messages name the options; ``--top-k 0`` and
    ``--max-reference-tokens 0`` mean None), with the checks that depend on the method."""
    config = SynthConfig(method=args.method, epsilon=args.epsilon, delta=args.delta, batch_size=args.batch_size,
                         max_new_tokens=args.max_new_tokens, top_k=cli_k(args.top_k, "--top-k"),
                         temperature=args.temperature, prompt_template=args.template, seed=args.seed,
                         max_texts=args.max_texts,
                         max_reference_tokens=cli_k(args.max_reference_tokens, "--max-reference-tokens"),
                         spelling="cli")
    check(config)
    return config


def run(args: argparse.Namespace) -> int:
    """Every check and refusal (parameters, paths, the corpus, an ``--out`` that is not this run's) before the model
    loads; then the batches not yet in ``--out``, each text appended as its batch finishes (docs/corpus.md)."""
    # every parameter and path is checked here, before the corpus is read and before torch or the model loads
    config = config_of(args)
    if args.limit is not None:
        int_at_least(args.limit, "--limit", 1)
    if str(args.out).strip() == "-":
        raise ConfigurationError("--out must be a file (texts are appended to it and read back to resume); standard "
                                 "output cannot be resumed")
    inputs = (args.file, args.template_file)
    check_output_path(args.out, inputs=inputs)
    check_output_path(partition_path(args.out), inputs=inputs, option="--out's partition file")
    check_output_path(ReleaseDigests.of(args.out).path, inputs=inputs, option="--out's digest file")
    config = config.replace(prompt_template=template_arg(args))
    fields = label_fields(args.label_fields)
    refs = load_references(args.file, text_field=args.text_field, label_fields=fields, limit=args.limit)
    from dpinfer.pipelines.synthesize import plan_synthesis  # imports torch: after the checks of every path

    plan = plan_synthesis(refs, config)  # the corpus's size, the template's fields, the calibration: no model yet
    header = plan.header(model_name(args.model),
                         {"text_field": args.text_field, "label_fields": fields, "limit": args.limit})
    return _run_job(args, plan, header, SynthesisOutput(args.out))


def _run_job(args: argparse.Namespace, plan: SynthesisPlan, header: dict[str, Any], out: SynthesisOutput) -> int:
    """The batches not yet in ``--out``, through the corpus jobs' loop (:func:`~dpinfer.jobs.run_resumable`:
    the lock, the read-back, the torn-line rule, one durable line per text); the checks of ``OUT`` come before the
    model loads."""
    import time

    from dpinfer.accounting.charge import reserve
    from dpinfer.jobs.synth import run_synthesis_job
    from dpinfer.pipelines.synthesize import SynthesisResult, synthesize_iter

    digest = plan.partition_sha256()
    total = len(plan.batches)
    new: list[SyntheticText] = []
    lm_name: list[str] = []
    released = ReleaseDigests.of(args.out)  # the batches released so far: a deleted text line is not released again

    def check(todo: list[int]) -> None:
        out.check(header, digest)  # other settings, a changed corpus, a missing partition file: refused
        released.load()
        note = check_rerelease({str(b): rec for b, rec in out.done.items()}, [(str(b), "") for b in range(total)],
                               [str(b) for b in todo], released, out=args.out, source=args.file,
                               allow=args.allow_rerelease, composes=True)
        if note is not None:
            print(f"dpinfer: {note}", file=sys.stderr)

    held: list[Any] = []

    def hold(resumed: bool) -> Any:
        """Charged once per run, from the plan's guarantee, before the model loads; a resumed run (texts already in
        --out) was charged by the run it resumes."""
        if not resumed:
            held.append(reserve(ledger_path(args), args.unit, plan.guarantee, scope="corpus", what="synth"))
        return held[0] if held else None

    def texts(skip: set[int]) -> Any:
        lm = models.load_model(args.model, device=args.device)  # after the charge, before the header is written
        lm_name.append(lm.name)
        return _texts(lm, skip)

    def _texts(lm: Any, skip: set[int]) -> Any:
        with count_progress(f"synthesizing ({args.method})", "batches") as progress:
            for text in synthesize_iter(plan, lm=lm, skip_batches=skip, progress=progress,
                                        debug_stats=args.debug_stats):
                new.append(text)
                yield text

    t0 = time.perf_counter()
    try:
        run = run_synthesis_job(out, total, header, digest, texts, job="dpinfer synth", hold=hold,
                                record=lambda text: text.to_dict(), check=check,
                                on_release=lambda b, _: released.add(str(b), ""))
    except OSError as exc:  # the texts before it are complete and durable in --out: say so, stop
        if not lm_name:
            raise
        print(f"dpinfer: error: could not append to --out {args.out} ({exc.strerror or type(exc).__name__}); "
              f"{len(out.done)} of {total} texts are safely in it ({max(len(new) - 1, 0)} from this run); free the "
              "space (or fix the cause) and rerun the same command to resume", file=sys.stderr)
        return EXIT_ERROR
    finally:
        if held:
            report_charge(held[0])
    seconds = time.perf_counter() - t0
    if len(out.done) == total:
        out.finish()  # every batch is released: the private partition file goes (and the list of batches released)
        released.path.unlink(missing_ok=True)
    if not run.new:
        return _print_done(args, header, out, torn=run.torn)
    res = SynthesisResult(texts=sorted(new, key=lambda t: t.batch), guarantee=plan.guarantee, method=plan.method,
                          settings=plan.settings_for(lm_name[0]), references_used=plan.references_used,
                          references_left_out=plan.references_left_out, seconds=seconds,
                          lm_calls_per_token=plan.lm_calls_per_token)
    return _report(args, res, header, out, run, generated=len(new))


def _report(args: argparse.Namespace, res: SynthesisResult, header: dict[str, Any], out: SynthesisOutput, run: Any, *,
            generated: int) -> int:
    """This run's summary (``--json``: one object) and, under ``--debug-stats``, its diagnostics."""
    if args.json:
        summary = {**header["dpinfer"], "texts": len(out.done), "generated": generated, "skipped": run.skipped,
                   "generated_tokens": res.generated_tokens, "truncated_bytes": run.truncated_bytes, "torn": run.torn,
                   "out": args.out}
        print_json({**summary, "diagnostics": res.diagnostics()} if args.debug_stats else summary)
        return 0
    print_summary(args, res, skipped=run.skipped, truncated_bytes=run.truncated_bytes, torn=run.torn)
    if args.debug_stats:
        print_json({"diagnostics": res.diagnostics()})
    return 0


def _print_done(args: argparse.Namespace, header: dict[str, Any], out: SynthesisOutput, *, torn: int = 0) -> int:
    """A rerun of a finished ``--out``: nothing generated, no model loaded."""
    total = len(out.done)
    if args.json:
        print_json({**header["dpinfer"], "texts": total, "generated": 0, "skipped": total,
                    "truncated_bytes": out.truncated_bytes, "torn": torn, "out": args.out})
        return 0
    console().print(f"All {total} batches are done in {args.out}; nothing to generate.")
    if torn:
        console().print(_TORN_NOTE)
    return 0


_TORN_NOTE = ("[dim]a torn last line from an interrupted run held part of a text: it is kept as released (an error "
              "record saying it was torn) and its batch is not generated again[/dim]")


def print_summary(args: argparse.Namespace, res: SynthesisResult, *, skipped: int = 0, truncated_bytes: int = 0,
                  torn: int = 0) -> None:
    """What was written (``skipped``: texts an earlier run had written), and the guarantee in words (from the method's
    table entry: its kind of guarantee). No timing: that is a diagnostic (``--debug-stats``)."""
    con = console()
    kind = TABLE.get(args.method).guarantee
    con.print(f"{len(res.texts)} synthetic texts ({res.generated_tokens} tokens, {res.lm_calls_per_token} LM calls "
              f"per token) written to {args.out}")
    if skipped:
        con.print(f"{skipped} texts from an earlier run were already there: {skipped + len(res.texts)} in all")
    if truncated_bytes:
        con.print(f"[dim]a torn last line of {truncated_bytes} bytes from an interrupted run was cut off[/dim]")
    if torn:
        con.print(_TORN_NOTE)
    if res.references_left_out and kind != "zero":
        con.print(f"[dim]{res.references_left_out} references were left out (label groups not filling a batch of "
                  f"{args.batch_size}, or --max-texts)[/dim]")
    if kind == "zero":
        con.print("Guarantee: the texts were generated from the public prompt only; they reveal nothing about the "
                  "references (ε = 0).")
    elif kind == "data-dependent":
        con.print(f"Guarantee: none ex ante. The privacy loss of {args.method} depends on the references; its "
                  "realised (data-dependent) figure is a diagnostic (--debug-stats), not a differential-privacy "
                  "guarantee.")
    elif kind == "none":
        con.print(f"Guarantee: none. {args.method} states no differential-privacy guarantee.")
    else:
        con.print(f"Guarantee: {res.guarantee}")
        con.print("It holds for every reference at once: the batches are disjoint and chosen without reading the "
                  "texts, so the file as a whole has the guarantee of one text.")
