"""The methods of private RAG (``dpinfer rag ask --mechanism``, :meth:`dpinfer.PrivateRAG.ask`'s ``mechanism=``).

Each entry's builder, ``build(config, runtime)``, returns the method's runner (:mod:`dpinfer.rag.answering`); the
pipeline dispatches through this table only, and the command line reads its names and summaries from it. Listing
them imports no mechanism and no torch.

>>> TABLE.names()
['pad', 'pad-as-published', 'static', 'none', 'public', 'summarize', 'distance-threshold']
>>> TABLE.get("public").guarantee, TABLE.get("pad").protects
('zero', 'retrieved context')
"""

from __future__ import annotations

from dpinfer.defaults import RAG
from dpinfer.methods.table import Method, MethodTable

__all__ = ["BUILDERS", "TABLE"]

BUILDERS = "dpinfer.rag.answering"
"""The module holding the builtin methods' builders."""

TABLE = MethodTable("rag", [
    Method("pad", "rag", build=f"{BUILDERS}:build_pad", contexts="public+retrieved", protects="retrieved context",
           guarantee="ex-ante", summary="PAD: public row plus clipped, noised shift from the retrieved context; "
                                        "(ε, δ) per answer from its parameters"),
    Method("pad-as-published", "rag", build=f"{BUILDERS}:build_pad_as_published", contexts="retrieved",
           protects="nothing", guarantee="data-dependent",
           summary="the authors' PAD step: no guarantee, its own figure data-dependent (--noise-scale)"),
    Method("static", "rag", build=f"{BUILDERS}:build_static", contexts="retrieved", protects="nothing",
           guarantee="none", summary="fixed Gaussian noise on every logit (--static-sigma; no guarantee)"),
    Method("none", "rag", mechanism="sampler", build=f"{BUILDERS}:build_none", contexts="retrieved",
           protects="nothing", guarantee="none", baseline=True,
           summary="greedy decoding with the retrieved documents (no defence)"),
    Method("public", "rag", mechanism="sampler", build=f"{BUILDERS}:build_public", contexts="public",
           protects="store", guarantee="zero", baseline=True,
           summary="the question alone: nothing retrieved (ε = 0 for the store)"),
    Method("summarize", "rag", mechanism="sampler", build=f"{BUILDERS}:build_summarize", contexts="retrieved",
           protects="nothing", guarantee="none", baseline=True,
           summary="each document condensed by the model first, then none (no guarantee)"),
    Method("distance-threshold", "rag", mechanism="sampler", build=f"{BUILDERS}:build_distance_threshold",
           contexts="retrieved", protects="nothing", guarantee="none", baseline=True,
           summary="documents farther than --theta dropped, then none (no guarantee)"),
], default=RAG.method)
"""The rag methods: the default (pad) first, then the other mechanisms, then the baselines."""
