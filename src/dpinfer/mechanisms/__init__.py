"""Mechanisms: one module each, one registry entry each.

>>> from dpinfer.mechanisms import get_mechanism
>>> get_mechanism("sampler", temperature=0.0).name
'sampler'
"""

from __future__ import annotations

from typing import Any

from dpinfer.mechanisms.base import Mechanism, Mode, StepInfo, StepResult
from dpinfer.mechanisms.registry import REGISTRY, MechanismEntry, MechanismRegistry

register = REGISTRY.register
"""``@register(name, tasks=(...), summary="...")``: add a mechanism class to :data:`REGISTRY`."""


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
