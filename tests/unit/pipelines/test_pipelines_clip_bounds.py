"""Public clip bounds: measured on the public corpus, stored per model in the cache, the embedded model's shipped."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dpinfer import clip_bounds as cb
from dpinfer.errors import ConfigurationError, CorruptCacheError


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPINFER_CACHE", str(tmp_path / "cache"))


def test_shipped_bounds_of_the_embedded_model_are_pinned() -> None:
    shipped = cb.packaged_bounds()["smollm2-135m-instruct"]
    # measured by `dpinfer calibrate-clip` (8 public paragraphs, 32 tokens, seed 0, μ + 4σ): docs/prompt-protection.md
    assert shipped.bounds == (4.776720595135153, 26.777245085295633)
    assert (shipped.n_texts, shipped.max_new_tokens, shipped.sigmas, shipped.source) == (8, 32, 4.0, "package")
    assert shipped.clip_max == pytest.approx(shipped.mean + 4 * shipped.std, rel=1e-12)
    assert shipped.corpus == cb.corpus_digest()  # measured on the corpus that ships


def test_public_corpus_is_packaged() -> None:
    paragraphs = cb.public_corpus()
    assert 10 <= len(paragraphs) <= 20
    assert all(20 <= len(p.split()) <= 80 for p in paragraphs)


def test_bounds_are_mean_and_mean_plus_sigmas_std(tiny_lm) -> None:
    from dpinfer.engine import Engine
    from dpinfer.mechanisms.sampler import Sampler

    seen: list[torch.Tensor] = []

    class Record(Sampler):
        def step(self, logits, info, generator):
            seen.append(logits[~info.finished].flatten().clone())
            return super().step(logits, info, generator)

    prompts = [tiny_lm.encode(tiny_lm.instruction_prompt(cb.PARAPHRASE_INSTRUCTION.format(text=t)))
               for t in cb.public_corpus()[:2]]
    Engine(tiny_lm).generate(prompts, Record(temperature=1.0), max_new_tokens=5, seed=cb.CALIBRATION_SEED)
    values = torch.cat(seen)
    record = cb.measure_clip_bounds(tiny_lm, n_texts=2, max_new_tokens=5, sigmas=2.0)
    assert record.clip_min == pytest.approx(float(values.mean()), rel=1e-9)
    assert record.clip_max == pytest.approx(float(values.mean() + 2.0 * values.std(unbiased=False)), rel=1e-9)
    assert record.model == tiny_lm.name and record.source == "measured"


def test_clip_bounds_are_stored_per_model_and_read_back(tiny_lm, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cb.read_cached(tiny_lm) is None
    with pytest.raises(ConfigurationError, match="calibrate-clip"):
        cb.clip_bounds(tiny_lm, measure=False)
    first = cb.clip_bounds(tiny_lm, n_texts=2, max_new_tokens=4)
    assert first.source == "measured" and cb.cache_path(tiny_lm).is_file()
    import dpinfer.engine

    def refuse(*args, **kwargs):
        raise AssertionError("the stored bounds were recomputed")

    monkeypatch.setattr(dpinfer.engine.Engine, "generate", refuse)
    again = cb.clip_bounds(tiny_lm, n_texts=2, max_new_tokens=4)
    assert again.bounds == first.bounds and again.source == "cache"
    with pytest.raises(AssertionError, match="recomputed"):  # other settings: not the stored record
        cb.clip_bounds(tiny_lm, n_texts=3, max_new_tokens=4)
    assert not hasattr(cb, "_CLIP_CACHE")  # no in-memory cache anywhere
    from dpinfer.mechanisms import dp_prompt

    assert not hasattr(dp_prompt, "_CLIP_CACHE") and not hasattr(dp_prompt, "public_clip_bounds")


def test_a_damaged_or_foreign_record_is_refused(tiny_lm) -> None:
    path = cb.cache_path(tiny_lm)
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(CorruptCacheError, match="calibrate-clip"):
        cb.clip_bounds(tiny_lm)
    record = cb.packaged_bounds()["smollm2-135m-instruct"].to_dict()
    path.write_text(json.dumps(record))
    with pytest.raises(CorruptCacheError, match="another model"):
        cb.clip_bounds(tiny_lm)


@pytest.mark.parametrize(("kwargs", "match"), [({"n_texts": 100}, "n_texts"), ({"sigmas": 0.0}, "sigmas"),
                                               ({"max_new_tokens": 0}, "max_new_tokens")])
def test_bad_settings_are_refused(tiny_lm, kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        cb.measure_clip_bounds(tiny_lm, **kwargs)


def test_calibrate_clip_command(tiny_model_dir, capsys) -> None:
    from dpinfer.cli import main

    assert main(["calibrate-clip", "--model", str(tiny_model_dir), "--device", "cpu", "--n-texts", "2",
                 "--max-new-tokens", "3", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert math.isfinite(data["clip_min"]) and data["clip_min"] < data["clip_max"]
    assert data["path"].endswith(".json") and data["packaged"] is None
    assert main(["calibrate-clip", "--sigmas", "-1"]) == 2
    assert "sigmas" in capsys.readouterr().err
