"""dpinfer audit MECHANISM: an empirical privacy audit of a registered mechanism.

Runs MECHANISM (calibrated to a claimed ε = 4 at δ = 1e-5; the sampler and AdaPMixED claim nothing) many times on
two neighbouring inputs of a small-vocabulary stand-in (V = 16 synthetic logit rows, crafted worst-case-ish),
chooses a likelihood-ratio test on a quarter of the runs, measures its false-positive and false-negative rates on
the rest, and turns them into a lower bound on ε with Clopper-Pearson 95% intervals. Prints the claimed ε beside the
audited lower bound; exit status 3 when the bound exceeds the claim (the claim is refuted), 0 otherwise.

--broken VARIANT audits a deliberately broken copy that keeps the rigorous claim (dp-fusion and invisibleink:
no-clip, int8-public; pad: no-clip, small-sigma, large-clip); the audit must catch it. See docs/audit.md.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

EXIT_REFUTED = 3
BROKEN_HELP = "dp-fusion and invisibleink: no-clip, int8-public; pad: no-clip, small-sigma, large-clip"
MECHANISMS_HELP = (
    "adapmixed, amin, dp-decoding, dp-fusion, dp-prompt, invisibleink, pad, pad-as-published, sampler, static"
)
"""The registered mechanisms, spelled out so that building the parser needs no torch (a test keeps it true)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``audit`` sub-command's arguments (no heavy import here: the parser is built on every call)."""
    parser.add_argument("mechanism", metavar="MECHANISM",
                        help=f"a registered mechanism: {MECHANISMS_HELP}")
    parser.add_argument("--trials", type=int, default=20000,
                        help="runs on each of the two inputs (default 20000; a quarter select the test, on each "
                             "candidate pair of inputs, the rest measure it)")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the trials' random generator (default: a fresh one from secrets)")
    parser.add_argument("--broken", default=None, metavar="VARIANT",
                        help=f"audit a deliberately broken variant that keeps the claim ({BROKEN_HELP})")


def _eps(x: float) -> str:
    return "∞ (no claim)" if math.isinf(x) else f"{x:.3f}"


def render(result: Any) -> str:
    """The text report of an :class:`~dpinfer.audit.runner.AuditResult`."""
    r = result
    name = r.mechanism + (f" (BROKEN variant: {r.variant})" if r.variant else "")
    lo_f, hi_f = r.fpr_interval
    lo_n, hi_n = r.fnr_interval
    point = "∞" if math.isinf(r.epsilon_point) else f"{r.epsilon_point:.3f}"
    lines = [
        f"audit {name}",
        f"  claimed ε        {_eps(r.claimed_epsilon)}  (δ = {r.delta:g}, T_max = {r.max_new_tokens})",
        f"  audited ε ≥      {r.epsilon_lb:.3f}  (95% Clopper-Pearson; point estimate {point})",
        f"  test errors      FPR = {r.fpr:.4f} [{lo_f:.4f}, {hi_f:.4f}]   FNR = {r.fnr:.4f} [{lo_n:.4f}, {hi_n:.4f}]",
        f"  trials           {r.trials} per input ({r.selection_trials} select the test, {r.evaluation_trials} "
        f"measure it); V = {r.vocab_size}, K = {r.num_contexts}; {r.seconds:.1f} s",
        f"  adjacency        {r.adjacency}",
        f"  inputs           {r.inputs}",
        f"  chosen pair      {r.input_pair} (on the selection trials)",
    ]
    if r.exceeds:
        lines.append("  REFUTED: the audited lower bound exceeds the claimed ε")
    elif math.isinf(r.claimed_epsilon):
        lines.append("  no ex-ante claim to check (the bound shows how distinguishable the inputs are)")
    else:
        lines.append("  consistent: the audited lower bound does not exceed the claimed ε")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Run the audit named by ``args``; print text or (``--json``) one object; exit 3 when the claim is refuted."""
    from dpinfer.audit import audit

    result = audit(args.mechanism, trials=args.trials, seed=args.seed, broken=args.broken)
    if getattr(args, "json", False):
        import json

        from dpinfer._json import plain

        sys.stdout.write(json.dumps(plain(result.to_dict()), indent=2, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(render(result) + "\n")
    return EXIT_REFUTED if result.exceeds else 0
