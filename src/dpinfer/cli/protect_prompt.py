"""``dpinfer protect-prompt``: a prompt rewritten locally with local DP (DP-GTR or DP-Prompt); ``dpinfer bench gtr``.

The protected prompt is the release: it alone goes to standard output (``--json``: one object with the protected
prompt, the intermediate releases and the guarantee). The guarantee goes to standard error. The original prompt is
never printed, logged or quoted in an error.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

DESCRIPTION = (
    "Rewrite a prompt locally with local differential privacy before sending it to a remote LLM. DP-GTR (default): "
    "n DP-Prompt paraphrases (clipped logits, full vocabulary, temperature τ), the lowest-perplexity one as an "
    "exemplar, the words most rewrites share as words to avoid, and a final greedy rewrite from those only. "
    "dp-prompt: one DP-Prompt paraphrase (the baseline). The guarantee (against any two prompts) composes the "
    "per-token ε over n rewrites × T_max tokens and is computed before the prompt is read; it is printed honestly, "
    "and at usable temperatures it is large (docs/prompt-protection.md explains per-token vs composed ε)."
)


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    from dpinfer.defaults import PROTECT as D

    p = sub.add_parser("protect-prompt", parents=[common], help="rewrite a prompt with local DP (DP-GTR / DP-Prompt)",
                       description=DESCRIPTION)
    p.add_argument("prompt", nargs="?", default=None, help="the prompt text ('-' for standard input), or use --file")
    p.add_argument("--file", default=None, help="read the prompt from this UTF-8 file ('-' for standard input)")
    p.add_argument("--method", default="dp-gtr", choices=["dp-gtr", "dp-prompt"],
                   help="dp-gtr (default): rewrites + keywords + final prompt; dp-prompt: one rewrite")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--epsilon", type=float, default=None,
                        help="target ε of all rewrites together (τ is calibrated to it)")
    budget.add_argument("--temperature", type=float, default=None,
                        help=f"stage-1 temperature τ (default {D.temperature:g}; ε follows from it)")
    p.add_argument("--delta", type=float, default=D.delta, help=f"δ (default {D.delta:g})")
    p.add_argument("--n-rewrites", type=int, default=None,
                   help=f"stage-1 rewrites (default {D.n_rewrites}; dp-prompt: 1)")
    p.add_argument("--n-keywords", type=int, default=D.n_keywords, help=f"K keywords to avoid (default {D.n_keywords})")
    p.add_argument("--keywords", default=D.keywords, choices=["ndp", "jem"],
                   help="ndp (default): the top K as they are; jem: Joint Exponential Mechanism over a fixed public "
                        "word universe")
    p.add_argument("--jem-epsilon", type=float, default=None,
                   help=f"ε₂ of JEM (default {D.jem_epsilon:g}; not added to ε)")
    p.add_argument("--max-new-tokens", type=int, default=D.max_new_tokens,
                   help=f"T_max of each rewrite and of the final prompt, fixed in advance (default {D.max_new_tokens})")
    p.add_argument("--show-rewrites", action="store_true",
                   help="also print the exemplar, keywords and rewrites to standard error (all covered by the "
                        "guarantee)")
    p.add_argument("--seed", type=int, default=None,
                   help="for tests and benchmarks only: the guarantee then holds only while the seed is secret")
    p.add_argument("--model", default=None, help="model name or local folder (default: embedded SmolLM2-135M)")
    p.add_argument("--device", default=None)
    p.set_defaults(func=run)


def _read_prompt(args: argparse.Namespace) -> str:
    from dpinfer.cli.output import read_text_arg
    from dpinfer.errors import InvalidInputError
    from dpinfer.validation import check_text

    if args.file is not None and args.prompt is not None:
        raise InvalidInputError("give the prompt as an argument or with --file, not both")
    if args.file is not None:
        return read_text_arg(args.file, "prompt")
    if args.prompt is None:
        raise InvalidInputError('give the prompt: dpinfer protect-prompt "text" (or --file F, or - for stdin)')
    if args.prompt == "-":
        return read_text_arg("-", "prompt")
    return check_text(args.prompt, "the prompt")


def run(args: argparse.Namespace) -> int:
    from dpinfer.pipelines.protect_prompt import DEFAULT_JEM_EPSILON, check_protect_params

    jem_epsilon = DEFAULT_JEM_EPSILON if args.jem_epsilon is None else args.jem_epsilon
    check_protect_params(method=args.method, epsilon=args.epsilon, temperature=args.temperature, delta=args.delta,
                         n_rewrites=args.n_rewrites, n_keywords=args.n_keywords, keywords=args.keywords,
                         max_new_tokens=args.max_new_tokens, jem_epsilon=jem_epsilon, seed=args.seed, cli=True)
    prompt = _read_prompt(args)

    from dpinfer.models import load_model
    from dpinfer.pipelines.protect_prompt import guarantee_lines, protect_prompt

    lm = load_model(args.model, device=args.device)
    res = protect_prompt(prompt, lm=lm, method=args.method, epsilon=args.epsilon, temperature=args.temperature,
                         delta=args.delta, n_rewrites=args.n_rewrites, n_keywords=args.n_keywords,
                         keywords=args.keywords, max_new_tokens=args.max_new_tokens, jem_epsilon=jem_epsilon,
                         seed=args.seed)
    del prompt
    if args.json:
        from dpinfer.cli.output import print_json

        print_json(res.to_dict())
        return 0
    sys.stdout.write(res.prompt + "\n")
    sys.stdout.flush()
    err = sys.stderr
    if args.show_rewrites and res.method == "dp-gtr":
        print(f"exemplar: {res.exemplar}", file=err)
        print(f"keywords (to avoid): {', '.join(res.keywords)}", file=err)
        for i, r in enumerate(res.rewrites, 1):
            print(f"rewrite {i}: {r}", file=err)
    for line in guarantee_lines(res):
        print(line, file=err)
    return 0


# ---------------------------------------------------------------------------------------------------------- bench
def add_bench_parser(bench_sub: Any, common: argparse.ArgumentParser) -> None:
    from dpinfer.bench import gtr

    b = bench_sub.add_parser("gtr", parents=[common], help="prompt protection on CSQA: ROUGE/BLEU leakage vs "
                                                           "accuracy, DP-GTR vs DP-Prompt, or --perf",
                             description=gtr.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    gtr.add_arguments(b)
    b.set_defaults(func=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    from dpinfer.cli.bench import run_bench as run_named_bench

    return run_named_bench("gtr", args)
