"""The accountant's one path: a mechanism declares its per-step loss event; the accountant does the rest.

A mechanism states WHAT one step releases as a :class:`LossEvent`: a frozen value object holding parameters only
(never a logit, a length or a text), whose docstring states the math and whose :meth:`LossEvent.step_loss` is the
:class:`~dpinfer.accounting.PrivacyLoss` of one step (as Google's dp_accounting keeps ``DpEvent`` objects apart from
the accountant that composes them). The accountant then

* composes the event over the most steps a generation can take (:func:`compose_steps`: adaptive composition,
  Mironov 2017, Prop. 1; ``T_max`` tokens, times the number of sequences that read the private input);
* converts it to (ε, δ) and builds the ex-ante :class:`~dpinfer.accounting.Guarantee` (:func:`ex_ante_guarantee`);
* solves a knob for a target (ε, δ) on exactly that loss (:func:`calibrate_event`), so that a calibrated mechanism
  always reports at most its target;
* keeps a history of releases (:class:`PrivacyAccountant`, as dp_accounting's ``PrivacyAccountant.compose(event,
  count)`` under one ``NeighboringRelation``): each entry an event, how many times it ran, and its
  :class:`Adjacency`; the history composes to one loss and saves to / loads from JSON.

>>> from dataclasses import dataclass
>>> from dpinfer.accounting import PureDp
>>> @dataclass(frozen=True)
... class RandomisedResponse(LossEvent):
...     '''One bit kept with probability e^ε/(1 + e^ε): ε-DP per step.'''
...     epsilon: float
...     def step_loss(self):
...         return PureDp(self.epsilon)
>>> compose_steps(RandomisedResponse(0.1), 3).to_epsilon(1e-5) <= 0.3 + 1e-12
True
>>> eps = calibrate_event(RandomisedResponse, steps=10, epsilon=1.0, delta=1e-5, lo=0.0, hi=1.0, name="ε_step")
>>> round(eps, 6), ex_ante_guarantee(RandomisedResponse(eps), steps=10, delta=1e-5, mechanism="rr",
...     adjacency="any two bits", parameters={}, max_new_tokens=10).epsilon <= 1.0
(0.1, True)
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import json
import math
import os
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpinfer.accounting.calibration import calibrate
from dpinfer.accounting.guarantee import GroupGuarantee, Guarantee
from dpinfer.accounting.losses import PrivacyLoss, PureDp, Zcdp, compose, conversion_route
from dpinfer.checks import check_delta, positive_int
from dpinfer.errors import ConfigurationError

__all__ = [
    "Adjacency",
    "Composition",
    "LossEvent",
    "NoGuaranteeEvent",
    "NoLossEvent",
    "PrivacyAccountant",
    "calibrate_event",
    "compose_steps",
    "ex_ante_guarantee",
    "grow_bracket",
]


class Adjacency(enum.StrEnum):
    """Which pairs of inputs a guarantee compares (dp_accounting's ``NeighboringRelation``; ALGORITHMS.md states one
    per mechanism). A ``str`` enum: ``Adjacency("replace-one") is Adjacency.REPLACE_ONE`` and it compares, hashes and
    serialises as its value.

    >>> Adjacency("replace-by-null"), Adjacency.REPLACE_ONE == "replace-one"
    (<Adjacency.REPLACE_BY_NULL: 'replace-by-null'>, True)
    >>> Adjacency.REPLACE_ONE.covers(Adjacency.REPLACE_BY_NULL), Adjacency.REPLACE_BY_NULL.covers("replace-one")
    (True, False)
    """

    REPLACE_BY_NULL = "replace-by-null"
    """One unit (a group of spans, a reference, a retrieved context) replaced by the null input ⊥."""
    REPLACE_ONE = "replace-one"
    """One unit replaced by any other value (⊥ included): covers replace-by-null too."""
    ADD_OR_REMOVE = "add-or-remove"
    """One unit added to or removed from a collection."""
    ANY_TWO_INPUTS = "any-two-inputs"
    """Any two inputs (local DP: DP-Decoding, DP-Prompt, DP-GTR): covers every relation above."""

    @classmethod
    def of(cls, value: object, name: str = "adjacency", choices: Iterable[Adjacency] | None = None) -> Adjacency:
        """``value`` (an :class:`Adjacency` or its string) checked against ``choices`` (default: every member).

        >>> Adjacency.of("replace-one", choices=[Adjacency.REPLACE_BY_NULL])
        Traceback (most recent call last):
        ...
        dpinfer.errors.ConfigurationError: adjacency must be one of replace-by-null, got 'replace-one'
        """
        allowed = list(cls) if choices is None else [cls(c) for c in choices]
        if isinstance(value, str) and value in allowed:
            return cls(value)
        raise ConfigurationError(f"{name} must be one of {', '.join(a.value for a in allowed)}, got {value!r}")

    def covers(self, other: Adjacency | str) -> bool:
        """Whether a guarantee under this relation also holds under ``other`` (``other``'s pairs are among ours)."""
        other = Adjacency(other)
        return other == self or self is Adjacency.ANY_TWO_INPUTS or (
            self is Adjacency.REPLACE_ONE and other is Adjacency.REPLACE_BY_NULL)

    @classmethod
    def common(cls, relations: Iterable[Adjacency | str]) -> Adjacency:
        """The strongest relation that every one of ``relations`` covers: what their composition holds under.

        >>> Adjacency.common(["replace-one", "replace-by-null"])
        <Adjacency.REPLACE_BY_NULL: 'replace-by-null'>
        """
        given = {cls(r) for r in relations}
        if not given:
            raise ConfigurationError("no adjacency to combine")
        for candidate in sorted(given, key=lambda a: sum(a.covers(b) for b in cls)):
            if all(g.covers(candidate) for g in given):
                return candidate
        raise ConfigurationError(f"releases under {', '.join(sorted(given))} do not compose under one adjacency")


@dataclass(frozen=True)
class LossEvent(ABC):
    """The privacy loss of ONE step of a mechanism, from its parameters only (subclasses are frozen dataclasses).

    The docstring of each subclass states the adjacency and the math; :meth:`step_loss` returns the per-step loss.
    """

    @abstractmethod
    def step_loss(self) -> PrivacyLoss:
        """The :class:`~dpinfer.accounting.PrivacyLoss` of one step."""


def compose_steps(event: LossEvent, steps: int) -> PrivacyLoss:
    """The ex-ante loss of at most ``steps`` adaptive repetitions of ``event``: ``event.step_loss().times(steps)``."""
    if not isinstance(event, LossEvent):
        raise TypeError(f"compose_steps needs a LossEvent, got {type(event).__name__}")
    return event.step_loss().times(positive_int(steps, "the number of steps"))


def ex_ante_guarantee(
    event: LossEvent,
    *,
    steps: int,
    delta: float,
    mechanism: str,
    adjacency: str,
    parameters: Mapping[str, Any],
    max_new_tokens: int | None,
    groups: Iterable[GroupGuarantee] = (),
    accounting: str = "dpinfer",
    route: bool = False,
) -> Guarantee:
    """The :class:`~dpinfer.accounting.Guarantee` of ``steps`` repetitions of ``event``, converted at ``delta``.

    ``route=True`` adds ``parameters["composition"]``, the conversion that wins (:func:`conversion_route`).
    """
    loss = compose_steps(event, steps)
    params = dict(parameters)
    if route:
        params["composition"] = conversion_route(loss, delta)
    return Guarantee.from_loss(
        loss,
        delta=delta,
        mechanism=mechanism,
        adjacency=adjacency,
        parameters=params,
        max_new_tokens=max_new_tokens,
        groups=groups,
        accounting=accounting,
    )


def calibrate_event(
    event_for: Callable[[float], LossEvent],
    *,
    steps: int,
    epsilon: float,
    delta: float,
    lo: float,
    hi: float,
    increasing: bool = True,
    name: str = "knob",
) -> float:
    """The most permissive knob in [lo, hi] whose ``steps``-fold event meets ``(epsilon, delta)``.

    ``event_for(knob)`` builds the event; the loss bisected is exactly :func:`compose_steps` of it, the loss the
    guarantee reports (:func:`~dpinfer.accounting.calibrate` states the policy at the ends of the bracket).
    """
    steps = positive_int(steps, "the number of steps")
    return calibrate(
        lambda knob: compose_steps(event_for(knob), steps),
        epsilon=epsilon,
        delta=delta,
        lo=lo,
        hi=hi,
        increasing=increasing,
        name=name,
    )


def grow_bracket(meets: Callable[[float], bool], start: float = 1.0, *, limit: float = 1e6) -> float:
    """Double ``start`` while ``meets`` holds and it is below ``limit``: the upper end of a calibration bracket for a
    knob whose loss increases (the first value that misses the target, or the first ≥ ``limit``).

    >>> grow_bracket(lambda x: x < 5.0)
    8.0
    """
    hi = start
    while meets(hi) and hi < limit:
        hi *= 2.0
    return hi


# ------------------------------------------------------------------------------------------------------ history
@dataclass(frozen=True)
class NoLossEvent(LossEvent):
    """A release that reads nothing private (e.g. an answer from the public row alone): ε = 0."""

    def step_loss(self) -> PrivacyLoss:
        return PureDp(0.0)


@dataclass(frozen=True)
class NoGuaranteeEvent(LossEvent):
    """A release that reads private data without a DP mechanism: no finite loss, so it voids any composition."""

    def step_loss(self) -> PrivacyLoss:
        raise ConfigurationError("a release without a guarantee has no finite privacy loss")


EVENT_MODULES = "dpinfer.accounting"
"""A saved history names its events as ``"module:Class"``; only classes under this package are loaded back."""


def _event_name(event: LossEvent) -> str:
    return f"{type(event).__module__}:{type(event).__qualname__}"


def _event_class(name: object) -> type[LossEvent]:
    if not isinstance(name, str) or ":" not in name or not name.startswith(EVENT_MODULES + "."):
        raise ConfigurationError(f"a saved history names an unknown event {name!r}")
    module, _, cls_name = name.partition(":")
    try:
        cls = getattr(importlib.import_module(module), cls_name)
    except (ImportError, AttributeError):
        raise ConfigurationError(f"a saved history names an unknown event {name!r}") from None
    if not (isinstance(cls, type) and issubclass(cls, LossEvent)):
        raise ConfigurationError(f"a saved history names {name!r}, which is not a loss event")
    return cls


@dataclass(frozen=True)
class Composition:
    """One entry of a :class:`PrivacyAccountant`'s history: ``event`` run ``count`` times under ``adjacency``.
    ``label`` names the release (a method name: a public setting); ``delta`` is the δ it was reported at."""

    event: LossEvent
    count: int
    adjacency: Adjacency
    label: str = ""
    delta: float | None = None

    @property
    def bounded(self) -> bool:
        """False for a release without a guarantee (:class:`NoGuaranteeEvent`)."""
        return not isinstance(self.event, NoGuaranteeEvent)

    def loss(self) -> PrivacyLoss | None:
        """The entry's loss (None for a release without a guarantee or one that reads nothing private)."""
        if not self.bounded or isinstance(self.event, NoLossEvent):
            return None
        return compose_steps(self.event, self.count)

    def to_dict(self) -> dict[str, Any]:
        params = {f.name: getattr(self.event, f.name) for f in dataclasses.fields(self.event)}
        return {"event": _event_name(self.event), "params": params, "count": self.count,
                "adjacency": self.adjacency.value, "label": self.label, "delta": self.delta}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Composition:
        if not isinstance(data, Mapping):
            raise ConfigurationError("a saved history entry must be a JSON object")
        params = data.get("params") or {}
        if not isinstance(params, Mapping):
            raise ConfigurationError("a saved history entry's params must be a JSON object")
        try:
            event = _event_class(data.get("event"))(**params)
        except TypeError:
            raise ConfigurationError(f"a saved history entry has bad params for {data.get('event')!r}") from None
        delta = data.get("delta")
        return cls(event, positive_int(data.get("count"), "a saved history entry's count"),
                   Adjacency.of(data.get("adjacency"), "a saved history entry's adjacency"), str(data.get("label", "")),
                   None if delta is None else check_delta(delta))


class PrivacyAccountant:
    """Composes releases as dp_accounting's ``PrivacyAccountant`` does: :meth:`compose` ``(event, count)`` appends to a
    history; :meth:`loss` is the sequential (adaptive) composition of every entry (Mironov 2017, Prop. 1), converted
    once by :meth:`epsilon` / :meth:`guarantee`. ``adjacency``: the relation every entry must cover (None: any; the
    history then holds under :meth:`relation`, the strongest one all entries cover).

    >>> from dpinfer.accounting.gaussian import GaussianShiftEvent
    >>> acc = PrivacyAccountant(Adjacency.REPLACE_BY_NULL)
    >>> acc.compose(GaussianShiftEvent(1.0, 1.0), count=4).compose(NoLossEvent(), label="public").loss()
    Zcdp(rho=2.0)
    >>> PrivacyAccountant.from_json(acc.to_json()).history == acc.history
    True
    >>> acc.compose(NoGuaranteeEvent(), label="none").epsilon(1e-5)
    inf
    """

    def __init__(self, adjacency: Adjacency | str | None = None,
                 history: Iterable[Composition] = ()) -> None:
        self.adjacency = None if adjacency is None else Adjacency.of(adjacency)
        self._history: list[Composition] = []
        for entry in history:
            self._append(entry)

    def _append(self, entry: Composition) -> None:
        if self.adjacency is not None and not entry.adjacency.covers(self.adjacency):
            raise ConfigurationError(f"a release under {entry.adjacency} does not cover this accountant's "
                                     f"{self.adjacency}")
        self._history.append(entry)

    def compose(self, event: LossEvent, count: int = 1, *, adjacency: Adjacency | str | None = None,
                label: str = "", delta: float | None = None) -> PrivacyAccountant:
        """Add ``count`` adaptive runs of ``event`` under ``adjacency`` (default: the accountant's; refused when it
        does not cover the accountant's). Returns the accountant (calls chain)."""
        if not isinstance(event, LossEvent):
            raise TypeError(f"compose needs a LossEvent, got {type(event).__name__}")
        relation = adjacency if adjacency is not None else self.adjacency
        if relation is None:
            raise ConfigurationError("give the release's adjacency (this accountant has none of its own)")
        self._append(Composition(event, positive_int(count, "count"), Adjacency.of(relation), str(label),
                                 None if delta is None else check_delta(delta)))
        return self

    @property
    def history(self) -> tuple[Composition, ...]:
        return tuple(self._history)

    def __len__(self) -> int:
        return len(self._history)

    @property
    def bounded(self) -> bool:
        """False once a release without a guarantee was composed (ε = ∞ from then on)."""
        return all(e.bounded for e in self._history)

    def relation(self) -> Adjacency | None:
        """The adjacency the whole history holds under (None while it is empty and the accountant has none)."""
        if not self._history:
            return self.adjacency
        return Adjacency.common(e.adjacency for e in self._history)

    def loss(self) -> PrivacyLoss | None:
        """Every entry's loss composed (zCDP ρ 0 for an empty or all-public history); None when unbounded."""
        if not self.bounded:
            return None
        losses = [lo for lo in (e.loss() for e in self._history) if lo is not None]
        return compose(*losses) if losses else Zcdp(0.0)

    def epsilon(self, delta: float) -> float:
        """ε of the whole history at ``delta`` (∞ when a release had no guarantee)."""
        loss = self.loss()
        return math.inf if loss is None else loss.to_epsilon(check_delta(delta))

    def delta(self, default: float = 1e-5) -> float:
        """The largest δ an entry was reported at (``default`` when none says)."""
        return max((e.delta for e in self._history if e.delta is not None), default=default)

    def guarantee(self, *, mechanism: str, adjacency: str, parameters: Mapping[str, Any] | None = None,
                  delta: float | None = None) -> Guarantee:
        """The history's :class:`Guarantee` at ``delta`` (default: :meth:`delta`); ``adjacency`` is its sentence."""
        loss = self.loss()
        if loss is None:
            return Guarantee.no_privacy(mechanism)
        return Guarantee.from_loss(loss, delta=self.delta() if delta is None else delta, mechanism=mechanism,
                                   adjacency=adjacency, parameters=dict(parameters or {}), max_new_tokens=None)

    # ---------------------------------------------------------------- save / load
    def to_json(self) -> str:
        return json.dumps({"adjacency": None if self.adjacency is None else self.adjacency.value,
                           "history": [e.to_dict() for e in self._history]}, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> PrivacyAccountant:
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            raise ConfigurationError("a saved accountant is not valid JSON") from None
        if not isinstance(data, dict) or not isinstance(data.get("history"), list):
            raise ConfigurationError("a saved accountant must be a JSON object with a 'history' list")
        return cls(data.get("adjacency"), [Composition.from_dict(e) for e in data["history"]])

    def save(self, path: str | Path) -> None:
        """Write the history to ``path`` as JSON, atomically (a temporary file renamed over it)."""
        target = Path(path)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(self.to_json())
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: str | Path) -> PrivacyAccountant:
        return cls.from_json(Path(path).read_text(encoding="utf-8"))
