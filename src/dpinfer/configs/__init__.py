"""Typed task configs: frozen dataclasses with defaults from :mod:`dpinfer.defaults` and checks from
:mod:`dpinfer.checks` in ``__post_init__`` (one module each; :mod:`dpinfer.configs.base` holds what they share).

``SanitizeConfig`` (:mod:`dpinfer.configs.sanitize`), ``SynthConfig`` (:mod:`dpinfer.configs.synth`), ``AskConfig``
(:mod:`dpinfer.configs.ask`), ``ProtectConfig`` (:mod:`dpinfer.configs.protect`) are imported on first use.
"""

from __future__ import annotations

from dpinfer._lazy import lazy_names
from dpinfer.configs.base import Config, add_options, option

_LAZY = {
    "SanitizeConfig": "dpinfer.configs.sanitize",
    "SynthConfig": "dpinfer.configs.synth",
    "AskConfig": "dpinfer.configs.ask",
    "ProtectConfig": "dpinfer.configs.protect",
}

__all__ = ["Config", "add_options", "option", *sorted(_LAZY)]


__getattr__, __dir__ = lazy_names("dpinfer.configs", _LAZY, globals())
