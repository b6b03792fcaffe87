"""dpinfer's one accountant: privacy losses, their composition, their conversion to (ε, δ), and the guarantee.

Every mechanism declares what one step releases as a :class:`LossEvent` (frozen, parameter-only; the events and their
formulas live here: :mod:`dpinfer.accounting.events`, :mod:`dpinfer.accounting.dp_fusion`), whose per-step loss is a
:class:`PrivacyLoss` (a Rényi-DP curve: :class:`RdpCurve`, :class:`Zcdp`, :class:`PureDp`, or :class:`SingleOrderRdp`
for a bound that holds at one order). The accountant composes it over the most steps a generation can take
(:func:`compose_steps`; in general :func:`compose` / :func:`compose_parallel`), solves a knob for a target with
:func:`calibrate_event` / :func:`calibrate`, and reports a :class:`Guarantee` computed ex ante
(:func:`ex_ante_guarantee`). Data-dependent figures are reported as :class:`DataDependentSpend`, never as ε. A
:class:`Ledger` (:mod:`dpinfer.accounting.ledger`) composes the releases charged to a protected unit across processes
and refuses one that would overspend its budget.

>>> loss = Zcdp(0.01).times(100) + PureDp(0.1)
>>> guarantee = Guarantee.from_loss(loss, delta=1e-5, mechanism="demo", adjacency="replace-one",
...                                 parameters={"sigma": 7.07}, max_new_tokens=100)
>>> guarantee.epsilon == loss.to_epsilon(1e-5)
True
"""

from dpinfer.accounting.accountant import (
    Adjacency,
    Composition,
    LossEvent,
    NoGuaranteeEvent,
    NoLossEvent,
    PrivacyAccountant,
    calibrate_event,
    compose_steps,
    ex_ante_guarantee,
    grow_bracket,
)
from dpinfer.accounting.calibration import calibrate, zcdp_rho_for_target
from dpinfer.accounting.costs import Cost
from dpinfer.accounting.guarantee import DataDependentSpend, GroupGuarantee, Guarantee
from dpinfer.accounting.ledger import Charge, Ledger
from dpinfer.accounting.ledger_store import UnitStatus
from dpinfer.accounting.losses import (
    DEFAULT_ORDERS,
    PrivacyLoss,
    PureDp,
    RdpCurve,
    SingleOrderRdp,
    Zcdp,
    compose,
    compose_parallel,
    conversion_route,
    delta_from_rdp,
    epsilon_from_rdp,
)

__all__ = [
    "DEFAULT_ORDERS",
    "Adjacency",
    "Charge",
    "Composition",
    "Cost",
    "DataDependentSpend",
    "GroupGuarantee",
    "Guarantee",
    "Ledger",
    "LossEvent",
    "NoGuaranteeEvent",
    "NoLossEvent",
    "PrivacyAccountant",
    "PrivacyLoss",
    "PureDp",
    "RdpCurve",
    "SingleOrderRdp",
    "UnitStatus",
    "Zcdp",
    "calibrate",
    "calibrate_event",
    "compose",
    "compose_parallel",
    "compose_steps",
    "conversion_route",
    "delta_from_rdp",
    "epsilon_from_rdp",
    "ex_ante_guarantee",
    "grow_bracket",
    "zcdp_rho_for_target",
]
