"""``dpinfer bench engine | sanitize | synth | serving | quality | tagger``: the built-in benchmarks.

Each prints what it measured, with its baseline, in one run. Their options are checked here before any model loads.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from dpinfer.cli.output import cli_k, print_json, progress_runner
from dpinfer.errors import InvalidInputError


def add_bench_parser(bsub: Any, common: argparse.ArgumentParser) -> None:
    from dpinfer.bench import engine as bench_engine

    be = bsub.add_parser("engine", parents=[common], help="engine tokens/s vs HF generate; --jobs N: the slot engine",
                         description=bench_engine.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_engine.add_arguments(be)
    be.set_defaults(func=run_engine)
    from dpinfer.bench import sanitize as bench_sanitize

    bs = bsub.add_parser("sanitize", parents=[common], help="sanitisation privacy-utility (PPL, ASR, leaks) or --perf",
                         description=bench_sanitize.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_sanitize.add_arguments(bs)
    bs.set_defaults(func=run_sanitize)
    from dpinfer.bench import synth as bench_synth

    bsy = bsub.add_parser("synth", parents=[common], help="synthetic-text MAUVE vs compute (B) at fixed ε, or --perf",
                          description=bench_synth.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_synth.add_arguments(bsy)
    bsy.set_defaults(func=run_synth)
    from dpinfer.bench import serving as bench_serving

    bsv = bsub.add_parser("serving", parents=[common],
                          help="the four serving figures (plain, DP-Fusion one document and corpus, "
                               "InvisibleInk) vs their targets, in one run",
                          description=bench_serving.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_serving.add_arguments(bsv)
    bsv.set_defaults(func=run_serving)
    from dpinfer.bench import quality as bench_quality

    bq = bsub.add_parser("quality", parents=[common],
                         help="each task's DP method beside the same model without privacy (ceiling) and the public "
                              "floor: derailment, PPL, loops, relevance, accuracy, MAUVE, in one table",
                         description=bench_quality.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_quality.add_arguments(bq)
    bq.set_defaults(func=run_quality)
    from dpinfer.bench import tagger as bench_tagger

    bt = bsub.add_parser("tagger", help="tagger precision / recall / F1 against gold spans",
                         description=bench_tagger.DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_tagger.add_arguments(bt)
    bt.set_defaults(func=run_tagger)


BENCH_COUNTS = ("n", "new_tokens", "prompt_tokens", "repeats", "max_chars", "max_new_tokens", "n_texts",
                "n_private", "n_real", "mauve_repeats", "perf_batch_size", "jobs", "max_rows", "corpus", "corpus_docs")
"""Options of any benchmark that must be integers ≥ 1 when present."""


def check_bench_args(args: argparse.Namespace) -> None:
    """The numeric options and the data file of a benchmark, checked before any model loads."""
    from dpinfer.validation import (
        check_delta,
        check_seed,
        check_temperature,
        int_at_least,
        positive_number,
        sniff_text_file,
    )

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
    """``dpinfer bench NAME``: check the options, convert them to the bench's typed config
    (``dpinfer.bench.<name>.config_from_args``), run it (``run(config, progress)``) under a spinner, and print what it
    returns (its ``report``, or ``render`` / ``--json``).

    A bench module without ``config_from_args`` is run the older way, ``main(args, progress=...)``, returning a dict
    with its ``"markdown"`` (and optional ``"plot"`` path)."""
    check_bench_args(args)
    bench = importlib.import_module(f"dpinfer.bench.{name}")
    prog, update = progress_runner(f"bench {name}")
    if hasattr(bench, "config_from_args"):
        config = bench.config_from_args(args)
        with prog:
            res = bench.run(config, progress=update)
        if hasattr(bench, "report"):
            bench.report(config, res)
            return 0
    else:
        with prog:
            res = bench.main(args, progress=update)
    if args.json:
        print_json(res)
    elif hasattr(bench, "render"):
        print(bench.render(res))
    else:
        print(res["markdown"] + (f"\n\nplot: {res['plot']}" if res.get("plot") else ""))
    return 0


def run_engine(args: argparse.Namespace) -> int:
    return run_bench("engine", args)


def run_sanitize(args: argparse.Namespace) -> int:
    return run_bench("sanitize", args)


def run_synth(args: argparse.Namespace) -> int:
    return run_bench("synth", args)


def run_serving(args: argparse.Namespace) -> int:
    return run_bench("serving", args)


def run_quality(args: argparse.Namespace) -> int:
    return run_bench("quality", args)


def run_tagger(args: argparse.Namespace) -> int:
    return run_bench("tagger", args)
