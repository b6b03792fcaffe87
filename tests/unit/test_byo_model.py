"""Bring your own model: a random-weight Qwen2.5-shape model (tiny dims, built from a config) through ``--model``.

The README's "Bring your own model" section points ``--model`` at a local instruct model folder; this keeps that path
from rotting for the Qwen2 architecture (Qwen2.5) and its ChatML template with a default system prompt.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpinfer.cli import main
from dpinfer.taggers import Span

QWEN_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n"
    "{%- else %}<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    "{%- endif %}{%- for m in messages %}{%- if m['role'] != 'system' %}<|im_start|>{{ m['role'] }}\n"
    "{{ m['content'] }}<|im_end|>\n{%- endif %}{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- endif %}"
)
DOC = "Mr Smith, a lawyer practising in London, lodged application no. 36244/06 on 20 May 1998."
SPANS = [Span(3, 8, "PERSON"), Span(33, 39, "LOC"), Span(64, 72, "CODE"), Span(76, 87, "DATETIME")]


@pytest.fixture(scope="module")
def qwen_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen2ForCausalLM (the Qwen2.5 architecture) with random weights and tiny dims, saved like a downloaded
    instruct model: config, weights, tokenizer and a Qwen-style chat template."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tok = AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)
    tok.chat_template = QWEN_TEMPLATE
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(cfg)
    path = tmp_path_factory.mktemp("tiny-qwen2.5")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_qwen_shape_model_loads_and_sanitizes(qwen_dir: Path) -> None:
    import dpinfer
    from dpinfer.models import load_model

    lm = load_model(str(qwen_dir), device="cpu")
    assert lm.model.config.model_type == "qwen2"
    assert "You are Qwen" in lm.instruction_prompt("hi")  # the model's own chat template is used
    res = dpinfer.sanitize(DOC, lm=lm, spans=SPANS, max_new_tokens=4, seed=0)
    assert res.generated_tokens <= 4
    assert res.settings["model"] == str(qwen_dir)
    assert sorted(g.name for g in res.guarantee.groups) == ["CODE", "DATETIME", "LOC", "PERSON"]
    assert res.guarantee.epsilon <= 40.0


def test_qwen_shape_model_on_the_command_line(qwen_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    doc = tmp_path / "doc.txt"
    doc.write_text(DOC)
    spans = tmp_path / "spans.json"
    spans.write_text(json.dumps([s.to_dict() for s in SPANS]))
    assert main(["sanitize", str(doc), "--spans", str(spans), "--model", str(qwen_dir), "--max-new-tokens", "3",
                 "--seed", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["settings"]["model"] == str(qwen_dir) and out["generated_tokens"] <= 3
    assert main(["generate", "The applicant", "--model", str(qwen_dir), "--max-new-tokens", "3", "--chat",
                 "--seed", "0"]) == 0


def test_models_says_what_the_embedded_model_is_for(capsys: pytest.CaptureFixture) -> None:
    assert main(["models", "--json"]) == 0
    note = json.loads(capsys.readouterr().out)["note"]
    assert "demonstration" in note and "--model" in note and "Qwen2.5" in note
    assert main(["models"]) == 0
    captured = capsys.readouterr()
    assert "Bring your own model" in captured.out + captured.err
