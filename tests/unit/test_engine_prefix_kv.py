"""A job given the keys and values of its rows' first tokens (``prefix_kv``), on the tiny random-weight Llama.

* the rows' first logits and greedy tokens are those of running the rows whole, on both runners, with seeded and
  unseeded rows of different lengths in one job;
* refusals before the model runs: one entry per row, the row's own first tokens with one left to run, a PrefixKV
  only, the model's layer count, shapes, no public-row job;
* a :class:`PrefixStore` serves the model it was computed on and that model's int8 decode twin, nothing else.
"""

from __future__ import annotations

import pytest
import torch

from dpinfer.engine import Engine, PrefixKV, PrefixStore
from dpinfer.engine.prefill import forward, prefill_rows, prefill_seeded
from dpinfer.errors import ConfigurationError
from dpinfer.mechanisms import get_mechanism
from dpinfer.mechanisms.sampler import Sampler
from dpinfer.quantize import shared_int8_twin

TEXTS = ("Refer to the following question to generate a new question: where is the violin kept?",
         "What is a kettle for?",
         "Refer to the following question to generate a new question: who wrote the ledger and when, and why?")


def own_kv(lm, tokens) -> PrefixKV:
    """The model's own keys and values of ``tokens`` (one plain forward)."""
    from dpinfer.engine.cache import new_kv_cache

    cache = new_kv_cache(lm)
    ids = torch.as_tensor([list(tokens)])
    with torch.inference_mode():
        forward(lm, input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=cache)
    return PrefixKV(tuple(tokens), tuple((layer.keys[0], layer.values[0]) for layer in cache.layers))


def rows_and_seeds(lm):
    rows = [lm.encode(t) for t in TEXTS]
    seeds = [own_kv(lm, rows[0][:9]), None, own_kv(lm, rows[2][:len(rows[2]) - 4])]  # different prefix lengths
    return rows, seeds


def test_seeded_prefill_gives_the_logits_of_the_whole_rows(tiny_lm) -> None:
    rows, seeds = rows_and_seeds(tiny_lm)
    with torch.inference_mode():
        seeded, kv = prefill_seeded(tiny_lm, rows, seeds)
        whole = prefill_rows(tiny_lm, rows, 1, prefix_sharing=False, static_cache=False)[0]
    torch.testing.assert_close(seeded, whole, rtol=1e-4, atol=1e-4)
    for row, layers, seed in zip(rows, kv, seeds, strict=True):
        assert all(k.shape[1] == len(row) and v.shape[1] == len(row) for k, v in layers)  # no padding kept
        if seed is not None:  # the given keys are kept as they are
            n = len(seed.tokens)
            assert all(torch.equal(k[:, :n], sk) for (k, _), (sk, _) in zip(layers, seed.layers, strict=True))


@pytest.mark.parametrize("runner", ["slots", "dynamic"])
def test_a_seeded_job_decodes_the_tokens_of_the_whole_rows(tiny_lm, runner: str) -> None:
    rows, seeds = rows_and_seeds(tiny_lm)
    engine = Engine(tiny_lm, runner=runner)
    greedy = Sampler(temperature=0.0)
    plain = engine.generate(rows, greedy, max_new_tokens=12, seed=0, stop_on_eos=False)
    seeded = engine.generate(rows, greedy, max_new_tokens=12, seed=0, stop_on_eos=False, prefix_kv=seeds)
    assert seeded.sequences == plain.sequences
    assert seeded.prompt_lengths == [len(r) for r in rows]


def test_bad_prefix_kv_is_refused_before_the_model_runs(tiny_lm, monkeypatch: pytest.MonkeyPatch) -> None:
    rows, seeds = rows_and_seeds(tiny_lm)
    engine = Engine(tiny_lm)
    greedy = Sampler(temperature=0.0)
    monkeypatch.setattr(tiny_lm.model, "forward", lambda *a, **k: pytest.fail("the model ran"))

    def refused(prefix_kv, match: str, mechanism=greedy, contexts=rows) -> None:
        with pytest.raises(ConfigurationError, match=match):
            engine.generate(contexts, mechanism, max_new_tokens=4, prefix_kv=prefix_kv)

    refused(seeds[:2], "one entry")
    refused([seeds[0], seeds[0], None], "first tokens of row 1")
    whole = PrefixKV(tuple(rows[1]), seeds[0].layers[:0] + tuple(
        (k[:, :1].expand(-1, len(rows[1]), -1), v[:, :1].expand(-1, len(rows[1]), -1)) for k, v in seeds[0].layers))
    refused([None, whole, None], "leave at least one")
    refused([None, "keys", None], "PrefixKV or None")
    short = PrefixKV(seeds[0].tokens, seeds[0].layers[:1])
    refused([short, None, None], "layers; the model has")
    fusion = get_mechanism("dp-fusion", bounds=[0.3], group_names=["A"], temperature=0.7, top_k=7)
    refused([None, seeds[0], None], "public row", mechanism=fusion,
            contexts=[rows[1], rows[0], rows[2]])
    k0, v0 = seeds[0].layers[0]
    with pytest.raises(ConfigurationError, match="shape"):
        PrefixKV(seeds[0].tokens, ((k0[:, :-1], v0),))
    with pytest.raises(ConfigurationError, match="at least one token"):
        PrefixKV((), ())


def test_a_store_serves_its_model_and_that_models_int8_twin_only(tiny_lm) -> None:
    store = PrefixStore(tiny_lm.model)
    assert store.serves(tiny_lm.model) and store.serves(shared_int8_twin(tiny_lm.model))
    assert not store.serves(torch.nn.Linear(2, 2))
    assert PrefixStore(shared_int8_twin(tiny_lm.model)).serves(tiny_lm.model)  # the same prompt processing
    entry = own_kv(tiny_lm, tiny_lm.encode(TEXTS[1]))
    store.put(entry)
    assert len(store) == 1 and store.get(list(entry.tokens)) is entry and store.get(entry.tokens[:-1]) is None


def test_a_twin_does_not_keep_its_model_alive(tiny_model_dir) -> None:
    import gc
    import weakref

    from dpinfer.models import load_model
    from dpinfer.quantize import prompt_model

    lm = load_model(str(tiny_model_dir), device="cpu")
    twin = shared_int8_twin(lm.model)
    assert prompt_model(twin) is lm.model and prompt_model(lm.model) is lm.model
    gone = weakref.ref(lm.model)
    del lm, twin
    gc.collect()
    assert gone() is None  # the model and its twin are freed together (no strong reference back from the twin)
