"""Number formatting for privacy statements: a printed ε or δ is rounded up, never down."""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, Decimal


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
