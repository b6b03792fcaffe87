"""Rényi divergences and mixtures of next-token distributions, in float64 from log-probabilities.

``D_α(P‖Q) = 1/(α−1)·log Σ_v P_v^α Q_v^(1−α)`` (van Erven & Harremoës 2014, "Rényi Divergence and Kullback-Leibler
Divergence", Def. 2), its symmetric form ``D↔_α(P, Q) = max(D_α(P‖Q), D_α(Q‖P))`` (DP-Fusion's constraint), and the
mixture ``(1 − λ)·P + λ·Q``: the building blocks of DP-Fusion (:mod:`dpinfer.mechanisms.dp_fusion`), AdaPMixED
(:mod:`dpinfer.mechanisms.adapmixed`) and the mollification solver (:mod:`dpinfer.mechanisms.mollify`).
"""

from __future__ import annotations

import math

import torch

from dpinfer.checks import check_alpha
from dpinfer.errors import InvalidInputError

__all__ = ["mix", "renyi_divergence", "symmetric_renyi"]

_NEG_INF = -math.inf


def renyi_divergence(logp: torch.Tensor, logq: torch.Tensor, alpha: float) -> torch.Tensor:
    """``D_α(P‖Q) = 1/(α−1) · log Σ_v P_v^α Q_v^(1−α)`` along the last dimension, from log-probabilities.

    Computed as ``logsumexp(α·log P + (1−α)·log Q)/(α−1)`` (van Erven & Harremoës 2014, "Rényi Divergence and
    Kullback-Leibler Divergence", Def. 2), never from clamped probabilities. A token with ``P_v = 0`` contributes
    nothing (also where ``Q_v = 0``); a token with ``P_v > 0 = Q_v`` makes the divergence ``+inf``.

    >>> import torch
    >>> p = torch.log(torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64))
    >>> q = torch.log(torch.tensor([0.25, 0.25, 0.5], dtype=torch.float64))
    >>> round(float(renyi_divergence(p, q, 2.0)), 6), float(renyi_divergence(q, p, 2.0))  # log 2, and inf
    (0.693147, inf)
    """
    alpha = check_alpha(alpha, "the Rényi order α", "", label="")
    terms = alpha * logp + (1.0 - alpha) * logq
    terms = terms.masked_fill(logp == _NEG_INF, _NEG_INF)
    return torch.logsumexp(terms, dim=-1) / (alpha - 1.0)


def symmetric_renyi(logp: torch.Tensor, logq: torch.Tensor, alpha: float) -> torch.Tensor:
    """``D↔_α(P, Q) = max(D_α(P‖Q), D_α(Q‖P))`` along the last dimension (DP-Fusion's constraint).

    >>> import torch
    >>> p = torch.log(torch.tensor([0.9, 0.1], dtype=torch.float64))
    >>> q = torch.log(torch.tensor([0.5, 0.5], dtype=torch.float64))
    >>> bool(symmetric_renyi(p, q, 2.0) == torch.maximum(renyi_divergence(p, q, 2.0), renyi_divergence(q, p, 2.0)))
    True
    """
    return torch.maximum(renyi_divergence(logp, logq, alpha), renyi_divergence(logq, logp, alpha))


def mix(logp_pub: torch.Tensor, logp_priv: torch.Tensor, lam: float | torch.Tensor) -> torch.Tensor:
    """``log((1 − λ)·p_pub + λ·p_i)``, computed with ``logaddexp``; ``lam`` is a scalar or one λ per private row.

    ``logp_pub`` is ``(V,)`` and ``logp_priv`` is ``(m, V)`` (or ``(V,)``); a λ of shape ``(m,)`` weighs row i by λ_i.

    >>> import torch
    >>> pub = torch.log(torch.tensor([1.0, 0.0], dtype=torch.float64))
    >>> priv = torch.log(torch.tensor([[0.0, 1.0], [0.5, 0.5]], dtype=torch.float64))
    >>> mix(pub, priv, torch.tensor([0.25, 1.0], dtype=torch.float64)).exp()
    tensor([[0.7500, 0.2500],
            [0.5000, 0.5000]], dtype=torch.float64)
    """
    lam_t = torch.as_tensor(lam, dtype=torch.float64, device=logp_priv.device)
    if lam_t.ndim >= 1 and lam_t.ndim == logp_priv.ndim - 1:
        lam_t = lam_t.unsqueeze(-1)
    if bool(((lam_t < 0) | (lam_t > 1) | torch.isnan(lam_t)).any()):
        raise InvalidInputError("λ must lie in [0, 1]")
    return torch.logaddexp(torch.log1p(-lam_t) + logp_pub, torch.log(lam_t) + logp_priv)
