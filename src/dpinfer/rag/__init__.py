"""Retrieval for private RAG: the persistent document store and the offline reranker (:mod:`dpinfer.pipelines.rag`
builds on them)."""

from dpinfer.rag.rerank import PassageReranker, rerank
from dpinfer.rag.store import AddReport, DocumentStore, Hit, content_id

__all__ = ["AddReport", "DocumentStore", "Hit", "PassageReranker", "content_id", "rerank"]
