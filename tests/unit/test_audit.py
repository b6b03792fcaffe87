"""dpinfer audit: the Clopper–Pearson bound, the broken variants it must catch, the rigorous mechanisms it must not
refute, and the command line."""

from __future__ import annotations

import builtins
import dataclasses
import json
import math

import pytest
import torch

from dpinfer.audit import audit, broken_variants, scenario
from dpinfer.audit.broken import BROKEN, shared_scale_int8
from dpinfer.audit.command import BROKEN_HELP, MECHANISMS_HELP
from dpinfer.audit.runner import run_audit
from dpinfer.audit.stats import clopper_pearson, epsilon_from_rates, epsilon_lower_bound
from dpinfer.cli import main
from dpinfer.errors import ConfigurationError
from dpinfer.mechanisms import available_mechanisms

TRIALS = 1000
BROKEN_CASES = [(m, v) for m in sorted(BROKEN) for v in sorted(BROKEN[m])]


@pytest.mark.parametrize(("k", "n"), [(0, 10), (3, 10), (10, 10), (0, 1000), (7, 1500), (1499, 1500)])
def test_clopper_pearson_without_scipy_matches_scipy(k, n, monkeypatch):
    pytest.importorskip("scipy")
    with_scipy = clopper_pearson(k, n)
    real_import = builtins.__import__

    def no_scipy(name, *args, **kwargs):
        if name.startswith("scipy"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_scipy)
    fallback = clopper_pearson(k, n)
    assert fallback == pytest.approx(with_scipy, abs=1e-9)
    lo, hi = fallback
    assert 0.0 <= lo <= k / n <= hi <= 1.0


def test_epsilon_bound_from_error_rates():
    # perfect separation on n runs each: bounded by the interval, not infinite
    eps = epsilon_lower_bound(0, 1000, 0, 1000, delta=1e-5)
    assert eps == pytest.approx(math.log((1 - 1e-5 - clopper_pearson(0, 1000)[1]) / clopper_pearson(0, 1000)[1]))
    assert 5.0 < eps < 6.0
    # a coin-flip test shows nothing
    assert epsilon_lower_bound(500, 1000, 500, 1000, delta=1e-5) == 0.0
    assert epsilon_from_rates(0.0, 0.5, 1e-5) == math.inf
    # the bound is below the point estimate
    assert epsilon_lower_bound(20, 1000, 300, 1000, delta=1e-5) < epsilon_from_rates(0.02, 0.3, 1e-5)


def test_every_registered_mechanism_has_an_audit():
    for name in available_mechanisms():
        sc = scenario(name)
        for pair in sc.pairs:
            assert pair.d.shape == pair.d_prime.shape and not torch.equal(pair.d, pair.d_prime)


@pytest.mark.parametrize("name", available_mechanisms())
def test_rigorous_mechanisms_are_not_refuted(name):
    result = audit(name, trials=TRIALS, seed=3)
    assert not result.exceeds
    assert result.epsilon_lb <= result.claimed_epsilon
    assert result.evaluation_trials + result.selection_trials == TRIALS


WEAK_BROKEN_TRIALS = {("pad", "small-sigma"): 6000, ("pad", "large-clip"): 6000}
"""Variants worth ε ≈ 21 against a claim of 4, whose Gaussian shift shows through an argmax only: more trials (at
the default 20,000 both are refuted with ε_lb ≈ 6.3; docs/audit.md)."""


@pytest.mark.parametrize(("name", "variant"), BROKEN_CASES)
def test_broken_variants_are_caught(name, variant):
    result = audit(name, trials=WEAK_BROKEN_TRIALS.get((name, variant), TRIALS), seed=3, broken=variant)
    sc = scenario(name)
    claim = sc.build().guarantee(sc.max_new_tokens).epsilon
    assert result.claimed_epsilon == pytest.approx(claim)  # the broken copy claims what the rigorous one does
    assert result.exceeds and result.epsilon_lb > result.claimed_epsilon


def test_audit_has_power_on_a_tight_mechanism():
    # DP-Decoding's one-token ε is exact on one-hot rows: the audit gets within reach of the claim
    result = audit("dp-decoding", trials=4000, seed=0)
    assert 3.0 < result.epsilon_lb <= result.claimed_epsilon


def test_sampler_claims_nothing_and_is_distinguishable():
    result = audit("sampler", trials=TRIALS, seed=0)
    assert math.isinf(result.claimed_epsilon) and not result.exceeds
    assert result.epsilon_lb > 4.0


def test_identical_inputs_give_no_evidence():
    # the test is chosen on separate trials, so two copies of the same input show (almost surely) nothing
    sc = scenario("dp-decoding")
    same = dataclasses.replace(sc, pairs=(dataclasses.replace(sc.pairs[0], d_prime=sc.pairs[0].d.clone()),))
    assert run_audit(same, trials=TRIALS, seed=5).epsilon_lb < 0.5


def test_seed_reproduces_the_audit():
    a, b = (audit("invisibleink", trials=200, seed=11) for _ in range(2))
    assert (a.fpr, a.fnr, a.epsilon_lb) == (b.fpr, b.fnr, b.epsilon_lb)


def test_int8_shared_scale_makes_the_public_row_depend_on_private_rows():
    for pair in scenario("dp-fusion", "int8-public").pairs:
        assert torch.equal(pair.d[0], pair.d_prime[0])  # the same public input
        assert not torch.equal(shared_scale_int8(pair.d)[0], shared_scale_int8(pair.d_prime)[0])


def test_unknown_names_fail_with_a_message():
    with pytest.raises(ConfigurationError, match="unknown mechanism"):
        scenario("no-such")
    with pytest.raises(ConfigurationError, match="no broken variant"):
        scenario("amin", "no-clip")
    with pytest.raises(ConfigurationError, match="trials"):
        audit("sampler", trials=2)


def test_help_names_every_registered_mechanism():
    assert MECHANISMS_HELP.split(", ") == available_mechanisms()


def test_broken_help_names_every_variant():
    for name in BROKEN:
        assert name in BROKEN_HELP
        for variant in broken_variants(name):
            assert variant in BROKEN_HELP


def test_cli_audit_exit_status_and_json(capsys):
    assert main(["audit", "dp-fusion", "--broken", "no-clip", "--trials", "400", "--seed", "0", "--json"]) == 3
    out = json.loads(capsys.readouterr().out)
    assert out["exceeds"] is True and out["variant"] == "no-clip" and out["epsilon_lb"] > out["claimed_epsilon"]
    assert main(["audit", "dp-decoding", "--trials", "400", "--seed", "0"]) == 0
    text = capsys.readouterr().out
    assert "claimed ε" in text and "audited ε ≥" in text and "consistent" in text
    assert main(["audit", "no-such"]) == 2
    assert "unknown mechanism" in capsys.readouterr().err
