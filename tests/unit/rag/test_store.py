"""The Chroma document store: idempotent adds, crash safety, one-line errors, offline."""

from __future__ import annotations

import pytest

from dpinfer.errors import ConfigurationError, DataNotFoundError, InvalidInputError
from dpinfer.rag.rerank import PassageReranker, rerank, windows
from dpinfer.rag.store import DocumentStore, Hit, content_id


def test_add_is_idempotent_and_ids_are_content_hashes(tmp_path, embedder, docs):
    store = DocumentStore(tmp_path / "s", embedder=embedder, create=True)
    first = store.add(docs)
    assert (first.added, first.skipped, first.total) == (5, 0, 5)
    calls = embedder.calls
    again = DocumentStore(tmp_path / "s", embedder=embedder).add([*docs, docs[0]])
    assert (again.added, again.skipped, again.total) == (0, 6, 5)
    assert embedder.calls == calls  # nothing re-embedded
    got = store._open().get(ids=[content_id(docs[2])], include=["documents"])
    assert got["documents"] == [docs[2]]


def test_query_returns_nearest_with_euclidean_distances(tmp_path, embedder, docs):
    store = DocumentStore(tmp_path / "s", embedder=embedder, create=True)
    store.add(docs)
    hits = store.query("I wheeze and cough at night, is it asthma?", k=3)
    assert len(hits) == 3 and hits[0].text == docs[2]
    assert all(0.0 <= h.distance <= 2.0 + 1e-6 for h in hits)
    assert [h.distance for h in hits] == sorted(h.distance for h in hits)
    assert docs[2] not in repr(hits[0])  # the text never shows in a repr
    assert len(store.query("asthma", k=50)) == 5


def test_a_crash_during_add_leaves_a_usable_store(tmp_path, make_embedder, docs):
    path = tmp_path / "s"
    crashing = make_embedder(fail_after=1)  # the first batch is stored, the second raises
    with pytest.raises(RuntimeError):
        DocumentStore(path, embedder=crashing, create=True).add(docs, batch_size=2)
    fresh = make_embedder()
    store = DocumentStore(path, embedder=fresh)
    assert store.count() == 2
    assert store.query("knee stairs", k=1)[0].id in {content_id(d) for d in docs[:2]}
    report = store.add(docs, batch_size=2)
    assert (report.added, report.skipped, report.total) == (3, 2, 5)


def test_one_line_errors(tmp_path, embedder, docs):
    with pytest.raises(DataNotFoundError, match=r"no store at .*dpinfer rag add"):
        DocumentStore(tmp_path / "missing", embedder=embedder)
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidInputError, match="is a file"):
        DocumentStore(tmp_path / "file", embedder=embedder)
    (tmp_path / "plain").mkdir()
    with pytest.raises(DataNotFoundError, match="not a dpinfer store"):
        DocumentStore(tmp_path / "plain", embedder=embedder)
    store = DocumentStore(tmp_path / "s", embedder=embedder, create=True)
    with pytest.raises(InvalidInputError, match="holds no documents"):
        store.query("anything")
    with pytest.raises(InvalidInputError, match="document 1 is empty"):
        store.add(["fine", "  "])
    with pytest.raises(InvalidInputError, match="same id"):
        store.add(["a", "b"], ids=["x", "x"])
    with pytest.raises(InvalidInputError, match="one id per document"):
        store.add(["a", "b"], ids=["x"])
    for exc in (DataNotFoundError, InvalidInputError):
        assert "\n" not in str(exc("x"))
    secret = "Patient: my name is Ada Lovelace"
    with pytest.raises(InvalidInputError) as info:
        store.add([secret, 3])  # type: ignore[list-item]
    assert "Ada" not in str(info.value)


def test_another_embedder_is_refused(tmp_path, embedder, docs):
    import numpy as np

    DocumentStore(tmp_path / "s", embedder=embedder, create=True).add(docs)

    class Other:
        def encode(self, texts, batch_size=32):
            return np.ones((len(texts), 64), dtype=np.float32) / 8.0

    with pytest.raises(ConfigurationError, match="same embedder"):
        DocumentStore(tmp_path / "s", embedder=Other()).query("knee")


def test_windows_cover_every_word():
    text = " ".join(f"w{i}" for i in range(101))
    pieces = windows(text, 10)
    covered = {w for p in pieces for w in p.split()}
    assert covered == set(text.split()) and all(len(p.split()) == 10 for p in pieces)


def test_maxp_reranker_prefers_the_document_with_a_matching_passage(embedder):
    filler = " ".join(["weather report sunny cloudy windy"] * 30)
    hits = [Hit("a", filler + " stairs", 0.5), Hit("b", filler + " my knee hurts when I climb stairs", 0.6),
            Hit("c", "nothing relevant here at all", 0.7)]
    out = rerank("my knee hurts when I climb stairs", hits, 2, embedder.encode, PassageReranker(window_words=8))
    assert out[0].id == "b"  # the first stage put b second: its last passage matches the question
    assert [h.id for h in rerank("q", hits, 2, embedder.encode, "none")] == ["a", "b"]
    with pytest.raises(ConfigurationError):
        PassageReranker(window_words=1)


@pytest.mark.slow
def test_store_with_minilm_reaches_no_network(tmp_path, no_network, docs):
    from dpinfer.errors import MissingDependencyError, ModelNotFoundError
    from dpinfer.eval.embeddings import load_embedder

    try:
        minilm = load_embedder()
    except (MissingDependencyError, ModelNotFoundError) as exc:
        pytest.skip(f"all-MiniLM-L6-v2 not installed: {exc}")
    store = DocumentStore(tmp_path / "s", embedder=minilm, create=True)
    store.add(docs)
    hits = store.query("I have a rash after gardening", k=2)
    assert hits[0].text == docs[4]
    assert store.info()["embedder"] == "/".join(minilm.path.parts[-2:])
