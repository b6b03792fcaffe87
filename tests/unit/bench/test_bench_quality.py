"""``dpinfer bench quality``: the derailment measures, the option checks, the settings, and the public min-p support."""

from __future__ import annotations

import argparse
import math

import pytest
import torch

from dpinfer.accounting.calibration import Budget, Spec
from dpinfer.bench import quality, quality_tasks
from dpinfer.errors import ConfigurationError
from dpinfer.mechanisms.dp_fusion import DPFusion
from dpinfer.mechanisms.transforms import MinP, PublicSupport


def test_english_share_separates_english_from_german() -> None:
    assert quality_tasks.english_share("The applicant was born in 1970 and lives in Izmir.") > 0.4
    assert quality_tasks.english_share("Ein leben ist zu wetzt, sie hatte mit den Kommunen") < quality.ENGLISH_THRESHOLD
    assert quality_tasks.english_share("") == 0.0 and quality_tasks.word_count("I. 12 --") == 1


def _args(**kw: object) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    quality.add_arguments(p)
    args = p.parse_args([])
    for k, v in kw.items():
        setattr(args, k, v)
    return args


def test_config_checks_before_any_model() -> None:
    cfg = quality.config_from_args(_args(tasks="sanitize,rag", runs=3))
    assert cfg.tasks == ("sanitize", "rag") and cfg.runs == 3 and cfg.settings == ("previous", "current")
    with pytest.raises(ConfigurationError, match="unknown task"):
        quality.config_from_args(_args(tasks="sanitise"))
    with pytest.raises(ConfigurationError, match="unknown setting"):
        quality.config_from_args(_args(settings="after"))
    with pytest.raises(ConfigurationError, match="held-in"):
        quality.config_from_args(_args(questions=30, docs=20))
    assert quality.config_from_args(_args(baselines="ner-scrub")).baselines == ("ner-scrub",)
    with pytest.raises(ConfigurationError, match="unknown row"):
        quality.config_from_args(_args(baselines="floor"))


def test_settings_differ_only_in_the_changed_defaults() -> None:
    prev, cur = quality_tasks.sanitize_options("previous"), quality_tasks.sanitize_options("current")
    assert prev == {"min_p": None, "cap": None, "opening": None} and cur["min_p"] and cur["cap"] and cur["opening"]
    assert not quality_tasks.rag_template("previous").chat and quality_tasks.rag_template("current").chat


def test_min_p_support_reads_the_public_row_only() -> None:
    z = torch.tensor([[3.0, 2.0, 1.0, 0.0], [0.0, 0.0, 9.0, 0.0]], dtype=torch.float64)
    keep = PublicSupport(min_p=0.3).mask(z[0])
    assert keep.tolist() == [True, True, False, False]
    z2 = z.clone()
    z2[1] = torch.tensor([9.0, -5.0, 0.0, 7.0], dtype=torch.float64)  # another private row: the same support
    assert torch.equal(PublicSupport(min_p=0.3)((), z2).isfinite(), PublicSupport(min_p=0.3)((), z).isfinite())
    assert MinP(0.3)((), z)[1].isfinite().tolist() == [False, False, True, False]  # per row (baselines)
    with pytest.raises(ConfigurationError, match="min_p"):
        PublicSupport(min_p=0.0)


def test_dp_fusion_min_p_keeps_the_guarantee_and_the_public_support() -> None:
    base = DPFusion.calibrated(Budget({"PERSON": 20.0}, 1e-5), Spec(50, temperature=0.7, top_k=40))
    mp = DPFusion.calibrated(Budget({"PERSON": 20.0}, 1e-5), Spec(50, temperature=0.7, top_k=40, min_p=0.05))
    assert mp.guarantee(50).epsilon == base.guarantee(50).epsilon  # the support is public: ε does not change
    assert mp.guarantee(50).parameters["min_p"] == 0.05
    pub = torch.linspace(0.0, -12.0, 50, dtype=torch.float64)
    for private in (torch.zeros(50, dtype=torch.float64), torch.linspace(-12.0, 0.0, 50, dtype=torch.float64)):
        probs, _, _ = mp.distribution(torch.stack([pub, private]))
        cut = (pub / 0.7) >= (pub / 0.7).max() + torch.log(torch.tensor(0.05, dtype=torch.float64))
        assert bool(((probs > 0) == cut).all())  # S = the public min-p set, whatever the private row


def test_markdown_puts_each_method_beside_its_ceiling_and_the_checks_in_the_same_table() -> None:
    def row(setting: str, method: str, eps: float, derailed: int) -> dict[str, object]:
        return {"task": "sanitize", "setting": setting, "method": method, "T_max": 24, "min_p": None, "epsilon": eps,
                "derailed": quality.share(derailed, 6), "english": 0.4, "similarity": 0.5, "ppl": 5.0,
                "loops": 0.0, "tokens": 24.0, "seconds": 10.0}

    res = {"model": "m", "seconds": 1.0, "sanitize": {
        "rows": [row("previous", "dp-fusion", 40.0, 2), row("current", "original", float("inf"), 0)],
        "document_tokens": 737, "spans": 20, "groups": 5,
        "checks": [{"setting": "previous", "min_p": None,
                    "audit": {"claimed_epsilon": 4.0, "epsilon_lb": 0.5, "trials": 2000, "exceeds": False},
                    "loss": {"skipped": "TAB data not found"}}]},
        "rag": {"skipped": "evaluation data not found"}}
    md = quality.markdown(res)
    assert "| previous | dp-fusion | 40 | 24 | – | – | 2/6 (33%" in md
    assert "| current | original | ∞ (no privacy) |" in md
    assert "0.500 / 4.000 (2000)" in md and "skipped (TAB data not found)" in md
    assert "rag: skipped (evaluation data not found)" in md


def test_merge_pools_split_runs_into_one_table_and_refuses_a_seed_measured_twice(tmp_path) -> None:
    import json

    def release(seed: int, derailed: bool) -> dict[str, object]:
        return {"seed": seed, "tokens": 10, "seconds": 1.0, "english": 0.4, "similarity": 0.2 if derailed else 0.6,
                "words": 9, "derailed": derailed, "ppl": 3.0, "loops": 0.0, "text": "x"}

    def part(name: str, setting: str, seeds: range, checks: list[dict[str, object]]) -> str:
        row = {"task": "sanitize", "setting": setting, "method": "dp-fusion", "T_max": 256, "min_p": None,
               "opening": None, "epsilon": 40.0, "releases": [release(s, s == 3) for s in seeds]}
        res = {"model": "m", "seconds": 5.0, "sanitize": {"rows": [quality.summarise_row(row)], "document_tokens": 7,
                                                          "spans": 2, "groups": 1, "checks": checks}}
        (tmp_path / name).write_text(json.dumps(res), encoding="utf-8")
        return str(tmp_path / name)

    audit = {"setting": "current", "min_p": 0.1, "audit": {"claimed_epsilon": 4.0, "epsilon_lb": 0.5,
                                                           "trials": 100, "exceeds": False}}
    loss = {"setting": "current", "min_p": 0.1, "audit": None, "loss": {"asr": 0.2, "asr_ci95": [0.1, 0.3], "games": 10,
                                                                  "docs": 3, "T_max": 64}}
    a = part("a.json", "current", range(0, 5), [{"setting": "current", "min_p": 0.1}, loss])
    b = part("b.json", "current", range(5, 10), [{**audit, "loss": {"skipped": "no TAB data"}}])
    cfg = quality.config_from_args(_args(merge=f"{a},{b}", out=str(tmp_path / "out")))
    res = quality.run(cfg)
    (row,) = res["sanitize"]["rows"]
    assert [x["seed"] for x in row["releases"]] == list(range(10)) and row["derailed"]["count"] == 1
    # one check row per setting: the audit of one run, the LOSS attack of the other
    assert row["derailed"]["n"] == 10 and res["sanitize"]["checks"] == [{**audit, "opening": None,
                                                                          "loss": loss["loss"]}]
    assert "1/10 (10%" in res["markdown"] and "the longest of 2 runs" in res["markdown"]
    assert (tmp_path / "out" / "bench_quality.md").is_file()
    with pytest.raises(ConfigurationError, match="same seed"):
        quality.merge_results([tmp_path / "a.json", tmp_path / "a.json"])


def test_rag_audit_runs_pad_with_each_settings_public_support_and_prints_it_beside_the_rows() -> None:
    from dpinfer.bench.quality_tasks import RAG_AUDIT_LEAD, pad_support, rag_audit
    from dpinfer.defaults import RAG

    assert pad_support("previous") == {"top_k": RAG.support_top_k, "min_p": None}
    assert pad_support("current") == {"top_k": RAG.support_top_k, "min_p": RAG.support_min_p}
    assert RAG_AUDIT_LEAD < -math.log(RAG.support_min_p)  # the pair's X is in the current support: not a trivial audit
    cfg = quality.config_from_args(_args(tasks="rag", audit_trials=400, seed=3))
    checks = rag_audit(cfg, lambda _: None)
    assert [(c["setting"], c["min_p"]) for c in checks] == [("previous", None), ("current", RAG.support_min_p)]
    for c in checks:
        a = c["audit"]
        assert a["claimed_epsilon"] == pytest.approx(4.0) and a["trials"] == 400 and not a["exceeds"]
    assert rag_audit(quality.config_from_args(_args(tasks="rag", audit_trials=0)), lambda _: None) == []
    row = {"setting": "current", "method": "pad", "epsilon": 64.0, "on_topic": quality.share(17, 20), "rouge_l": 0.1,
           "similarity": 0.4, "tokens": 50.0, "seconds": 1.0}
    md = quality.markdown({"model": "m", "seconds": 1.0, "rag": {"rows": [row], "docs": 100, "questions": 20,
                                                                 "checks": checks}})
    assert "| current | pad | 64 | 17/20 (85%" in md
    assert f"| current | Top-1⁺ ∩ min-p {RAG.support_min_p:g} | " in md and "| previous | Top-1⁺ | " in md
