"""The methods each task offers, one table per task: ``dpinfer.methods.<task>`` holds ``TABLE``, a
:class:`~dpinfer.methods.table.MethodTable` of :class:`~dpinfer.methods.table.Method` entries (mechanisms and
baselines alike). A pipeline dispatches through its table; the command line's ``choices``, ``--help`` and the checks
in :mod:`dpinfer.validation` read it. Adding a method to a task is its module plus one table entry.

:func:`table` imports a task's table module on first use (``importlib``, like the mechanism registry's
``"module:Class"`` entries), so listing methods imports no mechanism and no torch. Every task has its table module
(:data:`TABLE_MODULES`); a missing one is refused in one line.

The functions below (:func:`method_names`, :func:`methods_help`, :func:`is_baseline`, :func:`baseline`,
:func:`mechanism_of`, :func:`summaries`, :data:`BASELINES`, :data:`DEFAULT_METHODS`) read the tables.

>>> method_names("sanitize")[:1], is_baseline("sanitize", "ner-scrub"), baseline("synthesize", "public").context
(['dp-fusion'], True, 'public')
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterator, Mapping

from dpinfer.defaults import PROTECT, RAG, SANITIZE, SYNTH
from dpinfer.errors import ConfigurationError
from dpinfer.mechanisms.registry import load_target
from dpinfer.methods.table import GUARANTEES, TASKS, Method, MethodTable

__all__ = ["BASELINES", "DEFAULT_METHODS", "GUARANTEES", "TASKS", "Method", "MethodTable", "baseline",
           "is_baseline", "load_target", "mechanism_names", "mechanism_of", "method_names", "methods_help",
           "summaries", "table"]

TABLE_MODULES: dict[str, str] = {"sanitize": "dpinfer.methods.sanitize", "synthesize": "dpinfer.methods.synthesize",
                                 "rag": "dpinfer.methods.rag", "prompt": "dpinfer.methods.prompt"}
"""Task → the module whose ``TABLE`` is the task's :class:`MethodTable`."""

TASK_ALIASES = {"synth": "synthesize", "protect-prompt": "prompt", "protect_prompt": "prompt", "ask": "rag"}
"""Other spellings of a task (the command names)."""

DEFAULT_METHODS: dict[str, str] = {"sanitize": SANITIZE.method, "synthesize": SYNTH.method, "rag": RAG.method,
                                   "prompt": PROTECT.method}
"""The default method of each task (listed first; :mod:`dpinfer.defaults`)."""


_LOCK = threading.Lock()
_TABLES: dict[str, MethodTable] = {}


def task_name(task: str) -> str:
    """``task`` under its table's name (``synth`` → ``synthesize``, ``protect-prompt`` → ``prompt``)."""
    name = TASK_ALIASES.get(task, task) if isinstance(task, str) else task
    if name not in TABLE_MODULES:
        raise ConfigurationError(f"unknown task {task!r}; tasks with methods: {', '.join(TABLE_MODULES)}")
    return name


def table(task: str) -> MethodTable:
    """The :class:`MethodTable` of ``task`` (its module's ``TABLE``, imported on first use; torch-free)."""
    name = task_name(task)
    found = _TABLES.get(name)
    if found is not None:
        return found
    module = TABLE_MODULES[name]
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        raise ConfigurationError(f"the method table of {name!r} ({module}) is not installed; reinstall dpinfer") \
            from None
    found = mod.TABLE
    if not isinstance(found, MethodTable) or found.task != name:
        raise ConfigurationError(f"{module}.TABLE must be the MethodTable of {name!r}")
    with _LOCK:
        _TABLES[name] = found
    return found


def mechanism_names(task: str) -> list[str]:
    """The methods of ``task`` that are not baselines (the default first)."""
    return table(task).mechanisms()


def method_names(task: str) -> list[str]:
    """Every method of ``task``: the default first, the other mechanisms, then the baselines."""
    return table(task).names()


def is_baseline(task: str, method: object) -> bool:
    """Whether ``method`` is one of ``task``'s baselines (torch-free)."""
    t = table(task)
    return isinstance(method, str) and method in t and t.get(method).baseline


def baseline(task: str, method: str) -> Method | None:
    """The baseline entry named ``method``, or None for any other method."""
    t = table(task)
    entry = t.get(method) if method in t else None
    return entry if entry is not None and entry.baseline else None


def mechanism_of(task: str, method: str) -> str:
    """The registry name of the mechanism that ``method`` runs."""
    t = table(task)
    return t.get(method).mechanism if method in t else method


def summaries(task: str) -> dict[str, str]:
    """Method → one-line summary, in :func:`method_names` order."""
    return table(task).summaries()


def methods_help(task: str) -> str:
    """The ``--method`` help of ``task``'s command: every method with its summary, the default marked.

    >>> "dp-fusion (default): " in methods_help("sanitize") and "ner-scrub: " in methods_help("sanitize")
    True
    """
    return table(task).help()


class _Baselines(Mapping[str, dict[str, Method]]):
    """Task → baseline name → entry, read from the tables (a live view)."""

    def __getitem__(self, task: str) -> dict[str, Method]:
        if not isinstance(task, str) or TASK_ALIASES.get(task, task) not in TABLE_MODULES:
            raise KeyError(task)
        t = table(task)
        return {n: t.get(n) for n in t.baselines()}

    def __iter__(self) -> Iterator[str]:
        return iter(TABLE_MODULES)

    def __len__(self) -> int:
        return len(TABLE_MODULES)


BASELINES: Mapping[str, dict[str, Method]] = _Baselines()
"""Task → baseline name → :class:`Method` (read from the tables)."""
