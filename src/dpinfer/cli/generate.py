"""``dpinfer generate``: plain generation with the engine, streamed (no privacy guarantee)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dpinfer.cli.output import add_model_arguments, console, print_json, read_text_arg, show
from dpinfer.defaults import GENERATE


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    g = sub.add_parser("generate", parents=[common], help="plain generation (no privacy), streamed",
                       description="Generate a continuation of PROMPT with the engine (no privacy guarantee). "
                                   "The prompt is used exactly as given unless --chat.")
    g.add_argument("prompt", help="prompt text, or '-' for standard input, or a file with --file")
    g.add_argument("--file", action="store_true", help="PROMPT is a file path")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    add_model_arguments(g, device_help="cpu / cuda (default: cuda when available)")
    g.add_argument("--max-new-tokens", type=int, default=GENERATE.max_new_tokens,
                   help=f"the most tokens generated (default {GENERATE.max_new_tokens})")
    g.add_argument("--temperature", type=float, default=GENERATE.temperature,
                   help=f"0 = greedy (default {show(GENERATE.temperature)})")
    g.add_argument("--top-k", type=int, default=GENERATE.top_k,
                   help=f"sample among the k likeliest tokens (default {show(GENERATE.top_k)})")
    g.add_argument("--top-p", type=float, default=GENERATE.top_p,
                   help=f"nucleus sampling: the smallest set of tokens holding probability p (default "
                        f"{show(GENERATE.top_p)})")
    g.add_argument("--seed", type=int, default=None, help="reproduce the output (default: secure random)")
    g.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dpinfer.validation import check_generate_params, check_text

    check_generate_params(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                          top_p=args.top_p, seed=args.seed, spelling="cli")
    prompt = read_text_arg(args.prompt, "prompt") if (args.file or args.prompt == "-") else args.prompt
    check_text(prompt, "the prompt")
    from dpinfer.generation import generate, stream
    from dpinfer.models import load_model

    lm = load_model(args.model, device=args.device, quantize=args.quantize)
    kw: dict[str, Any] = {"lm": lm, "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
                          "top_k": args.top_k, "top_p": args.top_p, "seed": args.seed}
    if args.chat:
        kw["messages"] = [{"role": "user", "content": prompt}]
    else:
        kw["prompt"] = prompt
    if args.json:
        res = generate(**kw)
        print_json({"text": res.text, "finish_reason": res.finish_reason, "prompt_tokens": res.prompt_tokens,
                    "generated_tokens": len(res.token_ids), "seconds": round(res.seconds, 3),
                    "guarantee": res.guarantee.to_dict()})
        return 0
    for piece in stream(**kw):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    console(stderr=True).print("[dim]plain generation: no privacy guarantee[/dim]")
    return 0
