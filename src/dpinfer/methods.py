"""The methods each task offers: the mechanisms registered for it, plus the task's baselines.

A method of a task (``dpinfer sanitize --method``, ``dpinfer synth --method``, the pipelines' ``method=``) is either

* a mechanism registered for the task in :data:`dpinfer.mechanisms.registry.REGISTRY` (``tasks=("sanitize",)``),
  offered under its registry name; or
* a baseline of the task (:data:`BASELINES`): a registered mechanism run on one of the task's contexts, e.g.
  sanitisation's ``original`` (the plain sampler on the full document) and ``ner-scrub`` (the sampler on the public
  context). A mechanism that a task's baseline runs is offered through the baseline only, not under its own name.

So registering a mechanism for a task is enough for the task's pipeline, its command-line ``choices`` and ``--help``,
and the checks in :mod:`dpinfer.validation` to offer it.

Every lookup here is torch-free: the registry knows its entries' names, tasks and summaries without importing a
mechanism (:data:`~dpinfer.mechanisms.registry.BUILTIN`), so the command line refuses a bad ``--method`` and prints
``--help`` in well under a second.

>>> method_names("sanitize")[:1], is_baseline("sanitize", "ner-scrub"), baseline("synthesize", "public").context
(['dp-fusion'], True, 'public')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dpinfer.defaults import SANITIZE, SYNTH
from dpinfer.errors import ConfigurationError

Task = Literal["sanitize", "synthesize"]


@dataclass(frozen=True)
class Baseline:
    """A baseline method: the registered ``mechanism`` decoding one of the task's ``context`` s.

    ``protects``: what the baseline's guarantee covers: ``"spans"`` (the content of tagged spans, ε = 0: it never
    reads them), ``"nothing"`` (it reads everything without a mechanism), ``"references"`` (it reads none).
    """

    mechanism: str
    context: Literal["original", "public"]
    protects: Literal["spans", "nothing", "references"]
    summary: str


BASELINES: dict[str, dict[str, Baseline]] = {
    "sanitize": {
        "original": Baseline("sampler", "original", "nothing",
                             "the plain sampler on the full document (no privacy)"),
        "ner-scrub": Baseline("sampler", "public", "spans",
                              "the plain sampler on the public context, spans replaced (ε = 0 for their content)"),
    },
    "synthesize": {
        "public": Baseline("sampler", "public", "references", "the public prompt only (reads no reference; ε = 0)"),
    },
}
"""Task → baseline name → :class:`Baseline`."""

DEFAULT_METHODS: dict[str, str] = {"sanitize": SANITIZE.method, "synthesize": SYNTH.method}
"""The default method of each task (listed first; :mod:`dpinfer.defaults`)."""


def _check_task(task: str) -> None:
    if task not in BASELINES:
        raise ConfigurationError(f"unknown task {task!r}; tasks with methods: {', '.join(BASELINES)}")


def _registered(task: str) -> dict[str, str]:
    """Name → summary of the mechanisms registered for ``task`` (sorted by name)."""
    from dpinfer.mechanisms.registry import REGISTRY

    return {n: REGISTRY.get(n).summary for n in REGISTRY.names(task=task)}


def mechanism_names(task: str) -> list[str]:
    """The registered mechanisms the task offers under their own names (those its baselines run are left out)."""
    _check_task(task)
    used = {b.mechanism for b in BASELINES[task].values()}
    names = [n for n in _registered(task) if n not in used]
    default = DEFAULT_METHODS[task]
    return sorted(names, key=lambda n: (n != default, n))


def method_names(task: str) -> list[str]:
    """Every method of ``task``: the default first, the other registered mechanisms, then the baselines."""
    return [*mechanism_names(task), *BASELINES[task]]


def is_baseline(task: str, method: object) -> bool:
    """Whether ``method`` is one of ``task``'s baselines (torch-free)."""
    _check_task(task)
    return isinstance(method, str) and method in BASELINES[task]


def baseline(task: str, method: str) -> Baseline | None:
    """The :class:`Baseline` named ``method``, or None for a mechanism."""
    _check_task(task)
    return BASELINES[task].get(method)


def mechanism_of(task: str, method: str) -> str:
    """The registry name of the mechanism that ``method`` runs."""
    b = baseline(task, method)
    return b.mechanism if b is not None else method


def summaries(task: str) -> dict[str, str]:
    """Method → one-line summary (the registry's for mechanisms), in :func:`method_names` order."""
    registered = _registered(task)
    out = {n: registered[n] for n in mechanism_names(task)}
    out.update({n: b.summary for n, b in BASELINES[task].items()})
    return out


def methods_help(task: str) -> str:
    """The ``--method`` help of ``task``'s command: every method with its summary, the default marked.

    >>> "dp-fusion (default): " in methods_help("sanitize") and "ner-scrub: " in methods_help("sanitize")
    True
    """
    default = DEFAULT_METHODS[task]
    return "; ".join(f"{n}{' (default)' if n == default else ''}: {s}" if s else n
                     for n, s in summaries(task).items())
