"""Logit transforms: one small class per transform, in the style of transformers' ``LogitsProcessor``.

Each transform maps ``(K, V)`` float64 logits to ``(K, V)`` logits where excluded tokens are ``-inf``; it validates its
arguments in the constructor. They are pure functions of the rows they are given: privacy-aware code applies a
truncation computed from PUBLIC logits only (see :class:`PublicSupport`) to every row alike.

>>> import torch
>>> z = torch.tensor([[2.0, 1.0, 0.0, -1.0]], dtype=torch.float64)
>>> TopK(2)(z)
tensor([[2., 1., -inf, -inf]], dtype=torch.float64)
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from dpinfer.errors import ConfigurationError


class LogitsTransform(ABC):
    """A function ``(K, V) logits -> (K, V) logits``; ``-inf`` marks tokens removed from the support."""

    @abstractmethod
    def __call__(self, logits: torch.Tensor) -> torch.Tensor: ...


class Temperature(LogitsTransform):
    """Divide logits by ``τ > 0``: ``softmax(z / τ)``.

    >>> import torch
    >>> Temperature(0.5)(torch.tensor([[1.0, -1.0]], dtype=torch.float64))
    tensor([[ 2., -2.]], dtype=torch.float64)
    """

    def __init__(self, temperature: float) -> None:
        if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
            raise ConfigurationError(
                f"temperature must be a finite number > 0, got {temperature!r} (use greedy decoding for τ = 0)"
            )
        self.temperature = float(temperature)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        return logits if self.temperature == 1.0 else logits / self.temperature


class TopK(LogitsTransform):
    """Keep the ``k`` largest logits of each row (ties at the k-th value are kept).

    >>> import torch
    >>> TopK(1)(torch.tensor([[0.0, 3.0, 1.0]], dtype=torch.float64))
    tensor([[-inf, 3., -inf]], dtype=torch.float64)
    """

    def __init__(self, top_k: int) -> None:
        if not (isinstance(top_k, int) and top_k >= 1):
            raise ConfigurationError(f"top_k must be an integer ≥ 1, got {top_k!r}")
        self.top_k = top_k

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        k = min(self.top_k, logits.shape[-1])
        kth = torch.topk(logits, k, dim=-1).values[..., -1:]
        return logits.masked_fill(logits < kth, -torch.inf)


class TopP(LogitsTransform):
    """Nucleus: keep the smallest set of most likely tokens whose probability reaches ``top_p`` (at least one).

    >>> import torch
    >>> TopP(0.7)(torch.log(torch.tensor([[0.6, 0.3, 0.1]], dtype=torch.float64))).isfinite().tolist()
    [[True, True, False]]
    """

    def __init__(self, top_p: float) -> None:
        if not (isinstance(top_p, (int, float)) and 0.0 < top_p <= 1.0):
            raise ConfigurationError(f"top_p must be in (0, 1], got {top_p!r}")
        self.top_p = float(top_p)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if self.top_p >= 1.0:
            return logits
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # drop a token when the mass before it already reaches top_p
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= self.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        return logits.masked_fill(drop, -torch.inf)


class PublicSupport:
    """The token set S computed from PUBLIC logits only, applied to every row alike (ALGORITHMS §1 and §2).

    ``S = top-k(z_pub) ∪ {v : z_pub[v] ≥ kth_largest(z_pub) − margin}`` (``margin`` widens it like InvisibleInk's
    top-k⁺), optionally intersected with the nucleus ``top_p`` of ``softmax(z_pub / τ)``. Because S is a function of
    the public context alone it costs no privacy; a support computed from a private row would void the guarantee.

    >>> import torch
    >>> z = torch.tensor([[3.0, 2.0, 1.0, 0.0], [0.0, 0.0, 9.0, 0.0]], dtype=torch.float64)
    >>> PublicSupport(top_k=2)(z, public_row=0)[1].isfinite().tolist()
    [True, True, False, False]
    """

    def __init__(self, top_k: int | None = None, top_p: float | None = None, margin: float = 0.0) -> None:
        if top_k is not None and not (isinstance(top_k, int) and top_k >= 1):
            raise ConfigurationError(f"top_k must be None or an integer ≥ 1, got {top_k!r}")
        if top_p is not None and not 0.0 < top_p <= 1.0:
            raise ConfigurationError(f"top_p must be None or in (0, 1], got {top_p!r}")
        if not (math.isfinite(margin) and margin >= 0):
            raise ConfigurationError(f"margin must be ≥ 0, got {margin!r}")
        self.top_k, self.top_p, self.margin = top_k, top_p, float(margin)

    @property
    def is_full(self) -> bool:
        return self.top_k is None and (self.top_p is None or self.top_p >= 1.0)

    def mask(self, public_logits: torch.Tensor) -> torch.Tensor:
        """``(V,)`` bool: True for tokens in S."""
        keep = torch.ones_like(public_logits, dtype=torch.bool)
        if self.top_k is not None:
            k = min(self.top_k, public_logits.shape[-1])
            kth = torch.topk(public_logits, k).values[-1]
            keep &= public_logits >= kth - self.margin
        if self.top_p is not None and self.top_p < 1.0:
            keep &= TopP(self.top_p)(public_logits.unsqueeze(0))[0].isfinite()
        return keep

    def __call__(self, logits: torch.Tensor, public_row: int = 0) -> torch.Tensor:
        if self.is_full:
            return logits
        keep = self.mask(logits[public_row])
        return logits.masked_fill(~keep, -torch.inf)


class NoRepeatNGram:
    """Ban every token that would repeat an n-gram of the tokens generated so far (all rows alike).

    It reads only the released tokens, never a prompt, so in joint mode it is a public transform: applying it to
    every context before a mechanism leaves the mechanism's guarantee intact (the bound is checked on the
    transformed distributions). Counters the loops small models fall into on long rewrites.

    >>> import torch
    >>> z = torch.zeros(1, 5, dtype=torch.float64)
    >>> NoRepeatNGram(2)([[1, 2, 3, 1]], z)[0].isfinite().tolist()
    [True, True, False, True, True]
    """

    def __init__(self, n: int) -> None:
        if not (isinstance(n, int) and n >= 1):
            raise ConfigurationError(f"no_repeat_ngram_size must be an integer ≥ 1, got {n!r}")
        self.n = n

    def __call__(self, generated: Sequence[Sequence[int]], logits: torch.Tensor) -> torch.Tensor:
        n = self.n
        out = logits
        for row, seq in enumerate(generated):
            if len(seq) < n - 1:
                continue
            prefix = tuple(seq[len(seq) - n + 1:]) if n > 1 else ()
            banned = {seq[i + n - 1] for i in range(len(seq) - n + 1) if tuple(seq[i:i + n - 1]) == prefix}
            if banned:
                if out is logits:
                    out = logits.clone()
                rows = slice(None) if len(generated) == 1 else slice(row, row + 1)
                out[rows, list(banned)] = -torch.inf
        return out


def apply(transforms: Sequence[LogitsTransform], logits: torch.Tensor) -> torch.Tensor:
    """Apply ``transforms`` in order."""
    for tr in transforms:
        logits = tr(logits)
    return logits
