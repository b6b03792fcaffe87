"""Checks shared by the command line and the API, run before any model loads.

Parameter checks (:func:`check_sanitize_params`, :func:`check_generate_params`; synthesis: the
:class:`~dpinfer.configs.synth.SynthConfig` itself) are plain Python: no model, no torch, a few microseconds (the method
list is read without importing the mechanisms: :mod:`dpinfer.methods`). Budget checks (:func:`check_sanitize_budget`;
for synthesis :func:`dpinfer.methods.synthesize.build`) calibrate the mechanism from the parameters alone (they import
torch, still no model).
Path helpers refuse an output path that cannot be written, or that is the input, before any work is done, and write
results atomically (a temporary file in the same folder, then :func:`os.replace`).

Every message names parameters, values, sizes and paths only, never input text.
"""

from __future__ import annotations

from typing import Any

from dpinfer.checks import (
    check_seed,
    check_temperature,
    check_top_p,
    int_at_least,
    one_of,
    rdp_conversion_cost,
)
from dpinfer.configs.base import spelled
from dpinfer.configs.sanitize import SanitizeConfig
from dpinfer.defaults import GENERATE, SANITIZE
from dpinfer.errors import InvalidInputError


def _optional_k(value: object, name: str) -> None:
    """None (off / full vocabulary), ``"default"``, or an integer ≥ 1."""
    if value is None or value == "default":
        return
    int_at_least(value, name, 1, " (or None)")


# ------------------------------------------------------------------------------------------------------ commands
def check_method(task: str, method: object, name: str = "method") -> str:
    """``method`` as one of ``task``'s methods (:func:`dpinfer.methods.method_names`: the mechanisms registered for
    the task and its baselines); an unknown one is refused with the list (torch-free while no mechanism is imported).
    """
    from dpinfer.methods import method_names

    return one_of(method, name, method_names(task))


def check_groups(groups: object) -> None:
    """``groups`` (group name → TAB labels) is None or a mapping of non-empty names to label lists, no label twice."""
    if groups is not None:
        from dpinfer.taggers.resolve import check_group_labels

        check_group_labels(SanitizeConfig(groups=groups).groups or {})  # the shape, then the labels


def check_sanitize_config(config: SanitizeConfig, *, check_tagger: bool = True) -> SanitizeConfig:
    """The checks of a :class:`~dpinfer.configs.sanitize.SanitizeConfig` that need the method table or the tagger's
    labels (the config checked its scalars itself): a known method, greedy decoding for a baseline only, the labels
    of ``groups`` and the names of ``group_epsilon``, and (``check_tagger``) a known tagger name."""
    from dpinfer.methods.sanitize import TABLE
    from dpinfer.taggers.base import TAB_LABELS
    from dpinfer.taggers.resolve import check_group_labels

    n = config.name
    check_method("sanitize", config.method, n("method"))
    if config.temperature == 0 and not TABLE.get(config.method).baseline:
        check_temperature(config.temperature, n("temperature"), allow_zero=False)
    if config.groups is not None:
        check_group_labels(config.groups)
    for name in config.group_epsilon or {}:
        if name not in TAB_LABELS and name not in (config.groups or {}):
            raise InvalidInputError(f"{n('group_epsilon')} names a key that is neither a group nor a label; "
                                    f"labels: {', '.join(TAB_LABELS)}")
    if check_tagger and isinstance(config.tagger, str):
        from dpinfer.taggers.registry import available_taggers

        one_of(config.tagger, n("tagger"), available_taggers())
    return config


def check_sanitize_params(*, tagger: object = None, spelling: str = "api", **options: Any) -> SanitizeConfig:
    """Every parameter of :func:`dpinfer.sanitize` that can be checked without the document or the model, as the
    checked :class:`~dpinfer.configs.sanitize.SanitizeConfig` (``spelling="cli"``: messages name the command-line
    options, e.g. ``--max-new-tokens``; ``tagger``: a tagger name to check, None to leave it).

    >>> _ = check_sanitize_params(epsilon=10)
    >>> check_sanitize_params(epsilon=-1)
    Traceback (most recent call last):
    dpinfer.errors.ConfigurationError: epsilon must be > 0 (a finite number), got -1
    """
    check_method("sanitize", options.get("method", SANITIZE.method), spelled("method", spelling))
    config = SanitizeConfig(**options, **({"tagger": tagger} if tagger is not None else {}), spelling=spelling)
    return check_sanitize_config(config, check_tagger=tagger is not None)


def conversion_cost(alpha: float, delta: float) -> float:
    """The cost of converting a Rényi bound held at the single order α to (ε, δ), the infimum of every ε DP-Fusion
    reaches at that α and δ (:func:`dpinfer.checks.rdp_conversion_cost`, which the accountant uses too).

    >>> round(conversion_cost(2.0, 1e-5), 4)
    10.1266
    """
    return rdp_conversion_cost(alpha, delta)


def check_sanitize_budget(config: SanitizeConfig | None = None, **options: Any) -> None:
    """The method's own checks of the settings (:meth:`Method.check <dpinfer.methods.table.Method.check>`: for
    DP-Fusion, a target no calibration reaches is refused), from the settings alone: no document, no model, no torch.
    """
    from dpinfer.methods.sanitize import TABLE

    cfg = SanitizeConfig.merged(config, **options)
    TABLE.check(cfg.method, cfg, cfg.name("method"))


def check_generate_params(*, max_new_tokens: object = GENERATE.max_new_tokens,
                          temperature: object = GENERATE.temperature, top_k: object = GENERATE.top_k,
                          top_p: object = GENERATE.top_p, seed: object = None, spelling: str = "api") -> None:
    """Every parameter of plain :func:`dpinfer.generate` (``spelling="cli"``: messages name the options)."""

    def n(setting: str) -> str:
        return spelled(setting, spelling)

    int_at_least(max_new_tokens, n("max_new_tokens"), 1)
    check_temperature(temperature, n("temperature"), allow_zero=True)
    if top_k is not None:
        int_at_least(top_k, n("top_k"), 1, " (or None)")
    check_top_p(top_p, n("top_p"))
    check_seed(seed, n("seed"))


def check_text(value: object, what: str) -> str:
    """``value`` if it is a string holding more than white space; the message says the expected type otherwise."""
    if not isinstance(value, str):
        raise InvalidInputError(f"{what} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise InvalidInputError(f"{what} is empty (or only white space)")
    return value
