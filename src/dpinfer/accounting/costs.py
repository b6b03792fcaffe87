"""What a release costs its unit in the ledger (:class:`Cost`: a loss per privacy group, from parameters only), the
losses known only as an (ε, δ) pair (:class:`ApproxDp`), and how a unit's costs compose (:func:`composed_epsilon`).

>>> from dpinfer.accounting import Zcdp
>>> Cost.from_json(Cost.of(Zcdp(0.1)).to_json()) == Cost.of(Zcdp(0.1))
True
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from dpinfer._json import plain
from dpinfer.accounting.guarantee import Guarantee
from dpinfer.accounting.losses import PrivacyLoss, PureDp, RdpCurve, SingleOrderRdp, Zcdp, compose
from dpinfer.checks import check_delta, non_negative_number
from dpinfer.errors import ConfigurationError

ALL_GROUPS = "*"
"""The group key of a charge that protects the whole unit (no privacy groups): it counts against every group."""


@dataclass(frozen=True)
class ApproxDp:
    """A loss known only as an (ε, δ)-DP pair (e.g. a guarantee read back from JSON): composes by adding ε and δ.

    >>> ApproxDp(1.0, 1e-6)
    ApproxDp(epsilon=1.0, delta=1e-06)
    """

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", non_negative_number(self.epsilon, "ε", allow_inf=True))
        delta = float(self.delta)
        if not 0.0 <= delta < 1.0:
            raise ConfigurationError(f"an (ε, δ) charge needs 0 ≤ δ < 1, got {self.delta!r}")
        object.__setattr__(self, "delta", delta)


Loss = PrivacyLoss | ApproxDp


def _loss_to_json(loss: Loss) -> dict[str, Any]:
    if isinstance(loss, ApproxDp):
        return plain({"kind": "approx", "epsilon": loss.epsilon, "delta": loss.delta})
    if isinstance(loss, Zcdp):
        return {"kind": "zcdp", "rho": loss.rho}
    if isinstance(loss, PureDp):
        return {"kind": "pure", "epsilon": loss.epsilon, "bounded_range": loss.bounded_range}
    if isinstance(loss, SingleOrderRdp):
        return plain({"kind": "single_order", "alpha": loss.alpha, "epsilon": loss.epsilon})
    orders = loss.orders
    return plain({"kind": "curve", "orders": list(orders), "epsilons": [loss.rdp(alpha) for alpha in orders]})


def _loss_from_json(data: Mapping[str, Any]) -> Loss:
    kind = data["kind"]
    if kind == "approx":
        return ApproxDp(float(data["epsilon"]), float(data["delta"]))
    if kind == "zcdp":
        return Zcdp(float(data["rho"]))
    if kind == "pure":
        return PureDp(float(data["epsilon"]), bool(data["bounded_range"]))
    if kind == "single_order":
        return SingleOrderRdp(float(data["alpha"]), float(data["epsilon"]))
    if kind == "curve":
        return RdpCurve([float(a) for a in data["orders"]], [float(e) for e in data["epsilons"]])
    raise ValueError(f"unknown loss kind {kind!r}")


@dataclass(frozen=True)
class Cost:
    """What one release costs its unit: a loss per privacy group (:data:`ALL_GROUPS` for the whole unit).

    Built from parameters only: :meth:`from_guarantee` takes the release's ex-ante guarantee (each group's Rényi loss
    when it carries one, else its (ε, δ) pair); a guarantee with ε = ∞ or without an ex-ante figure costs ε = ∞ and
    is refused by every budget.

    >>> Cost.of(Zcdp(0.1)).parts
    mappingproxy({'*': Zcdp(rho=0.1)})
    """

    parts: Mapping[str, Loss] = field(hash=False)

    def __post_init__(self) -> None:
        if not self.parts:
            raise ConfigurationError("a cost needs at least one loss")
        for name, loss in self.parts.items():
            if not isinstance(name, str) or not name:
                raise ConfigurationError(f"a cost's group names must be non-empty strings, got {name!r}")
            if not isinstance(loss, (PrivacyLoss, ApproxDp)):
                raise ConfigurationError(f"a cost's losses must be PrivacyLoss or ApproxDp, got {type(loss).__name__}")
        object.__setattr__(self, "parts", MappingProxyType(dict(sorted(self.parts.items()))))

    @classmethod
    def of(cls, loss: Loss | Guarantee | Cost) -> Cost:
        """A :class:`Cost` from a guarantee, a whole-unit loss, or a cost."""
        if isinstance(loss, Cost):
            return loss
        if isinstance(loss, Guarantee):
            return cls.from_guarantee(loss)
        if isinstance(loss, (PrivacyLoss, ApproxDp)):
            return cls({ALL_GROUPS: loss})
        raise ConfigurationError(
            f"a ledger charges a Guarantee, a PrivacyLoss or a Cost, got {type(loss).__name__}"
        )

    @classmethod
    def from_guarantee(cls, guarantee: Guarantee) -> Cost:
        """The cost of a release with this ex-ante ``guarantee``: per group if it has groups, else for the unit."""
        if not guarantee.ex_ante or math.isinf(guarantee.epsilon):
            return cls({ALL_GROUPS: ApproxDp(math.inf, 0.0)})
        if guarantee.groups:
            return cls({group.name: group.loss if group.loss is not None else ApproxDp(group.epsilon, group.delta)
                        for group in guarantee.groups})
        loss = guarantee.loss if guarantee.loss is not None else ApproxDp(guarantee.epsilon, guarantee.delta)
        return cls({ALL_GROUPS: loss})

    def to_json(self) -> str:
        return json.dumps({name: _loss_to_json(loss) for name, loss in self.parts.items()}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Cost:
        return cls({name: _loss_from_json(data) for name, data in json.loads(text).items()})

    def epsilon(self, delta: float) -> float:
        """This release's ε alone at ``delta`` (the worst group's)."""
        return max(composed_epsilon([self], delta).values())


def _convert(rdp: list[PrivacyLoss], approx: list[ApproxDp], delta: float) -> float:
    """ε of the composition of ``rdp`` (in RDP) and ``approx`` (basic composition) at total ``delta``."""
    esum = math.fsum(a.epsilon for a in approx)
    dsum = math.fsum(a.delta for a in approx)
    if not rdp:
        return esum if dsum <= delta else math.inf
    left = delta - dsum
    if left <= 0.0 or math.isinf(esum):
        return math.inf
    # single-order bounds hold at their order only: bounds at different orders are converted apart (δ split evenly)
    families: dict[float | None, list[PrivacyLoss]] = {}
    for loss in rdp:
        families.setdefault(loss.alpha if isinstance(loss, SingleOrderRdp) else None, []).append(loss)
    orders = [key for key in families if key is not None]
    if orders and None in families:
        families[orders[0]].extend(families.pop(None))
    share = left / len(families)
    return math.fsum(compose(*losses).to_epsilon(share) for losses in families.values()) + esum


def composed_epsilon(costs: list[Cost], delta: float) -> dict[str, float]:
    """The composed ε of ``costs`` per privacy group, converted once at ``delta`` (composition in RDP; see the module
    docstring). Groups are the named groups of any cost, or :data:`ALL_GROUPS` when none has groups.

    >>> from dpinfer.accounting import Zcdp
    >>> eps = composed_epsilon([Cost.of(Zcdp(0.1))] * 10, 1e-5)
    >>> eps["*"] == Zcdp(1.0).to_epsilon(1e-5)
    True
    """
    delta = check_delta(delta, "the unit's δ")
    named = sorted({name for cost in costs for name in cost.parts if name != ALL_GROUPS}) or [ALL_GROUPS]
    out = {}
    for group in named:
        counts: Counter[str] = Counter()
        for cost in costs:
            for name, loss in cost.parts.items():
                if name in (group, ALL_GROUPS):
                    counts[json.dumps(_loss_to_json(loss), sort_keys=True)] += 1
        rdp: list[PrivacyLoss] = []
        approx: list[ApproxDp] = []
        for key in sorted(counts):
            loss = _loss_from_json(json.loads(key))
            if isinstance(loss, ApproxDp):
                approx += [loss] * counts[key]
            else:
                rdp.append(loss.times(counts[key]))
        out[group] = _convert(rdp, approx, delta) if (rdp or approx) else 0.0
    return out
