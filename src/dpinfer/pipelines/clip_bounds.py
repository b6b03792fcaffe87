"""DP-Prompt's public clip bounds, under their older import path: they live in :mod:`dpinfer.clip_bounds`."""

from __future__ import annotations

from dpinfer.clip_bounds import (
    CALIBRATION_SEED,
    PARAPHRASE_INSTRUCTION,
    ClipBounds,
    _check_settings,
    cache_path,
    calibrate_and_store,
    clip_bounds,
    corpus_digest,
    measure_clip_bounds,
    model_key,
    packaged_bounds,
    public_corpus,
    read_cached,
    store,
)

__all__ = ["CALIBRATION_SEED", "PARAPHRASE_INSTRUCTION", "ClipBounds", "_check_settings", "cache_path",
           "calibrate_and_store", "clip_bounds", "corpus_digest", "measure_clip_bounds", "model_key",
           "packaged_bounds", "public_corpus", "read_cached", "store"]
