"""``dpinfer sanitize FILE``: rewrite a document with a per-group (ε, δ) guarantee."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

from dpinfer.cli.output import (
    SEED_HELP,
    LazyHelpFormatter,
    add_method_argument,
    add_model_arguments,
    cli_k,
    console,
    print_json,
    read_text_arg,
    show,
    write_failure,
)
from dpinfer.configs import add_options
from dpinfer.configs.sanitize import SanitizeConfig
from dpinfer.defaults import SANITIZE
from dpinfer.errors import InvalidInputError

LABEL_STYLES = {"PERSON": "bold red", "CODE": "bold magenta", "LOC": "bold green", "ORG": "bold blue",
                "DEM": "bold yellow", "DATETIME": "bold cyan", "QUANTITY": "bold white", "MISC": "bold bright_black"}


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    sz = sub.add_parser("sanitize", parents=[common], help="rewrite a document with a per-group (ε, δ) guarantee",
                        description="Rewrite a sensitive document with DP-Fusion (or a baseline). Private spans are "
                                    "found by a local tagger (or given with --spans); each entity type is a privacy "
                                    "group with its own ε. The guarantee is computed before the document is read. "
                                    "Not protected: the existence, position and token length of each span, and "
                                    "anything the tagger missed.",
                        epilog=f"Choosing ε: the default ε = {show(SANITIZE.epsilon)} per group means the rewrite "
                               "changes the odds of any conclusion about one group's span contents by at most "
                               f"e^{show(SANITIZE.epsilon)} (≈ {show(float(f'{math.exp(SANITIZE.epsilon):.0e}'))}), "
                               "except with "
                               "probability δ: a weak worst-case bound. It is still useful: it is per group, covers "
                               "the spans' contents only, about 10 of it is the fixed cost of converting the Rényi "
                               "bound at α = 2, and measured attacks stay near chance (LOSS attack 0.24 at ε = 40, "
                               "0.22 at ε = 12, chance 0.20; docs/sanitize.md). Lower ε (> 10.13 at α = 2; with "
                               "--alpha 8 down to ≈ 1.22) protects more and reads worse; --group-epsilon tightens "
                               "the groups that matter most.",
                        formatter_class=LazyHelpFormatter)
    sz.add_argument("file", nargs="?", default=None,
                    help="the document (UTF-8 text), or '-' for standard input (or --corpus IN.jsonl)")
    sz.add_argument("--group-epsilon", action="append", metavar="NAME=E",
                    help="ε for one group or label, e.g. --group-epsilon PERSON=10 (repeatable)")
    sz.add_argument("--group", action="append", metavar="NAME=L1,L2",
                    help="merge labels into one group, e.g. --group ID=PERSON,CODE (repeatable)")
    sz.add_argument("--spans", default=None, help="JSON spans file (list of {start, end, label} or TAB "
                                                  "entity_mentions) for THIS document (its text/span_text must "
                                                  "match); overlapping spans are merged. Entity types the file "
                                                  "leaves uncovered are tagged by --tagger and merged in (said on "
                                                  "standard error and in the release), unless --spans-only")
    sz.add_argument("--spans-only", action="store_true",
                    help="use the given spans (--spans, or --spans-field with --corpus) alone: no tagging of the "
                         "entity types they leave uncovered")
    sz.add_argument("--explain", action="store_true",
                    help="print what the guarantee means in full under its one-sentence summary")
    sz.add_argument("--tagger", default=SANITIZE.tagger, help=f"presidio | regex (default {SANITIZE.tagger})")
    add_method_argument(sz, "sanitize")
    add_config_options(sz)
    sz.add_argument("--no-opening", action="store_true",
                    help="do not start the rewrite with the document's first untagged words (by default up to "
                         f"{SANITIZE.opening_tokens} tokens before the first tagged span are copied as they are: "
                         "public under the adjacency, but a name the tagger missed there is released)")
    sz.add_argument("--debug-stats", action="store_true",
                    help="add the DATA-DEPENDENT per-step λ/divergences, spans and timing to --json (they reveal the "
                         "private content: never release them)")
    sz.add_argument("--seed", type=int, default=None, help=SEED_HELP)
    add_model_arguments(sz)
    sz.add_argument("--out", default=None, help="also write the rewrite to this file (checked before the model "
                                                "loads; written atomically; never the input file); with --corpus: "
                                                "the JSONL file of releases, one per id, appended and resumable")
    sz.add_argument("--show-input", action="store_true",
                    help="also show the document with its private spans highlighted (terminal only: never printed "
                         "into a pipe or a file)")
    from dpinfer.cli.budget import add_ledger_options
    from dpinfer.cli.corpus_job import add_corpus_arguments

    add_ledger_options(sz, "the document's unit on the ledger (default: a keyed hash of its text, HMAC under the "
                           "ledger's secret; with --corpus, of each record's text), or NAME")

    add_corpus_arguments(sz)
    sz.set_defaults(func=run)


CLI_UNSET = ("epsilon", "temperature", "top_k", "no_repeat_ngram")
"""Config fields whose option defaults to None on the command line (absent: the config's default; 0 = None for
``--top-k`` and ``--no-repeat-ngram``: :func:`config_of`)."""


def add_config_options(parser: argparse.ArgumentParser) -> None:
    """One option per :class:`~dpinfer.configs.sanitize.SanitizeConfig` field declared with a help text (its help,
    its default shown, its choices): :func:`dpinfer.configs.add_options`."""
    add_options(parser, SanitizeConfig, defaults=dict.fromkeys(CLI_UNSET), show=show, store_true=True)


def parse_group_epsilon(items: Sequence[str] | None) -> dict[str, float] | None:
    """``--group-epsilon NAME=E`` options as a mapping (None when none is given)."""
    if not items:
        return None
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise InvalidInputError(f"--group-epsilon expects NAME=EPSILON (e.g. PERSON=2), got {item!r}")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise InvalidInputError(f"--group-epsilon {name}: {value!r} is not a number") from None
    return out


def parse_groups(items: Sequence[str] | None) -> dict[str, list[str]] | None:
    """``--group NAME=L1,L2`` options as a mapping (None when none is given)."""
    if not items:
        return None
    out: dict[str, list[str]] = {}
    for item in items:
        name, sep, labels = item.partition("=")
        if not sep or not name or not labels:
            raise InvalidInputError(f"--group expects NAME=LABEL[,LABEL...] (e.g. ID=PERSON,CODE), got {item!r}")
        out[name.strip()] = [lab.strip() for lab in labels.split(",") if lab.strip()]
    return out


def _check_max_input_tokens(args: argparse.Namespace) -> None:
    """``--max-input-tokens``: for the methods whose neighbour is any other document only."""
    from dpinfer.errors import ConfigurationError
    from dpinfer.methods.sanitize import TABLE

    if args.max_input_tokens is not None and TABLE.get(args.method).protects != "document":
        whole = ", ".join(m.name for m in TABLE if m.protects == "document")
        raise ConfigurationError(f"--max-input-tokens applies to the whole-document methods ({whole}); "
                                 f"{args.method}'s T_max follows the document, whose length is public under its "
                                 "adjacency")


def config_of(args: argparse.Namespace) -> SanitizeConfig:
    """The checked :class:`~dpinfer.configs.sanitize.SanitizeConfig` of parsed ``dpinfer sanitize`` arguments
    (messages name the options); options not given keep the config's defaults."""
    from dpinfer.validation import check_sanitize_params

    options: dict[str, Any] = {
        "method": args.method, "epsilon": args.epsilon, "group_epsilon": parse_group_epsilon(args.group_epsilon),
        "delta": args.delta, "groups": parse_groups(args.group), "max_new_tokens": args.max_new_tokens,
        "alpha": args.alpha, "temperature": args.temperature, "seed": args.seed, "accounting": args.accounting,
        "adjacency": args.adjacency, "max_input_tokens": args.max_input_tokens,
        "allow_untagged": args.allow_untagged, "debug": args.debug_stats, "tag_uncovered": not args.spans_only,
    }
    if args.no_opening:
        options["opening_tokens"] = 0
    if args.top_k is not None:
        options["top_k"] = cli_k(args.top_k, "--top-k")
    if args.no_repeat_ngram is not None:
        options["no_repeat_ngram"] = cli_k(args.no_repeat_ngram, "--no-repeat-ngram")
    return check_sanitize_params(tagger=args.tagger, spelling="cli", **options)


def run(args: argparse.Namespace) -> int:
    from dpinfer.cli.corpus_job import check_corpus_args
    from dpinfer.io import atomic_write_text, check_output_path
    from dpinfer.validation import check_sanitize_budget

    # every parameter and path is checked here, before the document is tagged and before the model loads
    check_corpus_args(args)
    if args.corpus is None and args.file is None:
        raise InvalidInputError("give the document FILE ('-' for standard input), or --corpus IN.jsonl --out OUT.jsonl")
    cfg = config_of(args)
    _check_max_input_tokens(args)
    check_sanitize_budget(cfg)
    if args.corpus is not None:
        from dpinfer.cli.corpus_job import run_sanitize_corpus, sanitize_options

        options = sanitize_options(args, group_epsilon=cfg.group_epsilon, groups=cfg.groups, top_k=cfg.top_k,
                                   no_repeat_ngram=cfg.no_repeat_ngram)
        if args.max_input_tokens is not None:
            options["max_input_tokens"] = args.max_input_tokens
        return run_sanitize_corpus(args, options)
    if args.out:
        check_output_path(args.out, inputs=(args.file, args.spans))
    text = read_text_arg(args.file, "document")
    if args.spans:
        read_text_arg(args.spans, "spans")  # a missing, empty, binary or oversized file is refused here
    from dpinfer.cli.output import count_progress
    from dpinfer.models import load_model
    from dpinfer.pipelines.sanitize import estimate_cost, sanitize
    from dpinfer.pipelines.sanitize_plan import resolve_span_source
    from dpinfer.taggers.resolve import resolve_groups

    # the spans, checked against THIS document (or tagged), and the refusal of zero spans: before the model loads
    spans = resolve_span_source(text, spans=args.spans, tagger=None if args.spans_only else args.tagger,
                                method=cfg.method, allow_untagged=cfg.allow_untagged,
                                tag_uncovered=cfg.tag_uncovered)
    if spans.note():
        print(f"dpinfer: {spans.note()}", file=sys.stderr)
    from dpinfer.accounting.charge import hold
    from dpinfer.cli.budget import cli_charge

    with cli_charge(args, scope="document", default_unit=lambda book: book.unit_for_text(text)) as spend:
        # the cost from the parameters and groups alone: refused before the model loads
        hold(spend, estimate_cost(cfg, resolve_groups(spans.spans, cfg.groups)), mechanism=cfg.method)
        lm = load_model(args.model, device=args.device, quantize=args.quantize)
        with count_progress("sanitizing", "tokens") as progress:
            res = sanitize(text, cfg.replace(tagger=None), lm=lm, spans=spans, progress=progress, ledger=spend)
    err = console(stderr=True)
    write_error: OSError | None = None
    if args.out:
        try:
            atomic_write_text(args.out, res.text + "\n")
        except OSError as exc:  # the release is still printed below: never lose a finished result
            write_error = exc
    if args.json:  # the release as it is; with --debug-stats, the diagnostics beside it
        print_json({**res.release(), "debug": res.diagnostics()} if args.debug_stats else res.release())
    else:
        print_release(args, text, res, err)
        if args.debug_stats:
            print(json.dumps(res.diagnostics(), ensure_ascii=False), file=sys.stderr)
    from dpinfer.cli.budget import report_charge

    report_charge(spend)
    if write_error is not None:
        return write_failure("--out", args.out, write_error, "the rewrite is on standard output")
    if args.out:
        err.print(f"[dim]rewrite written to {args.out}[/dim]", markup=True, highlight=False)
    return 0


def print_release(args: argparse.Namespace, text: str, res: Any, err: Any) -> None:
    """Standard output: the release, then the guarantee. Notes go to standard error. The private document is shown
    only with --show-input and only on a terminal (never into a pipe or a file)."""
    from rich.panel import Panel
    from rich.text import Text

    con = console()
    counts: dict[str, int] = {}
    for s in res.spans:
        counts[s.label] = counts.get(s.label, 0) + 1
    spans_from = res.settings.get("span_source", {})
    source = {"given": "spans file", "given+tagger": f"spans file + {spans_from.get('tagger')} tagger"}.get(
        spans_from.get("from"), f"{args.tagger} tagger")
    if args.show_input:
        if con.is_terminal:
            shown = Text(text)
            for s in res.spans:
                shown.stylize(LABEL_STYLES.get(s.label, "bold"), s.start, s.end)
            legend = ", ".join(f"[{LABEL_STYLES.get(k, 'bold')}]{k}[/] {v}" for k, v in counts.items()) or "none"
            con.print(Panel(shown, title=f"input: {len(res.spans)} private spans ({source})", subtitle=legend))
        else:
            err.print("[dim]--show-input ignored: standard output is not a terminal (the private document is never "
                      "written to a pipe or a file)[/dim]")
    per_label = ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"
    err.print(f"[dim]{len(res.spans)} private spans ({source}: {per_label}); {res.method}, {res.generated_tokens} "
              f"tokens, {res.tokens_per_second:.1f} tokens/s[/dim]", highlight=False)
    statement = guarantee_statement(res, explain=args.explain)
    if con.is_terminal:
        con.print(Panel(Text(res.text), title=f"rewrite ({res.method})"))
        con.print(Text(statement))
    else:
        sys.stdout.write(res.text + "\n\n" + statement + "\n")


def guarantee_sentence(res: Any) -> str:
    """The one-sentence guarantee printed under the rewrite (:mod:`dpinfer.accounting.sanitize_text`)."""
    from dpinfer.accounting import sanitize_text

    return sanitize_text.guarantee_sentence(res)


def guarantee_statement(res: Any, *, explain: bool = False) -> str:
    """What is printed under the rewrite: the sentence, its caveats and, with ``explain``, the details."""
    from dpinfer.accounting import sanitize_text

    return sanitize_text.guarantee_statement(res, explain=explain)
