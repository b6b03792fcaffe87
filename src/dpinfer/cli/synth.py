"""``dpinfer synth FILE``: synthetic texts from a private corpus, with an (ε, δ) guarantee per reference."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from dpinfer.cli.output import (
    SEED_HELP,
    LazyHelpFormatter,
    add_method_argument,
    add_model_arguments,
    cli_k,
    console,
    print_json,
    show,
    write_failure,
)
from dpinfer.defaults import SYNTH
from dpinfer.errors import InvalidInputError


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    sy = sub.add_parser("synth", parents=[common], help="synthetic texts from a private corpus, (ε, δ) per reference",
                        description="Generate synthetic texts that resemble a private corpus (InvisibleInk by "
                                    "default), one text per disjoint batch of B references. The (ε, δ) guarantee per "
                                    "reference is computed before the corpus is read and written into the output "
                                    "file's first line, with the settings.",
                        formatter_class=LazyHelpFormatter)
    sy.add_argument("file", help="the private corpus: a .jsonl or .csv file")
    sy.add_argument("--text-field", required=True, help="the field holding each reference's text")
    sy.add_argument("--label-fields", action="append", metavar="F1,F2",
                    help="public label fields shown in the prompts (e.g. label1,label2 for Yelp); references are "
                         "batched within equal labels")
    sy.add_argument("--epsilon", type=float, default=None, help="target ε per reference (required but for public)")
    sy.add_argument("--delta", type=float, default=SYNTH.delta, help=f"δ (default {show(SYNTH.delta)})")
    sy.add_argument("--batch-size", type=int, default=SYNTH.batch_size,
                    help=f"B references per text (compute ≈ B + 1 LM calls per token; default {SYNTH.batch_size})")
    sy.add_argument("--max-new-tokens", type=int, default=SYNTH.max_new_tokens,
                    help=f"T_max per text (default {SYNTH.max_new_tokens})")
    add_method_argument(sy, "synthesize")
    sy.add_argument("--top-k", type=int, default=SYNTH.top_k,
                    help=f"k of Top-k+ (default {show(SYNTH.top_k)}; 0 = full vocabulary)")
    sy.add_argument("--temperature", type=float, default=SYNTH.temperature,
                    help=f"τ (default {SYNTH.temperature:.1f})")
    sy.add_argument("--template", default=SYNTH.template, choices=["generic", "yelp", "tab"],
                    help=f"built-in prompt pair (default {SYNTH.template}; yelp uses {{label1}} and {{label2}})")
    sy.add_argument("--template-file", default=None,
                    help='JSON {"private": "... {reference} ...", "public": "...", "response_prefix": "..."} '
                         "(the prefix is optional); {field} names a label field")
    sy.add_argument("--max-texts", type=int, default=None, help="stop after this many texts")
    sy.add_argument("--max-reference-tokens", type=int, default=SYNTH.max_reference_tokens or 0,
                    help=f"cut each reference to this many tokens (default {SYNTH.max_reference_tokens or 0}; "
                         "0 = no cut)")
    sy.add_argument("--limit", type=int, default=None, help="read only the first N records")
    sy.add_argument("--seed", type=int, default=None, help=SEED_HELP)
    add_model_arguments(sy, quantize=False)
    sy.add_argument("--out", required=True, help="output .jsonl (first line: guarantee and settings)")
    sy.set_defaults(func=run)


def label_fields(items: Sequence[str] | None) -> list[str]:
    """``--label-fields`` options (repeatable, comma-separated) as one list."""
    fields: list[str] = []
    for item in items or ():
        fields.extend(f.strip() for f in item.split(",") if f.strip())
    return fields


def template_arg(args: argparse.Namespace) -> Any:
    """The prompt template: a built-in name, or a :class:`PromptTemplate` read from ``--template-file``."""
    from dpinfer.errors import ConfigurationError
    from dpinfer.pipelines.synthesize import PromptTemplate

    if not args.template_file:
        return args.template
    from dpinfer.validation import MAX_TEXT_BYTES, input_file

    p = input_file(args.template_file, "template")
    if p.stat().st_size > MAX_TEXT_BYTES:
        raise InvalidInputError(f"{p} is too large for a template file")
    try:
        data = json.loads(p.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InvalidInputError(f"{p} is not a JSON file") from None
    if not (isinstance(data, dict) and isinstance(data.get("private"), str) and isinstance(data.get("public"), str)):
        raise ConfigurationError(f'{p} must hold {{"private": "... {{reference}} ...", "public": "..."}}')
    prefix = data.get("response_prefix", "")
    if not isinstance(prefix, str):
        raise ConfigurationError(f"{p}: response_prefix must be a string")
    return PromptTemplate(private=data["private"], public=data["public"], response_prefix=prefix)


def run(args: argparse.Namespace) -> int:
    from dpinfer.validation import check_corpus_size, check_output_path, check_synth_budget, check_synth_params

    # every parameter and path is checked here, before the corpus is read and before the model loads
    top_k = cli_k(args.top_k, "--top-k")
    max_ref = cli_k(args.max_reference_tokens, "--max-reference-tokens")
    check_synth_params(method=args.method, epsilon=args.epsilon, delta=args.delta, batch_size=args.batch_size,
                       max_new_tokens=args.max_new_tokens, top_k=top_k, temperature=args.temperature, seed=args.seed,
                       max_texts=args.max_texts, max_reference_tokens=max_ref, limit=args.limit, cli=True)
    check_output_path(args.out, inputs=(args.file, args.template_file))
    template = template_arg(args)
    from dpinfer.pipelines.synthesize import load_references, synthesize

    refs = load_references(args.file, text_field=args.text_field, label_fields=label_fields(args.label_fields),
                           limit=args.limit)
    check_corpus_size(method=args.method, references=len(refs), batch_size=args.batch_size)
    check_synth_budget(method=args.method, epsilon=args.epsilon, delta=args.delta, batch_size=args.batch_size,
                       max_new_tokens=args.max_new_tokens, top_k=top_k, temperature=args.temperature)
    from dpinfer.cli.output import count_progress
    from dpinfer.models import load_model

    lm = load_model(args.model, device=args.device)
    with count_progress(f"synthesizing ({args.method})", "batches") as progress:
        res = synthesize(refs, lm=lm, method=args.method, epsilon=args.epsilon, delta=args.delta,
                         batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                         top_k=top_k, temperature=args.temperature,
                         prompt_template=template, seed=args.seed, max_texts=args.max_texts,
                         max_reference_tokens=max_ref, progress=progress)
    try:
        res.write_jsonl(args.out)
    except OSError as exc:  # never lose a finished result: save it elsewhere, or print it
        from dpinfer.validation import rescue_write_text

        body = "".join(res.jsonl_lines())
        rescue = rescue_write_text(body, ".jsonl")
        if rescue is None:
            sys.stdout.write(body)
            return write_failure("--out", args.out, exc, "the texts are on standard output")
        return write_failure("--out", args.out, exc, f"the texts were saved to {rescue}")
    if args.json:
        print_json({**res.header()["dpinfer"], "out": args.out})
        return 0
    print_summary(args, res)
    return 0


def print_summary(args: argparse.Namespace, res: Any) -> None:
    """What was written, and the guarantee in words."""
    import math

    from dpinfer.methods import is_baseline

    con = console()
    g = res.guarantee
    public = is_baseline("synthesize", args.method)
    con.print(f"{len(res.texts)} synthetic texts ({res.generated_tokens} tokens, {res.tokens_per_second:.1f} tokens/s, "
              f"{res.lm_calls_per_token} LM calls per token) written to {args.out}")
    if res.references_left_out and not public:
        con.print(f"[dim]{res.references_left_out} references were left out (label groups not filling a batch of "
                  f"{args.batch_size}, or --max-texts)[/dim]")
    if public:
        con.print("Guarantee: the texts were generated from the public prompt only; they reveal nothing about the "
                  "references (ε = 0).")
    elif math.isinf(g.epsilon):
        if any(t.data_dependent.get("spent") for t in res.texts):
            con.print(f"Guarantee: none ex ante. The privacy loss of {args.method} depends on the references; each "
                      "text records its realised (data-dependent) figure, which is not a differential-privacy "
                      "guarantee.")
        else:
            con.print(f"Guarantee: none. {args.method} states no differential-privacy guarantee.")
    else:
        con.print(f"Guarantee: {g}")
        con.print("It holds for every reference at once: the batches are disjoint and chosen without reading the "
                  "texts, so the file as a whole has the guarantee of one text.")
