"""What every dpinfer output carries: the ex-ante (ε, δ) guarantee, and data-dependent figures kept apart from it."""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from dpinfer._json import plain
from dpinfer.accounting.losses import PrivacyLoss, SingleOrderRdp
from dpinfer.checks import check_probability, format_up, non_negative_number
from dpinfer.errors import ConfigurationError

ACCOUNTINGS = ("dpinfer", "as_published")
SEEDED_NOTE = (
    "A random seed was set: this holds only while the seed stays secret (whoever knows it can replay the noise); "
    "seeds are for tests and benchmarks, not for private releases."
)


def _freeze(value: Any, where: str) -> Any:
    """A read-only, JSON-compatible copy of a parameter value: mappings become read-only and sorted, lists tuples."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, Mapping):
        if not all(isinstance(key, str) for key in value):
            raise ConfigurationError(f"parameter names must be strings, got {sorted(map(repr, value))} in {where}")
        return MappingProxyType({key: _freeze(value[key], f"{where}.{key}") for key in sorted(value)})
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(item, f"{where}[{i}]") for i, item in enumerate(value))
    raise ConfigurationError(
        f"{where} is a {type(value).__name__}, which a guarantee cannot store; "
        "pass numbers, strings, booleans, None, lists or mappings of these"
    )

USEFUL_EPSILON = 5.0
"""Above this ε (e^5 ≈ 148) a worst-case (ε, δ) bound says little about any single yes/no fact: every statement of
such a guarantee carries :func:`epsilon_caveat`."""

CHOOSING_EPSILON = "docs/threat-model.md (\"Choosing ε\")"
"""Where a user reads how to choose ε (the caveat points there)."""


def odds_factor(epsilon: float) -> str:
    """e^ε in words a reader can compare: ``"2.72"``, ``"22,100"``, ``"2.4·10^17"`` (rounded up).

    >>> odds_factor(1), odds_factor(10), odds_factor(40), odds_factor(28200)
    ('2.72', '22,100', '2.4·10^17', '1.3·10^12247')
    """
    if math.isinf(epsilon):
        return "∞"
    if epsilon < 10:
        return format_up(math.exp(epsilon))
    log10 = epsilon / math.log(10)
    exponent = math.floor(log10)
    mantissa = 10 ** (log10 - exponent)
    if exponent < 6:
        return f"{float(format_up(mantissa * 10**exponent)):,.0f}"
    return f"{math.ceil(mantissa * 10) / 10:g}·10^{exponent}"


def epsilon_caveat(epsilon: float, about: str = "the protected data") -> str | None:
    """The caveat every statement of a large ε carries (``None`` at ε ≤ :data:`USEFUL_EPSILON`): what e^ε means at
    that ε, and where to read how to choose ε.

    >>> epsilon_caveat(2) is None
    True
    >>> print(epsilon_caveat(40))  # doctest: +NORMALIZE_WHITESPACE
    Caveat: at ε = 40 the worst-case bound is weak: the release may change the odds of a yes/no conclusion about the
    protected data by a factor of up to e^40 ≈ 2.4·10^17. See docs/threat-model.md ("Choosing ε") for what it still
    means and how to choose ε.
    """
    if math.isinf(epsilon) or epsilon <= USEFUL_EPSILON:
        return None
    return (f"Caveat: at ε = {format_up(epsilon)} the worst-case bound is weak: the release may change the odds of a "
            f"yes/no conclusion about {about} by a factor of up to e^{format_up(epsilon)} ≈ {odds_factor(epsilon)}. "
            f"See {CHOOSING_EPSILON} for what it still means and how to choose ε.")


@dataclass(frozen=True)
class GroupGuarantee:
    """(ε, δ)-DP for one privacy group (e.g. DP-Fusion's PERSON spans), with the knobs that produced it.

    >>> group = GroupGuarantee("PERSON", epsilon=4.2, delta=1e-5, parameters={"beta": 0.01})
    >>> group.parameters["beta"], group.to_dict()["epsilon"]
    (0.01, 4.2)
    """

    name: str
    epsilon: float
    delta: float
    parameters: Mapping[str, Any] = field(default_factory=dict, hash=False)
    loss: PrivacyLoss | None = field(default=None, compare=False, repr=False)
    """The group's ex-ante :class:`PrivacyLoss` (not compared, not serialised): what a budget ledger composes."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigurationError(f"a privacy group needs a non-empty name, got {self.name!r}")
        object.__setattr__(self, "epsilon", non_negative_number(self.epsilon, "ε", allow_inf=True))
        object.__setattr__(self, "delta", check_probability(self.delta, "a guarantee's δ", high_open=True))
        object.__setattr__(self, "parameters", _freeze(self.parameters, f"parameters of group {self.name}"))

    @classmethod
    def from_loss(
        cls, name: str, loss: PrivacyLoss, *, delta: float, parameters: Mapping[str, Any] | None = None
    ) -> GroupGuarantee:
        """The group's guarantee from its ex-ante loss, converted at ``delta``."""
        return cls(name, loss.to_epsilon(delta), delta, parameters or {}, loss=loss)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (infinities as "inf")."""
        return plain({"name": self.name, "epsilon": self.epsilon, "delta": self.delta, "parameters": self.parameters})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GroupGuarantee:
        """The inverse of :meth:`to_dict`."""
        return cls(data["name"], float(data["epsilon"]), float(data["delta"]), data.get("parameters", {}))


@dataclass(frozen=True)
class Guarantee:
    """An (ε, δ)-differential-privacy guarantee, with everything needed to read it: mechanism, adjacency, knobs.

    Definition (Dwork & Roth 2014, Def. 2.4): for every pair of inputs D, D′ adjacent as stated in ``adjacency`` and
    every set S of outputs, P[M(D) ∈ S] ≤ e^ε · P[M(D′) ∈ S] + δ. The guarantee is ex ante (ALGORITHMS §0): computed
    from the mechanism's ``parameters`` and the maximum length ``max_new_tokens`` (T_max) before any private data is
    read. ``order`` is the Rényi order when the underlying bound holds at that order only. ``groups`` holds one
    guarantee per privacy group; the headline (ε, δ) must cover every group. ``accounting="as_published"`` marks the
    authors' own accounting, kept for comparison and flagged in the text. ``loss`` (not compared, not serialised) is
    the underlying :class:`PrivacyLoss`. ε = ∞ means no privacy guarantee. ``seeded`` marks a run whose noise came
    from a seeded stream: the statement then says that it holds only while the seed is secret (:data:`SEEDED_NOTE`).

    >>> from dpinfer.accounting import Zcdp
    >>> g = Guarantee.from_loss(Zcdp(1.5), delta=1e-6, mechanism="invisibleink",
    ...     adjacency="replace-by-null of one reference", parameters={"C": 0.6, "tau": 1.1}, max_new_tokens=500)
    >>> print(g)  # doctest: +NORMALIZE_WHITESPACE
    invisibleink: (ε = 9.85, δ = 1e-06)-differential privacy against replace-by-null of one reference;
    computed before reading the private data, from the mechanism's parameters and at most 500 generated tokens.
    >>> print(Guarantee.no_privacy("sampler"))
    sampler: no privacy guarantee.
    """

    epsilon: float
    delta: float
    mechanism: str
    adjacency: str
    parameters: Mapping[str, Any] = field(default_factory=dict, hash=False)
    max_new_tokens: int | None = None
    order: float | None = None
    groups: tuple[GroupGuarantee, ...] = ()
    accounting: str = "dpinfer"
    loss: PrivacyLoss | None = field(default=None, compare=False, repr=False)
    ex_ante: bool = True
    seeded: bool = False
    """The run drew its noise from a seeded stream (tests and benchmarks): the guarantee then holds only while the
    seed stays secret, since whoever knows it can replay the noise. The seed itself is never part of a release."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", non_negative_number(self.epsilon, "ε", allow_inf=True))
        object.__setattr__(self, "delta", check_probability(self.delta, "a guarantee's δ", high_open=True))
        if not isinstance(self.mechanism, str) or not self.mechanism:
            raise ConfigurationError(f"a guarantee needs the mechanism's name, got {self.mechanism!r}")
        if not isinstance(self.adjacency, str) or not self.adjacency:
            raise ConfigurationError("a guarantee needs its adjacency as a sentence, e.g. 'replace-by-null of ...'")
        object.__setattr__(self, "parameters", _freeze(self.parameters, "parameters"))
        if self.max_new_tokens is not None:
            if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, numbers.Integral):
                raise ConfigurationError(f"max_new_tokens must be None or an integer, got {self.max_new_tokens!r}")
            if self.max_new_tokens < 0:
                raise ConfigurationError(f"max_new_tokens must be ≥ 0, got {self.max_new_tokens}")
            object.__setattr__(self, "max_new_tokens", int(self.max_new_tokens))
        if self.order is not None:
            if not 1.0 < self.order < math.inf:
                raise ConfigurationError(f"order must be None or a finite Rényi order > 1, got {self.order!r}")
            object.__setattr__(self, "order", float(self.order))
        groups = tuple(self.groups)
        if not all(isinstance(group, GroupGuarantee) for group in groups):
            raise ConfigurationError("groups must be GroupGuarantee objects")
        if len({group.name for group in groups}) < len(groups):
            raise ConfigurationError(f"group names must be distinct, got {[group.name for group in groups]}")
        for group in groups:
            if group.epsilon > self.epsilon or group.delta > self.delta:
                raise ConfigurationError(
                    f"group {group.name} has (ε = {group.epsilon:g}, δ = {group.delta:g}), more than the headline "
                    f"(ε = {self.epsilon:g}, δ = {self.delta:g}); the headline must be the worst group's guarantee"
                )
        object.__setattr__(self, "groups", groups)
        if self.accounting not in ACCOUNTINGS:
            raise ConfigurationError(f"accounting must be one of {ACCOUNTINGS}, got {self.accounting!r}")
        if not isinstance(self.seeded, bool):
            raise ConfigurationError(f"seeded must be True or False, got {self.seeded!r}")

    @classmethod
    def no_privacy(cls, mechanism: str) -> Guarantee:
        """The statement for outputs that read private data without a DP mechanism: ε = ∞."""
        return cls(math.inf, 0.0, mechanism, "any change to the private input")

    @classmethod
    def from_loss(
        cls,
        loss: PrivacyLoss,
        *,
        delta: float,
        mechanism: str,
        adjacency: str,
        parameters: Mapping[str, Any],
        max_new_tokens: int | None,
        groups: Iterable[GroupGuarantee] = (),
        accounting: str = "dpinfer",
    ) -> Guarantee:
        """The guarantee of an ex-ante ``loss`` (for groups: the worst group's loss) converted at ``delta``."""
        return cls(
            epsilon=loss.to_epsilon(delta),
            delta=delta,
            mechanism=mechanism,
            adjacency=adjacency,
            parameters=parameters,
            max_new_tokens=max_new_tokens,
            order=loss.alpha if isinstance(loss, SingleOrderRdp) else None,
            groups=tuple(groups),
            accounting=accounting,
            loss=loss,
        )

    def worst_group(self) -> GroupGuarantee | None:
        """The group with the largest (ε, δ), or None without groups."""
        return max(self.groups, key=lambda group: (group.epsilon, group.delta), default=None)

    def __str__(self) -> str:
        if math.isinf(self.epsilon):
            return f"{self.mechanism}: no privacy guarantee."
        figure = f"ε = {format_up(self.epsilon)}, δ = {format_up(self.delta)}"
        if not self.ex_ante:
            text = (
                f"{self.mechanism}: no differential-privacy guarantee; the figure {figure} against {self.adjacency} "
                "was computed from the private data (data-dependent)"
            )
        else:
            scope = ""
            if self.groups:
                per_group = "; ".join(f"{group.name}: ε = {format_up(group.epsilon)}" for group in self.groups)
                scope = f" for each privacy group ({per_group})"
            text = f"{self.mechanism}: ({figure})-differential privacy{scope} against {self.adjacency}"
            if self.order is not None:
                text += f", from a Rényi bound at order α = {self.order:g}"
            text += "; computed before reading the private data, from the mechanism's parameters"
            if self.max_new_tokens is not None:
                text += f" and at most {self.max_new_tokens} generated tokens"
        if self.accounting == "as_published":
            text += "; accounting as published by the mechanism's authors, not dpinfer's own"
        text += "."
        if self.seeded and self.epsilon > 0:
            text += (" " + SEEDED_NOTE)
        return text

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (infinities as "inf"), with the plain-English ``statement``; ``loss`` is left out."""
        return plain(
            {
                "epsilon": self.epsilon,
                "delta": self.delta,
                "mechanism": self.mechanism,
                "adjacency": self.adjacency,
                "parameters": self.parameters,
                "max_new_tokens": self.max_new_tokens,
                "order": self.order,
                "groups": tuple(group.to_dict() for group in self.groups),
                "accounting": self.accounting,
                "ex_ante": self.ex_ante,
                "seeded": self.seeded,
                "statement": str(self),
            }
        )

    def to_json(self, **kwargs: Any) -> str:
        """:meth:`to_dict` as JSON; keyword arguments go to :func:`json.dumps`."""
        return json.dumps(self.to_dict(), ensure_ascii=False, **kwargs)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Guarantee:
        """The inverse of :meth:`to_dict` (without ``loss``; non-finite parameter values stay strings)."""
        order = data.get("order")
        return cls(
            epsilon=float(data["epsilon"]),
            delta=float(data["delta"]),
            mechanism=data["mechanism"],
            adjacency=data["adjacency"],
            parameters=data.get("parameters", {}),
            max_new_tokens=data.get("max_new_tokens"),
            order=None if order is None else float(order),
            groups=tuple(GroupGuarantee.from_dict(group) for group in data.get("groups", ())),
            accounting=data.get("accounting", "dpinfer"),
            ex_ante=data.get("ex_ante", True),
            seeded=bool(data.get("seeded", False)),
        )


@dataclass(frozen=True)
class DataDependentSpend:
    """A figure computed from realised, data-dependent quantities: reported ex post, and NOT a privacy guarantee.

    ALGORITHMS §0: anything computed from realised divergences, lengths or screening decisions depends on the private
    data, so it bounds nothing about the mechanism and may itself leak. It is shown as "spent (data-dependent, not a
    guarantee)" and never named ε: ``mechanism`` and ``quantity`` may not contain "ε" or "epsilon".

    >>> print(DataDependentSpend("dp-fusion", "sum of realised Rényi divergences at order 2 (PERSON)", 0.7312))
    dp-fusion: sum of realised Rényi divergences at order 2 (PERSON), spent (data-dependent, not a guarantee): 0.7312
    """

    mechanism: str
    quantity: str
    value: float
    label: ClassVar[str] = "spent (data-dependent, not a guarantee)"

    def __post_init__(self) -> None:
        for text in (self.mechanism, self.quantity):
            if not isinstance(text, str) or not text:
                raise ConfigurationError("a data-dependent figure needs a mechanism name and a description")
            if "ε" in text or "epsilon" in text.lower():
                raise ConfigurationError(
                    f"a data-dependent figure must not be named ε (it is not a guarantee), got {text!r}; describe what "
                    "was measured, e.g. 'sum of realised Rényi divergences at order 2'"
                )
        if math.isnan(self.value):
            raise ConfigurationError(f"a data-dependent figure must be a number, got {self.value!r}")
        object.__setattr__(self, "value", float(self.value))

    def __str__(self) -> str:
        return f"{self.mechanism}: {self.quantity}, {self.label}: {self.value:.4g}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (infinities as "inf") carrying the data-dependent ``label``."""
        return plain(
            {"label": self.label, "mechanism": self.mechanism, "quantity": self.quantity, "value": self.value}
        )
