"""Empirical privacy audits: does a mechanism's output tell two neighbouring inputs apart more than its claimed ε
allows?

For each registered mechanism, :mod:`dpinfer.audit.scenarios` calibrates it to a modest claim and builds two
neighbouring inputs on a small-vocabulary stand-in; :mod:`dpinfer.audit.runner` runs it many times on each, fits a
likelihood-ratio test on separate trials, and turns the test's error rates on fresh trials into an ε lower bound with
Clopper–Pearson 95% intervals (:mod:`dpinfer.audit.stats`). :mod:`dpinfer.audit.broken` holds deliberately broken
variants (never registered) that the audit must catch.

>>> result = audit("dp-decoding", trials=400, seed=0)
>>> result.claimed_epsilon, 0.0 < result.epsilon_lb <= result.claimed_epsilon
(4.0, True)
>>> audit("dp-fusion", trials=400, seed=0, broken="no-clip").exceeds
True
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dpinfer.audit.runner import AuditResult

DEFAULT_TRIALS = 20000
"""Generations on each of the two inputs (a quarter select the test, the rest measure it)."""


def audit(mechanism: str, *, trials: int = DEFAULT_TRIALS, seed: int | None = None,
          broken: str | None = None) -> AuditResult:
    """Audit the registered ``mechanism`` (or its ``broken`` variant) with ``trials`` runs on each input; ``seed``
    makes it reproducible (default: a seed from :mod:`secrets`)."""
    from dpinfer.audit.runner import run_audit
    from dpinfer.audit.scenarios import scenario

    return run_audit(scenario(mechanism, broken), trials=trials, seed=seed)


def __getattr__(name: str) -> Any:
    # torch-backed names load on first use, so that building the CLI parser (which imports this package) stays light
    if name == "AuditResult":
        from dpinfer.audit.runner import AuditResult

        return AuditResult
    if name in ("broken_variants", "scenario"):
        from dpinfer.audit import scenarios

        return getattr(scenarios, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DEFAULT_TRIALS", "AuditResult", "audit", "broken_variants", "scenario"]
