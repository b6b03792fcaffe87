"""The RAG task of ``dpinfer bench utility`` (:mod:`dpinfer.bench.utility`): ``none`` (ceiling), ``public``
(floor), ``pad`` over ε on held-in GenMedGPT questions, scored by the facts of the retrieved reply that the answer
names (:mod:`~dpinfer.bench.utility_vocab`); and why ``pad`` can or cannot name them (its public support).

``cfg`` is the bench's :class:`~dpinfer.bench.utility.UtilityBenchConfig`.
"""

from __future__ import annotations

import json
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dpinfer.bench.utility_tasks import mean_finite as _mean
from dpinfer.bench.utility_tasks import paired
from dpinfer.bench.utility_vocab import TermMatcher, medical_vocabulary
from dpinfer.eval.intervals import mean_interval, share


def summarise_rag_row(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with its figures from its per-item ``items`` (hit: at least one target named; recall: the share of
    the targets named; drug figures on the items whose targets include a drug)."""
    items = row["items"]
    hits = [1.0 if x["found"] else 0.0 for x in items]
    recall = [len(x["found"]) / len(x["targets"]) for x in items]
    drug_items = [x for x in items if x["drug_targets"]]
    drug_hits = [1.0 if set(x["found"]) & set(x["drug_targets"]) else 0.0 for x in drug_items]
    m, lo, hi = mean_interval(recall, digits=None) if len(recall) > 1 else (_mean(recall), math.nan, math.nan)
    row.update({
        "hit": share(int(sum(hits)), len(hits)), "recall": {"mean": m, "ci95": [lo, hi]},
        "drug_hit": share(int(sum(drug_hits)), len(drug_hits)),
        "named_any": _mean([float(x["named"]) for x in items]),
        "tokens": _mean([x["tokens"] for x in items]),
    })
    return row


def compare_to_floor(rows: list[dict[str, Any]], floor_method: str = "public") -> None:
    """Each row's paired difference of the hit rate to the floor row's, over the same items (in place)."""
    floor = next((r for r in rows if r["method"] == floor_method), None)
    if floor is None:
        return
    base = [1.0 if x["found"] else 0.0 for x in floor["items"]]
    for r in rows:
        if r is floor or len(r["items"]) != len(base):
            continue
        r["vs_floor"] = paired([1.0 if x["found"] else 0.0 for x in r["items"]], base)


# ------------------------------------------------------------------------------------------------ rag
def rag_items(records: Sequence[Mapping[str, str]], matcher: TermMatcher, n: int) -> list[dict[str, Any]]:
    """The first ``n`` records whose reply names at least one vocabulary term that the question does not:
    ``{index, question, targets, drug_targets}``."""
    out = []
    for i, r in enumerate(records):
        targets = matcher.named(r["output"]) - matcher.named(r["input"])
        if targets:
            out.append({"index": i, "question": r["input"], "targets": sorted(targets),
                        "drug_targets": sorted(t for t in targets if matcher.kind[t] == "drug")})
            if len(out) == n:
                break
    return out


def rag_methods(epsilons: Sequence[float], default_epsilon: float,
                baselines: bool = True) -> list[tuple[str, float | None]]:
    """The rows in the order they run: the ceiling, the floor (unless not ``baselines``), ``pad`` at the default ε,
    then the other ε."""
    rest = [e for e in epsilons if e != default_epsilon]
    pads = ([default_epsilon] if default_epsilon in epsilons else []) + rest
    return [*([("none", None), ("public", None)] if baselines else []), *(("pad", e) for e in pads)]


def merge_rag(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One RAG result of several runs (e.g. one with the baselines and ``pad`` at the default ε, one with the other
    ε and ``--no-rag-baselines``): every row restricted to the questions that every run asked (the same first
    questions of the same data), its figures and paired differences recomputed; a method and ε measured twice is
    kept from the first run that has it."""
    common = set.intersection(*({x["index"] for x in p["rows"][0]["items"]} for p in parts if p.get("rows")))
    rows: list[dict[str, Any]] = []
    seen: set[tuple[str, Any]] = set()
    for p in parts:
        for r in p.get("rows", []):
            key = (r["method"], r.get("target_epsilon"))
            if key in seen:
                continue
            seen.add(key)
            items = [x for x in r["items"] if x["index"] in common]
            rows.append(summarise_rag_row({k: v for k, v in r.items() if k != "vs_floor"} | {"items": items}))
    order = {"none": 0, "public": 1, "pad": 2}
    rows.sort(key=lambda r: (order.get(r["method"], 3), r.get("target_epsilon") or 0))
    compare_to_floor(rows)
    first = next(p for p in parts if p.get("rows"))
    items0 = rows[0]["items"] if rows else []
    out = {k: v for k, v in first.items() if k not in ("rows", "partial", "support", "screen")}
    out.update({"rows": rows, "questions": len(common), "merged": len(parts),
                "targets_per_item": _mean([len(x["targets"]) for x in items0]),
                "items_with_drug": sum(bool(x["drug_targets"]) for x in items0)})
    for key in ("support", "screen"):  # the diagnostics, from the first run that has them
        found = next((p[key] for p in parts if p.get(key)), None)
        if found is not None:
            out[key] = found
    return out


def run_rag(lm: Any, emb: Any, cfg: Any, progress: Callable[[str], None],
            checkpoint: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The RAG rows: ``none`` (ceiling), ``public`` (floor), ``pad`` at each ε of ``cfg.epsilons``, on the same
    held-in GenMedGPT questions; ``checkpoint(partial)`` after every row."""
    from dpinfer.defaults import RAG
    from dpinfer.errors import DataNotFoundError, DPInferError
    from dpinfer.paths import data_file
    from dpinfer.pipelines.rag import PrivateRAG

    try:
        path = data_file("medical", "genmedgpt_dialogues.jsonl")
    except DataNotFoundError as exc:
        return {"skipped": str(exc)}
    with path.open(encoding="utf-8") as f:
        every = [json.loads(line) for line in f if line.strip()]
    matcher = TermMatcher(medical_vocabulary(r["output"] for r in every))
    stored = every[:cfg.docs]
    items = rag_items(stored, matcher, cfg.questions)
    about: dict[str, Any] = {
        "docs": len(stored), "questions": len(items), "T_max": cfg.rag_tokens,
        "vocabulary": {"drugs": sum(t.kind == "drug" for t in matcher.terms),
                       "tests": sum(t.kind == "test" for t in matcher.terms)},
        "targets_per_item": _mean([len(x["targets"]) for x in items]),
        "items_with_drug": sum(bool(x["drug_targets"]) for x in items), "pad_min_p": cfg.support_min_p,
    }
    rows: list[dict[str, Any]] = []
    questions = [x["question"] for x in items]
    with tempfile.TemporaryDirectory(prefix="dpinfer-utility-") as tmp:
        rag = PrivateRAG(Path(tmp) / "store", lm=lm, embedder=emb, ledger=None)  # a measurement, not a release
        progress(f"rag: storing {len(stored)} dialogues")
        rag.add([f"Patient: {r['input']}\nDoctor: {r['output']}" for r in stored])
        for method, eps in rag_methods(cfg.epsilons, RAG.epsilon, cfg.rag_baselines):
            label = method if eps is None else f"{method} ε={eps:g}"
            progress(f"rag {label} ({len(questions)} questions)")
            t0 = time.perf_counter()
            extra: dict[str, Any] = {"epsilon": eps, "support_min_p": cfg.support_min_p} if eps is not None else {}
            answers: list[Any] = [None] * len(questions)
            for i, ans, error in rag.ask_many(questions, mechanism=method, seed=cfg.seed,
                                              max_new_tokens=cfg.rag_tokens, **extra):
                if error is not None:
                    raise DPInferError(f"rag {method}: question {i} failed ({error})")
                answers[i] = ans
            seconds = time.perf_counter() - t0
            row_items = []
            for x, a in zip(items, answers, strict=True):
                named = matcher.named(a.text)
                row_items.append({"index": x["index"], "targets": x["targets"], "drug_targets": x["drug_targets"],
                                  "found": sorted(named & set(x["targets"])), "named": len(named),
                                  "tokens": a.tokens, "text": a.text})
            rows.append(summarise_rag_row({
                "method": method, "epsilon": answers[0].guarantee.epsilon if answers else math.nan,
                "target_epsilon": eps, "items": row_items, "seconds": seconds / max(1, len(questions))}))
            if method == "none":
                progress("rag: the public support at the ceiling's facts")
                norms = clip_norms(cfg.epsilons, cfg.rag_tokens)
                about["support"] = support_reach(lm, [rag.public_ids(q) for q in questions], row_items, matcher,
                                                 norms)
            compare_to_floor(rows)
            if checkpoint is not None:
                checkpoint({**about, "rows": rows})
    return {**about, "rows": rows}


# ------------------------------------------------------------------------------------------------ rag: why
def clip_norms(epsilons: Iterable[float], max_new_tokens: int) -> dict[float, float]:
    """PAD's clip norm C at each ε (δ, σ, T_max: the defaults and ``max_new_tokens``), from the parameters alone."""
    from dpinfer.pipelines.rag import ask_guarantee

    return {e: float(ask_guarantee("pad", epsilon=e, max_new_tokens=max_new_tokens).parameters["clip_norm"])
            for e in sorted(epsilons)}


def support_of_run(lm: Any, result: Mapping[str, Any], epsilons: Sequence[float]) -> dict[str, Any]:
    """:func:`support_reach` for a finished run's ``rag`` result (its ``none`` row's answers, its questions read
    again from the data by index): the diagnostic of a run made before it existed."""
    from dpinfer.defaults import RAG
    from dpinfer.paths import data_file
    from dpinfer.rag.prompts import RagRows, RagTemplate

    with data_file("medical", "genmedgpt_dialogues.jsonl").open(encoding="utf-8") as f:
        every = [json.loads(line) for line in f if line.strip()]
    matcher = TermMatcher(medical_vocabulary(r["output"] for r in every))
    none = next(r for r in result["rows"] if r["method"] == "none")
    rows = RagRows(lm, RagTemplate(), RAG.top_n, RAG.max_doc_tokens)
    prompts = [rows.public_ids(every[x["index"]]["input"]) for x in none["items"]]
    return support_reach(lm, prompts, none["items"], matcher, clip_norms(epsilons, result["T_max"]))


def first_target_token(lm: Any, ids: Sequence[int], text: str, targets: Sequence[str],
                       matcher: TermMatcher) -> int | None:
    """The index in ``ids`` of the token where the first mention of a target term starts in the decoded ``text``
    (None when no target is named)."""
    starts = [m.start() for t, pats in matcher._patterns if t.name in targets for p in pats
              for m in [p.search(text)] if m]
    if not starts:
        return None
    start = min(starts)
    for j in range(len(ids)):
        if len(lm.decode(list(ids[:j + 1])).strip()) > start:
            return j
    return None


def support_reach(lm: Any, public_prompts: Sequence[Sequence[int]], items: Sequence[Mapping[str, Any]],
                  matcher: TermMatcher, clip_norms: Mapping[float, float]) -> dict[str, Any]:
    """Why ``pad`` can or cannot name what the retrieved record holds: for each question whose ceiling (``none``)
    answer (``item["text"]``, tokenised again) names a target, the first token of that name, and the PUBLIC row's
    logits at that point of the ceiling's answer (the question alone, then the ceiling's answer so far). PAD can
    only emit a token of its public support: within ln(1/min-p) of the public maximum (min-p) and within 2C of it
    (Top-1⁺). Returns the gaps (public maximum − the token's public logit), their ranks, and the share of tokens
    inside each support. A diagnostic of the benchmark (it reads the private answer), never part of a release."""
    import torch

    from dpinfer.defaults import RAG

    gaps: list[float] = []
    ranks: list[int] = []
    for prompt, item in zip(public_prompts, items, strict=True):
        ids = list(lm.encode(item["text"])) if item["found"] else []
        j = first_target_token(lm, ids, item["text"], item["found"], matcher) if ids else None
        if j is None:
            continue
        row = torch.as_tensor([list(prompt) + ids[:j]], dtype=torch.long, device=lm.device)
        with torch.inference_mode():
            z = lm.model(input_ids=row, use_cache=False).logits[0, -1].to(torch.float64).cpu()
        tok = ids[j]
        gaps.append(float(z.max() - z[tok]))
        ranks.append(int((z > z[tok]).sum()) + 1)
    n = len(gaps)
    min_p = RAG.support_min_p or 1.0
    return {
        "n": n, "gaps": gaps, "ranks": ranks,
        "median_gap": statistics.median(gaps) if gaps else math.nan,
        "median_rank": statistics.median(ranks) if ranks else math.nan,
        "in_min_p": share(sum(g <= -math.log(min_p) + 1e-12 for g in gaps), n), "min_p": RAG.support_min_p,
        "in_top1_plus": {f"{e:g}": share(sum(g <= 2 * c for g in gaps), n) for e, c in clip_norms.items()},
        "clip_norms": {f"{e:g}": c for e, c in clip_norms.items()},
    }


# ------------------------------------------------------------------------------------------------ rag: which support
SCREEN_SUPPORTS = (("min-p 0.5 (default)", 0.5, 1.5), ("min-p 0.1", 0.1, 1.5), ("min-p 0.02", 0.02, 1.5),
                   ("Top-1⁺ alone", None, 1.5), ("Top-1⁺ alone, σ = 3", None, 3.0))
"""The PAD settings :func:`emission_screen` compares: (label, min-p of the public support, σ); C is solved from
(ε, δ, T_max, σ) for each, so every setting has the same guarantee at the same ε."""


def emission_screen(lm: Any, emb: Any, result: Mapping[str, Any], epsilons: Sequence[float],
                    draws: int = 20000, seed: int = 0) -> dict[str, Any]:
    """For a finished run's ceiling answers that name a fact (as :func:`support_of_run`), the probability that PAD
    releases the first token of that name at that point of the ceiling's answer, under each setting of
    :data:`SCREEN_SUPPORTS` and each ε: the public row (question, then the answer so far) and the private row (the
    question with the ``top_n`` retrieved dialogues, then the answer so far) are read once; the support, the clipped
    shift and ``draws`` draws of the noise give the share of draws whose argmax is that token (0 outside the
    support). A screen of the settings before a full run (teacher-forced, one step per answer), never a release."""
    import torch

    from dpinfer.defaults import RAG
    from dpinfer.mechanisms.pad import Pad, clip_norm_for_target
    from dpinfer.paths import data_file
    from dpinfer.pipelines.rag import PrivateRAG

    with data_file("medical", "genmedgpt_dialogues.jsonl").open(encoding="utf-8") as f:
        every = [json.loads(line) for line in f if line.strip()]
    matcher = TermMatcher(medical_vocabulary(r["output"] for r in every))
    none = next(r for r in result["rows"] if r["method"] == "none")
    t_max = int(result["T_max"])
    gen = torch.Generator().manual_seed(seed)
    probs: dict[str, dict[str, list[float]]] = {lab: {f"{e:g}": [] for e in epsilons} for lab, _, _ in SCREEN_SUPPORTS}
    argmax_private = 0
    with tempfile.TemporaryDirectory(prefix="dpinfer-utility-") as tmp:
        rag = PrivateRAG(Path(tmp) / "store", lm=lm, embedder=emb, ledger=None)
        rag.add([f"Patient: {r['input']}\nDoctor: {r['output']}" for r in every[:int(result["docs"])]])
        for item in none["items"]:
            ids = list(lm.encode(item["text"])) if item["found"] else []
            j = first_target_token(lm, ids, item["text"], item["found"], matcher) if ids else None
            if j is None:
                continue
            q = every[item["index"]]["input"]
            docs = [h.text for h in rag.retrieve(q)]
            rows = [rag.public_ids(q) + ids[:j], rag.private_ids(q, docs, rag.doc_budget(q, t_max)) + ids[:j]]
            z = []
            for row in rows:
                with torch.inference_mode():
                    x = torch.as_tensor([row], dtype=torch.long, device=lm.device)
                    z.append(lm.model(input_ids=x, use_cache=False).logits[0, -1].to(torch.float64).cpu())
            logits, tok = torch.stack(z), ids[j]
            argmax_private += int(int(logits[1].argmax()) == tok)
            for lab, min_p, sigma in SCREEN_SUPPORTS:
                for e in epsilons:
                    c = clip_norm_for_target(e, RAG.delta, max_new_tokens=t_max, sigma=sigma)
                    idx, _, pre = Pad(clip_norm=c, sigma=sigma, top_k=RAG.support_top_k, min_p=min_p
                                      ).pre_noise_logits(logits)
                    where = (idx == tok).nonzero()
                    if where.numel() == 0:
                        probs[lab][f"{e:g}"].append(0.0)
                        continue
                    noisy = pre + sigma * torch.randn((draws, pre.numel()), generator=gen, dtype=torch.float64)
                    probs[lab][f"{e:g}"].append(float((noisy.argmax(dim=1) == int(where[0, 0])).double().mean()))
    return {"n": len(next(iter(next(iter(probs.values())).values()), [])), "draws": draws,
            "private_argmax": argmax_private, "probability": probs,
            "mean": {lab: {e: _mean(v) for e, v in by.items()} for lab, by in probs.items()}}
