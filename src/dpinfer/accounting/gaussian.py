"""The Gaussian mechanism's per-step loss event (PAD's rigorous step, :mod:`dpinfer.mechanisms.pad`).

A step releases ``μ(D) + N(0, σ²I)`` where ``‖μ(D) − μ(D′)‖₂ ≤ Δ`` for every adjacent pair: ``D_α = α·Δ²/(2σ²)`` for
every α > 1, i.e. ``Δ²/(2σ²)``-zCDP (Bun & Steinke 2016, Prop. 1.6; Mironov 2017, Prop. 7). Whatever is computed from
the released vector afterwards (an argmax, a sample) is post-processing and costs nothing more.

>>> GaussianShiftEvent(sensitivity=1.0, sigma=1.5).step_loss()
Zcdp(rho=0.2222222222222222)
"""

from __future__ import annotations

from dataclasses import dataclass

from dpinfer.accounting.accountant import LossEvent
from dpinfer.accounting.losses import Zcdp
from dpinfer.checks import positive_number

__all__ = ["GaussianShiftEvent"]


@dataclass(frozen=True)
class GaussianShiftEvent(LossEvent):
    """One release of a vector with ℓ2 sensitivity ``sensitivity`` (Δ) plus N(0, σ²I): ``ρ = Δ²/(2σ²)``-zCDP.

    For PAD: Δ = C under replace-by-null of the retrieved context (the neighbour's clipped shift is 0), Δ = 2C under
    replace-one (two clipped shifts).
    """

    sensitivity: float
    sigma: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "sensitivity", positive_number(self.sensitivity, "the sensitivity Δ"))
        object.__setattr__(self, "sigma", positive_number(self.sigma, "the noise σ"))

    @property
    def rho(self) -> float:
        """``Δ²/(2σ²)``."""
        return self.sensitivity**2 / (2.0 * self.sigma**2)

    def step_loss(self) -> Zcdp:
        return Zcdp(self.rho)
