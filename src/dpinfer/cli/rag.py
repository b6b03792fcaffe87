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
import sys
from typing import Any

METHODS_HELP = "pad (default) | pad-as-published | static | none | public | summarize | distance-threshold"


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
                                      "read. Not protected: the question, which documents exist, the store itself.",
                          epilog=f"Choosing ε: ε bounds, per answer, how much the answer can reveal about the "
                                 f"documents it was given (default {RAG.epsilon:g} per answer of at most "
                                 "--max-new-tokens tokens). Answers add up: k answers cost about k times the zCDP ρ "
                                 "of one. See docs/rag.md.")
    ask.add_argument("store", help="the store's folder")
    ask.add_argument("question", help="the question (public: it is not protected)")
    ask.add_argument("--mechanism", default=RAG.method, help=METHODS_HELP)
    ask.add_argument("--epsilon", type=float, default=None,
                     help=f"target ε per answer for pad (default {RAG.epsilon:g}); for pad-as-published the "
                          "authors' noise knob (not a guarantee)")
    ask.add_argument("--delta", type=float, default=RAG.delta, help=f"δ (default {RAG.delta:g})")
    ask.add_argument("--max-new-tokens", type=int, default=RAG.max_new_tokens,
                     help=f"T_max of the answer (default {RAG.max_new_tokens})")
    ask.add_argument("--temperature", type=float, default=RAG.temperature,
                     help="0 = argmax / greedy (default); τ > 0 samples")
    ask.add_argument("--sigma", type=float, default=RAG.sigma,
                     help=f"PAD's noise σ (default {RAG.sigma:g}; C is solved from ε)")
    ask.add_argument("--support-top-k", type=int, default=RAG.support_top_k,
                     help=f"k of PAD's public Top-k+ support (default {RAG.support_top_k}; 0 = full vocabulary)")
    ask.add_argument("--adjacency", default=RAG.adjacency, choices=["replace-by-null", "replace-one"],
                     help="replace-by-null (default): the context replaced by nothing; replace-one: by any other "
                          "context (covers a changed retrieval; twice the sensitivity)")
    ask.add_argument("--theta", type=float, default=RAG.theta,
                     help=f"distance-threshold: largest Euclidean distance kept (default {RAG.theta:g})")
    ask.add_argument("--static-sigma", type=float, default=RAG.static_sigma,
                     help=f"static: the noise σ (default {RAG.static_sigma:g})")
    ask.add_argument("--top-k", type=int, default=RAG.top_k, help=f"documents retrieved (default {RAG.top_k})")
    ask.add_argument("--top-n", type=int, default=RAG.top_n,
                     help=f"documents kept after reranking (default {RAG.top_n})")
    ask.add_argument("--show-doc-ids", action="store_true",
                     help="also print the retrieved documents' ids (for the store's owner: not covered by the "
                          "guarantee; never release them with the answer)")
    ask.add_argument("--debug-stats", action="store_true",
                     help="add the DATA-DEPENDENT figures (pad-as-published's own figure, computed from the private "
                          "logits) to the output, with a warning: debug only, never release them")
    ask.add_argument("--seed", type=int, default=None,
                     help="for tests and benchmarks only: the guarantee then holds only while the seed is secret")
    ask.add_argument("--model", default=None, help="model name or local folder (default: embedded SmolLM2-135M)")
    ask.add_argument("--device", default=None)
    ask.set_defaults(func=run_ask)

    info = rsub.add_parser("info", parents=[common], help="documents, embedder and settings of a store",
                           description="Public facts about STORE: folder, number of documents, embedder.")
    info.add_argument("store", help="the store's folder")
    info.set_defaults(func=run_info)


def add_bench_parser(bench_sub: Any, common: argparse.ArgumentParser) -> None:
    """``dpinfer bench rag``."""
    from dpinfer.bench import rag as bench_rag

    b = bench_sub.add_parser("rag", parents=[common], help="RAG extraction attack: leakage, PPL, tokens/s or --perf",
                             description=bench_rag.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_rag.add_arguments(b)
    b.set_defaults(func=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    """``dpinfer bench rag``: options checked (config), then the run, then the report (text or ``--json``)."""
    from dpinfer.bench import rag as bench_rag

    config = bench_rag.config_from_args(args)
    result = bench_rag.run(config)
    if args.json:
        _print_json({k: v for k, v in result.items() if k != "markdown"})
        return 0
    sys.stdout.write(bench_rag.render(result))
    return 0


def run_add(args: argparse.Namespace) -> int:
    from dpinfer.errors import ConfigurationError
    from dpinfer.pipelines.rag import PrivateRAG, read_documents

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


def run_ask(args: argparse.Namespace) -> int:
    from dpinfer.defaults import RAG
    from dpinfer.errors import InvalidInputError
    from dpinfer.pipelines.rag import PrivateRAG, check_ask_params
    from dpinfer.rag.store import DocumentStore
    from dpinfer.validation import check_text

    support = None if args.support_top_k == 0 else args.support_top_k
    if args.support_top_k is not None and args.support_top_k < 0:
        raise InvalidInputError(f"--support-top-k must be ≥ 0 (0 = full vocabulary), got {args.support_top_k}")
    check_ask_params(mechanism=args.mechanism, epsilon=args.epsilon, delta=args.delta,
                     max_new_tokens=args.max_new_tokens, seed=args.seed, temperature=args.temperature,
                     sigma=args.sigma, support_top_k=support, adjacency=args.adjacency, theta=args.theta,
                     static_sigma=args.static_sigma, cli=True)
    check_text(args.question, "the question")
    if args.mechanism == "pad":  # an unreachable ε is refused before anything loads
        from dpinfer.mechanisms.pad import Pad

        Pad.calibrated(epsilon=args.epsilon or RAG.epsilon, delta=args.delta, max_new_tokens=args.max_new_tokens,
                       sigma=args.sigma, adjacency=args.adjacency)
    store = DocumentStore(args.store, create=False)  # missing store: one line, before the model loads
    if store.count() == 0:
        raise InvalidInputError(f"the store {args.store} holds no documents; add some with: "
                                f"dpinfer rag add {args.store} FILES...")
    from dpinfer.models import load_model

    lm = load_model(args.model, device=args.device)
    rag = PrivateRAG(args.store, lm=lm, top_k=args.top_k, top_n=args.top_n)
    ans = rag.ask(args.question, mechanism=args.mechanism, epsilon=args.epsilon, delta=args.delta,
                  max_new_tokens=args.max_new_tokens, seed=args.seed, temperature=args.temperature, sigma=args.sigma,
                  support_top_k=support, adjacency=args.adjacency, theta=args.theta, static_sigma=args.static_sigma)
    if args.json:
        _print_json(ans.to_dict(doc_ids=args.show_doc_ids, debug=args.debug_stats))
        return 0
    print(ans.text)
    print(f"-- {ans.guarantee}", file=sys.stderr)
    if args.debug_stats and ans.data_dependent:
        print("-- WARNING: data-dependent figures, computed from the private documents (not a guarantee; never "
              f"release): {ans.data_dependent}", file=sys.stderr)
    if args.show_doc_ids:
        print(f"-- retrieved (not covered by the guarantee): {', '.join(ans.doc_ids) or 'none'}", file=sys.stderr)
    return 0


def run_info(args: argparse.Namespace) -> int:
    from dpinfer.rag.store import DocumentStore

    info = DocumentStore(args.store, create=False).info()
    if args.json:
        _print_json(info)
        return 0
    for key, value in info.items():
        print(f"{key}: {value}")
    return 0
