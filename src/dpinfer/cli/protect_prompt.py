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
import dataclasses
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
    from dpinfer.configs import add_options
    from dpinfer.configs.protect import ProtectConfig
    from dpinfer.methods.prompt import TABLE

    p = sub.add_parser("protect-prompt", parents=[common], help="rewrite a prompt with local DP (DP-GTR / DP-Prompt)",
                       description=DESCRIPTION)
    p.add_argument("prompt", nargs="?", default=None, help="the prompt text ('-' for standard input), or use --file")
    p.add_argument("--file", default=None, help="read the prompt from this UTF-8 file ('-' for standard input)")
    p.add_argument("--method", default=TABLE.default, choices=TABLE.names(), help=TABLE.help())
    fields = {f.name: f.metadata for f in dataclasses.fields(ProtectConfig)}
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--epsilon", type=float, default=None, help=fields["epsilon"]["help"])
    budget.add_argument("--temperature", type=float, default=None, help=fields["temperature"]["help"] +
                        "; ε follows from it")
    add_options(p, ProtectConfig)
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


def _config(args: argparse.Namespace) -> Any:
    """The settings of the command (checked, spelled as options in messages) and the method they name."""
    from dpinfer.configs.protect import ProtectConfig
    from dpinfer.pipelines.protect_prompt import method_for

    config = ProtectConfig.from_args(args, spelling="cli")
    from dpinfer.checks import check_seed

    check_seed(args.seed, "--seed")
    return config, method_for(config)


def run(args: argparse.Namespace) -> int:
    config, method = _config(args)
    n = method.rewrites
    from dpinfer.cli.budget import cli_charge, ledger_path, report_charge

    if args.prompts is not None or args.out is not None or args.allow_rerelease:
        charge = None
        if ledger_path(args) is not None:  # every prompt charged to the prompt source, at a cost known in advance
            import os

            from dpinfer.accounting.charge import RecordCharges, open_ledger
            from dpinfer.accounting.spend import pure_steps_estimate
            from dpinfer.errors import LedgerError

            if config.epsilon is None or args.unit is None:
                raise LedgerError("--prompts with a ledger needs --unit (the prompt source) and --epsilon (each "
                                  "prompt's cost is then known before the model loads)")
            cost = pure_steps_estimate(config.epsilon, config.delta, n * config.max_new_tokens, bounded_range=True)
            charge = RecordCharges(open_ledger(ledger_path(args)), job=os.path.abspath(args.out or ""),
                                   scope="prompt-source", mechanism=config.method, unit_of=lambda key: args.unit,
                                   bound_of=lambda key: cost, exact=True)
        return _run_prompts(args, config.api(), charge)
    prompt = _read_prompt(args)

    from dpinfer.accounting.charge import hold
    from dpinfer.accounting.spend import pure_steps_estimate
    from dpinfer.models import load_model
    from dpinfer.pipelines.protect_prompt import guarantee_lines, protect_prompt

    with cli_charge(args, scope="prompt-source", what="protect-prompt") as spend:
        # with --epsilon the cost follows from the settings: refused before the model loads
        hold(spend, None if config.epsilon is None else pure_steps_estimate(
            config.epsilon, config.delta, n * config.max_new_tokens, bounded_range=True), mechanism=config.method)
        lm = load_model(args.model, device=args.device)
        res = protect_prompt(prompt, config.api(), lm=lm, seed=args.seed, ledger=spend)
    del prompt
    report_charge(spend)
    if args.json:
        from dpinfer.cli.output import print_json

        print_json(res.release())
        return 0
    sys.stdout.write(res.prompt + "\n")
    sys.stdout.flush()
    err = sys.stderr
    if args.show_rewrites and (res.keywords or len(res.rewrites) > 1):  # a method with intermediate releases
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
    from dpinfer.jobs.corpus import check_corpus_paths, read_corpus

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


def _run_prompts(args: argparse.Namespace, config: Any, charge: Any = None) -> int:
    """``dpinfer protect-prompt --prompts P --out OUT``: the prompts not yet in OUT, :data:`CHUNK` at a time through
    :func:`~dpinfer.pipelines.protect_prompt.protect_prompts` (they share the engine's steps), each release appended
    as its chunk finishes (:func:`~dpinfer.jobs.corpus.run_corpus_job`); a summary line with the budget per
    prompt."""
    from dpinfer.cli.corpus_job import print_job_summary, record_progress, warn
    from dpinfer.jobs.corpus import per_record_budget, run_corpus_job

    records = _check_prompts_args(args)
    run = run_corpus_job(records, args.out, lambda todo: _protect_each(args, config, list(todo)),
                         job="dpinfer protect-prompt --prompts", source=f"--prompts {args.prompts}",
                         allow_rerelease=args.allow_rerelease, charge=charge,
                         progress=lambda total: record_progress("protect-prompt --prompts", total), warn=warn)
    if charge is not None:  # charges a killed run left pending: its released lines committed, its errors dropped
        from dpinfer.jobs.corpus import id_key

        charge.reconcile([str(id_key(r["id"])) for r in run.held if "error" not in r],
                         [str(id_key(r["id"])) for r in run.held if "error" in r])
    return print_job_summary(args, "protect-prompt --prompts", run,
                             per_record_budget(run.held, what="prompt", groups=False), records=len(records))


CHUNK = 8
"""Prompts of a ``--prompts`` file protected together (:func:`~dpinfer.pipelines.protect_prompt.protect_prompts`:
stage 1 of all of them in one engine run, stage 3 in one more); a killed run loses at most one chunk's work."""


def _protect_each(args: argparse.Namespace, config: Any, todo: list[Any]) -> Any:
    """The output record of each prompt of ``todo``, :data:`CHUNK` prompts at a time (a refusal is the prompt's error
    record; one line, never the prompt)."""
    from dpinfer.errors import DPInferError
    from dpinfer.pipelines.protect_prompt import protect_prompts
    from dpinfer.pipelines.sanitize_many import record_seed
    from dpinfer.runtime import Runtime

    runtime = Runtime.from_model(args.model, device=args.device)  # one model, engine and encoder for every chunk
    for start in range(0, len(todo), CHUNK):
        chunk = todo[start:start + CHUNK]
        try:
            results: list[Any] = protect_prompts([rec.text for rec in chunk], config, runtime=runtime,
                                                 seeds=[record_seed(args.seed, rec.id) for rec in chunk])
        except DPInferError as err:  # a refusal of the whole chunk (the settings against the model): each record
            results = [err] * len(chunk)
        for rec, res in zip(chunk, results, strict=True):
            if isinstance(res, DPInferError):
                yield {"id": rec.id, "error": str(res).splitlines()[0]}
            else:
                yield {"id": rec.id, **res.release()}
