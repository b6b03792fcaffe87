"""Method entries and per-task method tables (transformers' ``GENERATION_MODES_MAPPING`` shape: one table over a
typed config; entries light like :mod:`dpinfer.mechanisms.registry`'s ``"module:Class"``).

A :class:`Method` names how a task can run: the mechanism it decodes with, the contexts it reads, what its guarantee
protects, the kind of guarantee, a one-line summary, and its builder, ``build(config, runtime)``, as a
``"module:callable"`` string imported the first time the method is built. Listing a table's names, summaries or
``--help`` imports no mechanism and no torch. Its ``checker`` (``"module:callable"`` too) makes the checks of a config
that depend on the method (:meth:`Method.check`), before any model loads.

>>> t = MethodTable("sanitize", [Method("toy", "sanitize", build="builtins:repr", mechanism="sampler",
...                                     contexts="original", protects="nothing", guarantee="none",
...                                     summary="a toy")])
>>> t.names(), t.get("toy").loaded_build() is repr, t.help()
(['toy'], True, 'toy (default): a toy')
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from dpinfer.errors import ConfigurationError
from dpinfer.mechanisms.registry import load_target

TASKS = ("sanitize", "synthesize", "rag", "prompt")
"""Tasks with a method table (the mechanism registry's tasks less plain ``generate``)."""

GUARANTEES = ("ex-ante", "zero", "none", "data-dependent")
"""Kinds of guarantee a method gives: ``ex-ante`` (ε, δ from its parameters and a maximum length alone), ``zero``
(it never reads what is protected: ε = 0 for it), ``none`` (it reads the private input without a mechanism: no
privacy), ``data-dependent`` (a figure computed from the private input: never called ε, never in a release)."""

GuaranteeKind = Literal["ex-ante", "zero", "none", "data-dependent"]


@dataclass(frozen=True)
class Method:
    """One method of a task (see the module docstring).

    Attributes:
        name: what ``--method`` / ``method=`` takes.
        task: one of :data:`TASKS`.
        build: ``"module:callable"`` (or the callable) building the method's runner from a task config and a
            :class:`~dpinfer.runtime.Runtime`: ``build(config, runtime)``; its return type is the task's business.
        mechanism: the registry name of the mechanism it decodes with (:data:`dpinfer.mechanisms.REGISTRY`).
        contexts: which contexts it decodes (task-specific: ``"original"``, ``"public"``, ``"fusion"``, ...).
        protects: what its guarantee covers (``"spans"``, ``"document"``, ``"references"``, ``"nothing"``, ...).
        summary: one line for ``--help``.
        guarantee: the kind of guarantee (:data:`GUARANTEES`).
        baseline: a baseline of the task (run for comparison; listed after the mechanisms).
        checker: ``"module:callable"`` (or the callable) called as ``checker(config, method)`` by :meth:`check`: the
            checks of a config that depend on this method (a setting that does not apply, a budget no calibration
            reaches), from the parameters alone. None: the config's own checks are all.
    """

    name: str
    task: str
    build: str | Callable[..., Any] | None = None
    mechanism: str = ""
    contexts: str = "original"
    protects: str = "document"
    summary: str = ""
    guarantee: GuaranteeKind = "ex-ante"
    baseline: bool = False
    checker: str | Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigurationError("a method needs a non-empty name")
        if self.task not in TASKS:
            raise ConfigurationError(f"unknown task {self.task!r} for method {self.name!r}; tasks: {', '.join(TASKS)}")
        if self.guarantee not in GUARANTEES:
            raise ConfigurationError(f"unknown guarantee kind {self.guarantee!r} for method {self.name!r}; "
                                     f"kinds: {', '.join(GUARANTEES)}")
        if not self.mechanism:
            object.__setattr__(self, "mechanism", self.name)

    @property
    def context(self) -> str:
        """:attr:`contexts` (the name the baselines' entries had)."""
        return self.contexts

    def loaded_build(self) -> Callable[..., Any]:
        """The builder (importing its module the first time, for a ``"module:callable"`` string)."""
        if self.build is None:
            raise ConfigurationError(f"the {self.task} method {self.name!r} has no builder")
        return load_target(self.build) if isinstance(self.build, str) else self.build

    def check(self, config: Any) -> None:
        """The checks of ``config`` that depend on this method (its :attr:`checker`), before any model loads."""
        if self.checker is not None:
            (load_target(self.checker) if isinstance(self.checker, str) else self.checker)(config, self)


class MethodTable:
    """A task's methods by name, in listing order: the default first, then the order of registration (mechanisms
    before baselines by convention). ``default``: the default method's name (else the first entry)."""

    def __init__(self, task: str, entries: Iterable[Method] = (), *, default: str | None = None) -> None:
        if task not in TASKS:
            raise ConfigurationError(f"unknown task {task!r}; tasks with methods: {', '.join(TASKS)}")
        self.task = task
        self._default = default
        self._entries: dict[str, Method] = {}
        for entry in entries:
            self.register(entry)

    def register(self, entry: Method, *, replace: bool = False) -> Method:
        """Add ``entry`` (a method of this task); a taken name is refused unless ``replace``."""
        if entry.task != self.task:
            raise ConfigurationError(f"method {entry.name!r} is for {entry.task!r}, not {self.task!r}")
        if entry.name in self._entries and not replace and self._entries[entry.name] != entry:
            raise ConfigurationError(f"the {self.task} method {entry.name!r} is already registered")
        self._entries[entry.name] = entry
        return entry

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests that add a toy method take it out again)."""
        self._entries.pop(name, None)

    @contextlib.contextmanager
    def registered(self, entry: Method) -> Iterator[Method]:
        """``entry`` in the table for the length of a ``with`` block (a test's toy method), removed on any exit."""
        self.register(entry)
        try:
            yield entry
        finally:
            self.unregister(entry.name)

    @property
    def default(self) -> str:
        """The default method's name."""
        if self._default is not None:
            return self._default
        if not self._entries:
            raise ConfigurationError(f"the {self.task} table has no method")
        return next(iter(self._entries))

    def names(self) -> list[str]:
        """Every method's name: the default first, then the mechanisms, then the baselines (registration order)."""
        order = [n for n, e in self._entries.items() if not e.baseline] + \
                [n for n, e in self._entries.items() if e.baseline]
        default = self._default if self._default in self._entries else None
        return [default, *(n for n in order if n != default)] if default else order

    def get(self, name: object, option: str = "method") -> Method:
        """The entry ``name``; an unknown one is refused with the list of the table's names."""
        entry = self._entries.get(name) if isinstance(name, str) else None
        if entry is None:
            raise ConfigurationError(f"unknown {option} {name!r} for {self.task}; choose one of "
                                     f"{', '.join(self.names())}")
        return entry

    def build(self, name: str, config: Any, runtime: Any) -> Any:
        """``get(name).build(config, runtime)``: what the method runs (imports its module on first use)."""
        return self.get(name).loaded_build()(config, runtime)

    def check(self, name: object, config: Any, option: str = "method") -> Method:
        """The entry ``name`` (an unknown one refused, ``option`` naming the setting) with its checks of ``config``
        made (:meth:`Method.check`)."""
        entry = self.get(name, option)
        entry.check(config)
        return entry

    def baselines(self) -> list[str]:
        return [n for n in self.names() if self._entries[n].baseline]

    def mechanisms(self) -> list[str]:
        """The methods that are not baselines (default first)."""
        return [n for n in self.names() if not self._entries[n].baseline]

    def summaries(self) -> dict[str, str]:
        """Name → one-line summary, in :meth:`names` order."""
        return {n: self._entries[n].summary for n in self.names()}

    def help(self) -> str:
        """The ``--method`` help: every method with its summary, the default marked."""
        default = self.default if self._entries else None
        return "; ".join(f"{n}{' (default)' if n == default else ''}{': ' + s if s else ''}"
                         for n, s in self.summaries().items())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Method]:
        return iter([self._entries[n] for n in self.names()])

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"MethodTable({self.task!r}, {self.names()})"
