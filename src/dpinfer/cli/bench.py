"""``dpinfer bench NAME``: the built-in benchmarks, one sub-command per entry of the bench manifest.

Each prints what it measured, with its baseline, in one run. Their options are checked here before any model loads.
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

from dpinfer.bench.harness import MANIFEST, entry
from dpinfer.cli.output import cli_k, print_json, progress_runner
from dpinfer.errors import InvalidInputError


def add_bench_command(sub: Any, common: argparse.ArgumentParser) -> None:
    """``dpinfer bench NAME``: one sub-command per entry of :data:`dpinfer.bench.harness.MANIFEST`, with the
    benchmark's own options (:class:`~dpinfer.bench.harness.Bench`)."""
    b = sub.add_parser("bench", help="benchmarks (print what they measured, with their baseline, in one run)")
    bsub = b.add_subparsers(dest="bench", metavar="BENCH", required=True)
    for e in MANIFEST:
        bench = e.load()
        p = bsub.add_parser(e.name, parents=[common] if e.common_options else [], help=e.help,
                            description=bench.DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
        bench.add_arguments(p)
        p.set_defaults(func=functools.partial(run_bench, e.name))


BENCH_COUNTS = ("n", "new_tokens", "prompt_tokens", "repeats", "max_chars", "max_new_tokens", "n_texts",
                "n_private", "n_real", "mauve_repeats", "perf_batch_size", "jobs", "max_rows", "corpus", "corpus_docs")
"""Options of any benchmark that must be integers ≥ 1 when present."""


def check_bench_args(args: argparse.Namespace) -> None:
    """The numeric options and the data file of a benchmark, checked before any model loads."""
    from dpinfer.checks import check_delta, positive_number
    from dpinfer.io import sniff_text_file
    from dpinfer.validation import check_seed, check_temperature, int_at_least

    for name in BENCH_COUNTS:
        value = getattr(args, name, None)
        if value is not None:
            int_at_least(value, "--" + name.replace("_", "-"), 1)
    for k in getattr(args, "k", None) or ():
        int_at_least(k, "--k", 1)
    if getattr(args, "skip", None) is not None:
        int_at_least(args.skip, "--skip", 0)
    check_seed(getattr(args, "seed", None), "--seed")
    if getattr(args, "temperature", None) is not None:
        check_temperature(args.temperature, "--temperature", allow_zero=False)
    cli_k(getattr(args, "top_k", None), "--top-k")
    cli_k(getattr(args, "no_repeat_ngram", None), "--no-repeat-ngram")
    if getattr(args, "epsilon", None) is not None:
        positive_number(args.epsilon, "--epsilon")
    if getattr(args, "delta", None) is not None:
        check_delta(args.delta, "--delta")
    if getattr(args, "data", None):
        sniff_text_file(args.data, "data")
    for name in ("out", "out_dir"):
        folder = getattr(args, name, None)
        if folder:
            from pathlib import Path

            if Path(folder).exists() and not Path(folder).is_dir():
                raise InvalidInputError(f"--{name.replace('_', '-')} {folder} is a file; give a folder")


def run_bench(name: str, args: argparse.Namespace) -> int:
    """``dpinfer bench NAME``: check the options and convert them to the bench's config (``config_from_args``), run
    it (``run(config, progress)``) under a spinner, and print its ``render(results)``, or with ``--json`` the results
    (without their Markdown)."""
    check_bench_args(args)
    bench = entry(name).load()
    config = bench.config_from_args(args)
    prog, update = progress_runner(f"bench {name}")
    with prog:
        res = bench.run(config, progress=update)
    if getattr(args, "json", False) is True or getattr(args, "json", None) == "-":
        print_json({k: v for k, v in res.items() if k != "markdown"})
    else:
        text = bench.render(res)
        print(text, end="" if text.endswith("\n") else "\n")
    return 0
