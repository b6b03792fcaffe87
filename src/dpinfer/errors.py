"""Typed exceptions raised by dpinfer.

Every error dpinfer raises on purpose derives from :class:`DPInferError`, so callers (and the CLI) can catch one type.
Messages say what went wrong and how to fix it; they never contain private text (document content, prompts,
span strings): only sizes, offsets, labels, paths and parameter values.
"""

from __future__ import annotations


class DPInferError(Exception):
    """Base class of every error dpinfer raises deliberately."""


class InvalidInputError(DPInferError, ValueError):
    """The caller passed something dpinfer cannot use (empty text, bad spans, an unknown label, ...)."""


class ConfigurationError(DPInferError, ValueError):
    """A parameter is out of range or parameters contradict each other (ε ≤ 0, δ ∉ (0, 1), ...)."""


class InfeasibleBudgetError(ConfigurationError):
    """No value of the mechanism's knob reaches the requested (ε, δ); the message gives the smallest reachable ε."""


class ModelNotFoundError(DPInferError, FileNotFoundError):
    """A model name or path could not be resolved locally; the message says what to install."""


class MissingDependencyError(DPInferError, ImportError):
    """An optional back-end is not installed; the message gives the command that installs it (:func:`install_hint`)."""


class CorruptCacheError(DPInferError):
    """A cached artefact (e.g. the converted embedded model) cannot be read; the message says what to delete."""


class TaggingError(DPInferError):
    """The PII tagger failed. dpinfer fails closed: nothing is released when tagging fails."""


class DataNotFoundError(DPInferError, FileNotFoundError):
    """Evaluation data (``../shared/data``) is absent; the message says where it was looked for."""


class ContextTooLongError(InvalidInputError):
    """The prompt plus ``max_new_tokens`` does not fit the model's context window."""


class LedgerError(DPInferError):
    """A privacy-budget ledger cannot be used: the file is missing, corrupt or not a dpinfer ledger, a unit name is
    invalid, a charge is unknown. The message says what to do and never names private text."""


class BudgetExceededError(LedgerError):
    """A spend was refused before anything was generated: the unit has no budget, or this release would take its
    composed ε over the budget. The one-line message names the unit, its budget, what is spent and the cost."""


def install_hint(extra: str) -> str:
    """How to install an optional extra of dpinfer, in words that work from a clone of the repository (dpinfer is
    not on a package index).

    >>> install_hint("rag")
    'in the dpinfer folder: .venv/bin/pip install -e ".[rag]"'
    """
    return f'in the dpinfer folder: .venv/bin/pip install -e ".[{extra}]"'
