"""DP-Prompt (Utpala et al. 2023), the baseline of prompt protection: one stage-1 rewrite, released as it is."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from dpinfer.configs.protect import ProtectConfig
from dpinfer.errors import ConfigurationError


class OneRewrite:
    """The ``dp-prompt`` method: exactly one rewrite, which is the release (no stage 2 or 3)."""

    name = "dp-prompt"
    rewrites = 1
    uses_embedder = False
    uses_stage3 = False

    def __init__(self, config: ProtectConfig) -> None:
        if config.n_rewrites is not None and config.n_rewrites != 1:
            other = "--method dp-gtr" if config.spelling == "cli" else "method='dp-gtr'"
            raise ConfigurationError(f"dp-prompt makes exactly one rewrite; drop {config.name('n_rewrites')} or use "
                                     f"{other}")
        self.config = config

    def settings(self) -> dict[str, Any]:
        """Stages 2 and 3 do not run: their settings do not apply."""
        return {"n_keywords": 0, "keywords": None, "jem_epsilon": None, "suppress": None, "n_exemplars": None}

    def parameters(self) -> dict[str, Any]:
        return {}

    def finish(self, engine: Any, lm: Any, rewrites: Sequence[Sequence[str]], sources: Sequence[Any], *,
               embedder: Any = None, lap: Callable[[str], None] | None = None,
               stages: dict[str, float] | None = None, stage3_engine: Any = None) -> list[tuple[str, str, list[str]]]:
        """Each prompt's one rewrite, as it is."""
        return [(rw[0], rw[0], []) for rw in rewrites]


def build(config: ProtectConfig, runtime: Any = None) -> OneRewrite:
    """The ``dp-prompt`` entry's builder (:mod:`dpinfer.methods.prompt`)."""
    return OneRewrite(config)
