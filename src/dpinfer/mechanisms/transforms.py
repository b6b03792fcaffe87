"""Logits processors: one small class per transform, one protocol, in the style of transformers' ``LogitsProcessor``.

Every processor is called as ``processor(generated, logits)`` (:class:`LogitsProcessor`): ``generated`` holds the tokens
released so far (one sequence per row, or one sequence for all rows in joint mode; processors that do not need it
ignore it) and ``logits`` is a ``(K, V)`` float64 tensor; it returns ``(K, V)`` logits where excluded tokens are
``-inf``, without modifying its input. Each class validates its arguments in the constructor and has a doctest.

A processor reads released tokens and the rows it is given, never a prompt. Privacy-aware code applies a truncation
computed from PUBLIC logits only to every row alike (:class:`PublicSupport`); the engine applies the processors it is
given (e.g. :class:`NoRepeatNGram`) to every context before the mechanism, so the mechanism's bound is checked on the
distributions actually sampled from.

>>> import torch
>>> z = torch.tensor([[2.0, 1.0, 0.0, -1.0]], dtype=torch.float64)
>>> apply([Temperature(0.5), TopK(2)], z)
tensor([[4., 2., -inf, -inf]], dtype=torch.float64)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from dpinfer.checks import check_probability, finite_number, optional_positive_int, positive_int, positive_number
from dpinfer.errors import ConfigurationError

__all__ = [
    "BanSequences",
    "LogitsProcessor",
    "LogitsTransform",
    "MinP",
    "NoRepeatNGram",
    "PublicSupport",
    "Temperature",
    "TopK",
    "TopP",
    "apply",
    "check_processors",
    "column_bans",
]

Generated = Sequence[Sequence[int]]
"""The tokens released so far: one sequence per row (independent mode), or one sequence shared by every row."""


@runtime_checkable
class LogitsProcessor(Protocol):
    """``(generated, logits) -> logits``: the one signature of every processor the engine and the samplers apply."""

    def __call__(self, generated: Generated, logits: torch.Tensor) -> torch.Tensor: ...


LogitsTransform = LogitsProcessor
"""The former name of :class:`LogitsProcessor` (transforms that ignore ``generated``)."""


def check_processors(processors: object) -> tuple[LogitsProcessor, ...]:
    """``processors`` as a tuple of :class:`LogitsProcessor` objects (a sequence of them; a string or a bare callable
    of another shape is refused).

    >>> check_processors([TopK(3)])
    (TopK(top_k=3),)
    >>> check_processors(TopK(3))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dpinfer.errors.ConfigurationError: processors must be a sequence of logits processors ..., got TopK
    """
    if isinstance(processors, (str, bytes)) or not isinstance(processors, Sequence):
        raise ConfigurationError(
            "processors must be a sequence of logits processors (callables (generated, logits) -> logits), got "
            f"{type(processors).__name__}"
        )
    for proc in processors:
        if not isinstance(proc, LogitsProcessor):
            raise ConfigurationError(
                f"every processor must be callable as processor(generated, logits), got {type(proc).__name__}"
            )
    return tuple(processors)


@dataclass(frozen=True)
class Temperature:
    """Divide logits by ``τ > 0``: ``softmax(z / τ)``.

    >>> import torch
    >>> Temperature(0.5)((), torch.tensor([[1.0, -1.0]], dtype=torch.float64))
    tensor([[ 2., -2.]], dtype=torch.float64)
    """

    temperature: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "temperature", positive_number(
            self.temperature, "temperature", " (use greedy decoding for τ = 0)"
        ))

    def __call__(self, generated: Generated, logits: torch.Tensor) -> torch.Tensor:
        return logits if self.temperature == 1.0 else logits / self.temperature


@dataclass(frozen=True)
class TopK:
    """Keep the ``k`` largest logits of each row (ties at the k-th value are kept).

    >>> import torch
    >>> TopK(1)((), torch.tensor([[0.0, 3.0, 1.0]], dtype=torch.float64))
    tensor([[-inf, 3., -inf]], dtype=torch.float64)
    """

    top_k: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "top_k", positive_int(self.top_k, "top_k"))

    def __call__(self, generated: Generated, logits: torch.Tensor) -> torch.Tensor:
        k = min(self.top_k, logits.shape[-1])
        kth = torch.topk(logits, k, dim=-1).values[..., -1:]
        return logits.masked_fill(logits < kth, -torch.inf)


@dataclass(frozen=True)
class TopP:
    """Nucleus: keep the smallest set of most likely tokens whose probability reaches ``top_p`` (at least one).

    >>> import torch
    >>> TopP(0.7)((), torch.log(torch.tensor([[0.6, 0.3, 0.1]], dtype=torch.float64))).isfinite().tolist()
    [[True, True, False]]
    """

    top_p: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "top_p", check_probability(self.top_p, "top_p", low_open=True))

    def __call__(self, generated: Generated, logits: torch.Tensor) -> torch.Tensor:
        if self.top_p >= 1.0:
            return logits
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # drop a token when the mass before it already reaches top_p
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= self.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        return logits.masked_fill(drop, -torch.inf)


@dataclass(frozen=True)
class MinP:
    """Keep, in each row, the tokens whose probability at temperature ``τ`` is at least ``min_p`` times that row's
    most likely token's: ``z[v] ≥ max z + τ·ln(min_p)`` (the row's own maximum; for a DP mechanism use
    :class:`PublicSupport`'s ``min_p``, which reads the public row only).

    >>> import torch
    >>> MinP(0.3)((), torch.tensor([[3.0, 2.0, 1.0]], dtype=torch.float64)).isfinite().tolist()
    [[True, True, False]]
    """

    min_p: float
    temperature: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "min_p", check_probability(self.min_p, "min_p", low_open=True))
        object.__setattr__(self, "temperature", positive_number(self.temperature, "temperature"))

    def __call__(self, generated: Generated, logits: torch.Tensor) -> torch.Tensor:
        floor = logits.max(dim=-1, keepdim=True).values + self.temperature * math.log(self.min_p)
        return logits.masked_fill(logits < floor, -torch.inf)


@dataclass(frozen=True)
class PublicSupport:
    """The token set S computed from the PUBLIC row 0 only, applied to every row alike (ALGORITHMS §1 and §2).

    ``S = top-k(z_pub) ∪ {v : z_pub[v] ≥ kth_largest(z_pub) − margin}`` (``margin`` widens it like InvisibleInk's
    top-k⁺), optionally intersected with the nucleus ``top_p`` of ``softmax(z_pub / τ)`` and with the min-p set
    ``{v : p_pub[v] ≥ min_p · max p_pub}`` (``z_pub[v] ≥ max z_pub + ln min_p``: relative to the PUBLIC maximum, so
    a flat public step keeps many tokens and a peaked one few). Because S is a function of the public context alone
    it costs no privacy; a support computed from a private row would void the guarantee.

    >>> import torch
    >>> z = torch.tensor([[3.0, 2.0, 1.0, 0.0], [0.0, 0.0, 9.0, 0.0]], dtype=torch.float64)
    >>> PublicSupport(top_k=2)((), z)[1].isfinite().tolist()
    [True, True, False, False]
    >>> PublicSupport(min_p=0.3)((), z)[1].isfinite().tolist()  # e^(2-3) ≥ 0.3 > e^(1-3)
    [True, True, False, False]
    """

    top_k: int | None = None
    top_p: float | None = None
    margin: float = 0.0
    min_p: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "top_k", optional_positive_int(self.top_k, "top_k", " (or None)"))
        if self.top_p is not None:
            object.__setattr__(self, "top_p", check_probability(self.top_p, "top_p", " (or None)", low_open=True))
        margin = finite_number(self.margin, "margin")
        if margin < 0:
            raise ConfigurationError(f"margin must be ≥ 0, got {self.margin!r}")
        object.__setattr__(self, "margin", margin)
        if self.min_p is not None:
            object.__setattr__(self, "min_p", check_probability(self.min_p, "min_p", " (or None)", low_open=True))

    @property
    def is_full(self) -> bool:
        """Whether S is every token (no top-k, no nucleus below 1, no min-p)."""
        return self.top_k is None and (self.top_p is None or self.top_p >= 1.0) and self.min_p is None

    def mask(self, public_logits: torch.Tensor) -> torch.Tensor:
        """``(V,)`` bool: True for tokens in S, from the ``(V,)`` public logits."""
        keep = torch.ones_like(public_logits, dtype=torch.bool)
        if self.top_k is not None:
            k = min(self.top_k, public_logits.shape[-1])
            kth = torch.topk(public_logits, k).values[-1]
            keep &= public_logits >= kth - self.margin
        if self.top_p is not None and self.top_p < 1.0:
            keep &= TopP(self.top_p)((), public_logits.unsqueeze(0))[0].isfinite()
        if self.min_p is not None:
            keep &= public_logits >= public_logits.max() + math.log(self.min_p)
        return keep

    def __call__(self, generated: Generated, logits: torch.Tensor) -> torch.Tensor:
        if self.is_full:
            return logits
        keep = self.mask(logits[0])
        return logits.masked_fill(~keep, -torch.inf)


@dataclass(frozen=True)
class NoRepeatNGram:
    """Ban every token that would repeat an n-gram of the tokens generated so far.

    With one sequence in ``generated`` the ban applies to every row alike (joint mode); with one per row, row by row.
    It reads only the released tokens, never a prompt, so in joint mode it is a public transform: applying it to
    every context before a mechanism leaves the mechanism's guarantee intact (the bound is checked on the
    transformed distributions). Counters the loops small models fall into on long rewrites.

    >>> import torch
    >>> z = torch.zeros(1, 5, dtype=torch.float64)
    >>> NoRepeatNGram(2)([[1, 2, 3, 1]], z)[0].isfinite().tolist()
    [True, True, False, True, True]
    """

    n: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "n", positive_int(self.n, "no_repeat_ngram_size"))

    def banned(self, seq: Sequence[int]) -> set[int]:
        """The token ids that would repeat an n-gram of ``seq``."""
        n = self.n
        if len(seq) < n - 1:
            return set()
        prefix = tuple(seq[len(seq) - n + 1:]) if n > 1 else ()
        return {seq[i + n - 1] for i in range(len(seq) - n + 1) if tuple(seq[i:i + n - 1]) == prefix}

    def __call__(self, generated: Generated, logits: torch.Tensor) -> torch.Tensor:
        out = logits
        for row, seq in enumerate(generated):
            banned = self.banned(seq)
            if banned:
                if out is logits:
                    out = logits.clone()
                rows = slice(None) if len(generated) == 1 else slice(row, row + 1)
                out[rows, list(banned)] = -torch.inf
        return out


@dataclass(frozen=True)
class BanSequences:
    """Ban every token that would complete one of the given token sequences (transformers' ``NoBadWords``, per row).

    ``sequences[r]`` holds row ``r``'s banned sequences (one entry: every row alike). A one-token sequence is banned
    at every step; a longer one only where the row's released tokens end with all but its last token. It reads only
    the released tokens and the sequences it was built with, never a prompt. DP-GTR's stage 3 builds it from the
    released keywords (post-processing) to keep the final prompt from writing them.

    >>> import torch
    >>> ban = BanSequences([[(3,), (1, 2)]])
    >>> ban([[0, 1]], torch.zeros(1, 5, dtype=torch.float64))[0].isfinite().tolist()
    [True, True, False, False, True]
    >>> ban([[1, 0]], torch.zeros(1, 5, dtype=torch.float64))[0].isfinite().tolist()
    [True, True, True, False, True]
    >>> BanSequences([[()]])
    Traceback (most recent call last):
    ...
    dpinfer.errors.ConfigurationError: every banned sequence needs at least one token id ≥ 0 (row 0 has an empty one)
    """

    sequences: Sequence[Sequence[Sequence[int]]]

    def __post_init__(self) -> None:
        rows = []
        if isinstance(self.sequences, (str, bytes)) or not isinstance(self.sequences, Sequence):
            raise ConfigurationError("sequences must be a list per row of banned token-id sequences")
        for r, row in enumerate(self.sequences):
            frozen = []
            for seq in row:
                ids = tuple(int(t) for t in seq)
                if not ids or min(ids) < 0:
                    what = "an empty one" if not ids else "a negative id"
                    raise ConfigurationError(
                        f"every banned sequence needs at least one token id ≥ 0 (row {r} has {what})"
                    )
                frozen.append(ids)
            rows.append(tuple(frozen))
        if not rows:
            raise ConfigurationError("sequences must hold one list of banned sequences per row (or one for all)")
        object.__setattr__(self, "sequences", tuple(rows))

    def banned(self, row: int, released: Sequence[int]) -> list[int]:
        """The token ids banned for ``row`` after its ``released`` tokens."""
        seqs = self.sequences[0 if len(self.sequences) == 1 else row]
        tail = tuple(released)
        return sorted({s[-1] for s in seqs
                       if len(s) == 1 or (len(tail) >= len(s) - 1 and tail[len(tail) - len(s) + 1:] == s[:-1])})

    def __call__(self, generated: Generated, logits: torch.Tensor) -> torch.Tensor:
        out = logits.clone()
        for row in range(logits.shape[0]):
            released = generated[row] if len(generated) > 1 else (generated[0] if generated else ())
            ids = self.banned(row, released)
            if ids:
                out[row, ids] = -torch.inf
        return out


def column_bans(processors: Sequence[LogitsProcessor], generated: Generated) -> list[int] | None:
    """The token ids ``processors`` set to ``-inf`` in every row alike, given ONE released sequence (joint mode),
    sorted; None when one of them does anything else (or ``generated`` holds one sequence per row): the batched
    decisions of the engine apply such bans to the logits as they are instead of calling the processors.

    >>> column_bans([NoRepeatNGram(2)], [[1, 2, 3, 1]]), column_bans([TopK(2)], [[1]])
    ([2], None)
    """
    ids: set[int] = set()
    for proc in processors:
        if len(generated) != 1:
            return None
        if isinstance(proc, NoRepeatNGram):
            ids |= proc.banned(generated[0])
        elif isinstance(proc, BanSequences) and len(proc.sequences) == 1:
            ids |= set(proc.banned(0, generated[0]))
        else:
            return None
    return sorted(ids)


def apply(processors: Sequence[LogitsProcessor], logits: torch.Tensor, generated: Generated = ()) -> torch.Tensor:
    """Apply ``processors`` in order: ``logits = processor(generated, logits)``."""
    for proc in processors:
        logits = proc(generated, logits)
    return logits
