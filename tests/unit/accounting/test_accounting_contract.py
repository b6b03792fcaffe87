"""The contract every PrivacyLoss honours, run against every subclass (subclass PrivacyLossContract, give `loss`)."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from dpinfer.accounting import PrivacyLoss, PureDp, RdpCurve, SingleOrderRdp, Zcdp, compose, compose_parallel
from dpinfer.errors import ConfigurationError

DELTAS = (1e-12, 1e-9, 1e-6, 1e-5, 1e-3, 0.1, 0.5)
PARTNERS = (Zcdp(0.05), PureDp(0.3), PureDp(0.2, bounded_range=True))
PARTNER_IDS = ("zcdp", "pure", "bounded-range")


class PrivacyLossContract:
    """Properties of any privacy loss; a subclass provides the ``loss`` fixture (parametrised over instances)."""

    @pytest.fixture
    def loss(self) -> PrivacyLoss:
        raise NotImplementedError("subclasses provide the loss under test")

    def test_to_epsilon_is_non_increasing_in_delta(self, loss: PrivacyLoss) -> None:
        epsilons = [loss.to_epsilon(delta) for delta in DELTAS]
        assert all(a >= b for a, b in itertools.pairwise(epsilons))

    @pytest.mark.parametrize("delta", DELTAS)
    def test_to_delta_inverts_to_epsilon(self, loss: PrivacyLoss, delta: float) -> None:
        assert loss.to_delta(loss.to_epsilon(delta)) <= delta * (1 + 1e-6)

    @pytest.mark.parametrize("partner", [*PARTNERS, None], ids=[*PARTNER_IDS, "itself"])
    def test_composition_never_decreases_epsilon(self, loss: PrivacyLoss, partner: PrivacyLoss | None) -> None:
        partner = loss if partner is None else partner
        for delta in (1e-9, 1e-5, 1e-3):
            alone = loss.to_epsilon(delta)
            assert (loss + partner).to_epsilon(delta) >= alone * (1 - 1e-12)
            assert compose(partner, loss).to_epsilon(delta) >= alone * (1 - 1e-12)

    @pytest.mark.parametrize("n", [1, 2, 7])
    def test_times_is_n_fold_composition(self, loss: PrivacyLoss, n: int) -> None:
        repeated, scaled = compose(*[loss] * n), loss.times(n)
        assert scaled == n * loss == loss * n
        assert type(scaled) is type(repeated)
        assert [scaled.rdp(alpha) for alpha in loss.orders] == pytest.approx(
            [repeated.rdp(alpha) for alpha in loss.orders], rel=1e-12
        )
        assert scaled.to_epsilon(1e-5) == pytest.approx(repeated.to_epsilon(1e-5), rel=1e-9)

    def test_rdp_is_non_negative(self, loss: PrivacyLoss) -> None:
        assert all(loss.rdp(alpha) >= 0 for alpha in (*loss.orders, 1.001, 1.5, 2.0, 8.0, 1e3, 1e6, math.inf))

    @pytest.mark.parametrize("partner", PARTNERS, ids=PARTNER_IDS)
    def test_parallel_is_at_least_each_part_and_at_most_the_sum(self, loss: PrivacyLoss, partner: PrivacyLoss) -> None:
        for delta in (1e-9, 1e-5, 1e-3):
            parallel = compose_parallel(loss, partner).to_epsilon(delta)
            assert parallel >= loss.to_epsilon(delta) * (1 - 1e-12)
            assert parallel <= compose(loss, partner).to_epsilon(delta) * (1 + 1e-12)
        assert compose_parallel(loss, loss) == loss.parallel(loss)
        assert compose_parallel(loss, loss).to_epsilon(1e-5) == pytest.approx(loss.to_epsilon(1e-5), rel=1e-12)

    @pytest.mark.parametrize("delta", [0.0, 1.0, -1e-5, 1.5, math.nan])
    def test_bad_delta_raises(self, loss: PrivacyLoss, delta: float) -> None:
        with pytest.raises(ConfigurationError, match="δ"):
            loss.to_epsilon(delta)

    @pytest.mark.parametrize("epsilon", [-0.1, math.nan])
    def test_bad_epsilon_raises(self, loss: PrivacyLoss, epsilon: float) -> None:
        with pytest.raises(ConfigurationError, match="ε"):
            loss.to_delta(epsilon)

    @pytest.mark.parametrize("alpha", [1.0, 0.5, math.nan])
    def test_orders_at_most_one_raise(self, loss: PrivacyLoss, alpha: float) -> None:
        with pytest.raises(ConfigurationError, match="order"):
            loss.rdp(alpha)

    def test_is_a_frozen_hashable_value(self, loss: PrivacyLoss) -> None:
        assert hash(loss) == hash(dataclasses.replace(loss))  # type: ignore[type-var]
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(loss, dataclasses.fields(loss)[0].name, 0.0)  # type: ignore[arg-type]


class TestZcdpContract(PrivacyLossContract):
    @pytest.fixture(params=[0.0, 0.01, 1.539, 50.0])
    def loss(self, request: pytest.FixtureRequest) -> PrivacyLoss:
        return Zcdp(request.param)


class TestPureDpContract(PrivacyLossContract):
    @pytest.fixture(params=[(0.05, False), (2.0, False), (10.0, False), (1.0, True)])
    def loss(self, request: pytest.FixtureRequest) -> PrivacyLoss:
        return PureDp(*request.param)


class TestSingleOrderRdpContract(PrivacyLossContract):
    @pytest.fixture(params=[(2.0, 0.0), (2.0, 0.5), (8.0, 3.0), (1.5, 40.0)])
    def loss(self, request: pytest.FixtureRequest) -> PrivacyLoss:
        return SingleOrderRdp(*request.param)


class TestRdpCurveContract(PrivacyLossContract):
    @pytest.fixture(
        params=[
            RdpCurve([1.5, 2.0, 3.0, 4.0, 8.0, 16.0, 32.0, 64.0], [a / 32 for a in (1.5, 2, 3, 4, 8, 16, 32, 64)]),
            RdpCurve([2.0, 4.0, 8.0], [0.5, 1.0, math.inf]),
            PureDp(0.2) + PureDp(0.1, bounded_range=True),
            Zcdp(0.3) + PureDp(1.0),
        ],
        ids=["gaussian-grid", "finite-range", "pure-sum", "zcdp-plus-pure"],
    )
    def loss(self, request: pytest.FixtureRequest) -> PrivacyLoss:
        return request.param
