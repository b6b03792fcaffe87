"""``dpinfer protect-prompt``: a prompt rewritten locally with local DP (DP-GTR or DP-Prompt); ``dpinfer bench gtr``.

The protected prompt is the release: it alone goes to standard output (``--json``: one object with the protected
prompt, the intermediate releases and the guarantee). The guarantee goes to standard error. The original prompt is
never printed, logged or quoted in an error.

``--prompts P.jsonl --out OUT.jsonl``: every prompt of a JSONL file (one object per line, with an id), one release
record per id appended to OUT as it finishes (the same append-only, resumable file as ``sanitize --corpus``:
rerunning skips the ids already in OUT; a prompt that fails is an error record and the run goes on). Each prompt is
a different person's: each record carries its own guarantee, and the prompts do not compose.
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
    p.add_argument("--suppress", default=D.suppress, choices=["ban", "instruct"],
                   help="how the final rewrite avoids the keywords: ban (default): asked to and banned while "
                        "decoding; instruct: asked to only (the paper's template)")
    p.add_argument("--n-exemplars", type=int, default=D.n_exemplars,
                   help=f"final prompts written, one from each of the lowest-perplexity rewrites; the one closest to "
                        f"the rewrites' consensus is released (default {D.n_exemplars}; 1: the paper's one exemplar)")
    p.add_argument("--jem-epsilon", type=float, default=None,
                   help=f"ε₂ of JEM (default {D.jem_epsilon:g}; not added to ε)")
    p.add_argument("--max-new-tokens", type=int, default=D.max_new_tokens,
                   help=f"T_max of each rewrite and of the final prompt, fixed in advance (default {D.max_new_tokens})")
    p.add_argument("--max-input-tokens", type=int, default=D.max_input_tokens,
                   help=f"a public cap on the prompt: a longer one is cut to its first N tokens before stage 1, "
                        f"silently (its length is private; default {D.max_input_tokens})")
    p.add_argument("--show-rewrites", action="store_true",
                   help="also print the exemplar, keywords and rewrites to standard error (all covered by the "
                        "guarantee)")
    p.add_argument("--seed", type=int, default=None,
                   help="for tests and benchmarks only: the guarantee then holds only while the seed is secret")
    p.add_argument("--model", default=None, help="model name or local folder (default: embedded SmolLM2-135M)")
    p.add_argument("--device", default=None)
    from dpinfer.cli.budget import add_ledger_options

    add_ledger_options(p, "the prompt source charged on the ledger (a user or a tenant: its prompts compose); "
                          "required with a ledger")
    f = p.add_argument_group("a file of prompts (one release per JSONL record; resumable)")
    f.add_argument("--prompts", default=None, metavar="P.jsonl",
                   help="protect every prompt of this JSONL file instead of one; needs --out")
    f.add_argument("--out", default=None, metavar="OUT.jsonl",
                   help="--prompts: the JSONL file of releases (appended; rerunning skips the ids already there)")
    f.add_argument("--prompt-field", default="prompt", help="--prompts: the field holding the prompt (default prompt)")
    f.add_argument("--id-field", default="id", help="--prompts: the field holding the unique id (default id)")
    from dpinfer.cli.corpus_job import add_rerelease_argument

    add_rerelease_argument(f)
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
    n = check_protect_params(method=args.method, epsilon=args.epsilon, temperature=args.temperature, delta=args.delta,
                         n_rewrites=args.n_rewrites, n_keywords=args.n_keywords, keywords=args.keywords,
                         max_new_tokens=args.max_new_tokens, jem_epsilon=jem_epsilon, seed=args.seed,
                         suppress=args.suppress, n_exemplars=args.n_exemplars,
                         max_input_tokens=args.max_input_tokens, cli=True)
    from dpinfer.cli.budget import cli_spend, ledger_path, report_charge

    if args.prompts is not None or args.out is not None or args.allow_rerelease:
        charge = None
        if ledger_path(args) is not None:  # every prompt charged to the prompt source, at a cost known in advance
            import os

            from dpinfer.errors import LedgerError
            from dpinfer.pipelines.budget import LedgerCharges, open_ledger, pure_steps_estimate

            if args.epsilon is None or args.unit is None:
                raise LedgerError("--prompts with a ledger needs --unit (the prompt source) and --epsilon (each "
                                  "prompt's cost is then known before the model loads)")
            cost = pure_steps_estimate(args.epsilon, args.delta, n * args.max_new_tokens, bounded_range=True)
            charge = LedgerCharges(open_ledger(ledger_path(args)), job=os.path.abspath(args.out or ""),
                                   scope="prompt-source", mechanism=args.method, unit_of=lambda key: args.unit,
                                   bound_of=lambda key: cost, exact=True)
        return _run_prompts(args, jem_epsilon, charge)
    prompt = _read_prompt(args)

    from dpinfer.models import load_model
    from dpinfer.pipelines.budget import pure_steps_estimate
    from dpinfer.pipelines.protect_prompt import guarantee_lines, protect_prompt

    spend = cli_spend(args, scope="prompt-source", what="protect-prompt")
    if spend is not None:  # with --epsilon the cost follows from the settings: refused before the model loads
        spend.reserve(None if args.epsilon is None else pure_steps_estimate(
            args.epsilon, args.delta, n * args.max_new_tokens, bounded_range=True), mechanism=args.method)
    try:
        lm = load_model(args.model, device=args.device)
    except BaseException:
        if spend is not None:
            spend.cancel()
        raise
    res = protect_prompt(prompt, lm=lm, method=args.method, epsilon=args.epsilon, temperature=args.temperature,
                         delta=args.delta, n_rewrites=args.n_rewrites, n_keywords=args.n_keywords,
                         keywords=args.keywords, max_new_tokens=args.max_new_tokens, jem_epsilon=jem_epsilon,
                         suppress=args.suppress, n_exemplars=args.n_exemplars,
                         max_input_tokens=args.max_input_tokens, seed=args.seed, ledger=spend)
    del prompt
    report_charge(spend)
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


def _check_prompts_args(args: argparse.Namespace) -> list[Any]:
    """``--prompts``: the options, paths and the file itself, before the model loads; the records."""
    from dpinfer.errors import InvalidInputError
    from dpinfer.pipelines.corpus import check_corpus_paths, read_corpus

    if args.prompts is None:
        option = "--out" if args.out is not None else "--allow-rerelease"
        raise InvalidInputError(f"{option} applies to --prompts only (one prompt prints its protected prompt)")
    if args.prompt is not None or args.file is not None:
        raise InvalidInputError("give one prompt (argument or --file) or --prompts P.jsonl, not both")
    if not args.out:
        raise InvalidInputError("--prompts needs --out OUT.jsonl (the releases are appended there, one per id)")
    if args.show_rewrites:
        raise InvalidInputError("--show-rewrites does not apply to --prompts (each record holds its rewrites)")
    if not args.prompt_field or not args.id_field or args.prompt_field == args.id_field:
        raise InvalidInputError("--prompt-field and --id-field must name two different fields of the records")
    check_corpus_paths(args.prompts, args.out)
    return read_corpus(args.prompts, id_field=args.id_field, text_field=args.prompt_field, spans_field=None)


def _run_prompts(args: argparse.Namespace, jem_epsilon: float, charge: Any = None) -> int:
    """``dpinfer protect-prompt --prompts P --out OUT``: the prompts not yet in OUT, one after another, each release
    appended as it finishes (:func:`~dpinfer.pipelines.corpus.run_corpus_job`); a summary line with the budget per
    prompt."""
    from dpinfer.cli.corpus_job import print_job_summary, record_progress, warn
    from dpinfer.pipelines.corpus import per_record_budget, run_corpus_job

    records = _check_prompts_args(args)
    run = run_corpus_job(records, args.out, lambda todo: _protect_each(args, jem_epsilon, list(todo)),
                         job="dpinfer protect-prompt --prompts", source=f"--prompts {args.prompts}",
                         allow_rerelease=args.allow_rerelease, charge=charge,
                         progress=lambda total: record_progress("protect-prompt --prompts", total), warn=warn)
    if charge is not None:  # charges a killed run left pending: its released lines committed, its errors dropped
        from dpinfer.pipelines.corpus import id_key

        charge.reconcile([str(id_key(r["id"])) for r in run.held if "error" not in r],
                         [str(id_key(r["id"])) for r in run.held if "error" in r])
    return print_job_summary(args, "protect-prompt --prompts", run,
                             per_record_budget(run.held, what="prompt", groups=False), records=len(records))


def _protect_each(args: argparse.Namespace, jem_epsilon: float, todo: list[Any]) -> Any:
    """The output record of each prompt of ``todo``, one after another (a failure is the prompt's error record)."""
    from dpinfer.errors import DPInferError
    from dpinfer.models import load_model
    from dpinfer.pipelines.protect_prompt import protect_prompt
    from dpinfer.pipelines.sanitize import record_seed

    lm = load_model(args.model, device=args.device)
    embedder = None
    if args.method == "dp-gtr" and args.n_exemplars > 1:  # stage 3's consensus pick: one encoder, all prompts
        from dpinfer.eval.embeddings import load_embedder

        embedder = load_embedder()
    for rec in todo:
        try:
            res = protect_prompt(rec.text, lm=lm, method=args.method, epsilon=args.epsilon,
                                 temperature=args.temperature, delta=args.delta, n_rewrites=args.n_rewrites,
                                 n_keywords=args.n_keywords, keywords=args.keywords,
                                 max_new_tokens=args.max_new_tokens, jem_epsilon=jem_epsilon,
                                 suppress=args.suppress, n_exemplars=args.n_exemplars,
                                 max_input_tokens=args.max_input_tokens, seed=record_seed(args.seed, rec.id),
                                 embedder=embedder)
        except DPInferError as err:  # one line, never the prompt (errors do not quote private text)
            yield {"id": rec.id, "error": str(err).splitlines()[0]}
        else:
            release = res.to_dict()
            for timing in ("seconds", "stage_seconds"):  # they depend on the private prompt: not released
                release.pop(timing, None)
            yield {"id": rec.id, **release}
