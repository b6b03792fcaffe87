"""The benchmark harness: one protocol every benchmark follows, the manifest ``dpinfer bench`` is built from, and the
helpers every benchmark shares (atomic files, option lists, Markdown tables, interleaved timings).

A benchmark is a module that implements :class:`Bench`: ``add_arguments(parser)`` adds its options,
``config_from_args(args)`` turns them into its frozen config (checking them before any model or data loads),
``run(config, progress)`` measures and returns the results (a dict; it writes its files, JSON atomically, with
:func:`write_json`), ``render(results)`` is what it prints, and ``DESCRIPTION`` its ``--help`` text. Figures are
drawn in :mod:`dpinfer.bench.plots`, intervals come from :mod:`dpinfer.eval.intervals`.

:data:`MANIFEST` lists the benchmarks, ``"module"`` entries like :mod:`dpinfer.mechanisms.registry`'s: listing the names
and their one-line help imports no benchmark (and so no torch). Adding a benchmark is its module and one entry.

>>> [e.name for e in MANIFEST][:3]
['engine', 'sanitize', 'synth']
>>> entry("gtr").module
'dpinfer.bench.gtr'
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

from dpinfer.errors import ConfigurationError

Progress = Callable[[str], None]
"""``progress(stage)``: names the stage a benchmark has reached (a spinner on the command line)."""


@dataclass
class ProgressLine:
    """A bench's progress line: ``msg (N s)``, seconds since the bench started (nothing without ``update``)."""

    update: Callable[[str], None] | None
    start: float = field(default_factory=time.perf_counter)

    def __call__(self, msg: str) -> None:
        if self.update:
            self.update(f"{msg} ({time.perf_counter() - self.start:.0f} s)")


def quiet(stage: str) -> None:
    """The :data:`Progress` of a run nobody watches: says nothing."""


class Bench(Protocol):
    """What ``dpinfer bench NAME`` runs (a module implements it)."""

    DESCRIPTION: str
    """The ``--help`` text (usually the module's docstring)."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add the benchmark's options to its sub-command."""

    def config_from_args(self, args: argparse.Namespace) -> Any:
        """The frozen config of the parsed options, every option checked before any model or data loads."""

    def run(self, config: Any, progress: Progress = quiet) -> dict[str, Any]:
        """Measure (baselines in the same run), write the files the config asks for, return the results."""

    def render(self, results: dict[str, Any]) -> str:
        """The text ``dpinfer bench NAME`` prints (``--json`` prints the results instead)."""


@dataclass(frozen=True)
class BenchEntry:
    """One benchmark of the manifest: its sub-command, its module (imported when the parser is built) and its
    one-line help. ``common_options``: whether the sub-command takes the global ``--json`` (a benchmark with its own
    ``--json`` option says False)."""

    name: str
    module: str
    help: str
    common_options: bool = True

    def load(self) -> Bench:
        return cast(Bench, importlib.import_module(self.module))


MANIFEST: tuple[BenchEntry, ...] = (
    BenchEntry("engine", "dpinfer.bench.engine", "engine tokens/s vs HF generate; --jobs N: the slot engine"),
    BenchEntry("sanitize", "dpinfer.bench.sanitize", "sanitisation privacy-utility (PPL, ASR, leaks) or --perf"),
    BenchEntry("synth", "dpinfer.bench.synth", "synthetic-text MAUVE vs compute (B) at fixed ε, or --perf"),
    BenchEntry("serving", "dpinfer.bench.serving", "the four serving figures (plain, DP-Fusion one document and "
                                                   "corpus, InvisibleInk) vs their targets, in one run"),
    BenchEntry("quality", "dpinfer.bench.quality", "each task's DP method beside the same model without privacy "
                                                   "(ceiling) and the public floor: derailment, PPL, loops, relevance, "
                                                   "accuracy, MAUVE, in one table"),
    BenchEntry("utility", "dpinfer.bench.utility", "what the private data buys: each DP method over ε on a measure "
                                                   "only the private input can raise, beside its floor and ceiling"),
    BenchEntry("tagger", "dpinfer.bench.tagger", "tagger precision / recall / F1 against gold spans",
               common_options=False),
    BenchEntry("rag", "dpinfer.bench.rag", "RAG extraction attack: leakage, PPL, tokens/s or --perf"),
    BenchEntry("gtr", "dpinfer.bench.gtr", "prompt protection on CSQA: ROUGE/BLEU leakage vs accuracy, DP-GTR vs "
                                           "DP-Prompt, or --perf"),
    BenchEntry("load", "dpinfer.bench.load", "the warm model load in a new process, stage by stage"),
    BenchEntry("ledger", "dpinfer.bench.ledger", "the budget ledger: reserve + commit p50/p99 and spends/s, SQLite "
                                                 "and PostgreSQL, at 1, 8, 32 clients"),
    BenchEntry("serve", "dpinfer.bench.serve", "batching across HTTP requests: 8 concurrent vs sequential "
                                               "sanitisations, p50/p99 at 1, 8, 32 clients"),
)
"""Every ``dpinfer bench`` sub-command, in ``--help`` order."""


def entry(name: str) -> BenchEntry:
    """The manifest entry of benchmark ``name``."""
    for e in MANIFEST:
        if e.name == name:
            return e
    raise ConfigurationError(f"unknown benchmark {name!r}; choose one of {', '.join(e.name for e in MANIFEST)}")


# ---------------------------------------------------------------------------------------------------- files
def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (a reader never sees half a file; an interrupted run leaves the previous
    file); its folder is created. Returns the path."""
    from dpinfer.io import atomic_write_text

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(p, text)
    return p


def write_json(path: str | Path, obj: Any) -> Path:
    """Write ``obj`` as indented JSON (non-finite floats as strings, :func:`dpinfer._json.plain`) atomically."""
    from dpinfer._json import plain

    return write_text(path, json.dumps(plain(obj), indent=2, ensure_ascii=False, default=str) + "\n")


# ---------------------------------------------------------------------------------------------------- options
T = TypeVar("T")


def parse_list(text: str, kind: Callable[[str], T], option: str) -> list[T]:
    """The comma-separated values of ``option`` converted by ``kind``; refused (one line) when one does not convert
    or none is given.

    >>> parse_list("64, 16,4", float, "--epsilons")
    [64.0, 16.0, 4.0]
    """
    try:
        values = [kind(x.strip()) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ConfigurationError(f"{option} must be a comma-separated list, got {text!r}") from None
    if not values:
        raise ConfigurationError(f"{option} is empty")
    return values


def check_choices(values: Sequence[str], choices: Sequence[str], option: str) -> None:
    """Refuse (one line) a value of ``option`` outside ``choices``."""
    for v in values:
        if v not in choices:
            raise ConfigurationError(f"{option}: unknown {v!r}; choose from {', '.join(choices)}")


# ---------------------------------------------------------------------------------------------------- tables
def md_table(header: Sequence[str], align: str, rows: Iterable[Sequence[Any]]) -> list[str]:
    """The lines of a Markdown table: ``header``, its separator (``align``: a letter a column, ``l`` left or ``r``
    right), then a line a row (each cell as ``str``).

    >>> md_table(["config", "seconds"], "lr", [["a", 1.5], ["b", ""]])
    ['| config | seconds |', '|---|---:|', '| a | 1.5 |', '| b |  |']
    """
    if len(align) != len(header) or set(align) - {"l", "r"}:
        raise ValueError(f"align needs one of l/r per column ({len(header)}), got {align!r}")
    return [f"| {' | '.join(header)} |", "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|",
            *(f"| {' | '.join(str(c) for c in row)} |" for row in rows)]


# ---------------------------------------------------------------------------------------------------- timings
def rounds(repeats: int, items: Sequence[T]) -> Iterator[tuple[int, Sequence[T]]]:
    """``(round, items)`` for each of ``repeats`` rounds, the order alternating (ABBA...), so that a drifting machine
    load hits every item alike.

    >>> [list(order) for _, order in rounds(3, "ab")]
    [['a', 'b'], ['b', 'a'], ['a', 'b']]
    """
    for r in range(repeats):
        yield r, items if r % 2 == 0 else items[::-1]


class Timings:
    """Seconds per label over the rounds of one run: every figure (median, spread, ratio) comes from the runs
    recorded here, baselines included.

    >>> t = Timings()
    >>> for label, seconds in (("a", 2.0), ("a", 4.0), ("a", 3.0), ("b", 1.5)):
    ...     _ = t.add(label, seconds)
    >>> t.median("a"), t.spread("a"), t.ratio("a", "b")
    (3.0, [2.0, 4.0], 2.0)
    """

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.runs: dict[str, list[float]] = {}
        self.sync = sync
        """Called before and after each timed call (``torch.cuda.synchronize`` for a CUDA model)."""

    def add(self, label: str, seconds: float) -> float:
        self.runs.setdefault(label, []).append(seconds)
        return seconds

    def time(self, label: str, fn: Callable[[], T]) -> T:
        """``fn()``, its wall-clock seconds recorded under ``label``."""
        if self.sync is not None:
            self.sync()
        t0 = time.perf_counter()
        out = fn()
        if self.sync is not None:
            self.sync()
        self.add(label, time.perf_counter() - t0)
        return out

    def median(self, label: str) -> float:
        return statistics.median(self.runs[label])

    def spread(self, label: str, digits: int = 3) -> list[float]:
        """``[fastest, slowest]`` run of ``label``."""
        return [round(min(self.runs[label]), digits), round(max(self.runs[label]), digits)]

    def ratio(self, base: str, label: str) -> float:
        """How many times faster ``label`` is than ``base`` (median seconds of ``base`` / those of ``label``)."""
        return self.median(base) / self.median(label)
