"""Privacy losses as Rényi-DP curves: composition, and conversion to (ε, δ).

A privacy loss is a Rényi-DP curve ``ε(α) ≥ sup D_α(M(D)‖M(D′))`` over adjacent inputs D, D′ (Mironov 2017, "Rényi
Differential Privacy", CSF). Sequential (adaptive) composition adds curves order by order (Mironov 2017, Prop. 1);
parallel composition over disjoint, data-independent partitions of the data takes the maximum. The order ``α = ∞`` is
the max-divergence: ``ε(∞) ≤ ε`` is pure ε-DP, and adding it up is basic composition.

Conversion to (ε, δ) (Balle et al. 2020, "Hypothesis Testing Interpretations and Renyi Differential Privacy", AISTATS,
Thm 21; Canonne, Kamath & Steinke 2020, "The Discrete Gaussian for Differential Privacy", Prop. 12)::

    ε(δ) = min_α  ε(α) + log1p(−1/α) − (log δ + log α)/(α − 1)

is delegated to ``dp_accounting.rdp.compute_epsilon`` / ``compute_delta``, which convert only at orders α > 1.01 and
also use the KL bound: ε = 0 once ``δ ≥ sqrt(1 − exp(−ε(α)))``, i.e. when ε(α) is below about δ². At ``α = ∞`` the
correction term vanishes, so ``ε(∞)`` is converted as itself.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import numbers
import operator
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from dpinfer.checks import check_delta, check_order, non_negative_number, positive_int
from dpinfer.errors import ConfigurationError

DEFAULT_ORDERS: tuple[float, ...] = tuple(1.0 + 0.01 * 1.02**k for k in range(1, 698))
"""697 Rényi orders: ``α − 1`` geometric from 0.0102 to ≈ 9900, ratio 1.02 (dp_accounting converts at α > 1.01 only).

Near its optimum the conversion of ρ-zCDP behaves like ``ρ(α − 1) + log(1/δ)/(α − 1)``, so a grid of ratio r in
``α − 1`` overshoots the continuous optimum by at most about ``(ln r)²/8 ≈ 5e-5`` relative.
"""

_PURE_ORDERS: tuple[float, ...] = (*DEFAULT_ORDERS, math.inf)


DELTA_HINT = "; common choices are 1e-5, or well below 1/n for n records"
"""What the accountant says about a δ it refuses (:func:`dpinfer.checks.check_delta`)."""


def _check_delta(delta: object) -> float:
    return check_delta(delta, "δ", DELTA_HINT)


def _check_rdp(value: object) -> float:
    return non_negative_number(value, "an RDP value ε(α)", " (math.inf where no bound holds)", allow_inf=True)


def _split(orders: Sequence[float], rdp: Sequence[float]) -> tuple[list[float], list[float], float]:
    """Validate a curve; return its finite orders, their ε(α), and ε(∞) (math.inf when the order ∞ is absent)."""
    if len(orders) != len(rdp) or len(orders) == 0:
        raise ConfigurationError(
            f"an RDP curve needs one ε(α) per order and at least one order; got {len(orders)} orders, {len(rdp)} values"
        )
    finite_orders, finite_rdp, pure = [], [], math.inf
    for alpha, value in zip(map(check_order, orders), map(_check_rdp, rdp), strict=True):
        if math.isinf(alpha):
            pure = min(pure, value)
        else:
            finite_orders.append(alpha)
            finite_rdp.append(value)
    return finite_orders, finite_rdp, pure


def epsilon_from_rdp(orders: Sequence[float], rdp: Sequence[float], delta: float) -> tuple[float, float]:
    """The smallest ε such that the RDP curve ``rdp`` at ``orders`` gives (ε, δ)-DP, and the order attaining it.

    Finite orders go to ``dp_accounting.rdp.compute_epsilon``; the order ``math.inf`` (pure DP) gives ε(∞) itself.

    >>> eps, order = epsilon_from_rdp([2.0, 8.0, math.inf], [0.1, 0.4, 3.0], 1e-5)
    >>> round(eps, 4), order
    (1.6141, 8.0)
    """
    delta = _check_delta(delta)
    finite_orders, finite_rdp, pure = _split(orders, rdp)
    epsilon, best = math.inf, math.inf
    if finite_orders:
        from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon  # heavy (1.8 s): imported when used

        epsilon, best = compute_epsilon(finite_orders, finite_rdp, delta)
    if pure < epsilon:
        return pure, math.inf
    return float(epsilon), float(best)


def delta_from_rdp(orders: Sequence[float], rdp: Sequence[float], epsilon: float) -> tuple[float, float]:
    """The smallest δ such that the RDP curve ``rdp`` at ``orders`` gives (ε, δ)-DP, and the order attaining it.

    Finite orders go to ``dp_accounting``'s ``compute_delta``; the order ``math.inf`` gives δ = 0 when ε(∞) ≤ ε.

    >>> delta, order = delta_from_rdp([2.0, 8.0, math.inf], [0.1, 0.4, 3.0], 3.0)
    >>> delta, order
    (0.0, inf)
    """
    epsilon = non_negative_number(epsilon, "ε", allow_inf=True)
    finite_orders, finite_rdp, pure = _split(orders, rdp)
    if math.isinf(epsilon):  # every mechanism is (∞, 0)-DP
        return 0.0, math.inf
    delta, best = 1.0, math.inf
    if finite_orders:
        from dp_accounting.rdp.rdp_privacy_accountant import compute_delta  # heavy (1.8 s): imported when used

        delta, best = compute_delta(finite_orders, finite_rdp, epsilon)
    if pure <= epsilon:
        return 0.0, math.inf
    return float(delta), float(best)


class PrivacyLoss(ABC):
    """The privacy loss of a mechanism as a Rényi-DP curve ε(α), α ∈ (1, ∞], against a stated adjacency.

    Subclasses are frozen value objects. They implement :meth:`rdp` and provide :attr:`orders`, the orders at which
    ε(α) is evaluated for conversion; they may keep a closed form under composition by overriding ``_combine`` and
    ``_scaled``. ``a + b`` is :func:`compose`, ``n * a`` is ``a.times(n)``.

    >>> loss = 3 * Zcdp(0.1) + PureDp(1.0)  # mixed types compose into an RdpCurve
    >>> epsilon = loss.to_epsilon(1e-5)
    >>> type(loss).__name__, round(epsilon, 3), loss.to_delta(epsilon) <= 1e-5 * (1 + 1e-9)
    ('RdpCurve', 4.534, True)
    """

    orders: tuple[float, ...]
    """The orders at which ε(α) is evaluated when converting to (ε, δ) (a field or a property of each subclass)."""

    @abstractmethod
    def rdp(self, alpha: float) -> float:
        """ε(α), an upper bound on D_α(M(D)‖M(D′)) over adjacent D, D′; ``math.inf`` where no bound holds."""

    def to_epsilon(self, delta: float) -> float:
        """The smallest ε for which this loss gives (ε, δ)-DP (see :func:`epsilon_from_rdp`)."""
        return epsilon_from_rdp(self.orders, [self.rdp(alpha) for alpha in self.orders], delta)[0]

    def to_delta(self, epsilon: float) -> float:
        """The smallest δ for which this loss gives (ε, δ)-DP (see :func:`delta_from_rdp`)."""
        return delta_from_rdp(self.orders, [self.rdp(alpha) for alpha in self.orders], epsilon)[0]

    def compose(self, other: PrivacyLoss) -> PrivacyLoss:
        """Sequential (adaptive) composition with ``other``; see :func:`compose`."""
        return compose(self, other)

    def parallel(self, other: PrivacyLoss) -> PrivacyLoss:
        """Parallel composition with ``other`` (disjoint, data-independent parts); see :func:`compose_parallel`."""
        return compose_parallel(self, other)

    def times(self, n: int) -> PrivacyLoss:
        """The n-fold sequential composition of this loss with itself (n ≥ 1)."""
        n = positive_int(n, "a number of compositions")
        return self if n == 1 else self._scaled(n)

    def _scaled(self, n: int) -> PrivacyLoss:
        return RdpCurve(self.orders, [n * self.rdp(alpha) for alpha in self.orders])

    def _combine(self, other: PrivacyLoss, parallel: bool) -> PrivacyLoss | None:
        """The closed form of ``self + other`` (``max`` if ``parallel``), or None to fall back to an RdpCurve."""
        return None

    def __add__(self, other: object) -> PrivacyLoss:
        if not isinstance(other, PrivacyLoss):
            return NotImplemented
        return compose(self, other)

    def __mul__(self, n: object) -> PrivacyLoss:
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            return NotImplemented
        return self.times(int(n))

    __rmul__ = __mul__


@dataclass(frozen=True, repr=False)
class RdpCurve(PrivacyLoss):
    """A Rényi-DP curve given on a grid of orders: ε(α) = ``epsilons[i]`` at α = ``orders[i]``.

    Rényi divergence is non-decreasing in α (van Erven & Harremoës 2014, "Rényi Divergence and Kullback-Leibler
    Divergence", IEEE Trans. Inf. Theory, Thm 3), so the curve extends upward: ε(α) ≤ ε(α′) for the smallest grid order
    α′ ≥ α, and there is no bound above the grid. For the same reason the stored values are tightened to their suffix
    minimum. Orders are sorted; ``math.inf`` is allowed (pure DP). Converted at its own orders.

    >>> curve = RdpCurve([8.0, 2.0, 32.0], [0.4, 0.1, 1.6])
    >>> curve + curve
    RdpCurve(orders=(2.0, 8.0, 32.0), epsilons=(0.2, 0.8, 3.2))
    >>> curve.rdp(4.0), curve.rdp(64.0)
    (0.4, inf)
    >>> round(curve.to_epsilon(1e-5), 3)
    1.614
    """

    orders: tuple[float, ...]
    epsilons: tuple[float, ...]

    def __post_init__(self) -> None:
        finite_orders, finite_rdp, pure = _split(self.orders, self.epsilons)
        if len(set(map(float, self.orders))) < len(self.orders):
            raise ConfigurationError(f"the orders of an RdpCurve must be distinct, got {tuple(self.orders)}")
        pairs = sorted(zip(finite_orders, finite_rdp, strict=True))
        if len(pairs) < len(self.orders):
            pairs.append((math.inf, pure))
        tightened = list(itertools.accumulate(reversed([value for _, value in pairs]), min))[::-1]
        object.__setattr__(self, "orders", tuple(alpha for alpha, _ in pairs))
        object.__setattr__(self, "epsilons", tuple(tightened))

    def rdp(self, alpha: float) -> float:
        """ε at the smallest grid order ≥ α (RDP is non-decreasing in α), or ``math.inf`` above the grid."""
        i = bisect.bisect_left(self.orders, check_order(alpha))
        return self.epsilons[i] if i < len(self.orders) else math.inf

    def _scaled(self, n: int) -> PrivacyLoss:
        return RdpCurve(self.orders, [n * value for value in self.epsilons])

    def __repr__(self) -> str:
        if len(self.orders) <= 8:
            return f"RdpCurve(orders={self.orders}, epsilons={self.epsilons})"
        return (
            f"RdpCurve(<{len(self.orders)} orders in [{self.orders[0]:.4g}, {self.orders[-1]:.4g}], "
            f"ε(α) in [{self.epsilons[0]:.4g}, {self.epsilons[-1]:.4g}]>)"
        )


@dataclass(frozen=True)
class SingleOrderRdp(PrivacyLoss):
    """A Rényi bound that holds at one order only: D_α(M(D)‖M(D′)) ≤ ε at α = ``alpha``.

    DP-Fusion (Thareja et al. 2025) enforces its per-token bound at one order, so its loss is known there only and is
    converted there only: ``ε(δ) = ε + log1p(−1/α) − (log δ + log α)/(α − 1)``. The correction alone is ≈ 10.1 at α = 2,
    δ = 1e-5, and ≈ 1.2 at α = 8. Composition with a bound at the same α adds (parallel: max); with a curve, a zCDP or a
    pure-DP loss it evaluates that loss at α; with a bound at another order it raises ConfigurationError.

    >>> step = SingleOrderRdp(alpha=2.0, epsilon=0.01)
    >>> 100 * step
    SingleOrderRdp(alpha=2.0, epsilon=1.0)
    >>> round((100 * step).to_epsilon(1e-5), 2), step.rdp(3.0)
    (11.13, inf)
    """

    alpha: float
    epsilon: float

    def __post_init__(self) -> None:
        if not 1.0 < self.alpha < math.inf:
            raise ConfigurationError(
                f"a single-order Rényi bound needs a finite order α > 1, got {self.alpha!r} (use PureDp for α = ∞)"
            )
        object.__setattr__(self, "alpha", float(self.alpha))
        object.__setattr__(self, "epsilon", _check_rdp(self.epsilon))

    @property
    def orders(self) -> tuple[float, ...]:
        return (self.alpha,)

    def rdp(self, alpha: float) -> float:
        """ε at α = ``self.alpha``; ``math.inf`` at every other order."""
        return self.epsilon if check_order(alpha) == self.alpha else math.inf

    def _scaled(self, n: int) -> PrivacyLoss:
        return SingleOrderRdp(self.alpha, n * self.epsilon)

    def _combine(self, other: PrivacyLoss, parallel: bool) -> PrivacyLoss | None:
        if isinstance(other, SingleOrderRdp) and other.alpha != self.alpha:
            raise ConfigurationError(
                f"cannot combine Rényi bounds held at different single orders (α = {self.alpha:g} and "
                f"α = {other.alpha:g}); enforce both at the same α, or convert each to (ε, δ) separately"
            )
        op = max if parallel else operator.add
        return SingleOrderRdp(self.alpha, op(self.epsilon, other.rdp(self.alpha)))


@dataclass(frozen=True)
class Zcdp(PrivacyLoss):
    """ρ-zero-concentrated DP: ε(α) = ρα for every α > 1.

    Bun & Steinke 2016 ("Concentrated Differential Privacy: Simplifications, Extensions, and Lower Bounds", TCC,
    Def. 1.1). ρ adds under composition (Lemma 2.3). The Gaussian mechanism with ℓ2 sensitivity Δ and noise σ is
    Δ²/(2σ²)-zCDP; an ε-bounded-range mechanism (e.g. InvisibleInk's per-token exponential mechanism) is ε²/8-zCDP.
    Converted on :data:`DEFAULT_ORDERS`.

    >>> loss = Zcdp(0.25) + 2 * Zcdp(0.5)
    >>> loss
    Zcdp(rho=1.25)
    >>> round(loss.to_epsilon(1e-6), 3)
    8.846
    """

    rho: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.rho < math.inf:
            raise ConfigurationError(f"zCDP ρ must be a finite number ≥ 0, got {self.rho!r}")
        object.__setattr__(self, "rho", float(self.rho))

    @property
    def orders(self) -> tuple[float, ...]:
        return DEFAULT_ORDERS

    def rdp(self, alpha: float) -> float:
        """ρα (``math.inf`` at α = ∞ unless ρ = 0)."""
        alpha = check_order(alpha)
        return 0.0 if self.rho == 0.0 else self.rho * alpha

    def _scaled(self, n: int) -> PrivacyLoss:
        return Zcdp(n * self.rho)

    def _combine(self, other: PrivacyLoss, parallel: bool) -> PrivacyLoss | None:
        if isinstance(other, Zcdp):
            return Zcdp(max(self.rho, other.rho) if parallel else self.rho + other.rho)
        return None


@dataclass(frozen=True)
class PureDp(PrivacyLoss):
    """ε-DP, or an ε-bounded-range mechanism, as an RDP curve.

    ε-DP gives ε(α) ≤ min(ε, αε²/2) (the max-divergence bound, and ε²/2-zCDP: Bun & Steinke 2016, Prop. 3.3). An
    ε-bounded-range mechanism (``bounded_range=True``: the exponential mechanism with sensitivity-scaled utility,
    Durfee & Rogers 2019, "Practical Differentially Private Top-k Selection with Pay-what-you-get Composition") gives
    min(ε, αε²/8) (Cesar & Rogers 2021, "Bounding, Concentrating, and Truncating", Lemma 3.2).

    The order α = ∞ is part of the grid with ε(∞) = ε, so ``to_epsilon`` of one PureDp is min(ε, RDP conversion). A
    composition of pure-DP losses is an RdpCurve that keeps the order ∞, where values add: it converts to the minimum of
    basic composition Σε_i and the RDP conversion.

    >>> PureDp(0.5).to_epsilon(1e-5)
    0.5
    >>> round(PureDp(0.1, bounded_range=True).times(1000).to_epsilon(1e-5), 3)
    8.079
    """

    epsilon: float
    bounded_range: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.epsilon < math.inf:
            raise ConfigurationError(f"pure-DP ε must be a finite number ≥ 0, got {self.epsilon!r}")
        object.__setattr__(self, "epsilon", float(self.epsilon))

    @property
    def orders(self) -> tuple[float, ...]:
        return _PURE_ORDERS

    def rdp(self, alpha: float) -> float:
        """min(ε, αε²/8) if bounded range, else min(ε, αε²/2); ε at α = ∞."""
        alpha = check_order(alpha)
        if math.isinf(alpha):
            return self.epsilon
        return min(self.epsilon, alpha * self.epsilon**2 / (8.0 if self.bounded_range else 2.0))

    def _combine(self, other: PrivacyLoss, parallel: bool) -> PrivacyLoss | None:
        if parallel and isinstance(other, PureDp) and other.bounded_range == self.bounded_range:
            return PureDp(max(self.epsilon, other.epsilon), self.bounded_range)
        return None


def _pair(first: PrivacyLoss, second: PrivacyLoss, parallel: bool) -> PrivacyLoss:
    combined = first._combine(second, parallel)
    if combined is None:
        combined = second._combine(first, parallel)
    if combined is None:
        op = max if parallel else operator.add
        orders = sorted(set(first.orders) | set(second.orders))
        combined = RdpCurve(orders, [op(first.rdp(alpha), second.rdp(alpha)) for alpha in orders])
    return combined


def _fold(losses: tuple[PrivacyLoss, ...], parallel: bool) -> PrivacyLoss:
    if not losses:
        raise ConfigurationError("nothing to compose: pass at least one PrivacyLoss")
    for loss in losses:
        if not isinstance(loss, PrivacyLoss):
            raise ConfigurationError(f"can only compose PrivacyLoss objects, got {type(loss).__name__}")
    return functools.reduce(lambda first, second: _pair(first, second, parallel), losses)


def compose(*losses: PrivacyLoss) -> PrivacyLoss:
    """Sequential (adaptive) composition: ε(α) = Σ_i ε_i(α) (Mironov 2017, Prop. 1).

    Closed forms are kept where they exist (zCDP ρ adds; single-order bounds add at their order); otherwise the result
    is an RdpCurve on the union of the operands' orders.

    >>> compose(Zcdp(0.5), Zcdp(0.25), SingleOrderRdp(2.0, 0.5))
    SingleOrderRdp(alpha=2.0, epsilon=2.0)
    """
    return _fold(losses, parallel=False)


def compose_parallel(*losses: PrivacyLoss) -> PrivacyLoss:
    """Parallel composition over disjoint, data-independent partitions: ε(α) = max_i ε_i(α).

    Valid when each loss is incurred on its own part of the data and the partition does not depend on the data (e.g.
    InvisibleInk's disjoint batches of references): a change to one record touches one part only.

    >>> compose_parallel(Zcdp(0.5), Zcdp(0.25))
    Zcdp(rho=0.5)
    """
    return _fold(losses, parallel=True)


def conversion_route(loss: PrivacyLoss, delta: float) -> str:
    """Which conversion gives ``loss``'s ε at ``delta``: ``"basic (sum of per-token ε)"`` when the pure-DP order ∞
    wins, else ``"rdp (α = …)"`` with the optimal order.

    >>> conversion_route(PureDp(0.1).times(3), 1e-5)
    'basic (sum of per-token ε)'
    """
    _, order = epsilon_from_rdp(loss.orders, [loss.rdp(alpha) for alpha in loss.orders], delta)
    return "basic (sum of per-token ε)" if math.isinf(order) else f"rdp (α = {order:.4g})"
