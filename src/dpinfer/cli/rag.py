"""``dpinfer rag``: a private document store and answers with a guarantee for their retrieved context.

    dpinfer rag add STORE FILES... [--text-field F] [--id-field F]
    dpinfer rag ask STORE "question" [--mechanism M] [--epsilon E] [--json]
    dpinfer rag info STORE

``add`` reads every file and checks it before the embedder loads; ``ask`` checks its parameters and the store before
the model loads. The answer is the release; the retrieved documents are never printed (``--show-doc-ids`` prints
their ids, which the guarantee does not cover).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any


def _print_json(obj: Any) -> None:
    from dpinfer._json import plain

    sys.stdout.write(json.dumps(plain(obj), indent=2, ensure_ascii=False) + "\n")


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """``dpinfer rag {add,ask,info}``."""
    from dpinfer.defaults import RAG

    rag = sub.add_parser("rag", parents=[common], help="private RAG: a local document store, answers with PAD",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    rsub = rag.add_subparsers(dest="rag_command", metavar="ACTION", required=True)

    add = rsub.add_parser("add", parents=[common], help="add .jsonl/.csv records or .txt/.md files to a store",
                          description="Add documents to STORE (created if missing). Ids default to a hash of the "
                                      "text, so adding the same documents again changes nothing.")
    add.add_argument("store", help="the store's folder")
    add.add_argument("files", nargs="+", help=".jsonl / .csv (one document per record) or .txt / .md (one each)")
    add.add_argument("--text-field", default="text", help="field holding the text in .jsonl/.csv (default: text)")
    add.add_argument("--id-field", default=None, help="field holding the document id (default: a content hash)")
    add.set_defaults(func=run_add)

    ask = rsub.add_parser("ask", parents=[common], help="answer a question from the store (PAD by default)",
                          description="Retrieve top-k documents, rerank to top-n, and answer. With pad (default) the "
                                      "answer is (ε, δ)-DP for its retrieved context, computed before anything is "
                                      "read. Not protected: the question, which documents exist, the store itself, "
                                      "wall time. The default adjacency (replace-by-null) covers the CONTENT of the "
                                      "retrieved context, not a document's membership in the store: adding or "
                                      "removing a document changes what is retrieved; for membership use "
                                      "--adjacency replace-one (twice the sensitivity, the same ε costs more noise).",
                          epilog=f"Choosing ε: ε bounds, per answer, how much the answer can reveal about the "
                                 f"documents it was given (default {RAG.epsilon:g} per answer of at most "
                                 "--max-new-tokens tokens). Answers add up: k answers cost about k times the zCDP ρ "
                                 "of one. See docs/rag.md.")
    ask.add_argument("store", help="the store's folder")
    ask.add_argument("question", nargs="?", default=None,
                     help="the question (public: it is not protected); or --questions Q.jsonl --out OUT.jsonl")
    from dpinfer.configs.ask import AskConfig
    from dpinfer.configs.base import add_options
    from dpinfer.methods.rag import TABLE

    ask.add_argument("--mechanism", default=TABLE.default, metavar="METHOD", help=TABLE.help())
    add_options(ask, AskConfig, skip=("seed",))
    ask.add_argument("--support-top-k", type=int, default=RAG.support_top_k,
                     help=f"k of PAD's public Top-k+ support (default {RAG.support_top_k}; 0 = full vocabulary)")
    ask.add_argument("--top-k", type=int, default=RAG.top_k, help=f"documents retrieved (default {RAG.top_k})")
    ask.add_argument("--top-n", type=int, default=RAG.top_n,
                     help=f"documents kept after reranking (default {RAG.top_n})")
    ask.add_argument("--show-doc-ids", action="store_true",
                     help="also print the retrieved documents' ids (for the store's owner: not covered by the "
                          "guarantee; never release them with the answer)")
    ask.add_argument("--debug-stats", action="store_true",
                     help="also print the answer's diagnostics: DATA-DEPENDENT figures (the timing, which depends on "
                          "the retrieved documents; the retrieved ids; pad-as-published's own figure, computed from "
                          "the private logits), with a warning: debug only, never release them")
    add_options(ask, AskConfig, only=("seed",))
    ask.add_argument("--model", default=None, help="model name or local folder (default: embedded SmolLM2-135M)")
    ask.add_argument("--device", default=None)
    from dpinfer.cli.budget import add_ledger_options

    add_ledger_options(ask, "the store's unit on the ledger (default: 'store' on the store's own ledger, else a keyed "
                            "hash of the store's path)")
    ask.add_argument("--no-ledger", action="store_true",
                     help="charge no ledger (by default every answer is charged to the store's own ledger, "
                          "STORE/budget.db, created at the first answer; see dpinfer budget)")
    q = ask.add_argument_group("a file of questions (one answer per JSONL record; resumable)")
    q.add_argument("--questions", default=None, metavar="Q.jsonl",
                   help="answer every record of this JSONL file (one JSON object per line) instead of QUESTION; "
                        "--out OUT.jsonl gets one answer per id; rerunning skips the ids already in OUT; the summary "
                        "states the composed budget of all the answers in OUT (they read the same store)")
    q.add_argument("--out", default=None, help="--questions: the JSONL file of answers (appended, resumable)")
    q.add_argument("--question-field", default="question",
                   help="--questions: the field holding the question (default question)")
    q.add_argument("--id-field", default="id", help="--questions: the field holding the unique id (default id)")
    from dpinfer.cli.corpus_job import add_rerelease_argument

    add_rerelease_argument(q, composes=True)
    ask.set_defaults(func=run_ask)

    info = rsub.add_parser("info", parents=[common], help="documents, embedder and settings of a store",
                           description="Public facts about STORE: folder, number of documents, embedder.")
    info.add_argument("store", help="the store's folder")
    info.set_defaults(func=run_info)


def run_add(args: argparse.Namespace) -> int:
    from dpinfer.errors import ConfigurationError
    from dpinfer.pipelines.rag import PrivateRAG
    from dpinfer.rag.documents import read_documents

    if not args.text_field:
        raise ConfigurationError("--text-field must name a field")
    texts, ids = read_documents(args.files, text_field=args.text_field, id_field=args.id_field)  # before any model
    rag = PrivateRAG(args.store)
    report = rag.store.add(texts, ids=ids)
    if args.json:
        _print_json({"store": args.store, **report.to_dict()})
        return 0
    print(f"{report.added} documents added, {report.skipped} already stored; {report.total} in {args.store}")
    return 0


def ask_config_from_args(args: argparse.Namespace) -> Any:
    """The :class:`~dpinfer.configs.ask.AskConfig` of ``rag ask``'s options, checked through the method table (the
    method's knobs, PAD's calibration) before anything loads."""
    from dpinfer.configs.ask import AskConfig
    from dpinfer.errors import InvalidInputError
    from dpinfer.pipelines.rag import answer_method

    given = {k: v for k, v in vars(args).items() if k in AskConfig.field_names()}
    if args.mechanism == "pad-as-published" and given.get("epsilon") is not None:
        if given.get("noise_scale") is not None:
            raise InvalidInputError("give --noise-scale only (--epsilon is its deprecated alias for pad-as-published)")
        print("dpinfer: --epsilon with pad-as-published is a deprecated alias of --noise-scale (the authors' noise "
              "knob, not a guarantee)", file=sys.stderr)
        given["noise_scale"] = given.pop("epsilon")
    if args.support_top_k is not None and args.support_top_k < 0:
        raise InvalidInputError(f"--support-top-k must be ≥ 0 (0 = full vocabulary), got {args.support_top_k}")
    given["support_top_k"] = None if args.support_top_k == 0 else args.support_top_k
    config = AskConfig.merged(None, **{**given, "mechanism": args.mechanism}, spelling="cli")
    answer_method(config)  # the method's checks and PAD's calibration: an unreachable ε is refused here
    return config


def run_ask(args: argparse.Namespace) -> int:
    from dpinfer.errors import InvalidInputError
    from dpinfer.pipelines.rag import PrivateRAG
    from dpinfer.rag.store import DocumentStore
    from dpinfer.validation import check_text

    config = ask_config_from_args(args)
    if args.questions is None:
        if args.out or args.allow_rerelease:
            option = "--out" if args.out else "--allow-rerelease"
            raise InvalidInputError(f"{option} applies to --questions only (one question prints its answer)")
        if args.question is None:
            raise InvalidInputError("give a QUESTION, or --questions Q.jsonl --out OUT.jsonl")
        check_text(args.question, "the question")
    else:
        _check_questions_args(args)
    store = DocumentStore(args.store, create=False)  # missing store: one line, before the model loads
    if store.count() == 0:
        raise InvalidInputError(f"the store {args.store} holds no documents; add some with: "
                                f"dpinfer rag add {args.store} FILES...")
    if args.questions is not None:
        return _run_ask_questions(args, config)
    from dpinfer.accounting.charge import charge
    from dpinfer.cli.budget import report_charge
    from dpinfer.models import load_model
    from dpinfer.pipelines.rag import answer_method, store_reservation

    # the answer's guarantee from its parameters alone: an unaffordable answer is refused before the model loads
    with charge(store_reservation(args.store, *_rag_ledger(args)), None, answer_method(config).guarantee(),
                scope="store") as spend:
        lm = load_model(args.model, device=args.device)
        rag = PrivateRAG(args.store, lm=lm, top_k=args.top_k, top_n=args.top_n)
        ans = rag.ask(args.question, config=config, ledger=spend)
    report_charge(spend)
    if args.json:
        out = ans.release()
        if args.show_doc_ids:
            out = {**out, "doc_ids": list(ans.doc_ids)}  # asked by the store's owner: not covered by the guarantee
        if args.debug_stats:
            out = {**out, "diagnostics": ans.diagnostics()}
        _print_json(out)
        return 0
    print(ans.text)
    print(f"-- {ans.guarantee}", file=sys.stderr)
    if args.debug_stats:
        print(f"-- WARNING: diagnostics: {ans.diagnostics()}", file=sys.stderr)
    if args.show_doc_ids:
        print(f"-- retrieved (not covered by the guarantee): {', '.join(ans.doc_ids) or 'none'}", file=sys.stderr)
    return 0


def _probe_budget(args: argparse.Namespace, config: Any) -> None:
    """Refuse (BudgetExceededError) when the ledger cannot afford one answer: reserved, then cancelled."""
    from dpinfer.accounting.charge import charge
    from dpinfer.pipelines.rag import answer_method, store_reservation

    with charge(store_reservation(args.store, *_rag_ledger(args)), None, answer_method(config).guarantee(),
                scope="store") as probe:
        if probe is not None:
            probe.cancel()


def _rag_ledger(args: argparse.Namespace) -> tuple[Any, str | None]:
    """(ledger, unit) of ``rag ask``: --no-ledger, else --ledger / $DPINFER_LEDGER, else the store's own."""
    from dpinfer.cli.budget import ledger_path
    from dpinfer.errors import LedgerError
    from dpinfer.pipelines.rag import STORE_LEDGER

    if args.no_ledger:
        if args.ledger or args.unit:
            raise LedgerError("--no-ledger contradicts --ledger/--unit; give one or the other")
        return None, None
    return ledger_path(args) or STORE_LEDGER, args.unit


def run_info(args: argparse.Namespace) -> int:
    from dpinfer.rag.store import DocumentStore

    info = DocumentStore(args.store, create=False).info()
    if args.json:
        _print_json(info)
        return 0
    for key, value in info.items():
        print(f"{key}: {value}")
    return 0


def _check_questions_args(args: argparse.Namespace) -> None:
    """``--questions``: the options and paths, and the file itself, before anything loads."""
    from dpinfer.errors import InvalidInputError
    from dpinfer.jobs.corpus import check_corpus_paths, read_corpus

    if args.question is not None:
        raise InvalidInputError("give a QUESTION or --questions Q.jsonl, not both")
    if not args.out:
        raise InvalidInputError("--questions needs --out OUT.jsonl (the answers are appended there, one per id)")
    if args.show_doc_ids or args.debug_stats:
        raise InvalidInputError("--show-doc-ids and --debug-stats do not apply to --questions (an answer file holds "
                                "releases only)")
    if args.id_field == args.question_field:
        raise InvalidInputError("--id-field and --question-field must name two different fields")
    check_corpus_paths(args.questions, args.out)
    args.question_records = read_corpus(args.questions, id_field=args.id_field, text_field=args.question_field,
                                        spans_field=None)


def answers_budget(records: Any) -> str:
    """The budget of every answer record given (every answer in OUT: they read the same store, so they compose),
    composed by one :class:`~dpinfer.accounting.PrivacyAccountant`: each answer's method rebuilt from its released
    settings (:func:`~dpinfer.pipelines.rag.released_answer_method`) and composed as a session composes it
    (:func:`~dpinfer.pipelines.rag.compose_answer`), converted once at the largest δ; ``public`` answers cost
    nothing; any answer without a guarantee voids it. A torn answer (part of it was released) keeps its guarantee
    and counts."""
    from dpinfer.accounting import PrivacyAccountant
    from dpinfer.accounting.calibration import zcdp_rho
    from dpinfer.checks import format_up
    from dpinfer.pipelines.rag import compose_answer, released_answer_method

    acc, answers = PrivacyAccountant(), 0
    for rec in records:
        if not isinstance(rec.get("guarantee"), dict):
            continue
        answers += 1
        method = released_answer_method(rec)
        if method is None:
            return f"{answers} answers in the output; one has no guarantee, so together they have none"
        compose_answer(acc, method)
    if not answers:
        return "no answer in the output yet"
    if all(e.label == "public" for e in acc.history):
        return f"{answers} answers in the output, all public (ε = 0)"
    total, delta = acc.loss(), acc.delta()
    eps = acc.epsilon(delta)
    shown = "∞" if math.isinf(eps) else format_up(eps)
    return (f"{answers} answers in the output, composed (they read the same store): ρ = "
            f"{format_up(zcdp_rho(total))} zCDP, ε ≤ {shown} at δ = {format_up(delta)} for all of them together")


def _run_ask_questions(args: argparse.Namespace, config: Any) -> int:
    """``dpinfer rag ask STORE --questions Q --out OUT``: the questions not yet in OUT, one ``ask_many`` call
    (one ``Engine.run_jobs``), each answer appended as it finishes (:func:`~dpinfer.jobs.corpus.run_corpus_job`);
    a summary with the budget of every answer in OUT composed."""
    from dpinfer.cli.corpus_job import print_job_summary, record_progress, warn
    from dpinfer.jobs.corpus import run_corpus_job

    records = args.question_records
    run = run_corpus_job(records, args.out, lambda todo: _answers(args, config, list(todo)),
                         job="dpinfer rag ask --questions", source=f"--questions {args.questions}",
                         allow_rerelease=args.allow_rerelease, composes=True,
                         progress=lambda total: record_progress("rag ask --questions", total), warn=warn)
    return print_job_summary(args, "rag ask --questions", run, f"total budget: {answers_budget(run.held)}",
                             records=len(records))


def _answers(args: argparse.Namespace, config: Any, todo: list[Any]) -> Any:
    """The output record of each question of ``todo`` as it finishes (one ``ask_many`` call): its release."""
    from dpinfer.models import load_model
    from dpinfer.pipelines.rag import PrivateRAG

    _probe_budget(args, config)  # a store that cannot afford one answer is refused before the model loads
    lm = load_model(args.model, device=args.device)
    book, unit = _rag_ledger(args)
    rag = PrivateRAG(args.store, lm=lm, top_k=args.top_k, top_n=args.top_n, ledger=book, unit=unit)
    for i, ans, err in rag.ask_many([r.text for r in todo], ids=[r.id for r in todo], config=config):
        yield {"id": todo[i].id, "error": err} if ans is None else {"id": todo[i].id, **ans.release()}
