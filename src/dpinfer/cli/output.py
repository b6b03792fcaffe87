"""What every command shares: consoles, ``--json`` output, printing a result's release, reading a FILE argument,
progress displays.

A result is printed through :func:`release_json`: its ``release()`` as it is (public by construction,
:mod:`dpinfer.release`), and its ``diagnostics()`` only under ``--debug-stats``, under their warning. No command
deletes keys from a release or patches its strings.

Light on import (no torch, no rich until used): the parser is built on every call.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from dpinfer._json import plain
from dpinfer.errors import InvalidInputError
from dpinfer.io import MAX_TEXT_BYTES, decode_text, input_file
from dpinfer.methods import DEFAULT_METHODS, methods_help, task_name
from dpinfer.release import DIAGNOSTICS_WARNING, Release, check_release, diagnostics_of, release_of

EXIT_ERROR = 2
"""Exit status of every refusal and error (argparse's usage errors use it too)."""


PIPE_WIDTH = 10_000
"""The width of a console that is not a terminal: wide enough that nothing is wrapped or cut for a log or a script."""


def console(stderr: bool = False) -> Any:
    """A rich console on standard output (or error), without syntax highlighting. Into a pipe or a file it neither
    wraps nor truncates (``soft_wrap``, width :data:`PIPE_WIDTH`, no colour codes): one line stays one line."""
    from rich.console import Console

    con = Console(stderr=stderr, highlight=False)
    if not con.is_terminal:
        con = Console(stderr=stderr, highlight=False, soft_wrap=True, width=PIPE_WIDTH, no_color=True)
    return con


def print_json(obj: Any) -> None:
    """``obj`` as one indented JSON object on standard output (a result is printed as its ``release()``; other
    objects with ``to_dict`` are converted)."""

    def default(o: Any) -> Any:
        if isinstance(o, Release):
            return plain(o.release())
        return plain(o.to_dict()) if hasattr(o, "to_dict") else str(o)

    sys.stdout.write(json.dumps(plain(obj), indent=2, ensure_ascii=False, default=default) + "\n")


def release_json(result: Any, *, debug_stats: bool = False, allow: frozenset[str] = frozenset()) -> dict[str, Any]:
    """What a command prints for ``result``: its ``release()`` (checked: a forbidden key is a bug and refused, see
    :func:`dpinfer.release.check_release`; ``allow``: a task's public keys that share a forbidden name), plus its
    ``diagnostics()`` under ``"diagnostics"`` with ``debug_stats`` only (and a warning on standard error)."""
    out = check_release(release_of(result), allow=allow)
    if debug_stats:
        diagnostics = diagnostics_of(result)
        if diagnostics:
            print(f"dpinfer: warning: {DIAGNOSTICS_WARNING}", file=sys.stderr)
            out["diagnostics"] = diagnostics
    return out


def print_release(result: Any, *, debug_stats: bool = False, allow: frozenset[str] = frozenset()) -> None:
    """:func:`release_json` of ``result`` as one indented JSON object on standard output."""
    print_json(release_json(result, debug_stats=debug_stats, allow=allow))


DEBUG_STATS_HELP = ("also print the result's diagnostics (timings, lengths, per-step statistics): data-dependent, "
                    "computed from the private input, not covered by the guarantee; never publish them")


def add_debug_stats_argument(p: Any, help: str = DEBUG_STATS_HELP) -> None:
    """``--debug-stats``: print ``diagnostics()`` next to the release (:func:`release_json`)."""
    p.add_argument("--debug-stats", action="store_true", help=help)


def read_text_arg(source: str, what: str = "input") -> str:
    """Text of a FILE argument, or standard input for ``-``; refuses a missing file, a folder, an empty, binary,
    non-UTF-8 or oversized (> 4 MiB) input with a one-line message (sizes and offsets only, never the content)."""
    limit_mib = MAX_TEXT_BYTES // (1024 * 1024)
    if source == "-":
        data = sys.stdin.buffer.read(MAX_TEXT_BYTES + 1)
        where = "standard input"
    else:
        p = input_file(source, what)
        if p.stat().st_size > MAX_TEXT_BYTES:
            raise InvalidInputError(f"{source} is larger than {limit_mib} MiB; split it into parts")
        data = p.read_bytes()
        where = source
    return decode_text(data, where)


def cli_k(value: int | None, option: str) -> int | None:
    """A CLI count where 0 means "off / None": refuses negatives, maps 0 to None.

    >>> cli_k(0, "--top-k") is None, cli_k(5, "--top-k")
    (True, 5)
    """
    if value is not None and value < 0:
        raise InvalidInputError(f"{option} must be ≥ 0 (0 = off), got {value}")
    return None if value == 0 else value


def write_failure(option: str, path: str, exc: OSError, where: str) -> int:
    """Say on one line that writing ``path`` failed and ``where`` the result went instead; the exit status."""
    print(f"dpinfer: error: could not write {option} {path} ({exc.strerror or type(exc).__name__}); {where}",
          file=sys.stderr)
    return EXIT_ERROR


def progress_bar(label: str, unit: str, *fields: str) -> Any:
    """A transient rich progress bar on standard error (``label``, done/total ``unit``, a column for each task field
    named in ``fields``, time elapsed and the ETA), disabled when standard error is not a terminal."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    err = console(stderr=True)
    return Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn(unit),
                    *(TextColumn(f"{{task.fields[{name}]}}") for name in fields), TimeElapsedColumn(),
                    TextColumn("ETA"), TimeRemainingColumn(), console=err, transient=True,
                    disable=not err.is_terminal)


@contextmanager
def count_progress(label: str, unit: str, total: int | None = None) -> Iterator[Callable[[int, int], None]]:
    """A transient progress bar on a terminal's standard error (``label``, done/total ``unit``, time elapsed and an
    estimate of the time left: an upper bound when the text may stop early); yields ``update(done, total)``. The
    total is the public maximum (e.g. T_max), known before the first step: callers report ``update(0, total)`` first.
    Nothing is drawn into a pipe."""
    with progress_bar(label, unit) as prog:
        task = prog.add_task(label, total=total, visible=total is not None)  # never drawn as "0/?"

        def update(done: int, total: int) -> None:
            prog.update(task, completed=done, total=total, visible=True)

        yield update


def progress_runner(label: str) -> tuple[Any, Callable[[str], None]]:
    """A transient spinner (a context manager) on a terminal's standard error and ``update(what)`` to describe the
    current stage (benchmarks). When standard error is not a terminal (a log file), each stage is one line with the
    seconds since the start instead, so a log of a run that was stopped still shows how far it got and when."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    err = console(stderr=True)
    prog = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err,
                    transient=True, disable=not err.is_terminal)
    task = prog.add_task(label)
    start = time.perf_counter()

    def update(what: str) -> None:
        prog.update(task, description=f"{label}: {what}")
        if not err.is_terminal:
            print(f"{label}: {what} ({time.perf_counter() - start:.1f} s)", file=sys.stderr, flush=True)

    return prog, update


QUANTIZE_HELP = ("int8: CPU only; decode steps use dynamic int8 Linear layers (prompt processing stays float32): "
                 "faster decoding, slightly different sampling distribution (default: off)")


BACKEND_HELP = ("model code: auto (dpinfer's own for Llama, Qwen2 and Mistral folders, transformers for the others), "
                "own, or hf (transformers' forward); sets DPINFER_BACKEND (default: auto)")


def add_backend_argument(p: Any) -> None:
    """``--model-backend auto|own|hf``: read by :func:`dpinfer.models.load_model` through ``$DPINFER_BACKEND``
    (:func:`dpinfer.cli.main` sets it; ``--backend`` is the corpus runner's ``local|ray`` on ``sanitize``)."""
    p.add_argument("--model-backend", default=None, choices=["auto", "own", "hf"], help=BACKEND_HELP)


def add_model_arguments(p: Any, *, quantize: bool = True, device_help: str | None = None) -> None:
    """``--model``, ``--device``, ``--backend`` and (optionally) ``--quantize``."""
    p.add_argument("--model", default=None, help="model name or local folder (default: embedded SmolLM2-135M)")
    p.add_argument("--device", default=None, help=device_help)
    add_backend_argument(p)
    if quantize:
        p.add_argument("--quantize", default=None, choices=["int8"], help=QUANTIZE_HELP)


SEED_HELP = ("for tests and benchmarks only: the guarantee then holds only while the seed is secret "
             "(default: noise from the OS's secure generator)")


class Parser(argparse.ArgumentParser):
    """dpinfer's argument parser: a sub-command refuses what it does not know itself, with its own usage line and
    the closest option it has ("did you mean --epsilon?"), instead of leaving it to the top-level parser's usage.
    Sub-command parsers inherit the class (``add_subparsers`` uses the parent's)."""

    def _get_formatter(self) -> argparse.HelpFormatter:
        """Help and usage into a pipe or a file are not wrapped (one line per option), as every other output."""
        if sys.stdout.isatty() and sys.stderr.isatty():
            return super()._get_formatter()
        return self.formatter_class(prog=self.prog, width=PIPE_WIDTH)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(unrecognized_message(self, extras))
        return parsed, extras


def unrecognized_message(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """``unrecognized arguments: ...`` with the option ``parser`` has that is closest to the first unknown one.

    >>> p = Parser(prog="dpinfer sanitize")
    >>> _ = p.add_argument("--epsilon")
    >>> unrecognized_message(p, ["--epsilom", "3"])
    'unrecognized arguments: --epsilom 3 (did you mean --epsilon?)'
    """
    import difflib

    text = f"unrecognized arguments: {' '.join(extras)}"
    options = [opt for opt in parser._option_string_actions if opt.startswith("--")]
    for arg in extras:
        if arg.startswith("-"):
            close = difflib.get_close_matches(arg.split("=", 1)[0], options, n=1, cutoff=0.6)
            if close:
                return f"{text} (did you mean {close[0]}?)"
            break
    return text


class LazyHelpFormatter(argparse.HelpFormatter):
    """A help formatter that computes an option's help only when help is printed: an action with a ``lazy_help``
    callable gets its text from it (e.g. the methods read from the mechanism registry, which imports torch: building
    the parser must not)."""

    def _format_action(self, action: argparse.Action) -> str:
        lazy = getattr(action, "lazy_help", None)
        if lazy is not None:
            action = copy.copy(action)
            action.help = str(lazy()).replace("%", "%%")
        return super()._format_action(action)


def add_method_argument(p: argparse.ArgumentParser, task: str) -> argparse.Action:
    """``--method`` of a task's command: its methods (registered mechanisms and baselines, from
    :func:`dpinfer.methods.method_names`) are listed in ``--help`` and checked by :mod:`dpinfer.validation`; the parser
    needs ``formatter_class=LazyHelpFormatter``."""
    default = DEFAULT_METHODS[task_name(task)]
    action = p.add_argument("--method", default=default, metavar="METHOD", help=f"the method (default {default})")
    action.lazy_help = lambda: methods_help(task)  # type: ignore[attr-defined]
    return action


def show(value: float | int | str | None) -> str:
    """A default as ``--help`` prints it: ``1e-5``, ``0.7``, ``40`` (a string as it is).

    >>> show(1e-05), show(40.0), show(0.7), show(None), show("rdp")
    ('1e-5', '40', '0.7', 'none', 'rdp')
    """
    if value is None:
        return "none"
    if isinstance(value, str):
        return value
    text = f"{value:g}"
    mantissa, e, exponent = text.partition("e")
    return f"{mantissa}e{int(exponent)}" if e else text
