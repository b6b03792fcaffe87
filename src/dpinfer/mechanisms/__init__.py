"""Mechanisms: one module each, one registry entry each.

>>> from dpinfer.mechanisms import get_mechanism
>>> get_mechanism("sampler", temperature=0.0).name
'sampler'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dpinfer.errors import ConfigurationError
from dpinfer.mechanisms.base import Mechanism, Mode, StepInfo, StepResult

_REGISTRY: dict[str, type[Mechanism]] = {}


def register(name: str) -> Callable[[type[Mechanism]], type[Mechanism]]:
    """Class decorator adding a mechanism to the registry under ``name``."""

    def deco(cls: type[Mechanism]) -> type[Mechanism]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ConfigurationError(f"mechanism name {name!r} is already registered")
        _REGISTRY[name] = cls
        return cls

    return deco


def _load_builtin() -> None:
    # Importing the modules registers their classes.
    from dpinfer.mechanisms import (  # noqa: F401
        adapmixed,
        amin,
        dp_decoding,
        dp_fusion,
        dp_prompt,
        invisibleink,
        sampler,
    )


def available_mechanisms() -> list[str]:
    """Names accepted by :func:`get_mechanism`."""
    _load_builtin()
    return sorted(_REGISTRY)


def get_mechanism(name: str, **params: Any) -> Mechanism:
    """Build the registered mechanism ``name`` with ``params`` (validated by its constructor)."""
    _load_builtin()
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise ConfigurationError(
            f"unknown mechanism {name!r}; available: {', '.join(sorted(_REGISTRY))}"
        ) from None
    return cls(**params)


__all__ = [
    "Mechanism",
    "Mode",
    "StepInfo",
    "StepResult",
    "available_mechanisms",
    "get_mechanism",
    "register",
]
