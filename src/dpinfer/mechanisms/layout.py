"""Context-layout checks shared by the mechanisms' :meth:`~dpinfer.mechanisms.Mechanism.start`: does the number of
rows the engine steps match what the guarantee covers? (Scalar parameter checks live in :mod:`dpinfer.checks`.)

>>> check_batch_layout("InvisibleInk", batch_size=3, num_contexts=4)  # row 0 public, rows 1..3 references
>>> check_row_layout("independent", 0, 3, covered=2, count_name="n", rows_do="rewrite")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
dpinfer.errors.ConfigurationError: 3 rows rewrite but the guarantee covers n=2; build the mechanism ...
"""

from __future__ import annotations

from dpinfer.errors import ConfigurationError

__all__ = ["check_batch_layout", "check_row_layout"]


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


def check_batch_layout(mechanism: str, batch_size: int, num_contexts: int) -> None:
    """The layout of the batch mechanisms: row 0 public, rows 1..B one reference each (K = B + 1)."""
    if num_contexts != batch_size + 1:
        raise ConfigurationError(
            f"{mechanism} with B = {batch_size} references steps B + 1 = {batch_size + 1} contexts "
            f"(row 0 public, rows 1..B one reference each), got {num_contexts}"
        )
