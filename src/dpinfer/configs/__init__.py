"""Typed task configs: frozen dataclasses with defaults from :mod:`dpinfer.defaults` and checks from
:mod:`dpinfer.checks` in ``__post_init__`` (one module each; :mod:`dpinfer.configs.base` holds what they share).

``SanitizeConfig`` (:mod:`dpinfer.configs.sanitize`), ``SynthConfig`` (:mod:`dpinfer.configs.synth`), ``AskConfig``
(:mod:`dpinfer.configs.ask`), ``ProtectConfig`` (:mod:`dpinfer.configs.protect`) are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from dpinfer.configs.base import Config, add_options, option

_LAZY = {
    "SanitizeConfig": "dpinfer.configs.sanitize",
    "SynthConfig": "dpinfer.configs.synth",
    "AskConfig": "dpinfer.configs.ask",
    "ProtectConfig": "dpinfer.configs.protect",
}

__all__ = ["Config", "add_options", "option", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dpinfer.configs' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
