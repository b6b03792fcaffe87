"""Argument checks shared by the mechanisms' constructors (actionable messages, never private data)."""

from __future__ import annotations

import operator

from dpinfer.errors import ConfigurationError


def positive_int(value: object, name: str) -> int:
    """``value`` as an int ≥ 1 (bools and non-integers refused)."""
    if isinstance(value, bool):
        raise ConfigurationError(f"{name} must be an integer ≥ 1, got {value!r}")
    try:
        n = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ConfigurationError(f"{name} must be an integer ≥ 1, got {value!r}") from None
    if n < 1:
        raise ConfigurationError(f"{name} must be an integer ≥ 1, got {n}")
    return n


def check_delta(delta: object) -> float:
    """δ strictly between 0 and 1."""
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0.0 < delta < 1.0:
        raise ConfigurationError(f"δ must lie strictly between 0 and 1, got {delta!r}; 1e-5 is a common choice")
    return float(delta)


def check_row_layout(mode: str, row: int, num_contexts: int, covered: int, count_name: str, rows_do: str) -> None:
    """The layout check of the single-context baselines: in joint mode ``row`` must exist; in independent mode the
    guarantee covers ``covered`` rows (``count_name``), so more rows than that are refused. ``rows_do`` says what the
    rows do, for the message (e.g. "rewrite the private prompt")."""
    if mode == "joint" and not 0 <= row < num_contexts:
        raise ConfigurationError(f"row {row} out of range for {num_contexts} contexts")
    if mode == "independent" and num_contexts > covered:
        raise ConfigurationError(
            f"{num_contexts} rows {rows_do} but the guarantee covers {count_name}={covered}; build the mechanism with "
            f"{count_name} ≥ {num_contexts}"
        )
