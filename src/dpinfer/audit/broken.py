"""Deliberately broken mechanisms, for the audit only (never registered, never used by a pipeline).

Each keeps its parent's ex-ante :meth:`~dpinfer.mechanisms.base.Mechanism.guarantee`, i.e. it *claims* what the
rigorous mechanism claims, while its :meth:`step` has a bug that voids the claim. ``dpinfer audit MECHANISM --broken
VARIANT`` must report an audited lower bound above that claim: the audit's power.

* ``no-clip``: DP-Fusion without mollification (λ = 1 for every group, so ``p_out`` is the mean of the private
  distributions); InvisibleInk with the clip norm ignored (no DClip: ``ℓ̄ = ℓ_pub + mean_i(ℓ_i − ℓ_pub)``).
* ``int8-public``: every row, the public one included, goes through a symmetric int8 quantisation with ONE scale for
  the whole ``(K, V)`` batch (``max|z|/127``), as a dynamic per-tensor quantisation of a batch does. The scale reads
  the private rows, so the public row depends on them (rule 2 of the project), and the mechanism's divergence bound
  or clipping, measured against that public row, no longer bounds what the output reveals.
* PAD (``pad``): ``no-clip`` (the centred shift is released unclipped), ``small-sigma`` (the noise is σ/4 while the
  claim is for σ) and ``large-clip`` (the shift is clipped at 4C while the claim is for C). The last two are worth
  16 times the claimed zCDP ρ (ε ≈ 21 against a claim of 4 in the audit's scenario).
"""

from __future__ import annotations

import math

import torch

from dpinfer.mechanisms.base import Mechanism, StepInfo, StepResult
from dpinfer.mechanisms.dp_fusion import DPFusion
from dpinfer.mechanisms.invisibleink import InvisibleInk, dclip_aggregate, topk_plus
from dpinfer.mechanisms.pad import Pad, centre_and_clip
from dpinfer.mechanisms.randomness import Randomness, as_random_source
from dpinfer.mechanisms.sampler import sample_probs


def shared_scale_int8(logits: torch.Tensor) -> torch.Tensor:
    """Quantise and dequantise every row with one symmetric int8 scale ``max|z|/127`` over the finite entries of
    the whole batch: the public row's values then depend on the private rows through the scale.

    >>> z = torch.tensor([[3.0, 0.0], [0.0, 127.0]], dtype=torch.float64)
    >>> shared_scale_int8(z)[0].tolist(), shared_scale_int8(z[:1])[0].tolist()
    ([3.0, 0.0], [3.0, 0.0])
    >>> shared_scale_int8(torch.tensor([[3.0, 0.0], [0.0, 1270.0]], dtype=torch.float64))[0].tolist()
    [0.0, 0.0]
    """
    z = logits.to(torch.float64)
    finite = torch.isfinite(z)
    peak = float(z[finite].abs().max()) if bool(finite.any()) else 0.0
    if peak == 0.0:
        return z
    scale = peak / 127.0
    q = torch.round(z / scale).clamp(-127, 127) * scale
    return torch.where(finite, q, z)


class DPFusionNoClip(DPFusion):
    """DP-Fusion with λ_i = 1 for every group: no mollification towards the public distribution (BROKEN)."""

    def step(self, logits: torch.Tensor, info: StepInfo, generator: torch.Generator) -> StepResult:
        z = self._scaled(logits)
        idx = self._support_ids(z[0])
        if idx is not None:
            z = z.index_select(1, idx)
        probs = torch.softmax(z[1:], dim=-1).mean(dim=0)
        j = sample_probs(probs, generator)
        token = idx[j] if idx is not None else j
        return StepResult(tokens=token.to(torch.long))


class DPFusionInt8Public(DPFusion):
    """DP-Fusion run on logits quantised with one int8 scale shared by the public and private rows (BROKEN)."""

    def step(self, logits: torch.Tensor, info: StepInfo, generator: torch.Generator) -> StepResult:
        return super().step(shared_scale_int8(logits), info, generator)


class InvisibleInkNoClip(InvisibleInk):
    """InvisibleInk with the clip norm ignored: ``ℓ̄ = ℓ_pub + mean_i(ℓ_i − ℓ_pub)`` unclipped (BROKEN). The Top-k⁺
    set still uses C, as the rigorous mechanism does. It decides alone (no batched path), so that the per-job
    :meth:`step` runs the broken :meth:`_released`."""

    def batch_key(self) -> None:
        return None

    def _released(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, float | None]:
        support, kth = topk_plus(z[0], self.top_k, self.clip_norm, self.batch_size)
        idx = None
        if not bool(support.all()):
            idx = support.nonzero().squeeze(-1)
            z = z.index_select(1, idx)
        agg = dclip_aggregate(z, math.inf) / self.temperature
        return torch.softmax(agg, dim=-1), idx, kth


class InvisibleInkInt8Public(InvisibleInk):
    """InvisibleInk run on logits quantised with one int8 scale shared by the public and private rows (BROKEN)."""

    def step(self, logits: torch.Tensor, info: StepInfo, generator: torch.Generator) -> StepResult:
        return super().step(shared_scale_int8(logits), info, generator)


class _PadBroken(Pad):
    """PAD whose clip is ``clip_factor``·C and whose noise is ``noise_factor``·σ, while its claim (``guarantee()``,
    inherited) is for C and σ (BROKEN). The public Top-k⁺ support still uses C."""

    clip_factor = 1.0
    noise_factor = 1.0

    def pre_noise_logits(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        idx, pub, _ = super().pre_noise_logits(logits)
        private = logits.to(torch.float64)[1].index_select(0, idx)
        return idx, pub, pub + centre_and_clip(private - pub, self.clip_norm * self.clip_factor)

    def step(self, logits: torch.Tensor, info: StepInfo, generator: Randomness) -> StepResult:
        idx, _, pre = self.pre_noise_logits(logits)
        src = as_random_source(generator)
        noisy = pre + self.sigma * self.noise_factor * src.normal(pre.shape, device=pre.device)
        if self.temperature == 0.0:
            j = torch.argmax(noisy)
        else:
            j = sample_probs(torch.softmax(noisy / self.temperature, dim=-1), src)
        return StepResult(tokens=idx[j].to(torch.long))


class PadNoClip(_PadBroken):
    """PAD releasing the centred shift unclipped (BROKEN)."""

    clip_factor = math.inf


class PadSmallSigma(_PadBroken):
    """PAD drawing its noise with σ/4 while claiming σ (BROKEN): 16× the claimed ρ."""

    noise_factor = 0.25


class PadLargeClip(_PadBroken):
    """PAD clipping the shift at 4C while claiming C (BROKEN): 16× the claimed ρ."""

    clip_factor = 4.0


BROKEN: dict[str, dict[str, type[Mechanism]]] = {
    "dp-fusion": {"no-clip": DPFusionNoClip, "int8-public": DPFusionInt8Public},
    "invisibleink": {"no-clip": InvisibleInkNoClip, "int8-public": InvisibleInkInt8Public},
    "pad": {"no-clip": PadNoClip, "small-sigma": PadSmallSigma, "large-clip": PadLargeClip},
}
"""``BROKEN[mechanism][variant]``: the audit-only broken subclasses."""
