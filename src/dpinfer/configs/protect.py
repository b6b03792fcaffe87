"""``ProtectConfig``: the settings of prompt protection (:func:`dpinfer.protect_prompt`, ``dpinfer protect-prompt``).

Defaults from :data:`dpinfer.defaults.PROTECT`, checks from :mod:`dpinfer.checks` in ``__post_init__`` (before any
model loads). The method itself is looked up in the prompt method table (:mod:`dpinfer.methods.prompt`) when the
pipeline dispatches; the method says how many stage-1 rewrites it makes and which settings apply to it.

>>> ProtectConfig(temperature=0.5).replace(n_keywords=5).n_keywords
5
>>> ProtectConfig(epsilon=1.0, temperature=1.0)
Traceback (most recent call last):
...
dpinfer.errors.ConfigurationError: give exactly one of epsilon or temperature, not both (ε fixes τ)
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from dpinfer.checks import check_delta, int_at_least, one_of, positive_number
from dpinfer.configs.base import Config, option
from dpinfer.defaults import PROTECT
from dpinfer.errors import ConfigurationError


def quorum_arg(text: str) -> int | None:
    """``--stage3-quorum``: an integer, or ``all`` (None: every final decoded to its end).

    >>> quorum_arg("3"), quorum_arg("all")
    (3, None)
    """
    if text.strip().lower() == "all":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"give an integer ≥ 1 or 'all', got {text!r}") from None


def check_quorum(quorum: object, name: str = "stage3_quorum") -> None:
    """``quorum`` is None or an integer ≥ 1 (a bool is refused)."""
    if quorum is not None and (isinstance(quorum, bool) or not isinstance(quorum, int) or quorum < 1):
        whole = "all" if name.startswith("--") else 'None ("all" in a service request)'
        got = "an integer < 1" if isinstance(quorum, int) and not isinstance(quorum, bool) else (
            f"a {type(quorum).__name__}")
        raise ConfigurationError(f"{name} must be an integer ≥ 1, or {whole} to decode every final prompt to its end; "
                                 f"got {got}")

KEYWORD_METHODS = ("ndp", "jem")
"""How stage 2 releases the keywords: the top K as they are, or the Joint Exponential Mechanism."""
SUPPRESS_METHODS = ("ban", "instruct")
"""How stage 3 keeps the keywords out of the final prompt: asked and banned while decoding, or asked only."""


@dataclass(frozen=True)
class ProtectConfig(Config):
    """Every setting of a prompt-protection release (see :func:`dpinfer.protect_prompt` for each one's meaning).

    ``spelling`` is how messages name a setting: ``"api"`` (``n_rewrites``) or ``"cli"`` (``--n-rewrites``); the
    settings declared ``request=True`` are those a service request body may give.
    """

    method: str = option(PROTECT.method, cli=False, request=True, help="the prompt method (the method table's names)")
    epsilon: float | None = option(None, type=float, cli=False, request=True,
                                   help="target ε of all rewrites together (τ is calibrated to it)")
    temperature: float | None = option(None, type=float, cli=False,
                                       help=f"stage-1 temperature τ (default {PROTECT.temperature:g})")
    delta: float = option(PROTECT.delta, request=True, help=f"δ (default {PROTECT.delta:g})")
    n_rewrites: int | None = option(None, type=int, request=True,
                                    help=f"stage-1 rewrites (default {PROTECT.n_rewrites}; dp-prompt: 1)")
    n_keywords: int = option(PROTECT.n_keywords, request=True,
                             help=f"K keywords to avoid (default {PROTECT.n_keywords})")
    keywords: str = option(PROTECT.keywords, choices=KEYWORD_METHODS, request=True,
                           help="ndp (default): the top K as they are; jem: Joint Exponential Mechanism over a "
                                "fixed public word universe")
    max_new_tokens: int = option(PROTECT.max_new_tokens, request=True,
                                 help=f"T_max of each rewrite and of the final prompt, fixed in advance (default "
                                      f"{PROTECT.max_new_tokens})")
    jem_epsilon: float = option(PROTECT.jem_epsilon,
                                help=f"ε₂ of JEM (default {PROTECT.jem_epsilon:g}; not added to ε)")
    suppress: str = option(PROTECT.suppress, choices=SUPPRESS_METHODS,
                           help="how the final rewrite avoids the keywords: ban (default): asked to and banned while "
                                "decoding; instruct: asked to only (the paper's template)")
    n_exemplars: int = option(PROTECT.n_exemplars, request=True,
                              help=f"final prompts written, one from each of the lowest-perplexity rewrites; the one "
                                   f"closest to the rewrites' consensus is released (default {PROTECT.n_exemplars}; "
                                   "1: the paper's one exemplar)")
    stage3_quorum: int | None = option(PROTECT.stage3_quorum, type=quorum_arg, metavar="N|all", request=True,
                                       words={"all": None},
                                       help=f"stage 3 stops decoding a prompt's final prompts once N of them are "
                                            f"complete, the others cut where they are (default "
                                            f"{PROTECT.stage3_quorum}; all: decode every final to its end)")
    stage3_int8: bool = option(PROTECT.stage3_int8,
                               help="decode stage 3 (the final prompts: public post-processing) on int8 copies of a "
                                    "float32 CPU model's linear layers, about 2x faster decode steps (default on; "
                                    "stage 1 always runs in float32; no effect on a GPU)")
    max_input_tokens: int = option(PROTECT.max_input_tokens,
                                   help=f"a public cap on the prompt: a longer one is cut to its first N tokens before "
                                        f"stage 1, silently (its length is private; default "
                                        f"{PROTECT.max_input_tokens})")

    def __post_init__(self) -> None:
        super().__post_init__()
        n = self.name
        if not isinstance(self.method, str) or not self.method:
            raise ConfigurationError(f"method must be a method name, got {self.method!r}")
        one_of(self.keywords, "keywords method", KEYWORD_METHODS)
        one_of(self.suppress, n("suppress"), SUPPRESS_METHODS)
        check_quorum(self.stage3_quorum, n("stage3_quorum"))
        if not isinstance(self.stage3_int8, bool):
            raise ConfigurationError(f"{n('stage3_int8')} must be True or False, got {self.stage3_int8!r}")
        if self.epsilon is not None and self.temperature is not None:
            raise ConfigurationError(f"give exactly one of {n('epsilon')} or {n('temperature')}, not both (ε fixes τ)")
        if self.epsilon is not None:
            positive_number(self.epsilon, n("epsilon"), " (the target ε of all rewrites together)")
        if self.temperature is not None:
            positive_number(self.temperature, n("temperature"), " (ε_tok = 2(b_max − b_min)/τ is infinite at τ = 0)")
        check_delta(self.delta, n("delta"))
        if self.n_rewrites is not None:
            int_at_least(self.n_rewrites, n("n_rewrites"), 1)
        int_at_least(self.n_keywords, n("n_keywords"), 1)
        int_at_least(self.n_exemplars, n("n_exemplars"), 1)
        int_at_least(self.max_input_tokens, n("max_input_tokens"), 1, " (a public cap on the prompt's tokens)")
        int_at_least(self.max_new_tokens, n("max_new_tokens"), 1,
                     " (T_max: fixed in advance, never the prompt's length)")
        positive_number(self.jem_epsilon, n("jem_epsilon"))


__all__ = ["KEYWORD_METHODS", "SUPPRESS_METHODS", "ProtectConfig"]
