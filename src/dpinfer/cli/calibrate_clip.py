"""``dpinfer calibrate-clip``: measure a model's public clip bounds for DP-Prompt / DP-GTR and store them.

The bounds are ``(μ, μ + 4σ)`` of the logits the model produces while paraphrasing dpinfer's public corpus (no private
data; DP-GTR, Appendix A.2). They are written to the dpinfer cache (``<cache>/clip_bounds/<model key>.json``), where
``protect-prompt`` and ``sanitize --method dp-prompt`` read them. The embedded model's bounds ship with dpinfer.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("calibrate-clip", parents=[common], help="measure and store a model's public DP-Prompt clip "
                                                                "bounds", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model name or local folder (default: embedded SmolLM2-135M)")
    p.add_argument("--device", default=None)
    p.add_argument("--n-texts", type=int, default=8, help="public paragraphs paraphrased (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens per paraphrase (default 32)")
    p.add_argument("--sigmas", type=float, default=4.0, help="b_max = μ + sigmas·σ (default 4, as DP-GTR)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dpinfer.clip_bounds import _check_settings

    _check_settings(args.n_texts, args.max_new_tokens, args.sigmas)

    from dpinfer.clip_bounds import calibrate_and_store, packaged_bounds
    from dpinfer.models import load_model

    lm = load_model(args.model, device=args.device)
    record, path = calibrate_and_store(lm, n_texts=args.n_texts, max_new_tokens=args.max_new_tokens,
                                       sigmas=args.sigmas)
    shipped = packaged_bounds().get(str(lm.name))
    if args.json:
        from dpinfer.cli.output import print_json

        print_json({**record.to_dict(), "path": str(path),
                     "packaged": None if shipped is None else shipped.to_dict()})
        return 0
    print(f"{lm.name}: clip bounds [{record.clip_min:.4f}, {record.clip_max:.4f}] (μ = {record.mean:.4f}, "
          f"σ = {record.std:.4f}, {record.sigmas:g}σ) written to {path}")
    if shipped is not None:
        print(f"shipped with dpinfer: [{shipped.clip_min:.4f}, {shipped.clip_max:.4f}]")
    return 0
