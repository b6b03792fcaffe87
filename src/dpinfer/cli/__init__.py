"""The ``dpinfer`` command line.

Every error is printed as one line (``dpinfer: error: ...``) with exit status 2; no traceback (set
``DPINFER_DEBUG=1`` to see one for an unexpected error, whose message is withheld because it may quote the input).
Parameters and paths are checked before any model loads. ``--json`` (before or after the sub-command) prints one
JSON object on standard output instead of text.

One module per command (``dpinfer.cli.generate``, ``.sanitize``, ``.synth``, ``.models``, ``.audit``, ``.bench``);
what they share (consoles, JSON, reading FILE arguments, progress) is in :mod:`dpinfer.cli.output`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from dpinfer import __version__
from dpinfer.cli.bench import add_bench_command
from dpinfer.cli.output import EXIT_ERROR, Parser, read_text_arg
from dpinfer.errors import DPInferError
from dpinfer.models import defer_collection_until_loaded, resume_collection

BUILTIN_COMMAND_MODULES: tuple[str, ...] = (
    "dpinfer.cli.generate",
    "dpinfer.cli.sanitize",
    "dpinfer.cli.synth",
    "dpinfer.cli.models",
    "dpinfer.cli.audit",
    "dpinfer.cli.bench",
)
"""The built-in commands, in ``--help`` order, on the protocol of :data:`COMMAND_MODULES` (``add_parser`` is
optional: ``dpinfer bench`` is added last, from the bench manifest, by :func:`dpinfer.cli.bench.add_bench_command`)."""


COMMAND_MODULES: tuple[str, ...] = ("dpinfer.cli.rag", "dpinfer.cli.protect_prompt", "dpinfer.cli.calibrate_clip",
                                    "dpinfer.cli.serve", "dpinfer.cli.budget")
"""Command modules, one per command (``dpinfer.cli.<name>``). Each defines ``add_parser(sub, common)``, which adds its
subcommand to ``sub`` (parents ``[common]`` for ``--json``) with ``set_defaults(func=run)``, where ``run(args) -> int``
returns the exit status (benchmarks are entries of :data:`dpinfer.bench.harness.MANIFEST`, not commands). A
command module imports torch, models and pipelines lazily inside ``run`` (parameter errors come in under a second)."""


def build_parser() -> argparse.ArgumentParser:
    common = Parser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print one JSON object instead of text")
    parser = Parser(
        prog="dpinfer", parents=[common],
        description="Differentially private inference with LLMs, offline. Every private output carries an "
                    "(ε, δ) guarantee computed before the private data is read.",
    )
    parser.add_argument("--version", action="version", version=f"dpinfer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    modules = [importlib.import_module(name) for name in BUILTIN_COMMAND_MODULES + COMMAND_MODULES]
    for module in modules:
        if hasattr(module, "add_parser"):
            module.add_parser(sub, common)
    add_bench_command(sub, common)  # one sub-command per entry of the bench manifest
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "json"):
        args.json = False
    if getattr(args, "model_backend", None):
        os.environ["DPINFER_BACKEND"] = args.model_backend  # read by load_model (and by the processes it starts)
    if argv is None and "model" in vars(args):  # a process of its own that loads a model: collect after the load
        defer_collection_until_loaded()
    try:
        return int(args.func(args) or 0)
    except DPInferError as exc:
        print(f"dpinfer: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("dpinfer: interrupted", file=sys.stderr)
        return 130
    except MemoryError:
        print("dpinfer: error: out of memory; lower max-new-tokens or the number of contexts", file=sys.stderr)
        return EXIT_ERROR
    except OSError as exc:  # the file system said no: its reason and the path, never file content
        where = f" ({exc.filename})" if exc.filename else ""
        reason = exc.strerror or f"could not read or write a file ({type(exc).__name__}); check the paths given"
        print(f"dpinfer: error: {reason}{where}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:
        if os.environ.get("DPINFER_DEBUG"):
            raise
        print(f"dpinfer: error: unexpected {type(exc).__name__} (message withheld: it may quote the input); rerun "
              "with DPINFER_DEBUG=1 for the traceback", file=sys.stderr)
        return EXIT_ERROR
    finally:
        resume_collection()  # a command that ended before its model loaded


__all__ = ["BUILTIN_COMMAND_MODULES", "COMMAND_MODULES", "EXIT_ERROR", "build_parser", "main", "read_text_arg"]

if __name__ == "__main__":
    sys.exit(main())
