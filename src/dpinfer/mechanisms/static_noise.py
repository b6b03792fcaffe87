"""Static noise — the PAD paper's baseline: fixed Gaussian noise on every logit of the private context. No guarantee.

Per token, ``ℓ̃ = ℓ_ctx + N(0, σ²I)`` on the (finite) logits of the question with its retrieved documents, then the
argmax (τ = 0, default) or a sample from ``softmax(ℓ̃/τ)``. The logits are never clipped, so the noise bounds nothing:
the guarantee is none. Noise from the run's source (secure by default).

>>> mech = StaticNoise(sigma=1.0)
>>> mech.start(1, 3)
>>> from dpinfer.mechanisms.base import StepInfo
>>> int(mech.step(torch.tensor([[0.0, 50.0, 0.0]], dtype=torch.float64), StepInfo(0, 4, 1),
...               torch.Generator().manual_seed(0)).tokens)
1
>>> print(mech.guarantee(4))
static: no privacy guarantee.
"""

from __future__ import annotations

import math

import torch

from dpinfer.accounting import Guarantee
from dpinfer.checks import positive_int
from dpinfer.errors import ConfigurationError, InvalidInputError
from dpinfer.mechanisms.base import Mechanism, StepInfo, StepResult
from dpinfer.mechanisms.randomness import Randomness, as_random_source
from dpinfer.mechanisms.sampler import sample_probs


class StaticNoise(Mechanism):
    """Fixed Gaussian noise σ on every logit of the one (private) context, then argmax (τ = 0) or sampling at τ."""

    name = "static"
    mode = "joint"

    def __init__(self, *, sigma: float = 1.0, temperature: float = 0.0) -> None:
        if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not (math.isfinite(sigma) and sigma > 0):
            raise ConfigurationError(f"sigma must be a finite number > 0, got {sigma!r}")
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not (
                math.isfinite(temperature) and temperature >= 0):
            raise ConfigurationError(f"temperature must be a finite number ≥ 0 (0 = argmax), got {temperature!r}")
        self.sigma, self.temperature = float(sigma), float(temperature)

    def start(self, num_contexts: int, vocab_size: int) -> None:
        if num_contexts != 1:
            raise ConfigurationError(f"static noise decodes one context (the question with its documents), got "
                                     f"{num_contexts}")

    def step(self, logits: torch.Tensor, info: StepInfo, generator: Randomness) -> StepResult:
        if logits.ndim != 2 or logits.shape[0] != 1:
            raise InvalidInputError(f"static noise needs logits of shape (1, V), got {tuple(logits.shape)}")
        z = logits[0].to(torch.float64)
        total = float(z.sum())
        if math.isnan(total) or total == math.inf:
            raise InvalidInputError("the logits contain NaN or +inf; nothing is released")
        src = as_random_source(generator)
        noisy = torch.where(torch.isfinite(z), z + self.sigma * src.normal(z.shape, device=z.device), z)
        if self.temperature == 0.0:
            tok = torch.argmax(noisy)
        else:
            tok = sample_probs(torch.softmax(noisy / self.temperature, dim=-1), src)
        return StepResult(tokens=tok.to(torch.long))

    def guarantee(self, max_new_tokens: int) -> Guarantee:
        """None: the logits are not clipped, so the noise has no sensitivity to be calibrated against."""
        positive_int(max_new_tokens, "max_new_tokens")
        return Guarantee.no_privacy(self.name)
