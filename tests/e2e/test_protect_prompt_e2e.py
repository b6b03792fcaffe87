"""Prompt protection on the embedded SmolLM2-135M (e2e): shipped clip bounds reproduce, DP-GTR runs end to end."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e


def test_shipped_clip_bounds_reproduce_on_the_embedded_model(embedded_lm) -> None:
    from dpinfer.clip_bounds import measure_clip_bounds, packaged_bounds

    shipped = packaged_bounds()[embedded_lm.name]
    measured = measure_clip_bounds(embedded_lm)
    # same corpus, same seed, same settings; float32 kernels may differ slightly between CPUs
    assert measured.clip_min == pytest.approx(shipped.clip_min, rel=2e-3)
    assert measured.clip_max == pytest.approx(shipped.clip_max, rel=2e-3)


def test_dp_gtr_end_to_end(embedded_lm, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dpinfer.pipelines.protect_prompt import protect_prompt

    monkeypatch.setenv("DPINFER_CACHE", str(tmp_path))
    question = "Where do you keep a musical instrument so it doesn't get scratched?"
    res = protect_prompt(question, lm=embedded_lm, temperature=0.75, n_rewrites=4, max_new_tokens=24, seed=0)
    assert res.prompt.strip() and len(res.rewrites) == 4
    assert res.guarantee.parameters["clip_source"] == "package"
    assert res.guarantee.epsilon > 1000  # honest: 4 × 24 tokens at ε_tok ≈ 58.7
    assert res.epsilon_per_token == pytest.approx(2 * (26.777245085295633 - 4.776720595135153) / 0.75)
