"""Pair two ``dpinfer bench sanitize`` runs document by document (not part of dpinfer).

    .venv/bin/python scripts/pair_bench_runs.py A/sanitize_quality.json B/sanitize_quality.json

For every (method, target ε) present in both runs, on the documents both ran: the mean per-document difference
B − A of PPL and of the LOSS-attack success rate, with 95% intervals over documents (normal approximation). Both runs
must have used the same seed and document order (``--seed``, ``--skip``), so their samplers consumed the same
uniforms (common random numbers): e.g. a float32 run against a ``--quantize int8`` run of the same documents.
"""

from __future__ import annotations

import json
import math
import sys


def _mean_ci(xs: list[float]) -> str:
    from dpinfer.bench.sanitize import mean_ci95

    mean, ci = mean_ci95(xs)
    if mean is None or ci is None:
        return "n/a"
    return f"{mean:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    runs = []
    for path in argv:
        try:
            with open(path, encoding="utf-8") as fh:
                res = json.load(fh)
        except (OSError, ValueError) as exc:
            print(f"cannot read {path}: {exc}", file=sys.stderr)
            return 2
        if "per_document" not in res:
            print(f"{path} has no per-document records (made by an older dpinfer); rerun the bench", file=sys.stderr)
            return 2
        runs.append(res)
    seeds = {r["settings"].get("seed") for r in runs}
    if len(seeds) != 1:
        print(f"the runs used different seeds {sorted(map(str, seeds))}: no common random numbers", file=sys.stderr)
        return 2
    ids = [res["settings"].get("doc_ids") or [] for res in runs]
    moved = [d for d in set(ids[0]) & set(ids[1]) if ids[0].index(d) != ids[1].index(d)]
    if moved:
        print(f"{len(moved)} documents sit at other positions in the two runs (another --skip?): their seeds differ",
              file=sys.stderr)
        return 2
    a, b = ({(r["method"], r["target_epsilon"], r["doc_id"]): r for r in res["per_document"]} for res in runs)
    print(f"B − A per document (A = {argv[0]}, B = {argv[1]})\n")
    print("| method | target ε | documents | PPL B − A | ASR B − A |")
    print("|---|---:|---:|---|---|")
    for method, eps in dict.fromkeys((m, e) for m, e, _ in a):
        docs = [d for m, e, d in a if (m, e) == (method, eps) and (m, e, d) in b]
        d_ppl = [b[(method, eps, d)]["ppl"] - a[(method, eps, d)]["ppl"] for d in docs
                 if math.isfinite(a[(method, eps, d)]["ppl"]) and math.isfinite(b[(method, eps, d)]["ppl"])]
        d_asr = [(b[(method, eps, d)]["wins"] - a[(method, eps, d)]["wins"]) / max(a[(method, eps, d)]["games"], 1)
                 for d in docs]
        label = "" if eps is None else f"{eps:g}"
        print(f"| {method} | {label} | {len(docs)} | {_mean_ci(d_ppl)} | {_mean_ci(d_asr)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
