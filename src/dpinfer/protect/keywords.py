"""DP-GTR stage 2, keywords: consensus counts over the rewrites, released as the top K (NDP) or by JEM.

Everything here reads the released rewrites only (post-processing of stage 1), never the original prompt.

* **Words** of a text: maximal runs of letters, lower-cased (``"Paris,"`` and ``"paris"`` are one word; digits and
  punctuation separate words), one-letter words and the stop list (:func:`stop_words`: scikit-learn's English list,
  shipped as ``dpinfer/data/stopwords_en.txt``) dropped.
* **Counts**: for each word, the number of rewrites that contain it (a rewrite counts once however often it repeats
  the word), so replacing one rewrite moves every count by at most 1.
* **NDP** (:func:`top_k_ndp`): the K most frequent words (ties: alphabetical order), as they are.
* **JEM** (:func:`top_k_jem`): the Joint Exponential Mechanism (:mod:`dpinfer.mechanisms.jem`) over a FIXED PUBLIC
  universe of words (:func:`word_universe`: SCOWL size-50 American English, 73,109 words after the stop list, shipped
  as ``dpinfer/data/word_universe_en.txt.gz``), every word of the universe a candidate, zero counts included; words
  of the rewrites outside the universe cannot be released. Sensitivity 2 (one rewrite replaced: each count moves by
  at most 1, in any direction), so the release is ε₂-DP with respect to one rewrite.

>>> words("Where's the Eiffel Tower? In PARIS, of course: the Eiffel tower!")
['eiffel', 'tower', 'paris', 'course', 'eiffel', 'tower']
>>> counts = keyword_counts(["The Eiffel tower.", "A tower in Paris.", "Paris!"])
>>> sorted(counts.items())
[('eiffel', 1), ('paris', 2), ('tower', 2)]
>>> top_k_ndp(counts, 2)
['paris', 'tower']
"""

from __future__ import annotations

import functools
import gzip
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources

import numpy as np

from dpinfer.errors import ConfigurationError
from dpinfer.mechanisms.jem import JointExponentialTopK
from dpinfer.mechanisms.randomness import Randomness

_WORD = re.compile(r"[^\W\d_]+")
STOP_WORDS_FILE = "data/stopwords_en.txt"
UNIVERSE_FILE = "data/word_universe_en.txt.gz"


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


@functools.lru_cache(maxsize=1)
def stop_words() -> frozenset[str]:
    """The stop list (scikit-learn's ``ENGLISH_STOP_WORDS``, 318 words; package data).

    >>> {"the", "which", "would"} <= stop_words(), len(stop_words())
    (True, 318)
    """
    text = resources.files("dpinfer").joinpath(STOP_WORDS_FILE).read_text(encoding="utf-8")
    return frozenset(_lines(text))


@functools.lru_cache(maxsize=1)
def word_universe() -> tuple[str, ...]:
    """The fixed public universe of JEM (sorted; package data, see the module docstring).

    >>> universe = word_universe()
    >>> len(universe), "airplanes" in universe, "the" in universe
    (73109, True, False)
    """
    raw = resources.files("dpinfer").joinpath(UNIVERSE_FILE).read_bytes()
    return tuple(_lines(gzip.decompress(raw).decode("utf-8")))


@functools.lru_cache(maxsize=1)
def _universe_index() -> dict[str, int]:
    return {w: i for i, w in enumerate(word_universe())}


def words(text: str) -> list[str]:
    """The content words of ``text`` in order: lower-cased runs of letters, minus one-letter words and stop words."""
    stops = stop_words()
    return [w for w in _WORD.findall(text.lower()) if len(w) > 1 and w not in stops]


def keyword_counts(texts: Iterable[str]) -> Counter[str]:
    """For each content word, the number of ``texts`` containing it."""
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(set(words(text)))
    return counts


def top_k_ndp(counts: Mapping[str, int], k: int) -> list[str]:
    """The ``k`` most frequent words (count ≥ 1; ties in alphabetical order): DP-GTR's "NDP" release."""
    ranked = sorted(((-c, w) for w, c in counts.items() if c > 0))
    return [w for _, w in ranked[:k]]


def universe_counts(counts: Mapping[str, int], universe: Sequence[str] | None = None) -> np.ndarray:
    """The count of every word of the universe (0 for words no rewrite holds); other words are dropped."""
    if universe is None:
        index = _universe_index()
        size = len(word_universe())
    else:
        index = {w: i for i, w in enumerate(universe)}
        size = len(universe)
        if len(index) != size:
            raise ConfigurationError("the keyword universe must not repeat a word")
    vec = np.zeros(size, dtype=np.int64)
    for w, c in counts.items():
        i = index.get(w)
        if i is not None:
            vec[i] = c
    return vec


def top_k_jem(counts: Mapping[str, int], k: int, epsilon: float, generator: Randomness | None = None, *,
              universe: Sequence[str] | None = None) -> list[str]:
    """``k`` words released jointly by JEM at ``epsilon`` (ε₂) over the fixed ``universe`` (default
    :func:`word_universe`), sensitivity 2 (one rewrite replaced). Randomness: ``generator`` (default secure)."""
    words_of = word_universe() if universe is None else tuple(universe)
    vec = universe_counts(counts, words_of)
    picks = JointExponentialTopK(k, epsilon).sample(vec, generator)
    return [words_of[i] for i in picks]


__all__ = ["keyword_counts", "stop_words", "top_k_jem", "top_k_ndp", "universe_counts", "word_universe", "words"]
