"""The per-step loss events of the single-formula mechanisms: frozen, parameter-only, each docstring states the math.

The accountant (:mod:`dpinfer.accounting.accountant`) composes an event over the most steps a generation can take,
converts and calibrates. DP-Fusion's event, whose formula needs more room, lives in
:mod:`dpinfer.accounting.dp_fusion`.

>>> loss = UniformMixtureEvent(lam=0.5, vocab_size=4).step_loss()  # ε_tok = log((1 + 3·0.5)/(1 − 0.5)) = log 5
>>> type(loss).__name__, round(loss.epsilon, 12) == round(math.log(5.0), 12)
('PureDp', True)
>>> ClippedLogitsEvent(clip_min=-1.0, clip_max=2.0, temperature=0.5).epsilon_per_token
12.0
>>> ClippedExponentialEvent(clip_norm=0.5, batch_size=2, temperature=1.0).step_loss()
Zcdp(rho=0.03125)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpinfer.accounting.accountant import LossEvent
from dpinfer.accounting.losses import PureDp, Zcdp
from dpinfer.checks import check_probability, finite_number, int_at_least, positive_int, positive_number
from dpinfer.errors import ConfigurationError

__all__ = [
    "LAMBDA_MAX",
    "ClippedExponentialEvent",
    "ClippedLogitsEvent",
    "SparseVectorExponentialEvent",
    "UniformMixtureEvent",
    "check_clip_bounds",
    "check_vocab_size",
    "lambda_for_epsilon",
]

LAMBDA_MAX = math.nextafter(1.0, 0.0)
"""The largest λ < 1 a float represents; DP-Decoding's calibration never returns more (ε_tok ≈ 36.7 + log V there)."""


# ------------------------------------------------------------------------------------------------------ DP-Decoding
def check_vocab_size(vocab_size: object) -> int:
    """V, the width of the logits: an integer ≥ 2."""
    return int_at_least(vocab_size, "vocab_size", 2, " (the width of the model's logits, lm.vocab_size)")


def check_lambda(lam: object) -> float:
    """DP-Decoding's λ ∈ [0, 1) (λ = 1 samples from the model alone: no guarantee)."""
    return check_probability(
        lam, "lam (the weight of the model's distribution)",
        "; λ = 1 would sample from the model alone and has no guarantee. Use DPDecoding.calibrated(budget, spec) to "
        "pick λ for a target ε.",
        high_open=True,
    )


@dataclass(frozen=True)
class UniformMixtureEvent(LossEvent):
    """One DP-Decoding token (Majmudar et al. 2022): ``q = λ·softmax(z/τ) + (1 − λ)·uniform(V)``.

    Every ``q(v)`` lies in ``[(1 − λ)/V, λ + (1 − λ)/V]`` whatever the logits, so for any two private contexts and
    every token ``q(v)/q′(v) ≤ (1 + (V − 1)·λ)/(1 − λ)``: ``ε_tok = log((1 + (V − 1)·λ)/(1 − λ))``-DP (pure DP,
    :class:`~dpinfer.accounting.PureDp`), independent of τ and of the model.

    >>> UniformMixtureEvent(0.0, 10).epsilon_per_token
    0.0
    """

    lam: float
    vocab_size: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "lam", check_lambda(self.lam))
        object.__setattr__(self, "vocab_size", check_vocab_size(self.vocab_size))

    @property
    def epsilon_per_token(self) -> float:
        """``ε_tok = log1p((V − 1)·λ) − log1p(−λ)``."""
        return math.log1p((self.vocab_size - 1) * self.lam) - math.log1p(-self.lam)

    def step_loss(self) -> PureDp:
        return PureDp(self.epsilon_per_token)


def lambda_for_epsilon(epsilon: float, vocab_size: int) -> float:
    """The λ whose per-token loss is ``epsilon``: ``λ = (e^ε − 1)/(V − 1 + e^ε)``, capped at :data:`LAMBDA_MAX`.

    >>> round(lambda_for_epsilon(math.log(5.0), 4), 12)
    0.5
    """
    if not (isinstance(epsilon, (int, float)) and epsilon >= 0.0):
        raise ConfigurationError(f"a per-token ε must be a number ≥ 0, got {epsilon!r}")
    v = check_vocab_size(vocab_size)
    if epsilon > 700.0:  # e^ε overflows; λ is 1 to double precision
        return LAMBDA_MAX
    return min(math.expm1(epsilon) / (v - 1 + math.exp(epsilon)), LAMBDA_MAX)


# ------------------------------------------------------------------------------------------------------ DP-Prompt
def check_clip_bounds(clip_min: object, clip_max: object) -> tuple[float, float]:
    """``b_min < b_max``, both finite (DP-Prompt's clip bounds, from public data only)."""
    lo, hi = finite_number(clip_min, "clip_min (b_min)"), finite_number(clip_max, "clip_max (b_max)")
    if not lo < hi:
        raise ConfigurationError(
            f"the clip bounds need b_min < b_max, got clip_min={lo!r}, clip_max={hi!r}; derive them from public data "
            "with dpinfer.clip_bounds.clip_bounds(lm), never from the private prompt"
        )
    return lo, hi


def check_prompt_temperature(temperature: object) -> float:
    """DP-Prompt's τ > 0 (ε_tok is infinite at τ = 0)."""
    return positive_number(
        temperature, "temperature",
        "; ε_tok = 2(b_max − b_min)/τ is infinite at τ = 0. Use DPPrompt.calibrated(budget, spec) to pick τ for a "
        "target ε.",
    )


@dataclass(frozen=True)
class ClippedLogitsEvent(LossEvent):
    """One DP-Prompt token (Utpala et al. 2023): ``p(v) ∝ exp(clip(z_v, b_min, b_max)/τ)`` over the full vocabulary.

    The exponential mechanism with utility ``clip(z)``, each coordinate of which moves by at most
    ``Δ = b_max − b_min`` between any two prompts: ``log p(v) − log p′(v) ∈ [−2Δ/τ, 2Δ/τ]``, i.e.
    ``ε_tok = 2(b_max − b_min)/τ``-DP, and ε_tok-bounded-range (the loss ranges over an interval of width ε_tok), hence
    ``min(ε_tok, α·ε_tok²/8)``-RDP (Cesar & Rogers 2021, Lemma 3.2): ``PureDp(ε_tok, bounded_range=True)``.
    """

    clip_min: float
    clip_max: float
    temperature: float

    def __post_init__(self) -> None:
        lo, hi = check_clip_bounds(self.clip_min, self.clip_max)
        object.__setattr__(self, "clip_min", lo)
        object.__setattr__(self, "clip_max", hi)
        object.__setattr__(self, "temperature", check_prompt_temperature(self.temperature))

    @property
    def epsilon_per_token(self) -> float:
        """``ε_tok = 2(b_max − b_min)/τ``."""
        return 2.0 * (self.clip_max - self.clip_min) / self.temperature

    def step_loss(self) -> PureDp:
        return PureDp(self.epsilon_per_token, bounded_range=True)


# ------------------------------------------------------------------------------------------------------ InvisibleInk
@dataclass(frozen=True)
class ClippedExponentialEvent(LossEvent):
    """One InvisibleInk token (Vinod et al. 2025, Theorem 2): sampling from ``softmax(ℓ̄/τ)`` with DClip'd logits.

    Replacing one of B references by the null reference moves one clipped difference from ``[−C, C]`` to 0, so the
    aggregate ``ℓ̄`` moves by at most ``C/B`` per coordinate: an exponential mechanism with utility sensitivity
    ``C/(Bτ)``, ``2C/(Bτ)``-bounded-range, hence ``ρ₀ = ½·(C/(Bτ))² = C²/(2B²τ²)``-zCDP (Cesar & Rogers 2021).
    """

    clip_norm: float
    batch_size: int
    temperature: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "clip_norm", positive_number(self.clip_norm, "clip_norm C"))
        object.__setattr__(self, "batch_size", positive_int(self.batch_size, "batch_size B"))
        object.__setattr__(self, "temperature", positive_number(self.temperature, "temperature τ"))

    @property
    def rho(self) -> float:
        """``ρ₀ = C²/(2B²τ²)``."""
        return self.clip_norm**2 / (2.0 * self.batch_size**2 * self.temperature**2)

    def step_loss(self) -> Zcdp:
        return Zcdp(self.rho)


# ------------------------------------------------------------------------------------------------------ Amin et al.
@dataclass(frozen=True)
class SparseVectorExponentialEvent(LossEvent):
    """One PRIVATE token of Amin et al. (2024) with its AboveThreshold run (dpinfer's analysis, ALGORITHMS §2).

    The aggregate of B recentred, clipped rows has ℓ∞ sensitivity ``d = 2C/B`` under replace-by-null (``C/B``, the
    zero-out sensitivity granted in the InvisibleInk paper's experiments, when ``as_published``). The private token is
    an exponential mechanism with utility sensitivity ``d/τ``: ``ρ_tok = ½·(d/τ)²``-zCDP. With the sparse-vector test
    (noise σ), the query ``‖p̄ − p_pub‖₁`` has sensitivity ``Δ_q = min(2, e^{2d/τ} − 1)`` and each AboveThreshold run
    is ``2Δ_q/σ``-DP, i.e. ``½·(2Δ_q/σ)²``-zCDP. One run ends at each private token, so one event is both.

    >>> SparseVectorExponentialEvent(1.0, 2, 1.0, svt_noise=None).step_loss()
    Zcdp(rho=0.5)
    """

    clip_norm: float
    batch_size: int
    temperature: float
    svt_noise: float | None = None
    as_published: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "clip_norm", positive_number(self.clip_norm, "clip_norm C"))
        object.__setattr__(self, "batch_size", positive_int(self.batch_size, "batch_size B"))
        object.__setattr__(self, "temperature", positive_number(self.temperature, "temperature τ"))
        if self.svt_noise is not None:
            object.__setattr__(self, "svt_noise", positive_number(self.svt_noise, "svt_noise σ"))

    @property
    def sensitivity(self) -> float:
        """ℓ∞ sensitivity of the aggregated logits: ``2C/B`` (replace-by-null), ``C/B`` as published."""
        return (1.0 if self.as_published else 2.0) * self.clip_norm / self.batch_size

    @property
    def rho(self) -> float:
        """``½·(d/τ)² + ½·(2Δ_q/σ)²`` (second term only with the SVT)."""
        d = self.sensitivity / self.temperature
        rho = 0.5 * d * d
        if self.svt_noise is not None:
            dq = min(2.0, math.expm1(2.0 * d))
            rho += 0.5 * (2.0 * dq / self.svt_noise) ** 2
        return rho

    def step_loss(self) -> Zcdp:
        return Zcdp(self.rho)
