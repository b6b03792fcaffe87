"""Throughput of dpinfer's DP-Fusion against the authors' library, side by side in one run (not part of dpinfer).

dp-fusion-lib is never a dependency of dpinfer. To run this comparison, install it aside, without its dependencies
(it reuses this environment's torch and transformers):

    .venv/bin/pip install --no-deps --target .bench-deps/dpfl dp-fusion-lib==0.1.0
    PYTHONPATH=.bench-deps/dpfl .venv/bin/python scripts/compare_dp_fusion_lib.py

Same document (the first TAB-ECHR test case, cut to ~550 prompt tokens), same model (embedded SmolLM2-135M,
float32), same contexts (dpinfer's token-level public and per-group private contexts, built once), same bound b per
group, τ = 1 and the full vocabulary (the library has no truncation), exactly N new tokens for everyone (EOS ignored),
prefill included. Rows are interleaved over --repeats rounds; medians are reported.

--quantize int8 adds dpinfer rows with decode-step int8 Linear layers (dpinfer.load_model(quantize="int8")) next to
the float32 ones, in the same run; the library always runs the float32 model (the reference of the issue).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
import types
from collections.abc import Callable


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--max-chars", type=int, default=2600)
    ap.add_argument("--bound", type=float, default=0.5, help="b = α·β per group for both implementations")
    ap.add_argument("--quantize", default=None, choices=["int8"],
                    help="also time dpinfer with this quantisation (the library stays float32)")
    args = ap.parse_args()
    try:
        from dp_fusion_lib.utils import dp_fusion_groups_incremental
    except ImportError:
        print(__doc__, file=sys.stderr)
        return 2
    import torch

    from dpinfer.bench.sanitize import load_tab
    from dpinfer.engine import Engine
    from dpinfer.mechanisms.dp_fusion import DPFusion
    from dpinfer.mechanisms.sampler import Sampler
    from dpinfer.models import load_model
    from dpinfer.pipelines.sanitize import DEFAULT_INSTRUCTION, prepare_contexts

    lm = load_model(device="cpu")
    lms = {"float32": lm}
    if args.quantize:
        lms[args.quantize] = load_model(device="cpu", quantize=args.quantize)
    doc = load_tab(None, 1, args.max_chars)[0]
    labels = sorted({s.label for s in doc.spans})
    layouts = {1: {"ALL": labels}, 4: {f"G{i + 1}": labels[i::4] for i in range(4)}}
    preps = {m: prepare_contexts(lm, doc.text, doc.spans, g, DEFAULT_INSTRUCTION) for m, g in layouts.items()}
    n = args.new_tokens
    # the library stops at tokenizer.eos_token_id: hide it so every run makes exactly n tokens
    tok = types.SimpleNamespace(eos_token_id=-1, pad_token_id=lm.pad_token_id, decode=lm.tokenizer.decode)

    def ours(m: int, which: str = "float32") -> float:
        p = preps[m]
        mech = DPFusion(bounds=[args.bound] * m, group_names=p.group_names, temperature=1.0)
        t0 = time.perf_counter()
        out = Engine(lms[which]).generate([p.public, *p.private], mech, max_new_tokens=n, min_new_tokens=n, seed=0)
        assert len(out.sequences[0]) == n
        return time.perf_counter() - t0

    def original() -> float:
        t0 = time.perf_counter()
        Engine(lm).generate([preps[1].original], Sampler(temperature=1.0), max_new_tokens=n, min_new_tokens=n, seed=0)
        return time.perf_counter() - t0

    def lib(m: int) -> float:
        p = preps[m]
        groups = {"PUBLIC": torch.tensor(p.public)}
        groups.update({name: torch.tensor(ctx) for name, ctx in zip(p.group_names, p.private, strict=True)})
        torch.manual_seed(0)
        t0 = time.perf_counter()
        dp_fusion_groups_incremental(groups, {g: args.bound for g in p.group_names}, 2.0, lm.model, tok,
                                     temperature=1.0, max_new_tokens=n)
        return time.perf_counter() - t0

    runs: dict[str, Callable[[], float]] = {"original (dpinfer engine, plain, float32)": original}
    for m in (1, 4):
        for which in lms:
            runs[f"dpinfer DP-Fusion m={m} ({which})"] = functools.partial(ours, m, which)
        runs[f"dp-fusion-lib 0.1.0 m={m} (float32)"] = functools.partial(lib, m)
    times: dict[str, list[float]] = {k: [] for k in runs}
    for which in lms:
        ours(1, which)  # warm-up
    for _ in range(args.repeats):
        for name, fn in runs.items():
            times[name].append(fn())
    base = statistics.median(times["original (dpinfer engine, plain, float32)"])
    print(f"DP-Fusion vs dp-fusion-lib: {lm.name} CPU ({torch.get_num_threads()} threads), TAB doc {doc.doc_id} "
          f"({len(preps[1].original)}-token prompt), {n} new tokens, b = {args.bound}, τ = 1, full vocabulary, "
          f"median of {args.repeats}\n")
    print("| run | seconds | tokens/s | ratio vs plain |\n|---|---:|---:|---:|")
    for name in runs:
        t = statistics.median(times[name])
        print(f"| {name} | {t:.2f} | {n / t:.2f} | {base / t:.2f} |")
    print()
    for m in (1, 4):
        b = statistics.median(times[f"dp-fusion-lib 0.1.0 m={m} (float32)"])
        for which in lms:
            a = statistics.median(times[f"dpinfer DP-Fusion m={m} ({which})"])
            print(f"m = {m}: dpinfer ({which}) / dp-fusion-lib (float32) tokens/s = {b / a:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
