"""The methods each task offers, one table per task: ``dpinfer.methods.<task>`` holds ``TABLE``, a
:class:`~dpinfer.methods.table.MethodTable` of :class:`~dpinfer.methods.table.Method` entries (mechanisms and
baselines alike). A pipeline dispatches through its table; the command line's ``choices``, ``--help`` and the checks
in :mod:`dpinfer.validation` read it. Adding a method to a task is its module plus one table entry.

:func:`table` imports a task's table module on first use (``importlib``, like the mechanism registry's
``"module:Class"`` entries), so listing methods imports no mechanism and no torch. A task whose table module is not
written yet gets the table the mechanism registry implies: every mechanism registered for the task, then the task's
baselines of :data:`LEGACY_BASELINES` (a registered mechanism run on one of the task's contexts, e.g. sanitisation's
``original`` and ``ner-scrub``; a mechanism a baseline runs is offered through the baseline only).

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
from dpinfer.mechanisms.registry import REGISTRY
from dpinfer.methods.table import GUARANTEES, TASKS, Method, MethodTable, load_target

__all__ = ["BASELINES", "DEFAULT_METHODS", "GUARANTEES", "TASKS", "Baseline", "Method", "MethodTable", "baseline",
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

Baseline = Method
"""A baseline is a :class:`Method` with ``baseline=True`` (its ``mechanism`` run on one ``context``)."""

LEGACY_BASELINES: dict[str, tuple[Method, ...]] = {
    "sanitize": (
        Method("original", "sanitize", mechanism="sampler", contexts="original", protects="nothing",
               guarantee="none", baseline=True, summary="the plain sampler on the full document (no privacy)"),
        Method("ner-scrub", "sanitize", mechanism="sampler", contexts="public", protects="spans", guarantee="zero",
               baseline=True,
               summary="the plain sampler on the public context, spans replaced (ε = 0 for their content)"),
    ),
    "synthesize": (
        Method("public", "synthesize", mechanism="sampler", contexts="public", protects="references",
               guarantee="zero", baseline=True, summary="the public prompt only (reads no reference; ε = 0)"),
    ),
    "rag": (),
    "prompt": (),
}
"""The baselines of a task whose table module is not written yet (see the module docstring)."""

_LOCK = threading.Lock()
_TABLES: dict[str, MethodTable] = {}


def task_name(task: str) -> str:
    """``task`` under its table's name (``synth`` → ``synthesize``, ``protect-prompt`` → ``prompt``)."""
    name = TASK_ALIASES.get(task, task) if isinstance(task, str) else task
    if name not in TABLE_MODULES:
        raise ConfigurationError(f"unknown task {task!r}; tasks with methods: {', '.join(TABLE_MODULES)}")
    return name


def _registry_table(task: str) -> MethodTable:
    """The table the mechanism registry implies for ``task`` (built afresh each call: it follows the registry)."""
    baselines = LEGACY_BASELINES[task]
    used = {b.mechanism for b in baselines}
    default = DEFAULT_METHODS[task]
    names = sorted((n for n in REGISTRY.names(task=task) if n not in used), key=lambda n: (n != default, n))
    entries = [Method(n, task, mechanism=n, summary=REGISTRY.get(n).summary) for n in names]
    return MethodTable(task, [*entries, *baselines], default=default if default in names else None)


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
        return _registry_table(name)
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
