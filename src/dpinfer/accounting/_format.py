"""Number formatting for privacy statements: a printed ε or δ is rounded up, never down (:func:`format_up`, defined
in :mod:`dpinfer.checks` so that the checks below the accountant print figures the same way)."""

from __future__ import annotations

__all__ = []
