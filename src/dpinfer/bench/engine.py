"""``dpinfer bench engine``: engine throughput against Hugging Face ``model.generate``, side by side in one run.

For a real ~500-token document prompt (the shipped ECHR example) and ``N`` new tokens (EOS masked so every run makes
exactly ``N``), it times

* ``hf``: ``lm.model.generate(do_sample=False, min_new_tokens=N, max_new_tokens=N)`` (prefill included);
* ``engine K=…``: the engine stepping K copies of the same prompt in joint mode (greedy on row 0), prefill included,
  with the shared prefix prefilled once (``shared``) and, for K > 1, without prefix sharing (``unshared``: every row
  prefilled, as for K different contexts).

Throughput is generated tokens per second of wall-clock time, prefill included; ratios are to ``hf`` in the same run.
Runs are interleaved over ``--repeats`` rounds and the median is reported (this machine is noisy).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpinfer.errors import DataNotFoundError

DEFAULT_DOC = "echr_case_001-66929.txt"
INSTRUCTION = "Rewrite the following court document in your own words, keeping its meaning:\n\n"


def example_document(name: str = DEFAULT_DOC) -> str:
    """Text of a document shipped in the repository's ``examples/`` folder."""
    from dpinfer.paths import repo_root

    root = repo_root()
    candidates = [Path.cwd() / "examples" / name]
    if root is not None:
        candidates.insert(0, root / "examples" / name)
    for c in candidates:
        if c.is_file():
            return c.read_text(encoding="utf-8")
    raise DataNotFoundError(f"example document {name} not found (looked in {', '.join(map(str, candidates))})")


def document_prompt_ids(lm: Any, target_tokens: int = 500, document: str | None = None) -> list[int]:
    """Chat prompt asking to rewrite a document, cut at a paragraph so that it has about ``target_tokens`` tokens."""
    doc = document if document is not None else example_document()
    paragraphs = doc.split("\n\n")
    best: list[int] = lm.encode(lm.instruction_prompt(INSTRUCTION + paragraphs[0]))
    for n in range(2, len(paragraphs) + 1):
        ids = lm.encode(lm.instruction_prompt(INSTRUCTION + "\n\n".join(paragraphs[:n])))
        if len(ids) > target_tokens * 1.1:
            break
        best = ids
    return best


def _time_hf(lm: Any, ids: list[int], n: int) -> float:
    import torch

    x = torch.tensor([ids], device=lm.device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = lm.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, min_new_tokens=n,
                                max_new_tokens=n, pad_token_id=lm.pad_token_id)
    dt = time.perf_counter() - t0
    assert out.shape[1] - len(ids) == n
    return dt


def _time_engine(lm: Any, ids: list[int], k: int, n: int, shared: bool) -> tuple[float, float]:
    from dpinfer.engine import Engine
    from dpinfer.mechanisms.sampler import Sampler

    eng = Engine(lm, prefix_sharing=shared)
    t0 = time.perf_counter()
    out = eng.generate([ids] * k, Sampler(temperature=0.0, mode="joint"), max_new_tokens=n, min_new_tokens=n,
                       seed=0)
    dt = time.perf_counter() - t0
    assert len(out.sequences[0]) == n
    return dt, out.prefill_seconds


def run_engine_bench(lm: Any, *, ks: tuple[int, ...] = (1, 2, 5, 9), new_tokens: int = 256, prompt_tokens: int = 500,
                     repeats: int = 1, unshared: bool = True, progress: Any = None) -> dict[str, Any]:
    """Measure and return ``{"settings": ..., "rows": [...]}`` (see module docstring)."""
    ids = document_prompt_ids(lm, prompt_tokens)
    configs: list[tuple[str, int, bool]] = [("hf generate", 1, True)]
    for k in ks:
        configs.append((f"engine K={k}", k, True))
        if unshared and k > 1:
            configs.append((f"engine K={k} unshared", k, False))
    # warm-up (thread pools, allocator) so the first timed run is not penalised
    _time_engine(lm, ids[:64], 1, 4, True)
    times: dict[str, list[float]] = {c[0]: [] for c in configs}
    prefill: dict[str, list[float]] = {c[0]: [] for c in configs}
    for _ in range(repeats):
        for label, k, shared in configs:
            if progress:
                progress(label)
            if label == "hf generate":
                times[label].append(_time_hf(lm, ids, new_tokens))
            else:
                dt, pf = _time_engine(lm, ids, k, new_tokens, shared)
                times[label].append(dt)
                prefill[label].append(pf)
    base = statistics.median(times["hf generate"])
    rows = []
    for label, k, shared in configs:
        t = statistics.median(times[label])
        rows.append({
            "config": label, "contexts": k, "prefix_sharing": shared if label != "hf generate" else None,
            "seconds": round(t, 3), "prefill_seconds": round(statistics.median(prefill[label]), 3)
            if prefill[label] else None,
            "tokens_per_s": round(new_tokens / t, 2), "ratio_vs_hf": round(base / t, 3),
        })
    import torch

    return {
        "settings": {"model": lm.name, "device": str(lm.device), "dtype": str(lm.dtype).replace("torch.", ""),
                     "prompt_tokens": len(ids), "new_tokens": new_tokens, "repeats": repeats,
                     "torch_threads": torch.get_num_threads()},
        "rows": rows,
    }


def format_markdown(res: dict[str, Any]) -> str:
    s = res["settings"]
    lines = [
        f"Engine throughput: {s['model']} on {s['device']} ({s['dtype']}, {s['torch_threads']} threads), "
        f"{s['prompt_tokens']}-token document prompt, {s['new_tokens']} new tokens, median of {s['repeats']} run(s)",
        "",
        "| config | K | seconds | prefill s | tokens/s | ratio vs HF |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in res["rows"]:
        pf = "" if r["prefill_seconds"] is None else f"{r['prefill_seconds']:.2f}"
        lines.append(f"| {r['config']} | {r['contexts']} | {r['seconds']:.2f} | {pf} | {r['tokens_per_s']:.2f} "
                     f"| {r['ratio_vs_hf']:.2f} |")
    return "\n".join(lines)


@dataclass(frozen=True)
class EngineBenchConfig:
    """Settings of ``dpinfer bench engine`` (one field per option)."""

    model: str | None = None
    """Model name or local folder (None: the embedded SmolLM2)."""
    ks: tuple[int, ...] = (1, 2, 5, 9)
    """Numbers of contexts K stepped together."""
    new_tokens: int = 256
    prompt_tokens: int = 500
    repeats: int = 1
    unshared: bool = True
    """Also time K > 1 without prefix sharing."""


def config_from_args(args: argparse.Namespace) -> EngineBenchConfig:
    """The config of parsed ``dpinfer bench engine`` options."""
    return EngineBenchConfig(model=args.model, ks=tuple(args.k), new_tokens=args.new_tokens,
                             prompt_tokens=args.prompt_tokens, repeats=args.repeats, unshared=not args.no_unshared)


def run(config: EngineBenchConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Load the model and measure (:func:`run_engine_bench`); ``progress(stage)`` names each run as it starts."""
    from dpinfer.models import load_model

    lm = load_model(config.model)
    return run_engine_bench(lm, ks=config.ks, new_tokens=config.new_tokens, prompt_tokens=config.prompt_tokens,
                            repeats=config.repeats, unshared=config.unshared, progress=progress)


def render(res: dict[str, Any]) -> str:
    """What ``dpinfer bench engine`` prints (the Markdown table)."""
    return format_markdown(res)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model name or local folder (default: the embedded SmolLM2)")
    p.add_argument("--k", type=int, nargs="+", default=[1, 2, 5, 9], help="numbers of contexts (default 1 2 5 9)")
    p.add_argument("--new-tokens", type=int, default=256, help="tokens generated per run (default 256)")
    p.add_argument("--prompt-tokens", type=int, default=500, help="approximate prompt length (default 500)")
    p.add_argument("--repeats", type=int, default=1, help="interleaved rounds; the median is reported (default 1)")
    p.add_argument("--no-unshared", action="store_true", help="skip the runs without prefix sharing")
