"""Offline reranking of the retrieved candidates: top-k by embedding distance → top-n by best-passage similarity.

The first stage embeds each WHOLE document once (all-MiniLM-L6-v2 mean-pools at most 256 word pieces, so a long
document is represented by its beginning, diluted by everything in it). The reranker re-reads the k candidates more
finely: each is cut into overlapping windows of ``window_words`` words (stride ``window_words // 2``, covering the
whole document), every window is embedded with the same offline encoder, and a candidate's score is the largest
cosine similarity between the question and one of its windows (MaxP passage scoring, Dai & Callan 2019, "Deeper Text
Understanding for IR with Contextual Neural Language Modeling"). Ties keep the first-stage order. It needs no extra
model or download, costs one encoder call over about ``k · len/stride`` short windows per question (tens of
milliseconds on a CPU), and favours the document holding a passage about the question over one that is merely
similar on average. A cross-encoder (e.g. bge-reranker, as the PAD authors used) would be stronger but needs weights
that are not available offline here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpinfer.errors import ConfigurationError
from dpinfer.rag.store import Hit


def windows(text: str, size: int) -> list[str]:
    """Overlapping windows of ``size`` words with stride ``max(1, size // 2)``, covering every word.

    >>> windows("a b c d e", 2)
    ['a b', 'b c', 'c d', 'd e']
    >>> windows("a b", 4)
    ['a b']
    """
    words = text.split()
    if len(words) <= size:
        return [" ".join(words)] if words else [text]
    stride = max(1, size // 2)
    starts = list(range(0, len(words) - size + 1, stride))
    if starts[-1] + size < len(words):
        starts.append(len(words) - size)
    return [" ".join(words[s:s + size]) for s in starts]


@dataclass(frozen=True)
class PassageReranker:
    """MaxP reranking with an offline sentence encoder (see the module docstring)."""

    window_words: int = 48

    def __post_init__(self) -> None:
        if isinstance(self.window_words, bool) or not isinstance(self.window_words, int) or self.window_words < 4:
            raise ConfigurationError(f"window_words must be an integer ≥ 4, got {self.window_words!r}")

    def scores(self, question: str, hits: Sequence[Hit], embed: Callable[[Sequence[str]], Any]) -> list[float]:
        """The best-window cosine similarity of each hit to ``question`` (``embed`` returns unit vectors)."""
        if not hits:
            return []
        pieces: list[str] = [question]
        owner: list[int] = []
        for i, hit in enumerate(hits):
            for w in windows(hit.text, self.window_words):
                pieces.append(w)
                owner.append(i)
        vectors = np.asarray(embed(pieces), dtype=np.float64)
        sims = vectors[1:] @ vectors[0]
        best = np.full(len(hits), -np.inf)
        np.maximum.at(best, np.asarray(owner), sims)
        return [float(b) for b in best]

    def __call__(self, question: str, hits: Sequence[Hit], top_n: int,
                 embed: Callable[[Sequence[str]], Any]) -> list[Hit]:
        scores = self.scores(question, hits, embed)
        order = sorted(range(len(hits)), key=lambda i: (-scores[i], i))
        return [hits[i] for i in order[:top_n]]


def rerank(question: str, hits: Sequence[Hit], top_n: int, embed: Callable[[Sequence[str]], Any],
           method: str | Callable[..., list[Hit]] = "maxp") -> list[Hit]:
    """``top_n`` of ``hits``: ``"maxp"`` (:class:`PassageReranker`), ``"none"`` (first-stage order) or a callable
    ``(question, hits, top_n, embed) -> hits``."""
    if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
        raise ConfigurationError(f"top_n must be an integer ≥ 1, got {top_n!r}")
    if method == "none":
        return list(hits[:top_n])
    if method == "maxp":
        return PassageReranker()(question, hits, top_n, embed)
    if callable(method):
        return list(method(question, hits, top_n, embed))
    raise ConfigurationError(f"unknown reranker {method!r}; use 'maxp', 'none' or a callable")
