"""Scalar argument checks shared by every layer: one definition of "a valid δ", "a Rényi order", "a positive integer".

The bottom layer of dpinfer: it imports :mod:`dpinfer.errors` only, so the accountant, the mechanisms, the engine,
the pipelines and the command line all use the same checks and say the same thing. Each check returns the value
converted (``float`` / ``int``) or raises :class:`~dpinfer.errors.ConfigurationError` with a one-line message naming
the parameter and the value, never any input text. ``name`` is how the caller spells the parameter (``"delta"`` in the
API, ``"--delta"`` on the command line, ``"δ"`` in a formula); ``hint`` (appended as is) says what to do.

A number is an ``int`` or a ``float`` (or another real type such as a NumPy scalar); ``bool`` is refused everywhere.

>>> check_delta(1e-5), check_alpha(2), positive_int(3, "max_new_tokens")
(1e-05, 2.0, 3)
>>> check_delta(1.0)
Traceback (most recent call last):
...
dpinfer.errors.ConfigurationError: delta must lie strictly between 0 and 1, got 1.0 (e.g. 1e-5)
>>> one_of("x", "method", ["dp-fusion", "dp-prompt"])
Traceback (most recent call last):
...
dpinfer.errors.ConfigurationError: unknown method 'x'; choose one of dp-fusion, dp-prompt
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Iterable
from decimal import ROUND_CEILING, Decimal

from dpinfer.errors import ConfigurationError

__all__ = [
    "check_alpha",
    "check_delta",
    "check_order",
    "check_probability",
    "check_seed",
    "check_temperature",
    "check_top_p",
    "dp_fusion_floor_message",
    "finite_number",
    "format_up",
    "int_at_least",
    "is_number",
    "non_negative_number",
    "one_of",
    "optional_positive_int",
    "positive_int",
    "positive_number",
    "rdp_conversion_cost",
]


def is_number(value: object) -> bool:
    """A real number that is not a ``bool`` (``True`` is an ``int`` in Python, never a valid parameter here).

    >>> is_number(1), is_number(2.5), is_number(True), is_number("1")
    (True, True, False, False)
    """
    return not isinstance(value, bool) and isinstance(value, numbers.Real)


def finite_number(value: object, name: str, hint: str = "") -> float:
    """``value`` as a finite float (any sign).

    >>> finite_number(-1, "clip_min")
    -1.0
    """
    if not is_number(value) or not math.isfinite(value):  # type: ignore[arg-type]
        raise ConfigurationError(f"{name} must be a finite number, got {value!r}{hint}")
    return float(value)  # type: ignore[arg-type]


def positive_number(value: object, name: str, hint: str = "") -> float:
    """``value`` as a finite float > 0.

    >>> positive_number(0.5, "clip_norm C")
    0.5
    """
    if not is_number(value) or not (math.isfinite(value) and value > 0):  # type: ignore[arg-type,operator]
        raise ConfigurationError(f"{name} must be > 0 (a finite number), got {value!r}{hint}")
    return float(value)  # type: ignore[arg-type]


def non_negative_number(value: object, name: str, hint: str = "", *, allow_inf: bool = False) -> float:
    """``value`` as a float ≥ 0: finite unless ``allow_inf`` (e.g. an RDP value, where ∞ means "no bound").

    >>> non_negative_number(0, "a bound b"), non_negative_number(math.inf, "ε(α)", allow_inf=True)
    (0.0, inf)
    """
    ok = is_number(value) and value >= 0 and (allow_inf or math.isfinite(value))  # type: ignore[operator,arg-type]
    if not ok:
        what = "a number ≥ 0" if allow_inf else "a finite number ≥ 0"
        raise ConfigurationError(f"{name} must be {what}, got {value!r}{hint}")
    return float(value)  # type: ignore[arg-type]


def check_probability(value: object, name: str, hint: str = "", *, low_open: bool = False,
                      high_open: bool = False) -> float:
    """``value`` as a float in [0, 1], each end excluded when ``low_open`` / ``high_open``.

    >>> check_probability(0.5, "svt_threshold"), check_probability(0.0, "λ", high_open=True)
    (0.5, 0.0)
    """
    ok = is_number(value) and (0 < value if low_open else 0 <= value) and (  # type: ignore[operator]
        value < 1 if high_open else value <= 1  # type: ignore[operator]
    )
    if not ok:
        interval = ("(" if low_open else "[") + "0, 1" + (")" if high_open else "]")
        raise ConfigurationError(f"{name} must lie in {interval}, got {value!r}{hint}")
    return float(value)  # type: ignore[arg-type]


def check_delta(value: object, name: str = "delta", hint: str = " (e.g. 1e-5)") -> float:
    """δ strictly between 0 and 1.

    >>> check_delta(1e-6, "δ")
    1e-06
    """
    if not is_number(value) or not (math.isfinite(value) and 0 < value < 1):  # type: ignore[arg-type,operator]
        raise ConfigurationError(f"{name} must lie strictly between 0 and 1, got {value!r}{hint}")
    return float(value)  # type: ignore[arg-type]


def check_alpha(value: object, name: str = "alpha", hint: str = " (default 2)", label: str = " (the Rényi order)"
                ) -> float:
    """A Rényi order: a finite number > 1 (``label`` follows ``name`` in the message).

    >>> check_alpha(8)
    8.0
    >>> check_alpha(1, "the Rényi order α", "", label="")
    Traceback (most recent call last):
    ...
    dpinfer.errors.ConfigurationError: the Rényi order α must be a finite number > 1, got 1
    """
    if not is_number(value) or not (math.isfinite(value) and value > 1):  # type: ignore[arg-type,operator]
        raise ConfigurationError(f"{name}{label} must be a finite number > 1, got {value!r}{hint}")
    return float(value)  # type: ignore[arg-type]


def check_order(value: object, name: str = "a Rényi order α") -> float:
    """A Rényi order of an RDP curve: a number > 1, ``math.inf`` included (the max-divergence, pure DP).

    >>> check_order(math.inf), check_order(1.5)
    (inf, 1.5)
    """
    if not is_number(value) or not value > 1:  # type: ignore[operator]
        raise ConfigurationError(f"{name} must be > 1 (math.inf for pure DP), got {value!r}")
    return float(value)  # type: ignore[arg-type]


def check_temperature(value: object, name: str = "temperature", *, allow_zero: bool, hint: str = "") -> float:
    """A finite temperature, > 0 for a private mechanism (greedy decoding has no DP guarantee), ≥ 0 otherwise.

    >>> check_temperature(0, allow_zero=True), check_temperature(0.7, allow_zero=False)
    (0.0, 0.7)
    """
    ok = is_number(value) and math.isfinite(value) and (value >= 0 if allow_zero else value > 0)  # type: ignore
    if not ok:
        bound = "≥ 0 (0 = greedy)" if allow_zero else "> 0 (a private mechanism must sample; 0.7 is a good start)"
        raise ConfigurationError(f"{name} must be a finite number {bound}, got {value!r}{hint}")
    return float(value)  # type: ignore[arg-type]


def int_at_least(value: object, name: str, minimum: int, hint: str = "") -> int:
    """``value`` as an int ≥ ``minimum`` (bools and non-integers refused).

    >>> int_at_least(0, "seed", 0)
    0
    """
    if isinstance(value, bool):
        raise ConfigurationError(f"{name} must be an integer ≥ {minimum}, got {value!r}{hint}")
    try:
        n = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ConfigurationError(f"{name} must be an integer ≥ {minimum}, got {value!r}{hint}") from None
    if n < minimum:
        raise ConfigurationError(f"{name} must be an integer ≥ {minimum}, got {n}{hint}")
    return n


def positive_int(value: object, name: str, hint: str = "") -> int:
    """``value`` as an int ≥ 1 (bools and non-integers refused).

    >>> positive_int(2.0, "batch_size B")
    Traceback (most recent call last):
    ...
    dpinfer.errors.ConfigurationError: batch_size B must be an integer ≥ 1, got 2.0
    """
    return int_at_least(value, name, 1, hint)


def optional_positive_int(value: object, name: str, hint: str = " (or None)") -> int | None:
    """None (off / the full vocabulary), or an int ≥ 1.

    >>> optional_positive_int(None, "top_k"), optional_positive_int(50, "top_k")
    (None, 50)
    """
    return None if value is None else int_at_least(value, name, 1, hint)


def check_top_p(value: object, name: str = "top_p") -> float | None:
    """None (off), or a nucleus mass in (0, 1].

    >>> check_top_p(None), check_top_p(0.9)
    (None, 0.9)
    """
    if value is None:
        return None
    if not is_number(value) or not (0 < value <= 1):  # type: ignore[operator]
        raise ConfigurationError(f"{name} must lie in (0, 1], got {value!r}")
    return float(value)  # type: ignore[arg-type]


def check_seed(value: object, name: str = "seed") -> int | None:
    """None, or an integer ≥ 0.

    >>> check_seed(None), check_seed(7)
    (None, 7)
    """
    return None if value is None else int_at_least(value, name, 0)


def one_of(value: object, name: str, choices: Iterable[str]) -> str:
    """``value`` if it is one of ``choices`` (strings), else a message listing them."""
    options = tuple(choices)
    if not isinstance(value, str) or value not in options:
        raise ConfigurationError(f"unknown {name} {value!r}; choose one of {', '.join(options)}")
    return value


def format_up(value: float, digits: int = 3) -> str:
    """``value`` rounded up to ``digits`` significant digits (``"∞"`` for infinity), so a printed bound stays a bound.

    >>> format_up(4.2071), format_up(1e-05), format_up(123456.0), format_up(math.inf)
    ('4.21', '1e-05', '124000', '∞')
    """
    if math.isinf(value):
        return "∞"
    if value == 0:
        return "0"
    exact = Decimal(repr(float(value)))
    step = Decimal(1).scaleb(exact.adjusted() - digits + 1)
    return f"{float(exact.quantize(step, rounding=ROUND_CEILING)):g}"


def rdp_conversion_cost(alpha: float, delta: float) -> float:
    """What converting a Rényi bound held at the single order α to (ε, δ) costs on its own (Canonne, Kamath & Steinke
    2020): ``log1p(−1/α) − (log δ + log α)/(α − 1)``; the infimum of every reachable DP-Fusion ε at that α and δ.

    >>> round(rdp_conversion_cost(2.0, 1e-5), 4), round(rdp_conversion_cost(8.0, 1e-5), 4)
    (10.1266, 1.2141)
    """
    alpha, delta = check_alpha(alpha, "α", "", label=""), check_delta(delta, "δ")
    return math.log1p(-1.0 / alpha) - (math.log(delta) + math.log(alpha)) / (alpha - 1.0)


def dp_fusion_floor_message(epsilon: float, delta: float, alpha: float, *, group: str = "",
                            max_new_tokens: int | None = None, alpha_name: str = "α") -> str:
    """The one wording of "no DP-Fusion calibration reaches this ε" (the check before the model loads and the
    calibration itself say the same; ``alpha_name``: how the caller spells the order, e.g. ``--alpha``).

    >>> dp_fusion_floor_message(5, 1e-5, 2)[:72]
    'DP-Fusion cannot give a privacy group ε = 5 at δ = 1e-05: the smallest r'
    """
    floor = rdp_conversion_cost(alpha, delta)
    other = 8.0 if alpha < 8.0 else 4.0 * alpha
    who = f"group {group}" if group else "a privacy group"
    over = f" over {max_new_tokens} tokens" if max_new_tokens is not None else ""
    up = format_up(floor, 4)
    return (
        f"DP-Fusion cannot give {who} ε = {epsilon:g} at δ = {delta:g}{over}: the smallest reachable ε is {up} at "
        f"α = {alpha:g}, the cost of converting a Rényi bound held at that single order to (ε, δ) before any token is "
        f"generated. Ask for ε > {up}, a larger δ, or a larger {alpha_name} (the conversion costs "
        f"{format_up(rdp_conversion_cost(other, delta), 3)} at α = {other:g}); docs/sanitize.md explains how to "
        "choose ε."
    )
