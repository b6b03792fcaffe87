"""Where every mechanism's randomness comes from: a cryptographically secure source by default, a seeded one for tests.

A :class:`RandomSource` hands out uniformly random 64-bit words (:meth:`RandomSource.words`); uniforms, normals and
Laplace draws are built from them, so two sources differ only in where the words come from:

* :class:`SecureRandom` (the default everywhere): ``os.urandom``, the operating system's CSPRNG (≥ 128-bit security).
  Nothing about a run can be predicted or replayed, which is what a differential-privacy guarantee assumes.
* :class:`SeededRandom`: numpy's PCG64 seeded through a ``SeedSequence`` with the WHOLE seed (any size of integer:
  seeds that differ only above bit 32 or 64 give different streams; ``torch.Generator`` keeps 32 bits of a CPU seed).
  For tests and benchmarks only: whoever knows the seed can replay the noise, so a seeded release is private only
  while the seed stays secret (the guarantee says so, see :attr:`dpinfer.accounting.Guarantee.seeded`). The stream
  does not depend on the device: the same seed gives the same draws on CPU and GPU.

A plain ``torch.Generator`` is still accepted wherever a source is (:func:`as_random_source` wraps it in
:class:`TorchGeneratorSource`, which draws exactly as dpinfer did before); it is meant for tests.

>>> a, b = SeededRandom(2**70 + 1), SeededRandom(1)
>>> a.words(2).tolist() != b.words(2).tolist()
True
>>> u = SeededRandom(0).uniform((3,))
>>> bool(((u >= 0) & (u < 1)).all()) and u.dtype == torch.float64
True
"""

from __future__ import annotations

import math
import numbers
import os
from abc import ABC, abstractmethod
from typing import TypeAlias

import numpy as np
import torch

from dpinfer.errors import ConfigurationError

TWO_M53 = 2.0**-53
"""The spacing of the 53-bit uniforms: ``uniform() = k · 2⁻⁵³`` with ``k`` uniform on ``[0, 2⁵³)``."""

MAX_LEADING_ZEROS = 1020
"""Where :meth:`RandomSource.half_open_tail_uniform` stops counting zero bits: ``u ≥ 2⁻¹⁰²²``, the smallest normal
float64, hence ``|z| ≤ 37.5`` (reached with probability below 2⁻¹⁰²⁰)."""

Shape: TypeAlias = int | tuple[int, ...]


def _size(shape: Shape) -> tuple[tuple[int, ...], int]:
    shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
    return shape, math.prod(shape)


def _leading_zeros(words: np.ndarray) -> np.ndarray:
    """The number of leading zero bits of each 64-bit word (64 for a zero word), exactly (no float rounding)."""
    w = words.astype(np.uint64)
    n = np.zeros(w.shape, dtype=np.int64)
    for bits in (32, 16, 8, 4, 2, 1):
        empty = (w >> np.uint64(64 - bits)) == 0
        n += np.where(empty, bits, 0)
        w = np.where(empty, w << np.uint64(bits), w)
    return n + (w == 0)


class RandomSource(ABC):
    """All the randomness a mechanism may use. Subclasses implement :meth:`words` only.

    ``secure`` is True for a source whose draws cannot be predicted (no seed).
    """

    secure: bool = False

    @abstractmethod
    def words(self, n: int) -> np.ndarray:
        """``n`` independent uniformly random 64-bit words (``numpy.uint64``, shape ``(n,)``)."""

    def integers53(self, n: int) -> np.ndarray:
        """``n`` independent integers uniform on ``[0, 2⁵³)`` (``int64``): the top 53 bits of ``n`` words."""
        return (self.words(n) >> np.uint64(11)).astype(np.int64)

    def uniform(self, shape: Shape, *, device: torch.device | str | None = None) -> torch.Tensor:
        """Float64 uniforms on ``[0, 1)`` with 53 random bits each (``k · 2⁻⁵³``, ``k`` uniform on ``[0, 2⁵³)``)."""
        shape, n = _size(shape)
        u = self.integers53(n).astype(np.float64) * TWO_M53
        return torch.from_numpy(u.reshape(shape)).to(device or "cpu")

    def normal(self, shape: Shape, *, device: torch.device | str | None = None) -> torch.Tensor:
        """Float64 standard normals by inversion, with no cap on the tails: ``z = ±Φ⁻¹(u)`` for ``u`` uniform on
        ``(0, ½)``, drawn in floating point with its full exponent range (:meth:`half_open_tail_uniform`), so a tail
        of ``k`` standard deviations is reached whenever ``u`` is as small as ``Φ(−k)``: about 37.5 standard
        deviations for the smallest normal float64 ``u`` (probability below 2⁻¹⁰²¹), instead of the fixed cap of
        about 9.4 that a 64-bit uniform gives. Two words per normal (one more in a share 2⁻⁶⁴ of the draws)."""
        shape, n = _size(shape)
        w = self.words(n)
        sign = np.where((w & np.uint64(1)) == 1, -1.0, 1.0)
        u = self.half_open_tail_uniform(w >> np.uint64(12))
        z = sign * -torch.special.ndtri(torch.from_numpy(u)).numpy()
        return torch.from_numpy(np.ascontiguousarray(z).reshape(shape)).to(device or "cpu")

    def half_open_tail_uniform(self, mantissas: np.ndarray) -> np.ndarray:
        """Uniforms on ``(0, ½)`` with relative (not absolute) resolution, one per 52-bit ``mantissas`` entry:
        ``u = 2^−(G+2)·(1 + m·2⁻⁵²)`` with ``G`` the number of leading zero bits of fresh words (a geometric count,
        ``P(G = g) = 2^−(g+1)``), so ``u`` is never 0 and as fine near 0 as float64 allows (``G`` stops at 1020)."""
        m = mantissas.astype(np.uint64)
        g = np.zeros(m.shape, dtype=np.int64)
        todo = np.arange(m.size)
        while todo.size:
            w = self.words(todo.size)
            g[todo] += _leading_zeros(w)
            todo = todo[(w == 0) & (g[todo] < MAX_LEADING_ZEROS)]
        g = np.minimum(g, MAX_LEADING_ZEROS)
        return np.ldexp(1.0 + m.astype(np.float64) * 2.0**-52, -(g + 2).astype(np.int32))

    def laplace(self, scale: float, shape: Shape = 1, *, device: torch.device | str | None = None) -> torch.Tensor:
        """Float64 Laplace draws with the given ``scale`` (density ∝ exp(−|x|/scale)): a random sign (one bit) times
        an exponential from the other 63 bits of the same word."""
        if not (isinstance(scale, numbers.Real) and math.isfinite(scale) and scale > 0):
            raise ConfigurationError(f"the Laplace scale must be a finite number > 0, got {scale!r}")
        shape, n = _size(shape)
        w = self.words(n)
        sign = np.where((w & np.uint64(1)) == 1, -1.0, 1.0)
        u = ((w >> np.uint64(1)).astype(np.float64) + 0.5) * 2.0**-63  # (0, 1]
        x = -float(scale) * sign * np.log(u)
        return torch.from_numpy(x.reshape(shape)).to(device or "cpu")


class SecureRandom(RandomSource):
    """The operating system's CSPRNG (``os.urandom``): the default of every dpinfer run without a seed."""

    secure = True

    def words(self, n: int) -> np.ndarray:
        return np.frombuffer(os.urandom(8 * int(n)), dtype=np.uint64).copy()

    def __repr__(self) -> str:
        return "SecureRandom()"


def check_seed(seed: object) -> int | None:
    """``seed`` as an int (``None`` stays ``None``: the secure default); anything else is refused."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ConfigurationError(f"seed must be an integer or None, got a {type(seed).__name__}")
    return int(seed)


class SeededRandom(RandomSource):
    """A reproducible stream for tests and benchmarks: PCG64 from a ``SeedSequence`` holding the whole ``seed``.

    Any integer is accepted (negative ones too); every bit of it changes the stream. NOT for private releases: the
    noise of a seeded run can be replayed by anyone who knows the seed.
    """

    secure = False

    def __init__(self, seed: int) -> None:
        s = check_seed(seed)
        if s is None:
            raise ConfigurationError("SeededRandom needs an integer seed; use SecureRandom() for unseeded runs")
        entropy = 2 * s if s >= 0 else -2 * s - 1  # one-to-one onto the non-negative integers
        self._bits = np.random.PCG64(np.random.SeedSequence(entropy))

    def words(self, n: int) -> np.ndarray:
        return self._bits.random_raw(int(n)).astype(np.uint64, copy=False)

    def __repr__(self) -> str:
        return "SeededRandom(<seed>)"  # never show the seed


class TorchGeneratorSource(RandomSource):
    """A ``torch.Generator`` used as a source (tests; kept for callers that pass one). Uniforms, normals and Laplace
    draws come from ``torch.rand`` / ``torch.randn`` exactly as before dpinfer had sources. Not secure: a CPU
    generator keeps only 32 bits of its seed."""

    secure = False

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def words(self, n: int) -> np.ndarray:
        halves = torch.randint(0, 2**32, (2 * int(n),), dtype=torch.int64, generator=self.generator,
                               device=self.generator.device).cpu().numpy().astype(np.uint64)
        return (halves[0::2] << np.uint64(32)) | halves[1::2]

    def integers53(self, n: int) -> np.ndarray:
        # torch's float64 uniforms on CPU are k · 2⁻⁵³ with 53 random bits; floor() keeps k exactly
        u = torch.rand(int(n), dtype=torch.float64, generator=self.generator, device=self.generator.device)
        return np.floor(u.cpu().numpy() * 2.0**53).astype(np.int64)

    def uniform(self, shape: Shape, *, device: torch.device | str | None = None) -> torch.Tensor:
        shape, _ = _size(shape)
        u = torch.rand(shape, dtype=torch.float64, generator=self.generator, device=self.generator.device)
        return u.to(device or u.device)

    def normal(self, shape: Shape, *, device: torch.device | str | None = None) -> torch.Tensor:
        shape, _ = _size(shape)
        z = torch.randn(shape, dtype=torch.float64, generator=self.generator, device=self.generator.device)
        return z.to(device or z.device)

    def laplace(self, scale: float, shape: Shape = 1, *, device: torch.device | str | None = None) -> torch.Tensor:
        if not (isinstance(scale, numbers.Real) and math.isfinite(scale) and scale > 0):
            raise ConfigurationError(f"the Laplace scale must be a finite number > 0, got {scale!r}")
        u = self.uniform(shape, device=device) - 0.5
        return -float(scale) * torch.sign(u) * torch.log1p(-2.0 * u.abs())


Randomness: TypeAlias = RandomSource | torch.Generator
"""What :meth:`Mechanism.step <dpinfer.mechanisms.base.Mechanism.step>` accepts as its source of randomness."""


def as_random_source(rng: Randomness) -> RandomSource:
    """``rng`` itself if it is a :class:`RandomSource`, a :class:`TorchGeneratorSource` around a ``torch.Generator``."""
    if isinstance(rng, RandomSource):
        return rng
    if isinstance(rng, torch.Generator):
        return TorchGeneratorSource(rng)
    raise ConfigurationError(f"expected a RandomSource or a torch.Generator, got {type(rng).__name__}")


def random_source(seed: int | None = None) -> RandomSource:
    """The source of one run: :class:`SecureRandom` without a seed (the default), :class:`SeededRandom` with one."""
    return SecureRandom() if seed is None else SeededRandom(seed)


__all__ = [
    "RandomSource",
    "Randomness",
    "SecureRandom",
    "SeededRandom",
    "TorchGeneratorSource",
    "as_random_source",
    "check_seed",
    "random_source",
]
