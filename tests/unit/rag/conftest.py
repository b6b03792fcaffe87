"""Fixtures of the RAG tests: a deterministic offline bag-of-words embedder (no model), and tiny stores."""

from __future__ import annotations

import hashlib
import re

import numpy as np
import pytest


class HashEmbedder:
    """Unit vectors from hashed lower-cased words: similar word sets are close. ``fail_after`` batches, then raise
    (to simulate a crash in the middle of an add)."""

    dim = 64

    def __init__(self, fail_after: int | None = None) -> None:
        self.calls = 0
        self.fail_after = fail_after

    def encode(self, texts, batch_size: int = 32):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise RuntimeError("simulated crash")
        self.calls += 1
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in re.findall(r"\w+", t.lower()):
                out[i, int(hashlib.md5(w.encode()).hexdigest(), 16) % self.dim] += 1.0
            norm = np.linalg.norm(out[i])
            out[i] = out[i] / norm if norm else out[i]
            if not norm:
                out[i, 0] = 1.0
        return out


DOCS = [
    "Patient: I have a migraine and nausea. Doctor: Rest in a dark room and take ibuprofen.",
    "Patient: My knee hurts when I climb stairs. Doctor: It may be arthritis; see a physiotherapist.",
    "Patient: I cough at night and wheeze. Doctor: This could be asthma; use an inhaler.",
    "Patient: I feel thirsty and tired all the time. Doctor: Check your blood sugar for diabetes.",
    "Patient: There is a rash on my arm after gardening. Doctor: Contact dermatitis; use a steroid cream.",
]


@pytest.fixture
def embedder() -> HashEmbedder:
    return HashEmbedder()


@pytest.fixture
def make_embedder():
    return HashEmbedder


@pytest.fixture
def docs() -> list[str]:
    return list(DOCS)


@pytest.fixture
def swap_pad_mechanism(monkeypatch):
    """``swap(make)``: every ``pad`` answer decodes with ``make(config, calibrated_pad)`` instead of the calibrated PAD
    (a spy, a broken row), through the method table's ``pad`` entry (restored after the test)."""
    import dataclasses
    import functools

    from dpinfer.methods.rag import TABLE
    from dpinfer.rag.answering import PadAnswer

    def swap(make):
        class Swapped(PadAnswer):
            @functools.cached_property
            def mechanism(self):
                return make(self.config, PadAnswer.mechanism.func(self))

        entry = dataclasses.replace(TABLE.get("pad"), build=lambda config, runtime=None: Swapped("pad", config))
        monkeypatch.setitem(TABLE._entries, "pad", entry)

    return swap
