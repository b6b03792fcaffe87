"""End-to-end checks on the embedded SmolLM2-135M-Instruct (marked ``e2e``; a small set, about a minute on 2 CPUs)."""

from __future__ import annotations

import json

import pytest
import torch

from dpinfer.bench.engine import document_prompt_ids, example_document
from dpinfer.engine import Engine
from dpinfer.generation import generate
from dpinfer.mechanisms.sampler import Sampler

pytestmark = pytest.mark.e2e


def test_embedded_loads_offline_and_greedy_matches_hf_generate(embedded_lm, no_network):
    from dpinfer.models import load_model

    lm = load_model(device="cpu")  # a second load, with the network blocked
    ids = document_prompt_ids(lm, 300)
    out = Engine(lm).generate([ids], Sampler(temperature=0), max_new_tokens=32, min_new_tokens=32)
    assert lm.backend == "own"  # the engine runs dpinfer's own model code; transformers' generate is the reference
    hf_lm = load_model(device="cpu", backend="hf")
    x = torch.tensor([ids])
    with torch.inference_mode():
        hf = hf_lm.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=32,
                                  min_new_tokens=32, pad_token_id=hf_lm.pad_token_id)
    assert out.sequences[0] == hf[0, len(ids):].tolist()


def test_generate_uses_prompt_verbatim(embedded_lm):
    res = generate("The European Court of Human Rights", lm=embedded_lm, max_new_tokens=8, temperature=0)
    assert res.prompt_tokens == len(embedded_lm.tokenizer("The European Court of Human Rights",
                                                          add_special_tokens=False)["input_ids"])
    assert res.text and "no privacy guarantee" in str(res.guarantee)


def test_identical_contexts_joint_rows_agree(embedded_lm):
    ids = document_prompt_ids(embedded_lm, 200)
    seen = []

    class Check(Sampler):
        def step(self, logits, info, generator):
            p = torch.softmax(logits, -1)
            seen.append(float((p - p[:1]).abs().max()))
            return super().step(logits, info, generator)

    Engine(embedded_lm).generate([ids] * 3, Check(temperature=0, mode="joint"), max_new_tokens=6)
    # the public row 0 is prefilled alone and decoded in its own batch layout (rule 2), so rows 1-2 run other float32
    # kernels: they agree to float32 rounding (1.2e-6 measured on this CPU), not bit for bit
    assert 0 < len(seen) and max(seen) < 1e-5


def test_cli_sanitize_example_document(embedded_lm, capsys):
    from pathlib import Path

    from dpinfer.cli import main

    root = Path(__file__).resolve().parents[2]
    doc = root / "examples" / "echr_case_001-66929.txt"
    spans = root / "examples" / "echr_case_001-66929.spans.json"
    assert example_document().startswith("PROCEDURE")
    rc = main(["sanitize", str(doc), "--spans", str(spans), "--spans-only", "--max-new-tokens", "24", "--seed", "0",
               "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    groups = {g["name"]: g for g in out["guarantee"]["groups"]}
    assert set(groups) == {"PERSON", "CODE", "LOC", "ORG", "DEM", "DATETIME"}
    assert out["guarantee"]["epsilon"] == pytest.approx(max(g["epsilon"] for g in groups.values()))
    assert out["generated_tokens"] <= 24 and out["text"]
