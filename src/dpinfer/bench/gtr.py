"""``dpinfer bench gtr``: prompt protection on CommonsenseQA, DP-GTR (NDP, JEM) against DP-Prompt, or ``--perf``.

Quality run (default). The first ``--n`` questions of CSQA's dev split (``--data csqa``: ../shared/data/csqa/
csqa_dev.jsonl, or a JSONL file of the same shape) are protected at each temperature τ of ``--temperatures``,
``--repeats`` times each (fresh noise per repeat), by

* **DP-GTR (NDP)** and **DP-GTR (JEM)**: ``--n-rewrites`` stage-1 rewrites at τ (shared by the two: they differ only
  in the keyword release, which is post-processing), exemplar, keywords, greedy final prompt;
* **DP-Prompt, equal τ**: one DP-Prompt rewrite at τ. It is the FIRST of the stage-1 rewrites: every stage-1 row is an
  independent DP-Prompt rewrite at τ, so this is exactly a DP-Prompt release (common random numbers, no extra cost).
  Its ε is n times smaller than DP-GTR's composed ε;
* **DP-Prompt, equal ε**: one rewrite at the colder τ′ whose ε (one rewrite of T_max tokens) equals DP-GTR's composed
  ε at τ.

Privacy (lower = less leakage): ROUGE-1 and ROUGE-L F1 (rouge-score, no stemming) and sentence BLEU (sacrebleu, /100)
between the original and the protected question, mean over questions and repeats with a 95% t-interval. Utility:
accuracy of an answerer that sees ONLY the protected question and the original five choices. Default answerer:
all-MiniLM-L6-v2 cosine between the question and each choice (the embedded 135M LM answers CSQA at chance);
``--answer-model M``: a local causal LM scoring each choice's log-likelihood after the question. Beside them: the
answerer's accuracy on the original questions and chance (1/5). Accuracy intervals are 95% Wilson intervals over all
answers (questions × repeats; repeats of one question are not independent, so the interval is somewhat too narrow
when repeats > 1). Every row carries the per-token ε (ε_tok = 2(b_max − b_min)/τ) and the composed (ε, δ).

The run ends with the issue's check, computed from the numbers above: at every τ ≤ 0.75, DP-GTR's ROUGE-1 against
DP-Prompt's at equal τ (target ≤ 0.8× on average) and DP-GTR's accuracy against the lower end of DP-Prompt's interval.

``--perf``: the latency a user sees, in one run on the first question of ``--data``: one DP-Prompt release
(``protect_prompt(method="dp-prompt")``) and one whole DP-GTR release (``protect_prompt()`` with the defaults:
``--n-rewrites`` rewrites, ranking, keywords, ``--n-exemplars`` final prompts, consensus pick), alternated,
``--repeats`` times each (default 2; the same seed per pair), at τ = the first of ``--temperatures`` (default 0.5),
the model and the encoder loaded once before. Prints the best (fastest) of the repeats of each, the ratio (target
≤ 2×), stage 1 alone (the DP-GTR release's own stage 1) against the one rewrite, and the DP-GTR release's per-stage
split (``protect_prompt(profile=…)``: loading, stage 1, ranking, stage 2 keywords, stage 3 (its prefill apart),
embedding), with the tokens each side generated (rows stop at EOS, so a ratio also reflects how long the rewrites
happened to be).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpinfer.accounting.calibration import Budget, Spec
from dpinfer.bench import plots
from dpinfer.bench.data import load_csqa
from dpinfer.bench.gtr_scoring import LMAnswerer, MiniLMAnswerer, privacy_scores
from dpinfer.bench.harness import Progress, quiet, write_json, write_text
from dpinfer.bench.speed import speed_model
from dpinfer.checks import int_at_least, positive_number
from dpinfer.configs import Config, add_options, option
from dpinfer.configs.protect import check_quorum, quorum_arg
from dpinfer.defaults import PROTECT
from dpinfer.errors import ConfigurationError
from dpinfer.eval.intervals import mean_interval, ratio_interval

DESCRIPTION = __doc__

METHODS = ("dp-prompt", "dp-gtr-ndp", "dp-gtr-jem", "dp-prompt-equal-eps")
LABELS = {"dp-prompt": "DP-Prompt (equal τ)", "dp-gtr-ndp": "DP-GTR (NDP)", "dp-gtr-jem": "DP-GTR (JEM)",
          "dp-prompt-equal-eps": "DP-Prompt (equal ε)"}
DEFAULT_TEMPERATURES = (0.25, 0.5, 0.75)
PERF_TEMPERATURE = 0.5


# ---------------------------------------------------------------------------------------------------------- data
def parse_temperatures(text: str) -> list[float]:
    try:
        values = [float(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        raise ConfigurationError(f"--temperatures must be comma-separated numbers, got {text!r}") from None
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise ConfigurationError(f"--temperatures must be numbers > 0, got {text!r}")
    return values


# ---------------------------------------------------------------------------------------------------------- quality
def run_quality(lm: Any, records: list[dict[str, Any]], *, temperatures: list[float], repeats: int, n_rewrites: int,
                n_keywords: int, jem_epsilon: float, max_new_tokens: int, delta: float, batch_questions: int,
                seed: int, answerers: list[Any], progress: Progress = quiet, suppress: str | None = None,
                n_exemplars: int | None = None, stage3_int8: bool = PROTECT.stage3_int8,
                stage3_quorum: int | None = PROTECT.stage3_quorum) -> dict[str, Any]:
    import dataclasses

    from dpinfer.clip_bounds import clip_bounds
    from dpinfer.configs.protect import ProtectConfig
    from dpinfer.eval.intervals import wilson as wilson_interval
    from dpinfer.mechanisms.dp_prompt import DPPrompt
    from dpinfer.pipelines import protect_prompt as pp
    from dpinfer.protect.stage1 import stage1_mechanism
    from dpinfer.runtime import Runtime
    from dpinfer.task import run_jobs

    bounds = clip_bounds(lm)
    lo, hi = bounds.bounds
    questions = [r["question"] for r in records]
    choices = [r["choices"] for r in records]
    gold = [r["answer"] for r in records]
    original_acc = {a.name: sum(int(p == g) for p, g in zip(a.answer(questions, choices), gold, strict=True))
                    for a in answerers}
    # stage 3's consensus selection embeds released text with the same offline MiniLM (loaded once)
    rt = Runtime(lm, embedder=next((a.embedder for a in answerers if isinstance(a, MiniLMAnswerer)), None))
    rows_out: list[dict[str, Any]] = []
    examples: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    for tau in temperatures:
        # DP-GTR as the pipeline plans it (NDP; JEM is the same release with the other keyword method)
        ndp = ProtectConfig(temperature=tau, n_rewrites=n_rewrites, n_keywords=n_keywords, keywords="ndp",
                            jem_epsilon=jem_epsilon, max_new_tokens=max_new_tokens, delta=delta,
                            suppress=suppress or PROTECT.suppress, n_exemplars=n_exemplars or PROTECT.n_exemplars,
                            stage3_int8=stage3_int8, stage3_quorum=stage3_quorum)
        jem = ndp.replace(keywords="jem")
        gtr_g = stage1_mechanism(clip=(lo, hi), n_rewrites=n_rewrites, max_new_tokens=max_new_tokens,
                                    delta=delta, temperature=tau).guarantee(max_new_tokens)
        one_g = stage1_mechanism(clip=(lo, hi), n_rewrites=1, max_new_tokens=max_new_tokens, delta=delta,
                                    temperature=tau).guarantee(max_new_tokens)
        eq_mech = DPPrompt.calibrated(Budget(gtr_g.epsilon, delta),
                                      Spec(max_new_tokens, clip_min=lo, clip_max=hi, num_rewrites=1))
        eq_g = eq_mech.guarantee(max_new_tokens)
        equal_eps = ProtectConfig(method="dp-prompt", epsilon=gtr_g.epsilon, max_new_tokens=max_new_tokens,
                                  delta=delta)
        released: dict[str, list[list[str]]] = {m: [[] for _ in range(repeats)] for m in METHODS}
        for rep in range(repeats):
            for start in range(0, len(records), batch_questions):
                chunk = list(range(start, min(start + batch_questions, len(records))))
                progress(f"τ={tau:g} repeat {rep + 1}/{repeats} questions {chunk[0] + 1}-{chunk[-1] + 1}")
                seeds = [seed * 1_000_003 + rep * 7919 + round(tau * 1000) + 104_729 * i for i in chunk]
                # stage 1 of every question of the chunk in one engine run (the pipeline's plan), then stages 2-3
                # of NDP and of JEM on the SAME released rewrites (post-processing: common random numbers)
                plan = pp.plan_protect([questions[i] for i in chunk], ndp, rt, seeds=seeds)
                outputs = run_jobs(rt.engine, plan.jobs)
                by_ndp = pp.finish_protect(plan, outputs)
                by_jem = pp.finish_protect(dataclasses.replace(plan, config=jem, method=pp.method_for(jem, rt)),
                                           outputs)
                by_eq = pp.protect_prompts([questions[i] for i in chunk], equal_eps, runtime=rt,
                                           seeds=[s + 1 for s in seeds])
                for j, (a, b, e) in enumerate(zip(by_ndp, by_jem, by_eq, strict=True)):
                    assert isinstance(e, pp.ProtectedPrompt)
                    released["dp-prompt"][rep].append(a.rewrites[0])
                    released["dp-gtr-ndp"][rep].append(a.prompt)
                    released["dp-gtr-jem"][rep].append(b.prompt)
                    released["dp-prompt-equal-eps"][rep].append(e.prompt)
                    if rep == 0 and chunk[0] == 0 and j < 2:
                        examples.append({"tau": tau, "question": questions[j], "dp-prompt": a.rewrites[0],
                                         "exemplar": a.exemplar, "ndp_keywords": a.keywords,
                                         "jem_keywords": b.keywords, "dp-gtr-ndp": a.prompt, "dp-gtr-jem": b.prompt,
                                         "dp-prompt-equal-eps": e.prompt})
        guarantees = {"dp-prompt": (tau, one_g), "dp-gtr-ndp": (tau, gtr_g), "dp-gtr-jem": (tau, gtr_g),
                      "dp-prompt-equal-eps": (eq_mech.temperature, eq_g)}
        for method in METHODS:
            prot = [x for rep in released[method] for x in rep]
            orig = questions * repeats
            scores = [privacy_scores(o, p) for o, p in zip(orig, prot, strict=True)]
            m_tau, g = guarantees[method]
            row: dict[str, Any] = {
                "method": method, "label": LABELS[method], "tau": tau, "stage1_tau": m_tau,
                "epsilon_per_token": g.parameters["epsilon_per_token"], "epsilon": g.epsilon, "delta": g.delta,
                "rewrites": g.parameters["num_rewrites"], "n": len(prot),
                "empty_share": sum(not p.strip() for p in prot) / len(prot),
            }
            for metric in ("rouge1", "rougeL", "bleu"):
                mean, low, high = mean_interval([s[metric] for s in scores], digits=None)
                row[metric], row[f"{metric}_low"], row[f"{metric}_high"] = mean, low, high
            row["rouge1_items"] = [s["rouge1"] for s in scores]  # (repeat, question) order, the same in every row
            row["accuracy"] = {}
            for a in answerers:
                pred = a.answer(prot, choices * repeats)
                hits = sum(int(p == g_) for p, g_ in zip(pred, gold * repeats, strict=True))
                low, high = wilson_interval(hits, len(prot))
                row["accuracy"][a.name] = {"accuracy": hits / len(prot), "low": low, "high": high, "hits": hits}
            rows_out.append(row)
    n = len(records)
    return {
        "rows": rows_out,
        "original": {a: {"accuracy": hits / n, "low": wilson_interval(hits, n)[0], "high": wilson_interval(hits, n)[1]}
                     for a, hits in original_acc.items()},
        "chance": 0.2,
        "answerers": [a.name for a in answerers],
        "clip": {"clip_min": lo, "clip_max": hi, "source": bounds.source},
        "examples": examples,
        "seconds": time.perf_counter() - t_start,
    }


def issue_check(res: dict[str, Any], answerer: str) -> list[dict[str, Any]]:
    """Per τ ≤ 0.75: DP-GTR's ROUGE-1 over DP-Prompt's (equal τ) and DP-GTR's accuracy against the lower end of
    DP-Prompt's Wilson interval, for NDP and JEM."""
    out = []
    by = {(r["method"], r["tau"]): r for r in res["rows"]}
    for tau in sorted({r["tau"] for r in res["rows"]}):
        if tau > 0.75:
            continue
        base = by[("dp-prompt", tau)]
        for m in ("dp-gtr-ndp", "dp-gtr-jem"):
            r = by[(m, tau)]
            ratio = r["rouge1"] / base["rouge1"] if base["rouge1"] > 0 else math.inf
            low, high = ratio_interval(r.get("rouge1_items", []), base.get("rouge1_items", []))
            acc, floor = r["accuracy"][answerer]["accuracy"], base["accuracy"][answerer]["low"]
            out.append({"tau": tau, "method": m, "rouge1_ratio": ratio, "rouge1_ratio_low": low,
                        "rouge1_ratio_high": high, "accuracy": acc, "dp_prompt_low": floor,
                        "accuracy_ok": acc >= floor})
    return out


def format_markdown(res: dict[str, Any], settings: dict[str, Any]) -> str:
    ans = res["answerers"]
    lines = [f"CSQA, {settings['n']} questions × {settings['repeats']} repeats, model {settings['model']}, clip "
             f"[{res['clip']['clip_min']:.3f}, {res['clip']['clip_max']:.3f}] ({res['clip']['source']}), T_max "
             f"{settings['max_new_tokens']}, n = {settings['n_rewrites']} rewrites, K = {settings['n_keywords']}, "
             f"JEM ε₂ = {settings['jem_epsilon']:g}, stage-3 suppression {settings.get('suppress', 'instruct')} "
             f"from {settings.get('n_exemplars', 1)} exemplar(s), "
             f"δ = {settings['delta']:g}; {res['seconds']:.0f} s.", ""]
    head = "| method | τ | ε_tok | composed ε | ROUGE-1 | ROUGE-L | BLEU | " + " | ".join(
        f"acc ({a})" for a in ans) + " |"
    lines += [head, "|" + "---|" * (7 + len(ans))]
    for r in res["rows"]:
        accs = " | ".join(f"{r['accuracy'][a]['accuracy']:.3f} [{r['accuracy'][a]['low']:.3f}, "
                          f"{r['accuracy'][a]['high']:.3f}]" for a in ans)
        lines.append(f"| {r['label']} | {r['stage1_tau']:.3g} | {r['epsilon_per_token']:.1f} | {r['epsilon']:.4g} | "
                     f"{r['rouge1']:.3f} ± {(r['rouge1_high'] - r['rouge1']):.3f} | {r['rougeL']:.3f} | "
                     f"{r['bleu']:.3f} | {accs} |")
    orig = " | ".join(f"{res['original'][a]['accuracy']:.3f} [{res['original'][a]['low']:.3f}, "
                      f"{res['original'][a]['high']:.3f}]" for a in ans)
    lines.append(f"| original (no privacy) | – | – | ∞ | 1.000 | 1.000 | 1.000 | {orig} |")
    lines.append(f"| chance | – | – | 0 | – | – | – | {' | '.join('0.200' for _ in ans)} |")
    lines += ["", "ROUGE/BLEU: mean ± 95% t half-width over questions × repeats; accuracy: 95% Wilson interval. "
              "DP-Prompt (equal τ) is the first stage-1 rewrite of DP-GTR (an exact DP-Prompt draw at τ); "
              "DP-Prompt (equal ε) is one rewrite at the τ′ whose ε equals DP-GTR's composed ε.", "",
              f"Issue check (answerer {ans[0]}): DP-GTR ROUGE-1 / DP-Prompt ROUGE-1 at equal τ (target ≤ 0.8 on "
              "average), accuracy ≥ DP-Prompt's lower Wilson end:"]
    checks = issue_check(res, ans[0])
    for c in checks:
        lines.append(f"- τ = {c['tau']:g}, {LABELS[c['method']]}: ratio {c['rouge1_ratio']:.3f} "
                     f"[{c['rouge1_ratio_low']:.3f}, {c['rouge1_ratio_high']:.3f}] (95% paired bootstrap), accuracy "
                     f"{c['accuracy']:.3f} vs {c['dp_prompt_low']:.3f}: {'ok' if c['accuracy_ok'] else 'below'}")
    for m in ("dp-gtr-ndp", "dp-gtr-jem"):
        ratios = [c["rouge1_ratio"] for c in checks if c["method"] == m]
        if ratios:
            mean = statistics.fmean(ratios)
            lines.append(f"- {LABELS[m]}: mean ROUGE-1 ratio {mean:.3f} ({'≤' if mean <= 0.8 else '>'} 0.8)")
    return "\n".join(lines)


def plot(res: dict[str, Any], path: Path) -> Path | None:
    """Accuracy vs ROUGE-1 leakage per method (:func:`dpinfer.bench.plots.gtr_leakage_accuracy`)."""
    return plots.gtr_leakage_accuracy(res, path, LABELS)


# ---------------------------------------------------------------------------------------------------------- perf
def run_perf(lm: Any, question: str, *, n_rewrites: int, max_new_tokens: int, repeats: int, seed: int,
             temperature: float = PERF_TEMPERATURE, n_keywords: int | None = None, n_exemplars: int | None = None,
             suppress: str | None = None, stage3_int8: bool = PROTECT.stage3_int8,
             stage3_quorum: int | None = PROTECT.stage3_quorum) -> dict[str, Any]:
    """Seconds of one DP-Prompt release and one whole DP-GTR release of ``question`` (alternated, ``repeats`` pairs,
    seed ``seed + r`` for pair r), with the DP-GTR release's per-stage split; the best (smallest) of each."""
    from dpinfer.bench import machine_load
    from dpinfer.clip_bounds import clip_bounds
    from dpinfer.eval.embeddings import shared_embedder
    from dpinfer.pipelines import protect_prompt as pp
    from dpinfer.protect.stage1 import paraphrase_ids
    from dpinfer.runtime import Runtime

    t0 = time.perf_counter()
    clip_bounds(lm)
    n_ex = n_exemplars or PROTECT.n_exemplars
    if n_ex > 1:
        shared_embedder()
    if stage3_int8:
        _ = Runtime(lm).int8_engine  # stage 3's int8 twin: built once per process, like the model
    loading = time.perf_counter() - t0  # once per process: not part of either release below
    common = dict(lm=lm, temperature=temperature, max_new_tokens=max_new_tokens)
    gtr_kwargs = dict(n_rewrites=n_rewrites, n_keywords=n_keywords or PROTECT.n_keywords, n_exemplars=n_ex,
                      suppress=suppress or PROTECT.suppress, stage3_int8=stage3_int8, stage3_quorum=stage3_quorum)
    pp.protect_prompt(question, method="dp-prompt", seed=seed, **{**common, "max_new_tokens": 2})  # warm-up
    runs: list[dict[str, Any]] = []
    for r in range(repeats):
        one_prof: dict[str, float] = {}
        c0 = time.process_time()
        one = pp.protect_prompt(question, method="dp-prompt", seed=seed + r, profile=one_prof, **common)
        c1 = time.process_time()
        gtr_prof: dict[str, float] = {}
        res = pp.protect_prompt(question, seed=seed + r, profile=gtr_prof, **common, **gtr_kwargs)
        c2 = time.process_time()
        runs.append({"one": one_prof["total"], "one_tokens": len(lm.encode(one.prompt)), "gtr": gtr_prof["total"],
                     "one_cpu": c1 - c0, "gtr_cpu": c2 - c1,
                     "stages": dict(gtr_prof), "rewrite_tokens": [len(lm.encode(x)) for x in res.rewrites],
                     "final_tokens": len(lm.encode(res.prompt))})
    best_one = min(x["one"] for x in runs)
    best_gtr = min(runs, key=lambda x: x["gtr"])
    best_stage1 = min(x["stages"]["stage1"] for x in runs)
    cpu_one, cpu_gtr = min(x["one_cpu"] for x in runs), min(x["gtr_cpu"] for x in runs)
    pair_ratios = [x["gtr"] / x["one"] for x in runs]  # each pair's two releases ran one after the other
    return {"runs": runs, "best_one": best_one, "best_gtr": best_gtr["gtr"], "best_stage1": best_stage1,
            "pair_ratios": pair_ratios, "median_pair_ratio": statistics.median(pair_ratios),
            "ratio": best_gtr["gtr"] / best_one, "stage1_ratio": best_stage1 / best_one,
            "best_one_cpu": cpu_one, "best_gtr_cpu": cpu_gtr, "cpu_ratio": cpu_gtr / cpu_one,
            "stages": best_gtr["stages"], "loading_once": loading, "temperature": temperature,
            "n_rewrites": n_rewrites, "n_exemplars": n_ex, "max_new_tokens": max_new_tokens, "repeats": repeats,
            "prompt_tokens": len(paraphrase_ids(lm, question)), **machine_load()}


def perf_markdown(perf: dict[str, Any]) -> str:
    """The ``--perf`` report: best-of times, ratios and the DP-GTR release's per-stage split."""
    st = perf["stages"]
    split = ", ".join(f"{name} {st[name]:.2f} s" for name in ("loading", "stage1", "ranking", "stage2", "stage3",
                                                              "embedding") if name in st)
    if "stage3_prefill" in st:
        split += f" (stage3 = prefill of the final requests {st['stage3_prefill']:.2f} s + decoding " \
                 f"{st['stage3'] - st['stage3_prefill']:.2f} s)"
    toks = "; ".join(f"pair {i + 1}: one rewrite {x['one_tokens']} tokens in {x['one']:.2f} s, DP-GTR rewrites "
                     f"{x['rewrite_tokens']} (longest {max(x['rewrite_tokens'], default=0)}), final "
                     f"{x['final_tokens']} tokens in {x['gtr']:.2f} s" for i, x in enumerate(perf["runs"]))
    return "\n".join([
        f"One question ({perf['prompt_tokens']}-token paraphrase request), τ = {perf['temperature']:g}, T_max "
        f"{perf['max_new_tokens']}, best of {perf['repeats']} alternated pairs:",
        f"- one DP-Prompt rewrite: {perf['best_one']:.2f} s",
        f"- stage 1 alone ({perf['n_rewrites']} rewrites): {perf['best_stage1']:.2f} s = {perf['stage1_ratio']:.2f}× "
        "one rewrite",
        f"- whole DP-GTR release: {perf['best_gtr']:.2f} s = **{perf['ratio']:.2f}×** one rewrite (target ≤ 2×)",
        f"- per pair (one rewrite and the release with the same seed, one right after the other): "
        f"{', '.join(f'{r:.2f}×' for r in perf['pair_ratios'])}; median {perf['median_pair_ratio']:.2f}×",
        f"- in CPU time (the process's, best of each; other processes on a shared machine stretch wall time, much "
        f"less CPU time): one rewrite {perf['best_one_cpu']:.2f} s, DP-GTR release {perf['best_gtr_cpu']:.2f} s = "
        f"**{perf['cpu_ratio']:.2f}×**",
        f"- per stage (fastest DP-GTR release): {split}; total {st['total']:.2f} s",
        f"- loaded once per process before the runs (model clip bounds, MiniLM, stage 3's int8 twin): "
        f"{perf['loading_once']:.2f} s",
        f"- {toks}",
        f"- torch threads {perf['torch_threads']} on {perf['cpu_count']} CPUs, load average "
        f"{perf['load_average_1min']}",
    ])


def perf_questions_markdown(perfs: list[dict[str, Any]]) -> str:
    """``--perf-questions N``: each question's best-of times and ratio, and the median and range of the ratios."""
    ratios = [p["ratio"] for p in perfs]
    lines = [f"Each of the first {len(perfs)} questions (best of {perfs[0]['repeats']} alternated pairs each):"]
    lines += [f"- question {i + 1} ({p['prompt_tokens']}-token request): one rewrite {p['best_one']:.2f} s, stage 1 "
              f"{p['best_stage1']:.2f} s, whole DP-GTR release {p['best_gtr']:.2f} s = **{p['ratio']:.2f}×**"
              for i, p in enumerate(perfs)]
    lines.append(f"- median ratio **{statistics.median(ratios):.2f}×** (range {min(ratios):.2f}–{max(ratios):.2f}×; "
                 f"{sum(r <= 2 for r in ratios)} of {len(ratios)} at most 2×)")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------- entry
@dataclass(frozen=True)
class GtrBenchConfig(Config):
    """Settings of ``dpinfer bench gtr`` (one field per option, its ``--help`` with it; the ``--perf``-dependent
    defaults resolved by :func:`config_from_args`), checked when built."""

    dataset: str = option("csqa", flag="--data", help="csqa (default: ../shared/data/csqa/csqa_dev.jsonl) or a "
                                                      "CSQA-shaped .jsonl file")
    n: int = option(200, help="questions (default 200)")
    temperatures: tuple[float, ...] = option(DEFAULT_TEMPERATURES, type=str, help="comma-separated stage-1 "
                                             "temperatures (default 0.25,0.5,0.75; --perf: its first, default 0.5)")
    repeats: int = option(3, help="repeats per τ, fresh noise each (default 3; --perf: 2, the best of them reported)")
    n_rewrites: int = option(PROTECT.n_rewrites, help="DP-GTR stage-1 rewrites (default 10)")
    n_keywords: int = option(PROTECT.n_keywords, help="keywords K (default 10)")
    jem_epsilon: float = option(PROTECT.jem_epsilon, help="ε₂ of JEM (default: the pipeline's, 40)")
    suppress: str | None = option(None, type=str, choices=("ban", "instruct"),
                                  help="stage 3's keyword suppression (default: the pipeline's, ban)")
    n_exemplars: int | None = option(None, type=int, help="stage-3 final prompts per question, the one closest to the "
                                                          "rewrites' consensus released (default: the pipeline's, 5)")
    max_new_tokens: int = option(PROTECT.max_new_tokens, help="T_max (default 48)")
    stage3_quorum: int | None = option(PROTECT.stage3_quorum, type=quorum_arg, metavar="N|all",
                                       help="stage 3 stops decoding a question's finals once N are complete, the "
                                            "others cut where they are (default: the pipeline's, 3; all: every "
                                            "final to its end)")
    stage3_int8: bool = option(PROTECT.stage3_int8, help="stage 3 on the int8 decode twin (default: the pipeline's, "
                                                         "on); --no-stage3-int8: stage 3 in float32")
    delta: float = option(PROTECT.delta, help="δ (default 1e-5)")
    batch_questions: int = option(4, help="questions decoded together in one engine batch (default 4: 4 × n rows)")
    answer_model: str | None = option(None, type=str, help="also answer with this local causal LM (log-likelihood "
                                                           "of each choice)")
    perf: bool = option(False, help="latency: one DP-Prompt rewrite, stage 1 alone and the whole DP-GTR release, "
                                    "per stage, in one run")
    perf_questions: int = option(1, help="--perf: time each of the first N questions (default 1) and print each "
                                         "one's ratio and their median")
    model: str | None = option(None, type=str, help="model name or local folder (default: embedded SmolLM2-135M)")
    seed: int = option(0, help="seed of the benchmark's noise (default 0)")
    out: str | None = option(None, type=str, help="folder for gtr.json, gtr.md and gtr.png (default: no files)")

    def __post_init__(self) -> None:
        for name in ("repeats", "n_rewrites", "n_keywords", "batch_questions", "perf_questions"):
            int_at_least(getattr(self, name), "--" + name.replace("_", "-"), 1)
        positive_number(self.jem_epsilon, "--jem-epsilon")
        check_quorum(self.stage3_quorum, "--stage3-quorum")
        if self.perf_questions != 1 and not self.perf:
            raise ConfigurationError("--perf-questions times releases: give it with --perf")
        if self.perf and self.n_rewrites < 2:
            raise ConfigurationError("--perf compares --n-rewrites rows with one row: give --n-rewrites ≥ 2")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_options(p, GtrBenchConfig)


def config_from_args(args: argparse.Namespace) -> GtrBenchConfig:
    """The config of parsed ``dpinfer bench gtr`` options, checked before any data or model loads."""
    from dpinfer.io import check_output_path

    perf = getattr(args, "perf", False)
    temperatures = (parse_temperatures(args.temperatures) if "temperatures" in args
                    else [PERF_TEMPERATURE] if perf else list(DEFAULT_TEMPERATURES))
    c = GtrBenchConfig.from_args(args, temperatures=tuple(temperatures),
                                 **({} if "repeats" in args or not perf else {"repeats": 2}))
    if c.out:
        Path(c.out).mkdir(parents=True, exist_ok=True)
        check_output_path(Path(c.out) / "gtr.json")
    return c


def run(config: GtrBenchConfig, progress: Progress = quiet) -> dict[str, Any]:
    """The quality table (or, with ``perf``, the latency run); ``gtr.json``, ``gtr.md`` (and ``gtr.png``) written
    into ``config.out`` when given; the results with their Markdown (``"markdown"``)."""
    c = config
    records = load_csqa(c.dataset, c.perf_questions if c.perf else c.n)
    lm = speed_model(c.model)  # the packed copies made now: the first timed release does not pay for them
    settings = {"n": len(records), "repeats": c.repeats, "temperatures": list(c.temperatures),
                "n_rewrites": c.n_rewrites, "n_keywords": c.n_keywords, "jem_epsilon": c.jem_epsilon,
                "max_new_tokens": c.max_new_tokens, "delta": c.delta, "model": lm.name,
                "batch_questions": c.batch_questions, "suppress": c.suppress or PROTECT.suppress,
                "n_exemplars": c.n_exemplars or PROTECT.n_exemplars, "stage3_int8": c.stage3_int8,
                "stage3_quorum": c.stage3_quorum}  # never the seed
    out_dir = Path(c.out) if c.out else None
    if c.perf:
        perfs = []
        for i, record in enumerate(records):
            progress(f"--perf question {i + 1}/{len(records)}")
            perfs.append(run_perf(lm, record["question"], n_rewrites=c.n_rewrites, max_new_tokens=c.max_new_tokens,
                                  repeats=c.repeats, seed=c.seed, temperature=c.temperatures[0],
                                  n_keywords=c.n_keywords, n_exemplars=settings["n_exemplars"],
                                  suppress=settings["suppress"], stage3_int8=c.stage3_int8,
                                  stage3_quorum=c.stage3_quorum))
        markdown = perf_markdown(perfs[0])
        result = {"perf": perfs[0], "settings": settings}
        if len(perfs) > 1:
            result["perf_questions"] = perfs
            markdown += "\n" + perf_questions_markdown(perfs)
        result["markdown"] = markdown
    else:
        from dpinfer.generation import resolve_lm

        answerers: list[Any] = [MiniLMAnswerer()]
        if c.answer_model:
            answerers.append(LMAnswerer(resolve_lm(c.answer_model)))
        res = run_quality(lm, records, temperatures=list(c.temperatures), repeats=c.repeats,
                          n_rewrites=c.n_rewrites, n_keywords=c.n_keywords, jem_epsilon=c.jem_epsilon,
                          max_new_tokens=c.max_new_tokens, delta=c.delta, batch_questions=c.batch_questions,
                          seed=c.seed, answerers=answerers, progress=progress, suppress=settings["suppress"],
                          n_exemplars=settings["n_exemplars"], stage3_int8=c.stage3_int8,
                          stage3_quorum=c.stage3_quorum)
        result = {**res, "settings": settings, "check": issue_check(res, res["answerers"][0]),
                  "markdown": format_markdown(res, settings)}
        if out_dir is not None:
            png = plot(res, out_dir / "gtr.png")
            result["plot"] = str(png) if png else None
    if out_dir is not None:
        write_text(out_dir / "gtr.md", result["markdown"] + "\n")
        write_json(out_dir / "gtr.json", {k: v for k, v in result.items() if k != "markdown"})
    return result


def render(result: dict[str, Any]) -> str:
    """What ``dpinfer bench gtr`` prints: the Markdown, and the plot's path when one was drawn."""
    return result["markdown"] + (f"\n\nplot: {result['plot']}" if result.get("plot") else "")
