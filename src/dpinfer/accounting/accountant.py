"""The accountant's one path: a mechanism declares its per-step loss event; the accountant does the rest.

A mechanism states WHAT one step releases as a :class:`LossEvent`: a frozen value object holding parameters only
(never a logit, a length or a text), whose docstring states the math and whose :meth:`LossEvent.step_loss` is the
:class:`~dpinfer.accounting.PrivacyLoss` of one step (as Google's dp_accounting keeps ``DpEvent`` objects apart from
the accountant that composes them). The accountant then

* composes the event over the most steps a generation can take (:func:`compose_steps`: adaptive composition,
  Mironov 2017, Prop. 1; ``T_max`` tokens, times the number of sequences that read the private input);
* converts it to (ε, δ) and builds the ex-ante :class:`~dpinfer.accounting.Guarantee` (:func:`ex_ante_guarantee`);
* solves a knob for a target (ε, δ) on exactly that loss (:func:`calibrate_event`), so that a calibrated mechanism
  always reports at most its target.

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

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dpinfer.accounting.calibration import calibrate
from dpinfer.accounting.guarantee import GroupGuarantee, Guarantee
from dpinfer.accounting.losses import PrivacyLoss, conversion_route
from dpinfer.checks import positive_int

__all__ = ["LossEvent", "calibrate_event", "compose_steps", "ex_ante_guarantee", "grow_bracket"]


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
