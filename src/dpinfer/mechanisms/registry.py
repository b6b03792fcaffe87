"""The mechanism registry: an object that maps names to mechanism classes and what they serve.

Dispatch reads it: pipelines build mechanisms by name, the command line takes its ``choices`` and ``--help`` lists from
it, and the contract suite and ``dpinfer audit`` run over every entry. Adding a built-in mechanism means one module,
one entry in :data:`BUILTIN` (its name, ``"module:Class"``, tasks and summary) and the contract suite. The mechanism
modules do not import the registry; the registry imports a class the first time it is built (so listing the names,
tasks and summaries, e.g. for ``--help`` or to refuse a bad ``--method``, imports neither torch nor any mechanism).
Code outside dpinfer adds its own mechanisms with :meth:`MechanismRegistry.register` (``@register(...)``).

>>> reg = MechanismRegistry()
>>> from dpinfer.mechanisms.sampler import Sampler
>>> _ = reg.register("toy", tasks=("generate",), summary="plain sampling")(Sampler)
>>> reg.names(task="generate"), reg.get("toy").summary
(['toy'], 'plain sampling')
>>> reg.build("toy", temperature=0.0).greedy
True
>>> REGISTRY.get("dp-fusion").target
'dpinfer.mechanisms.dp_fusion:DPFusion'
"""

from __future__ import annotations

import functools
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

@functools.cache
def load_target(target: str) -> Any:
    """The object a ``"module:qualname"`` string names, imported once: a registered mechanism's class, a method
    table's builder (:class:`~dpinfer.methods.table.Method`)."""
    module, sep, qualname = target.partition(":")
    if not sep or not module or not qualname:
        raise ConfigurationError(f"a target must be 'module:callable', got {target!r}")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class MechanismEntry:
    """One registered mechanism: its name, its class (or ``"module:Class"``, imported on first use), the tasks it
    serves and a one-line summary for ``--help``."""

    name: str
    target: type[Mechanism] | str
    tasks: tuple[str, ...] = ()
    summary: str = ""

    @property
    def cls(self) -> type[Mechanism]:
        """The mechanism class (importing its module the first time, for a ``"module:Class"`` target)."""
        return self.target if isinstance(self.target, type) else load_target(self.target)


BUILTIN: tuple[MechanismEntry, ...] = (
    MechanismEntry("adapmixed", "dpinfer.mechanisms.adapmixed:AdaPMixED", ("synthesize",),
                   "AdaPMixED (Flemings et al. 2024): data-dependent, no ex-ante guarantee"),
    MechanismEntry("amin", "dpinfer.mechanisms.amin:AminSVT", ("synthesize",),
                   "Amin et al. 2024: clipped average with a sparse-vector test"),
    MechanismEntry("dp-decoding", "dpinfer.mechanisms.dp_decoding:DPDecoding", ("sanitize",),
                   "DP-Decoding (Majmudar et al. 2022): mix with the uniform distribution"),
    MechanismEntry("dp-fusion", "dpinfer.mechanisms.dp_fusion:DPFusion", ("sanitize",),
                   "DP-Fusion: per-group mollified mixture of public and private contexts"),
    MechanismEntry("dp-prompt", "dpinfer.mechanisms.dp_prompt:DPPrompt", ("sanitize", "prompt"),
                   "DP-Prompt (Utpala et al. 2023): clipped logits, full-vocabulary sampling"),
    MechanismEntry("invisibleink", "dpinfer.mechanisms.invisibleink:InvisibleInk", ("synthesize",),
                   "InvisibleInk: DClip + Top-k+ exponential mechanism"),
    MechanismEntry("pad", "dpinfer.mechanisms.pad:Pad", ("rag",),
                   "PAD (rigorous): clipped context shift on a public Top-k+ support + Gaussian noise, zCDP per "
                   "answer"),
    MechanismEntry("pad-as-published", "dpinfer.mechanisms.pad:PadAsPublished", ("rag",),
                   "PAD as published by its authors (no clipping, data-dependent screening): no guarantee, heuristic "
                   "figure"),
    MechanismEntry("sampler", "dpinfer.mechanisms.sampler:Sampler", ("generate", "sanitize", "synthesize"),
                   "plain sampling (no privacy); the original / NER-scrub / public baselines"),
    MechanismEntry("static", "dpinfer.mechanisms.static_noise:StaticNoise", ("rag",),
                   "Static: fixed Gaussian noise on all logits of the private context (baseline, no guarantee)"),
)
"""The built-in mechanisms (one entry each), in :data:`REGISTRY` from the start."""


def _check_tasks(name: str, tasks: tuple[str, ...]) -> None:
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise ConfigurationError(f"unknown task(s) {unknown} for mechanism {name!r}; tasks are {', '.join(TASKS)}")


class MechanismRegistry:
    """Names → :class:`MechanismEntry`, starting from ``entries`` (e.g. :data:`BUILTIN`)."""

    def __init__(self, entries: Iterable[MechanismEntry] = ()) -> None:
        self._entries: dict[str, MechanismEntry] = {}
        for entry in entries:
            self._add(entry)

    def _add(self, entry: MechanismEntry) -> None:
        _check_tasks(entry.name, entry.tasks)
        old = self._entries.get(entry.name)
        if old is not None and old.target != entry.target and old.cls is not entry.cls:
            raise ConfigurationError(f"mechanism name {entry.name!r} is already registered")
        self._entries[entry.name] = entry

    def register(self, name: str, *, tasks: Iterable[str] = (), summary: str = "") -> Callable[[type[Mechanism]],
                                                                                                  type[Mechanism]]:
        """Class decorator adding ``cls`` under ``name`` (unique), serving ``tasks`` (a subset of :data:`TASKS`)."""
        task_tuple = tuple(tasks)
        _check_tasks(name, task_tuple)

        def deco(cls: type[Mechanism]) -> type[Mechanism]:
            self._add(MechanismEntry(name=name, target=cls, tasks=task_tuple, summary=summary))
            return cls

        return deco

    def names(self, task: str | None = None) -> list[str]:
        """Registered names (sorted), only those serving ``task`` when given."""
        if task is not None and task not in TASKS:
            raise ConfigurationError(f"unknown task {task!r}; tasks are {', '.join(TASKS)}")
        return sorted(n for n, e in self._entries.items() if task is None or task in e.tasks)

    def get(self, name: str) -> MechanismEntry:
        """The entry for ``name``; an unknown name is refused with the list of known ones."""
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
        return name in self._entries

    def __iter__(self) -> Iterator[MechanismEntry]:
        return iter([self._entries[n] for n in sorted(self._entries)])


REGISTRY = MechanismRegistry(BUILTIN)
"""The registry every pipeline, the command line, the contract suite and the audit read."""
