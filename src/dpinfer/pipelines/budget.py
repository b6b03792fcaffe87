"""Charging a release to a privacy-budget ledger, under its older import path: it lives in
:mod:`dpinfer.accounting.spend`."""

from __future__ import annotations

from dpinfer.accounting.spend import (
    NO_PRIVACY,
    LedgerCharges,
    LedgerLike,
    Spend,
    charged,
    current_spend,
    open_ledger,
    pure_steps_estimate,
    single_order_estimate,
    start_spend,
    zcdp_estimate,
)

__all__ = ["NO_PRIVACY", "LedgerCharges", "LedgerLike", "Spend", "charged", "current_spend", "open_ledger",
           "pure_steps_estimate", "single_order_estimate", "start_spend", "zcdp_estimate"]
