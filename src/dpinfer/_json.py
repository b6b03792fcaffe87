"""JSON form of dpinfer values: non-finite floats become the strings "inf", "-inf", "nan" (valid JSON)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def plain(value: Any) -> Any:
    """``value`` with mappings as dicts, tuples and lists as lists, and non-finite floats as strings.

    >>> plain({"e": float("inf"), "xs": (1.0, float("nan"))})
    {'e': 'inf', 'xs': [1.0, 'nan']}
    """
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return [plain(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
