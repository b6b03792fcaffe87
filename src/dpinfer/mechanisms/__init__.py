"""Mechanisms: one module each, one registry entry each (:data:`~dpinfer.mechanisms.registry.BUILTIN`).

Importing this package imports neither torch nor any mechanism: the base classes are loaded on first use, and the
registry imports a mechanism's module the first time that mechanism is built.

>>> from dpinfer.mechanisms import get_mechanism
>>> get_mechanism("sampler", temperature=0.0).name
'sampler'
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dpinfer.mechanisms.registry import REGISTRY, MechanismEntry, MechanismRegistry

if TYPE_CHECKING:
    from dpinfer.mechanisms.base import Mechanism, Mode, StepInfo, StepResult

register = REGISTRY.register
"""``@register(name, tasks=(...), summary="...")``: add a mechanism class of your own to :data:`REGISTRY`."""

_BASE_NAMES = frozenset({"Mechanism", "Mode", "StepInfo", "StepResult"})


def __getattr__(name: str) -> Any:
    """The base classes, imported on first use (they import torch)."""
    if name in _BASE_NAMES:
        return getattr(importlib.import_module("dpinfer.mechanisms.base"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def available_mechanisms(task: str | None = None) -> list[str]:
    """Names accepted by :func:`get_mechanism` (those serving ``task`` when given)."""
    return REGISTRY.names(task)


def get_mechanism(name: str, **params: Any) -> Mechanism:
    """Build the registered mechanism ``name`` with ``params`` (validated by its constructor)."""
    return REGISTRY.build(name, **params)


__all__ = [
    "REGISTRY",
    "Mechanism",
    "MechanismEntry",
    "MechanismRegistry",
    "Mode",
    "StepInfo",
    "StepResult",
    "available_mechanisms",
    "get_mechanism",
    "register",
]
