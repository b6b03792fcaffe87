"""The non-private sampler: temperature, top-k, top-p, greedy. No privacy guarantee.

It powers :func:`dpinfer.generate` and the ``original`` baselines. In ``independent`` mode (the default) each of the
K rows gets its own token; in ``joint`` mode only row ``row`` (default 0) is read and its token goes to every row.
"""

from __future__ import annotations

import torch

from dpinfer.errors import ConfigurationError
from dpinfer.mechanisms import register
from dpinfer.mechanisms.base import Mechanism, Mode, StepInfo, StepResult
from dpinfer.mechanisms.transforms import LogitsTransform, Temperature, TopK, TopP, apply


def sample_probs(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One index per row of ``probs`` (``(..., V)``, ≥ 0, not necessarily normalised), drawn by inverting each row's
    CDF with ONE uniform per row from ``generator``.

    The uniform is kept strictly below the row's total mass, so the first index whose cumulative mass exceeds it has
    positive probability: a zero-probability token is never drawn. Every sampler of dpinfer draws this way (unlike
    ``torch.multinomial``, which draws one exponential per vocabulary entry), so two mechanisms run with the same seed
    consume the same uniforms: at λ = 0, DP-Fusion and NER scrubbing release the same text, and benchmarks compare
    methods on common random numbers. Each method's output distribution is unaffected.

    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> sample_probs(torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 0.0]], dtype=torch.float64), g).tolist()
    [1, 0]
    """
    cdf = probs.cumsum(dim=-1)
    total = cdf[..., -1:]
    u = torch.rand(total.shape, dtype=cdf.dtype, generator=generator, device=cdf.device)
    x = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, x, right=True).squeeze(-1)


def sample_rows(logits: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Draw one token per row from ``softmax(logits)`` (rows may hold ``-inf``) with ``generator``
    (:func:`sample_probs`)."""
    return sample_probs(torch.softmax(logits, dim=-1), generator)


@register("sampler")
class Sampler(Mechanism):
    """Plain decoding: ``temperature == 0`` is greedy (argmax, ties to the lowest id, as in transformers).

    >>> import torch
    >>> s = Sampler(temperature=0.0)
    >>> g = torch.Generator().manual_seed(0)
    >>> z = torch.tensor([[0.0, 2.0, 1.0], [5.0, 0.0, 0.0]], dtype=torch.float64)
    >>> s.step(z, StepInfo(step=0, max_new_tokens=1, num_contexts=2), g).tokens.tolist()
    [1, 0]
    """

    name = "sampler"

    def __init__(self, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                 mode: Mode = "independent", row: int = 0) -> None:
        if mode not in ("joint", "independent"):
            raise ConfigurationError(f"mode must be 'joint' or 'independent', got {mode!r}")
        if not (isinstance(temperature, (int, float)) and temperature >= 0):
            raise ConfigurationError(f"temperature must be ≥ 0 (0 = greedy), got {temperature!r}")
        self.greedy = temperature == 0
        self.transforms: list[LogitsTransform] = []
        if not self.greedy:
            self.transforms.append(Temperature(temperature))
            if top_k is not None:
                self.transforms.append(TopK(top_k))
            if top_p is not None:
                self.transforms.append(TopP(top_p))
        self.temperature, self.top_k, self.top_p, self.row = float(temperature), top_k, top_p, row
        self.mode = mode  # type: ignore[misc]  # instance override of the class default

    def start(self, num_contexts: int, vocab_size: int) -> None:
        if self.mode == "joint" and not 0 <= self.row < num_contexts:
            raise ConfigurationError(f"row {self.row} out of range for {num_contexts} contexts")

    def step(self, logits: torch.Tensor, info: StepInfo, generator: torch.Generator) -> StepResult:
        rows = logits[self.row : self.row + 1] if self.mode == "joint" else logits
        if self.greedy:
            tokens = rows.argmax(dim=-1)
        else:
            tokens = sample_rows(apply(self.transforms, rows), generator)
        return StepResult(tokens=tokens[0] if self.mode == "joint" else tokens)
