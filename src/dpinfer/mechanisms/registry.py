"""The mechanism registry: an object that maps names to mechanism classes and what they serve.

Dispatch reads it: pipelines build mechanisms by name, the command line takes its ``choices`` and ``--help`` lists from
it, and the contract suite and ``dpinfer audit`` run over every entry. Adding a mechanism means one module with one
``@register(...)`` line, its module name in :data:`BUILTIN_MODULES`, and the contract suite.

>>> reg = MechanismRegistry()
>>> from dpinfer.mechanisms.sampler import Sampler
>>> _ = reg.register("toy", tasks=("generate",), summary="plain sampling")(Sampler)
>>> reg.names(task="generate"), reg.get("toy").summary
(['toy'], 'plain sampling')
>>> reg.build("toy", temperature=0.0).greedy
True
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dpinfer.errors import ConfigurationError

if TYPE_CHECKING:
    from dpinfer.mechanisms.base import Mechanism

TASKS = ("generate", "sanitize", "synthesize", "rag", "prompt")
"""What a mechanism can serve: plain generation, document sanitisation, synthetic text, private RAG answers, prompt
protection. A pipeline offers the mechanisms registered for its task."""

BUILTIN_MODULES = (
    "adapmixed",
    "amin",
    "dp_decoding",
    "dp_fusion",
    "dp_prompt",
    "invisibleink",
    "pad",
    "sampler",
    "static_noise",
)
"""Modules under :mod:`dpinfer.mechanisms` whose import registers the built-in mechanisms into :data:`REGISTRY`."""


@dataclass(frozen=True)
class MechanismEntry:
    """One registered mechanism: its name, class, the tasks it serves and a one-line summary for ``--help``."""

    name: str
    cls: type[Mechanism]
    tasks: tuple[str, ...] = ()
    summary: str = ""


class MechanismRegistry:
    """Names → :class:`MechanismEntry`. ``loader`` (optional) is called once, on first read, to import built-ins."""

    def __init__(self, loader: Callable[[], None] | None = None) -> None:
        self._entries: dict[str, MechanismEntry] = {}
        self._loader = loader
        self._loaded = loader is None

    def _ensure_loaded(self) -> None:
        if not self._loaded:
            self._loaded = True
            assert self._loader is not None
            self._loader()

    def register(self, name: str, *, tasks: Iterable[str] = (), summary: str = "") -> Callable[[type[Mechanism]],
                                                                                                  type[Mechanism]]:
        """Class decorator adding ``cls`` under ``name`` (unique), serving ``tasks`` (a subset of :data:`TASKS`)."""
        task_tuple = tuple(tasks)
        unknown = [t for t in task_tuple if t not in TASKS]
        if unknown:
            raise ConfigurationError(f"unknown task(s) {unknown} for mechanism {name!r}; tasks are {', '.join(TASKS)}")

        def deco(cls: type[Mechanism]) -> type[Mechanism]:
            old = self._entries.get(name)
            if old is not None and old.cls is not cls:
                raise ConfigurationError(f"mechanism name {name!r} is already registered")
            self._entries[name] = MechanismEntry(name=name, cls=cls, tasks=task_tuple, summary=summary)
            return cls

        return deco

    def names(self, task: str | None = None) -> list[str]:
        """Registered names (sorted), only those serving ``task`` when given."""
        self._ensure_loaded()
        if task is not None and task not in TASKS:
            raise ConfigurationError(f"unknown task {task!r}; tasks are {', '.join(TASKS)}")
        return sorted(n for n, e in self._entries.items() if task is None or task in e.tasks)

    def get(self, name: str) -> MechanismEntry:
        """The entry for ``name``; an unknown name is refused with the list of known ones."""
        self._ensure_loaded()
        try:
            return self._entries[name]
        except KeyError:
            raise ConfigurationError(
                f"unknown mechanism {name!r}; available: {', '.join(sorted(self._entries))}"
            ) from None

    def build(self, name: str, **params: Any) -> Mechanism:
        """Build the mechanism ``name`` with ``params`` (validated by its constructor)."""
        return self.get(name).cls(**params)

    def __contains__(self, name: object) -> bool:
        self._ensure_loaded()
        return name in self._entries

    def __iter__(self) -> Iterator[MechanismEntry]:
        self._ensure_loaded()
        return iter([self._entries[n] for n in sorted(self._entries)])


def _load_builtin() -> None:
    for module in BUILTIN_MODULES:
        importlib.import_module(f"dpinfer.mechanisms.{module}")


REGISTRY = MechanismRegistry(loader=_load_builtin)
"""The registry every pipeline, the command line, the contract suite and the audit read."""
