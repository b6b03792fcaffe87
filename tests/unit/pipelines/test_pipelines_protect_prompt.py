"""Prompt protection (DP-GTR, DP-Prompt): stage-1 sampler, guarantee, stages 2-3 isolation, errors; tiny model."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from dpinfer.accounting import DEFAULT_ORDERS
from dpinfer.configs.protect import ProtectConfig
from dpinfer.defaults import PROTECT
from dpinfer.errors import ConfigurationError, ContextTooLongError, InvalidInputError
from dpinfer.mechanisms.base import StepInfo
from dpinfer.mechanisms.dp_prompt import DPPrompt
from dpinfer.mechanisms.randomness import SeededRandom
from dpinfer.pipelines import protect_prompt as pp
from dpinfer.protect import gtr as prompt_gtr
from dpinfer.protect import stage1, stage3
from dpinfer.protect.keywords import word_universe, words
from dpinfer.release import check_release

SECRET = "Where did Zanzibarquux Oduya hide the Kettleborough ledger?"


@pytest.fixture(scope="module", autouse=True)
def _own_cache(tmp_path_factory: pytest.TempPathFactory):
    """One cache for the module: the tiny model's clip bounds are measured once, then read back."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DPINFER_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


# ------------------------------------------------------------------------------------------------ stage 1 mechanism
def test_stage1_sampler_matches_the_clipped_softmax_at_the_calibrated_temperature() -> None:
    mech = stage1.stage1_mechanism(clip=(0.0, 3.0), n_rewrites=4, max_new_tokens=2, delta=1e-5, epsilon=40.0)
    assert mech.mode == "independent" and mech.num_rewrites == 4
    tau = mech.temperature
    assert mech.guarantee(2).epsilon <= 40.0
    z = torch.tensor([5.0, 2.5, 1.0, 0.3, -1.0, -40.0, 3.0, 0.0], dtype=torch.float64)  # 5 and 3 clip to 3, -40 to 0
    expected = torch.softmax(z.clamp(0.0, 3.0) / tau, dim=0).numpy()
    rows = z.expand(4, -1).clone()
    source = SeededRandom(5)
    info = StepInfo(step=0, max_new_tokens=2, num_contexts=4, finished=torch.zeros(4, dtype=torch.bool))
    draws = torch.cat([mech.step(rows, info, source).tokens for _ in range(2000)]).numpy()
    observed = np.bincount(draws, minlength=8)
    assert observed[5] > 0  # full vocabulary: the token at −40 keeps probability e^{(0 − 3)/τ}/Z
    assert chisquare(observed, expected * observed.sum()).pvalue > 1e-3


def test_no_truncation_can_be_switched_on(tiny_lm) -> None:
    settings = set(inspect.signature(pp.protect_prompt).parameters) | set(ProtectConfig.field_names())
    assert not {"top_k", "top_p"} & settings
    assert not {"top_k", "top_p"} & set(inspect.signature(stage1.stage1_mechanism).parameters)
    for knob in ({"top_k": 50}, {"top_p": 0.9}):
        with pytest.raises(ConfigurationError, match="full vocabulary"):
            DPPrompt(0.0, 3.0, 1.0, **knob)
    with pytest.raises(ConfigurationError, match="unknown setting"):
        pp.protect_prompt("q", lm=tiny_lm, temperature=1.0, top_k=50)  # type: ignore[call-arg]
    from dpinfer.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["protect-prompt", "q", "--top-k", "50"])


def test_guarantee_is_the_composition_formula(tiny_lm) -> None:
    res = pp.protect_prompt("What is a kettle for?", lm=tiny_lm, temperature=0.9, n_rewrites=3, max_new_tokens=5,
                            seed=1)
    g = res.guarantee
    p = g.parameters
    eps_tok = 2 * (p["clip_max"] - p["clip_min"]) / 0.9
    assert res.epsilon_per_token == pytest.approx(eps_tok, rel=1e-12)
    n = 3 * 5
    delta = 1e-5
    rdp = min(n * min(eps_tok, a * eps_tok**2 / 8) + math.log1p(-1 / a) - (math.log(delta) + math.log(a)) / (a - 1)
              for a in DEFAULT_ORDERS)
    assert g.epsilon == pytest.approx(min(n * eps_tok, rdp), rel=1e-9)
    assert (g.mechanism, g.max_new_tokens, p["num_rewrites"], p["T_max"], p["composed_tokens"]) == ("dp-gtr", 5, 3,
                                                                                                      5, 15)
    assert "any two private prompts" in g.adjacency and g.seeded
    assert "jem_epsilon" not in p
    jem = pp.protect_prompt("What is a kettle for?", lm=tiny_lm, temperature=0.9, n_rewrites=3, max_new_tokens=5,
                            keywords="jem", jem_epsilon=7.0, seed=1)
    assert jem.guarantee.epsilon == g.epsilon  # ε₂ is recorded, not added
    assert jem.guarantee.parameters["jem_epsilon"] == 7.0


def test_epsilon_target_calibrates_the_temperature(tiny_lm) -> None:
    res = pp.protect_prompt("What is a kettle for?", lm=tiny_lm, epsilon=500.0, n_rewrites=2, max_new_tokens=4,
                            seed=0)
    assert res.guarantee.epsilon <= 500.0 * (1 + 1e-9)
    assert res.guarantee.epsilon == pytest.approx(500.0, rel=1e-5)
    one = pp.protect_prompt("What is a kettle for?", lm=tiny_lm, method="dp-prompt", epsilon=500.0, max_new_tokens=4,
                            seed=0)
    assert one.settings["temperature"] < res.settings["temperature"]  # one rewrite: a colder τ for the same ε


# ------------------------------------------------------------------------------------------------ pipeline
def test_dp_gtr_on_the_tiny_model(tiny_lm, monkeypatch: pytest.MonkeyPatch) -> None:
    from dpinfer.protect import gtr as prompt_gtr
    from dpinfer.protect import stage3 as prompt_stage3

    seen: dict[str, list] = {"stage2+3": []}
    # every stage-2/3 function the method runs, where it is called from (the method's modules)
    for module, name in ((prompt_gtr, "choose_exemplars"), (prompt_gtr, "release_keywords"),
                         (prompt_gtr, "stage3_choices"), (prompt_stage3, "stage3_prompts"),
                         (prompt_stage3, "closest_to_consensus"), (prompt_gtr, "perplexities")):
        original = getattr(module, name)

        def spy(*args, _original=original, **kwargs):
            seen["stage2+3"].append(repr((args[1:], kwargs)))
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    lengths: list[int] = []
    from dpinfer.engine import Engine

    wait = Engine._wait  # every job run to its end (Engine.run, Engine.generate) waits here

    def record(self, job):
        lengths.append(job.max_new_tokens)
        out = wait(self, job)
        assert max(len(s) for s in out.sequences) <= job.max_new_tokens
        return out

    monkeypatch.setattr(Engine, "_wait", record)
    res = pp.protect_prompt(SECRET, lm=tiny_lm, temperature=1.0, n_rewrites=4, n_keywords=3, max_new_tokens=6,
                            seed=3)
    assert len(res.rewrites) == 4 and res.method == "dp-gtr"
    counts = {w for r in res.rewrites for w in words(r)}
    assert set(res.keywords) <= counts and len(res.keywords) <= 3
    assert res.exemplar in res.rewrites or res.exemplar == ""
    assert len(seen["stage2+3"]) >= 4  # exemplars, keywords, stage 3 (and the consensus pick, when it has a choice)
    for call in seen["stage2+3"]:
        assert "Zanzibarquux" not in call and "Kettleborough" not in call
    assert lengths[-2:] == [6, 6]  # stage 1 and stage 3 at the fixed T_max (before: the clip calibration, if any)
    d = res.to_dict()
    assert d == check_release(res.release())  # no timing, seed or input text in the release, at any depth
    assert {"stage1", "stage3", "total"} <= set(res.diagnostics()["seconds"])
    assert "Zanzibarquux" not in repr(d) and "seed" not in d["settings"]
    assert d["guarantee"]["seeded"] is True
    res2 = pp.protect_prompt(SECRET + " " + SECRET, lm=tiny_lm, temperature=1.0, n_rewrites=2, max_new_tokens=6,
                             seed=3)
    assert lengths[-2] == 6 and res2.guarantee.max_new_tokens == 6  # T_max never follows the prompt's length


def test_jem_keywords_come_from_the_public_universe(tiny_lm) -> None:
    res = pp.protect_prompt(SECRET, lm=tiny_lm, temperature=1.0, n_rewrites=3, n_keywords=4, keywords="jem",
                            jem_epsilon=1.0, max_new_tokens=4, seed=2)
    assert len(res.keywords) == 4 and len(set(res.keywords)) == 4
    assert set(res.keywords) <= set(word_universe())


def test_dp_prompt_is_one_rewrite(tiny_lm) -> None:
    res = pp.protect_prompt(SECRET, lm=tiny_lm, method="dp-prompt", temperature=1.0, max_new_tokens=5, seed=0)
    assert len(res.rewrites) == 1 and res.prompt == res.rewrites[0] == res.exemplar and res.keywords == []
    assert res.guarantee.parameters["num_rewrites"] == 1 and res.guarantee.mechanism == "dp-prompt"
    with pytest.raises(ConfigurationError, match="exactly one rewrite"):
        pp.protect_prompt(SECRET, lm=tiny_lm, method="dp-prompt", n_rewrites=3)


def test_stage3_strips_echoes_and_falls_back_to_the_exemplar() -> None:
    echoed = "Generated question: What is it?\nAvoid using the following tokens: a, b"
    assert stage3.strip_echoes(echoed) == "What is it?"
    assert stage3.strip_echoes("**New question:** 'Why?'") == "Why?"
    assert stage3.strip_echoes("\n\n") == ""


def test_stage3_bans_every_spelling_of_the_released_keywords(tiny_lm, monkeypatch: pytest.MonkeyPatch) -> None:
    from dpinfer.engine import Engine

    seen: list[list[list[int]]] = []
    generate = Engine.generate

    def record(self, contexts, mechanism, **kwargs):
        out = generate(self, contexts, mechanism, **kwargs)
        seen.append([list(s) for s in out.sequences])
        return out

    monkeypatch.setattr(Engine, "generate", record)
    engine = Engine(tiny_lm)
    exemplar = "Where would you keep a violin so that it does not get scratched?"
    stage3.stage3_prompts(engine, tiny_lm, [(exemplar, [])], max_new_tokens=12, suppress="instruct")
    free = seen[-1][0]
    # the keywords: the words the model writes when nothing is banned (its greedy output, decoded token by token)
    pieces = [tiny_lm.decode([t]).strip().lower() for t in free]
    keywords = sorted({p for p in pieces if p.isalpha()})[:6]
    assert keywords, "the tiny model wrote no word to ban"
    items = [(exemplar, keywords), (exemplar, [])]
    stage3.stage3_prompts(engine, tiny_lm, items, max_new_tokens=12, suppress="ban")
    banned_row, free_row = seen[-1]
    assert free_row == free  # a row without keywords is decoded as before
    for seq in stage3.keyword_ban(tiny_lm, keywords):
        n = len(seq)
        assert all(tuple(banned_row[i:i + n]) != seq for i in range(len(banned_row) - n + 1))
    assert banned_row != free
    with pytest.raises(ConfigurationError, match="suppress"):
        stage3.stage3_prompts(engine, tiny_lm, items, max_new_tokens=4, suppress="filter")


def test_exemplar_prefers_content_and_low_perplexity(tiny_lm) -> None:
    rewrites = ["", "ok", "The applicant was born in 1970 and lives in Izmir.", "zq xv kk ww pp qq"]
    ex = prompt_gtr.choose_exemplar(tiny_lm, rewrites)
    assert ex in rewrites[2:]
    ctx = stage3.final_prompt_head(tiny_lm)
    from dpinfer.eval.metrics import perplexity

    scores = prompt_gtr.perplexities(tiny_lm, ctx, [tiny_lm.encode(r) for r in rewrites[2:]])
    alone = [perplexity(tiny_lm, ctx, tiny_lm.encode(r)) for r in rewrites[2:]]
    assert scores == pytest.approx(alone, rel=1e-4)
    assert ex == rewrites[2 + int(np.argmin(scores))]
    assert prompt_gtr.choose_exemplar(tiny_lm, ["", "  "]) == ""
    assert prompt_gtr.choose_exemplar(tiny_lm, ["hi", ""]) == "hi"  # nothing has 3 content words: any non-empty one


# ------------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"prompt": "   "}, InvalidInputError, "empty"),
    ({"prompt": "q", "epsilon": 0.0}, ConfigurationError, "epsilon must be > 0"),
    ({"prompt": "q", "epsilon": -3.0}, ConfigurationError, "epsilon must be > 0"),
    ({"prompt": "q", "temperature": 0.0}, ConfigurationError, "temperature must be > 0"),
    ({"prompt": "q", "epsilon": 1.0, "temperature": 1.0}, ConfigurationError, "exactly one"),
    ({"prompt": "q", "keywords": "tfidf"}, ConfigurationError, "keywords method"),
    ({"prompt": "q", "suppress": "filter"}, ConfigurationError, "suppress"),
    ({"prompt": "q", "method": "dp-fusion"}, ConfigurationError, "method"),
    ({"prompt": "q", "n_rewrites": 0}, ConfigurationError, "n_rewrites"),
    ({"prompt": "q", "max_new_tokens": 0}, ConfigurationError, "max_new_tokens"),
    ({"prompt": "q", "delta": 1.0}, ConfigurationError, "delta"),
])
def test_bad_input_is_refused_before_the_model_loads(model_gate, kwargs: dict, error: type, match: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    model_gate.forbid()
    prompt = kwargs.pop("prompt")
    with pytest.raises(error, match=match):
        pp.protect_prompt(prompt, **kwargs)


def test_a_long_prompt_is_cut_to_the_public_cap_and_nothing_says_so(tiny_lm) -> None:
    # any two prompts are adjacent, so the prompt's length is private: a long prompt is cut to max_input_tokens and
    # released like any other (before, it was refused with "the prompt's paraphrase request is N tokens")
    long = ("Zanzibarquux " * 600).strip()
    short = "Where is the kettle?"
    bound = stage1.request_bound(tiny_lm, 40)
    assert len(stage1.capped_paraphrase_ids(tiny_lm, long, 40)) <= bound
    # within the cap: as is
    assert stage1.capped_paraphrase_ids(tiny_lm, short, 40) == stage1.paraphrase_ids(tiny_lm, short)
    assert stage1.truncate_tokens(tiny_lm, long, 40) == long[: len(stage1.truncate_tokens(tiny_lm, long, 40))]  # prefix
    kwargs = dict(lm=tiny_lm, temperature=1.0, n_rewrites=2, n_keywords=2, max_new_tokens=4, max_input_tokens=40,
                  seed=0)
    from dpinfer.clip_bounds import clip_bounds

    clip_bounds(tiny_lm)  # measured once (clip_source "measured"), read back by both runs below ("cache")
    a, b = pp.protect_prompt(long, **kwargs), pp.protect_prompt(short, **kwargs)
    da, db = a.to_dict(), b.to_dict()
    assert set(da) == set(db)
    assert da["guarantee"] == db["guarantee"] and da["settings"] == db["settings"]
    assert da["settings"]["max_input_tokens"] == 40


def test_settings_that_cannot_fit_are_refused_by_the_settings_alone(tiny_lm) -> None:
    messages = set()
    for prompt in ("Where is the kettle?", ("Zanzibarquux " * 600).strip()):
        with pytest.raises(ContextTooLongError, match="context window") as info:
            pp.protect_prompt(prompt, lm=tiny_lm, temperature=1.0, max_input_tokens=600)
        messages.add(str(info.value))
    assert len(messages) == 1  # the same refusal whatever the prompt
    (msg,) = messages
    assert "Zanzibarquux" not in msg and "\n" not in msg and "max_input_tokens=600" in msg


def test_stage3_stops_a_row_once_its_first_line_is_kept(tiny_lm, monkeypatch: pytest.MonkeyPatch) -> None:
    from dpinfer.engine import Engine

    newline = [t for t in range(tiny_lm.vocab_size) if "\n" in tiny_lm.decode([t])]
    word = next(t for t in range(tiny_lm.vocab_size) if tiny_lm.decode([t]).strip().isalpha()
                and len(tiny_lm.decode([t]).strip()) > 2)
    assert newline
    stop = stage3.StopAfterFirstLine(tiny_lm, [[], []])
    logits = torch.zeros((2, tiny_lm.vocab_size), dtype=torch.float64)
    out = stop([[word, word], [word, newline[0]]], logits)
    assert torch.equal(out[0], logits[0])  # no complete line yet: untouched
    eos = sorted(tiny_lm.eos_token_ids)
    assert out[1].isfinite().nonzero().flatten().tolist() == eos  # a kept line is complete: only EOS is left
    # end to end, the final prompts are those of a run without the stop (it only cuts what strip_echoes drops)
    engine = Engine(tiny_lm)
    items = [("Where would you keep a violin?", ["violin"]), ("What is a kettle for?", [])]
    with_stop = stage3.stage3_prompts(engine, tiny_lm, items, max_new_tokens=24)
    monkeypatch.setattr(stage3.StopAfterFirstLine, "__call__", lambda self, generated, logits: logits)
    assert stage3.stage3_prompts(engine, tiny_lm, items, max_new_tokens=24) == with_stop


def test_stage3_quorum_stops_a_group_once_enough_of_its_finals_are_complete(tiny_lm) -> None:
    newline = next(t for t in range(tiny_lm.vocab_size) if "\n" in tiny_lm.decode([t]))
    word = next(t for t in range(tiny_lm.vocab_size) if tiny_lm.decode([t]).strip().isalpha()
                and len(tiny_lm.decode([t]).strip()) > 2)
    eos = sorted(tiny_lm.eos_token_ids)
    stop = stage3.StopAfterFirstLine(tiny_lm, [[]] * 5, groups=[0, 0, 0, 1, 1], quorum=2)
    logits = torch.zeros((5, tiny_lm.vocab_size), dtype=torch.float64)
    # group 0: row 0 wrote a kept line, row 1 ended by EOS (one token short), row 2 still runs -> cut;
    # group 1: one complete row (row 3) of the two needed, row 4 runs on
    out = stop([[word, newline], [word], [word, word], [word, newline], [word, word]], logits)
    assert stop.cut == [False, False, True, False, False]
    assert out[2].isfinite().nonzero().flatten().tolist() == eos  # the cut row may only end
    assert torch.equal(out[4], logits[4])  # another group's count is its own
    out = stop([[word, newline], [word], [word, word], [word, newline], [word, word, newline]], logits)
    assert stop.cut == [False, False, True, False, False]  # row 4 completed its own line: a candidate
    with pytest.raises(ConfigurationError, match="one group per row"):
        stage3.StopAfterFirstLine(tiny_lm, [[]] * 2, groups=[0], quorum=1)
    with pytest.raises(ConfigurationError, match="stage3_quorum"):
        stage3.StopAfterFirstLine(tiny_lm, [[]], quorum=0)


def test_stage3_finals_cut_at_the_quorum_stay_candidates(tiny_lm, monkeypatch: pytest.MonkeyPatch) -> None:
    from dpinfer.protect import stage3 as prompt_stage3

    def finals(engine, lm, items, **kwargs):
        assert kwargs["groups"] == [0, 0, 0, 1, 1] and kwargs["quorum"] == 2
        return [f"final {i}" for i in range(len(items))]  # final 0 as if cut at the quorum

    seen: list[list[str]] = []

    def pick(cands, rewrites, embedder):
        seen.append(list(cands))
        return 0  # the first candidate offered

    monkeypatch.setattr(prompt_stage3, "stage3_prompts", finals)
    monkeypatch.setattr(prompt_stage3, "closest_to_consensus", pick)
    groups = [(["a", "b", "c"], ["k"], ["r"]), (["d", "e"], ["k"], ["r"])]
    chosen = stage3.stage3_choices(None, tiny_lm, groups, max_new_tokens=4, embedder=object(), quorum=2)
    assert seen == [["final 0", "final 1", "final 2"], ["final 3", "final 4"]]  # final 0, cut, with its text so far
    assert chosen == [("final 0", 0), ("final 3", 0)]  # indices into each group's exemplars


def test_stage3_quorum_of_the_whole_group_changes_nothing(tiny_lm) -> None:
    from dpinfer.engine import Engine

    engine = Engine(tiny_lm)
    groups = [(["Where would you keep a violin?", "What is a kettle for?"], ["violin"], ["a", "b"])]

    class First:
        def encode(self, texts):
            return np.eye(len(texts), 4, dtype=np.float32)

    kw = dict(max_new_tokens=16, embedder=First())
    assert (stage3.stage3_choices(engine, tiny_lm, groups, quorum=2, **kw)
            == stage3.stage3_choices(engine, tiny_lm, groups, quorum=None, **kw))


def test_perplexities_share_the_context_and_match_one_row_at_a_time(tiny_lm) -> None:
    context = stage3.final_prompt_head(tiny_lm)
    outputs = [tiny_lm.encode(t) for t in ("Where is the violin kept?", "", "A", "What is a kettle for, then?")]
    batched = prompt_gtr.perplexities(tiny_lm, context, outputs)
    assert batched[1] == math.inf
    for o, score in zip(outputs, batched, strict=True):
        if o:
            with torch.inference_mode():
                ids = torch.as_tensor([context + o])
                lp = torch.log_softmax(tiny_lm.model(input_ids=ids).logits[0].to(torch.float64), dim=-1)
            nll = -sum(float(lp[len(context) - 1 + j, t]) for j, t in enumerate(o))
            assert score == pytest.approx(math.exp(nll / len(o)), rel=1e-5)


def test_a_public_context_is_run_once_and_scores_are_unchanged(tiny_lm, monkeypatch: pytest.MonkeyPatch) -> None:
    from dpinfer.protect import gtr as prompt_gtr

    context = stage3.final_prompt_head(tiny_lm)
    outputs = [tiny_lm.encode(t) for t in ("Where is the violin kept?", "A", "What is a kettle for, then?")]
    fresh = prompt_gtr.perplexities(tiny_lm, context, outputs)
    prompt_gtr._PUBLIC_CONTEXTS.pop(tiny_lm.model, None)
    passes = []
    real = tiny_lm.model.forward

    def counting(*args, **kwargs):
        passes.append(kwargs["input_ids"].shape[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(tiny_lm.model, "forward", counting)
    first = prompt_gtr.perplexities(tiny_lm, context, outputs, reuse_context=True)
    again = prompt_gtr.perplexities(tiny_lm, context, outputs, reuse_context=True)
    assert first == fresh and again == fresh  # bit for bit: the same tensors a fresh pass computes
    assert passes.count(len(context)) == 1 and len(passes) == 3  # the context once, then one packed pass per call
    private = tiny_lm.encode("a private context")
    prompt_gtr.perplexities(tiny_lm, private, outputs)
    assert tuple(private) not in prompt_gtr._PUBLIC_CONTEXTS[tiny_lm.model]  # never kept unless declared public
    monkeypatch.undo()
    prompt_gtr._PUBLIC_CONTEXTS.pop(tiny_lm.model, None)


def test_cli_errors_are_one_line_and_never_echo_the_prompt(model_gate, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from dpinfer.cli import main

    model_gate.forbid()
    for argv in (["protect-prompt", "   "], ["protect-prompt", SECRET, "--epsilon", "0"],
                 ["protect-prompt", SECRET, "--epsilon", "-1"], ["protect-prompt", SECRET, "--n-rewrites", "0"],
                 ["protect-prompt"], ["protect-prompt", SECRET, "--file", "x.txt"],
                 ["protect-prompt", SECRET, "--method", "dp-prompt", "--n-rewrites", "4"]):
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and err.startswith("dpinfer: error: ")
        assert "Zanzibarquux" not in err


def test_cli_prints_the_protected_prompt_only(tiny_model_dir, capsys) -> None:
    import json

    from dpinfer.cli import main

    args = ["protect-prompt", SECRET, "--model", str(tiny_model_dir), "--device", "cpu", "--temperature", "1",
            "--n-rewrites", "2", "--max-new-tokens", "4", "--seed", "1"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert out.count("\n") == 1 and "Zanzibarquux" not in out + err
    assert "ε_tok" in err and "composed over 2 rewrites × T_max 4 = 8 tokens" in err
    assert main([*args, "--json", "--keywords", "jem"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) >= {"prompt", "exemplar", "keywords", "rewrites", "guarantee", "epsilon_per_token"}
    assert data["guarantee"]["parameters"]["jem_epsilon"] == pp.DEFAULT_JEM_EPSILON


def test_cli_json_holds_nothing_that_depends_on_the_prompt_beyond_the_release(tiny_model_dir, capsys) -> None:
    import json

    from dpinfer.cli import main

    runs = []
    for prompt in ("warm-up: the clip bounds are measured once, then read back", SECRET, "What is a kettle for? " * 30):
        assert main(["protect-prompt", prompt, "--model", str(tiny_model_dir), "--device", "cpu", "--temperature",
                     "1", "--n-rewrites", "2", "--max-new-tokens", "4", "--max-input-tokens", "40", "--seed", "1",
                     "--json"]) == 0
        runs.append(json.loads(capsys.readouterr().out))
    _, first, second = runs
    assert set(first) == set(second)
    release = {"prompt", "exemplar", "keywords", "rewrites"}  # the protected prompt and its intermediate releases
    for key in set(first) - release:
        assert first[key] == second[key], key  # no timing, length or count read from the prompt


def test_stage1_mechanism_meets_the_contract() -> None:
    """The mechanism contract (tests/unit/mechanisms/test_contract.py) on stage 1 exactly as protect_prompt builds it:
    one token per rewrite row, drawn from the generator only; guarantee ex ante, non-decreasing in T_max; more rows
    than the rewrites it covers refused."""
    def build() -> DPPrompt:
        return stage1.stage1_mechanism(clip=(4.78, 26.78), n_rewrites=3, max_new_tokens=8, delta=1e-5, temperature=0.75)

    def run(seed: int) -> list[list[int]]:
        mech = build()
        mech.start(3, 32)
        data = torch.Generator().manual_seed(9)
        source = SeededRandom(seed)
        out = []
        for t in range(5):
            z = torch.randn(3, 32, dtype=torch.float64, generator=data) * 20
            info = StepInfo(step=t, max_new_tokens=8, num_contexts=3, finished=torch.zeros(3, dtype=torch.bool))
            out.append(mech.step(z, info, source).tokens.tolist())
        return out

    state = torch.get_rng_state()
    first = run(4)
    assert torch.equal(state, torch.get_rng_state()) and first == run(4) and all(len(r) == 3 for r in first)
    mech = build()
    before = [mech.guarantee(t).to_dict() for t in (1, 8, 48)]
    run(1)
    assert before == [mech.guarantee(t).to_dict() for t in (1, 8, 48)]
    assert before[0]["epsilon"] < before[1]["epsilon"] < before[2]["epsilon"]
    with pytest.raises(ConfigurationError, match="num_rewrites"):
        build().start(4, 32)


def test_cli_prompts_file_appends_one_release_per_id_and_resumes(tmp_path, tiny_model_dir, capsys) -> None:
    """``--prompts P --out OUT``: one record per id (release + guarantee, never the prompt or its timing), a bad
    prompt is an error record and the run goes on; a rerun after deleting a record is refused (it would be released
    twice) unless --allow-rerelease, which writes only that one again."""
    import json

    from dpinfer.cli import main
    from dpinfer.clip_bounds import clip_bounds
    from dpinfer.generation import resolve_lm

    clip_bounds(resolve_lm(str(tiny_model_dir)))  # measured now if no earlier test did: every run reads the cache
    prompts = tmp_path / "p.jsonl"
    rows = [{"id": "a", "prompt": SECRET}, {"id": "b", "prompt": "   "}, {"id": 3, "prompt": "Why is the sky blue?"}]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    args = ["protect-prompt", "--prompts", str(prompts), "--out", str(out), "--model", str(tiny_model_dir),
            "--temperature", "1.0", "--n-rewrites", "2", "--max-new-tokens", "4", "--seed", "1"]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and "done 2 / skipped 0 / errors 1" in captured.err
    assert "budget per prompt" in captured.err
    lines = out.read_text().splitlines()
    recs = {r["id"]: r for r in map(json.loads, lines)}
    assert set(recs) == {"a", "b", 3} and "error" in recs["b"] and "guarantee" in recs["a"]
    assert "seconds" not in recs["a"] and "stage_seconds" not in recs["a"]
    assert "Zanzibarquux" not in out.read_text() + captured.err
    out.write_text("\n".join(line for line in lines if json.loads(line)["id"] != 3) + "\n")
    assert main(args) == 2 and "--allow-rerelease" in capsys.readouterr().err
    assert main([*args, "--allow-rerelease"]) == 0
    again = out.read_text().splitlines()
    assert again[:2] == [line for line in lines if json.loads(line)["id"] != 3]
    assert json.loads(again[2]) == recs[3]  # the same seed per id: the same release
    assert "done 1 / skipped 2" in capsys.readouterr().err


def test_cli_prompts_refusals_come_before_the_model_loads(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                                          model_gate, capsys) -> None:
    from dpinfer.cli import main

    model_gate.forbid()
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": 1, "prompt": "q"}\n')
    for argv, message in ((["--prompts", str(prompts)], "needs --out"),
                          (["--out", str(tmp_path / "o.jsonl")], "applies to --prompts only"),
                          (["q", "--prompts", str(prompts), "--out", str(tmp_path / "o.jsonl")], "not both"),
                          (["--prompts", str(prompts), "--out", str(prompts)], "--corpus file"),
                          (["--prompts", str(prompts), "--out", str(tmp_path / "o.jsonl"), "--show-rewrites"],
                           "--show-rewrites")):
        assert main(["protect-prompt", *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1


def test_many_prompts_share_the_engine_and_match_their_own_runs(tiny_lm, monkeypatch: pytest.MonkeyPatch) -> None:
    from dpinfer.engine import Engine

    prompts = ["Where is the kettle?", SECRET, "   ", "What do people use to cut paper?"]
    kwargs = dict(lm=tiny_lm, temperature=1.0, n_rewrites=3, n_keywords=2, max_new_tokens=5, n_exemplars=1)
    from dpinfer.clip_bounds import clip_bounds

    clip_bounds(tiny_lm)  # measured once (an engine run of its own) before counting
    calls: list[int] = []
    generate, run_jobs = Engine.generate, Engine.run_jobs

    def count(self, contexts, mechanism, **kw):
        calls.append(len(contexts))
        return generate(self, contexts, mechanism, **kw)

    def count_jobs(self, jobs, **kw):
        calls.append(sum(len(j.contexts) for j in jobs))
        assert len({j.pad_width for j in jobs}) == 1 and jobs[0].pad_width == stage1.request_bound(tiny_lm, 256)
        yield from run_jobs(self, jobs, **kw)

    monkeypatch.setattr(Engine, "generate", count)
    monkeypatch.setattr(Engine, "run_jobs", count_jobs)
    out = pp.protect_prompts(prompts, seeds=[1, 2, 3, 4], **kwargs)
    assert calls == [9, 3]  # stage 1 of the three prompts in one slot-engine call, stage 3 of the three in one run
    assert isinstance(out[2], InvalidInputError) and "Zanzibarquux" not in str(out[2])
    for i in (0, 1, 3):
        alone = pp.protect_prompt(prompts[i], seed=i + 1, **kwargs)
        assert out[i].rewrites == alone.rewrites and out[i].prompt == alone.prompt
        assert out[i].to_dict() == alone.to_dict()


def test_stage3_decodes_on_the_int8_twin_and_stage1_in_float32(tiny_lm, monkeypatch: pytest.MonkeyPatch) -> None:
    from dpinfer.clip_bounds import clip_bounds
    from dpinfer.engine import Engine

    clip_bounds(tiny_lm)  # measured now if no earlier test did: both releases below read the cached bounds

    ran_on: list[str | None] = []
    wait = Engine._wait  # every job run to its end (Engine.run, Engine.generate) waits here

    def record(self, job):
        ran_on.append(self.lm.quantize)
        return wait(self, job)

    monkeypatch.setattr(Engine, "_wait", record)
    res = pp.protect_prompt(SECRET, lm=tiny_lm, temperature=1.0, n_rewrites=3, max_new_tokens=5, seed=3)
    assert ran_on[-2:] == [None, "int8"] and res.settings["stage3_int8"] is True  # stage 1 float32, stage 3 int8
    ran_on.clear()
    off = pp.protect_prompt(SECRET, lm=tiny_lm, temperature=1.0, n_rewrites=3, max_new_tokens=5, seed=3,
                            stage3_int8=False)
    assert ran_on[-2:] == [None, None] and off.settings["stage3_int8"] is False
    assert off.rewrites == res.rewrites  # stage 1 (the DP release) does not depend on stage 3's weights
    assert off.guarantee == res.guarantee
    one = pp.protect_prompt(SECRET, lm=tiny_lm, method="dp-prompt", temperature=1.0, max_new_tokens=5, seed=3)
    assert "stage3_int8" not in one.settings  # no stage 3: no twin built for it
    assert res.settings["stage3_quorum"] == PROTECT.stage3_quorum == res.guarantee.parameters["stage3_quorum"]


def test_stage3_reuses_the_rankings_pass_over_each_exemplar(tiny_lm, monkeypatch: pytest.MonkeyPatch) -> None:
    from dpinfer.clip_bounds import clip_bounds
    from dpinfer.engine import Engine, PrefixStore
    from dpinfer.engine.cache import new_kv_cache
    from dpinfer.engine.prefill import forward
    from dpinfer.models import int8_twin

    rewrites = ["Where is the violin kept in the house?", "What is a kettle used for?", "ok",
                "Who wrote the ledger and where was it hidden?"]
    store = PrefixStore(tiny_lm.model)
    chosen = prompt_gtr.choose_exemplars(tiny_lm, rewrites, 2, prefixes=store)
    # the same ranking with or without keeping the pass
    assert chosen == prompt_gtr.choose_exemplars(tiny_lm, rewrites, 2)
    head = stage3.final_prompt_head(tiny_lm)
    assert len(store) == 2  # the chosen exemplars only
    for ex in chosen:
        entry = store.get(head + tiny_lm.encode(ex))
        cache = new_kv_cache(tiny_lm)
        ids = torch.as_tensor([list(entry.tokens)])
        with torch.inference_mode():
            forward(tiny_lm, input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=cache)
        for (k, v), layer in zip(entry.layers, cache.layers, strict=True):  # what a plain pass of those tokens gives
            torch.testing.assert_close(k, layer.keys[0], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(v, layer.values[0], rtol=1e-4, atol=1e-4)
        assert stage3.final_prompt_ids(tiny_lm, ex, ["kettle"])[:len(entry.tokens)] == list(entry.tokens)
    # stage 3 on the int8 twin reads them: each seeded row skips its head and exemplar, and the finals are the same
    seen: list = []
    wait = Engine._wait  # every job run to its end (Engine.run, Engine.generate) waits here

    def record(self, job):
        seen.append(job.prefix_kv)
        return wait(self, job)

    monkeypatch.setattr(Engine, "_wait", record)
    twin = Engine(int8_twin(tiny_lm))
    items = [(ex, ["kettle"]) for ex in chosen] + [("Not ranked: a question?", [])]
    seeded = stage3.stage3_prompts(twin, twin.lm, items, max_new_tokens=10, prefixes=store)
    assert [s is not None for s in seen[-1]] == [True, True, False]
    assert stage3.stage3_prompts(twin, twin.lm, items, max_new_tokens=10) == seeded and seen[-1] is None
    other = PrefixStore(torch.nn.Linear(2, 2))  # computed on other layers: never read
    stage3.stage3_prompts(twin, twin.lm, items, max_new_tokens=10, prefixes=other)
    assert seen[-1] is None
    # a release passes the ranking's pass to stage 3 (and nothing of the prompt: the spy test above)
    clip_bounds(tiny_lm)
    seen.clear()
    pp.protect_prompt(SECRET, lm=tiny_lm, temperature=1.0, n_rewrites=3, max_new_tokens=5, seed=3, n_exemplars=2)
    assert seen[0] is None and seen[-1] is not None and any(s is not None for s in seen[-1])
