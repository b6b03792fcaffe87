"""dpinfer's one accountant: privacy losses, their composition, their conversion to (ε, δ), and the guarantee.

Every mechanism states its loss as a :class:`PrivacyLoss` (a Rényi-DP curve: :class:`RdpCurve`, :class:`Zcdp`,
:class:`PureDp`, or :class:`SingleOrderRdp` for a bound that holds at one order), composes it with :func:`compose` /
:func:`compose_parallel`, solves its knob with :func:`calibrate`, and reports a :class:`Guarantee` computed ex ante.
Data-dependent figures are reported as :class:`DataDependentSpend`, never as ε.

>>> loss = Zcdp(0.01).times(100) + PureDp(0.1)
>>> guarantee = Guarantee.from_loss(loss, delta=1e-5, mechanism="demo", adjacency="replace-one",
...                                 parameters={"sigma": 7.07}, max_new_tokens=100)
>>> guarantee.epsilon == loss.to_epsilon(1e-5)
True
"""

from dpinfer.accounting.calibration import calibrate, zcdp_rho_for_target
from dpinfer.accounting.guarantee import DataDependentSpend, GroupGuarantee, Guarantee
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
    "DataDependentSpend",
    "GroupGuarantee",
    "Guarantee",
    "PrivacyLoss",
    "PureDp",
    "RdpCurve",
    "SingleOrderRdp",
    "Zcdp",
    "calibrate",
    "compose",
    "compose_parallel",
    "conversion_route",
    "delta_from_rdp",
    "epsilon_from_rdp",
    "zcdp_rho_for_target",
]
