"""The contract every registered mechanism must meet (one factory per registry entry; a new mechanism adds one).

* ``step`` returns a valid token (joint: one id; independent: one per row) drawn with the given generator only:
  the same seed gives the same tokens, and the global torch RNG is untouched;
* ``guarantee(T_max)`` is ex ante: the same before and after any private logits are seen, non-decreasing in T_max,
  and it names its adjacency;
* ``start`` refuses a context layout its guarantee does not cover.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import pytest
import torch

from dpinfer.errors import ConfigurationError
from dpinfer.mechanisms import Mechanism, available_mechanisms, get_mechanism
from dpinfer.mechanisms.base import StepInfo

V = 32
FACTORIES: dict[str, tuple[Callable[[], Mechanism], int, int]] = {
    # name: (factory, K it steps, a K it must refuse (0 = any K is fine))
    "sampler": (lambda: get_mechanism("sampler", temperature=1.0, mode="joint"), 1, 0),
    "dp-fusion": (lambda: get_mechanism("dp-fusion", bounds=[0.05, 0.1], group_names=["A", "B"]), 3, 2),
    "dp-decoding": (lambda: get_mechanism("dp-decoding", lam=0.5, vocab_size=V), 1, 0),
    "dp-prompt": (lambda: get_mechanism("dp-prompt", clip_min=-2.0, clip_max=2.0, num_rewrites=2), 2, 3),
    "invisibleink": (lambda: get_mechanism("invisibleink", clip_norm=0.5, batch_size=3, top_k=5), 4, 3),
    "amin": (lambda: get_mechanism("amin", clip_norm=0.5, batch_size=3), 4, 2),
    "adapmixed": (lambda: get_mechanism("adapmixed", batch_size=3, epsilon=50.0, top_k=None), 4, 5),
    "pad": (lambda: get_mechanism("pad", clip_norm=0.5, sigma=1.5, top_k=5), 2, 3),
    "pad-as-published": (lambda: get_mechanism("pad-as-published"), 1, 2),
    "static": (lambda: get_mechanism("static", sigma=1.0), 1, 2),
}


def test_every_registered_mechanism_has_a_contract_factory() -> None:
    assert sorted(FACTORIES) == available_mechanisms()


def _run(mech: Mechanism, k: int, seed: int, steps: int = 6) -> list[list[int]]:
    mech.start(k, V)
    g = torch.Generator().manual_seed(seed)
    data = torch.Generator().manual_seed(123)
    out = []
    for t in range(steps):
        z = torch.randn(k, V, dtype=torch.float64, generator=data) * 3
        res = mech.step(z, StepInfo(step=t, max_new_tokens=50, num_contexts=k,
                                    finished=None if mech.mode == "joint" else torch.zeros(k, dtype=torch.bool)), g)
        if res.stop:
            break
        toks = res.tokens.reshape(-1).tolist()
        assert len(toks) == (1 if mech.mode == "joint" else k)
        assert all(0 <= x < V for x in toks)
        out.append(toks)
    return out


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_tokens_come_from_the_generator_only(name: str) -> None:
    factory, k, _ = FACTORIES[name]
    state = torch.get_rng_state()
    first = _run(factory(), k, seed=7)
    assert torch.equal(state, torch.get_rng_state())  # the global RNG was not used
    assert first == _run(factory(), k, seed=7)
    assert len(first) > 0


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_guarantee_is_ex_ante(name: str) -> None:
    factory, k, _ = FACTORIES[name]
    mech = factory()
    before = [mech.guarantee(t) for t in (1, 10, 100)]
    _run(mech, k, seed=1)
    after = [mech.guarantee(t) for t in (1, 10, 100)]
    assert [g.to_dict() for g in before] == [g.to_dict() for g in after]
    eps = [g.epsilon for g in before]
    assert all(a <= b or (math.isinf(a) and math.isinf(b)) for a, b in itertools.pairwise(eps))
    assert all(g.adjacency and g.mechanism == name for g in before)


@pytest.mark.parametrize("name", [n for n, (_, _, bad) in sorted(FACTORIES.items()) if bad])
def test_start_refuses_an_uncovered_layout(name: str) -> None:
    factory, _, bad = FACTORIES[name]
    with pytest.raises(ConfigurationError):
        factory().start(bad, V)
