"""dpinfer's own model code (:mod:`dpinfer.modeling`) against transformers: logits, greedy tokens, chat templates,
and the load path's imports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dpinfer.bench.speed import SHAPES
from dpinfer.engine.prefill import left_pad
from dpinfer.modeling import folder_unsupported_reason, load_causal_lm

TOL = 1e-4
STEPS = 64

# tiny random-weight versions of each SHAPES entry (same architecture, head ratio, tie and RoPE base), plus Llama 3's
# RoPE scaling and Mistral
SHRINK = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, vocab_size=256, max_position_embeddings=512)
GROUPS = {name: shape["num_attention_heads"] // shape["num_key_value_heads"] for name, shape in SHAPES.items()}
FAMILIES = {
    **{name: {**shape, **SHRINK, "num_attention_heads": 2 * GROUPS[name], "hidden_size": 32 * GROUPS[name],
              "num_key_value_heads": 2, "head_dim": 16}
       for name, shape in SHAPES.items()},
    "llama-3-rope-scaling": dict(model_type="llama", **SHRINK, num_attention_heads=4, num_key_value_heads=2,
                                 tie_word_embeddings=False, rope_theta=500000.0,
                                 rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "mistral": dict(model_type="mistral", **SHRINK, num_attention_heads=4, num_key_value_heads=1,
                    tie_word_embeddings=False, sliding_window=None, rope_theta=1000000.0),
}


def build(tmp: Path, fields: dict) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A random-weight transformers model of ``fields`` saved to ``tmp`` and reloaded by dpinfer's loader."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(fields)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    with torch.no_grad():  # peaked distributions, so that greedy tokens are not decided by rounding
        hf.get_output_embeddings().weight.mul_(8.0)
        for name, p in hf.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0, 0.5)
    hf.save_pretrained(tmp)
    (tmp / "tokenizer.json").write_text("{}")  # the loader's check; the forward reads no tokenizer
    assert folder_unsupported_reason(tmp) is None
    return hf, load_causal_lm(tmp, torch.device("cpu"), torch.float32)


def run_both(hf, own, rows: list[list[int]], steps: int = STEPS) -> tuple[float, list, list]:
    """Left-padded prefill of ``rows`` and ``steps`` decode steps on both forwards, each fed its own greedy tokens;
    returns the largest logit difference while the tokens agree, and both token sequences."""
    from transformers import DynamicCache

    ids, mask = left_pad(rows, 0, "cpu")
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    caches = [DynamicCache(config=hf.config), own.new_cache()]
    worst, tokens = 0.0, ([], [])
    inputs = [ids, ids]
    with torch.inference_mode():
        for _ in range(steps + 1):
            outs = [model(input_ids=x, attention_mask=mask, position_ids=pos, cache=c, use_cache=True,
                          logits_to_keep=1).logits[:, -1] for model, x, c in zip((hf, own), inputs, caches,
                                                                                  strict=True)]
            if all(a == b for a, b in zip(*tokens, strict=True)):
                worst = max(worst, float((outs[0] - outs[1]).abs().max()))
            nxt = [o.argmax(-1) for o in outs]
            for t, n in zip(tokens, nxt, strict=True):
                t.append(n.tolist())
            inputs = [n[:, None] for n in nxt]
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            pos = pos[:, -1:] + 1
    return worst, tokens[0], tokens[1]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_own_forward_matches_transformers(tmp_path: Path, family: str) -> None:
    hf, own = build(tmp_path, FAMILIES[family])
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (19, 7, 12)]
    worst, hf_tokens, own_tokens = run_both(hf, own, rows)
    assert worst < TOL
    assert own_tokens == hf_tokens
    worst, hf_tokens, own_tokens = run_both(hf, own, rows[:1], steps=4)  # no padding: the causal kernel, no mask
    assert worst < TOL and own_tokens == hf_tokens


def test_own_model_shares_the_engine_paths(tmp_path: Path) -> None:
    """The tied head is the embedding; packing and the int8 twin find the own model's linears."""
    from dpinfer.packed import pack_linears
    from dpinfer.quantize import int8_decode_twin

    hf, own = build(tmp_path, FAMILIES["qwen2.5-0.5b"])
    assert own.lm_head.weight is own.model.embed_tokens.weight
    assert own.model.layers[0].self_attn.q_proj.bias is not None and own.model.layers[0].self_attn.o_proj.bias is None
    n_linear = sum(isinstance(m, torch.nn.Linear) for m in own.modules())
    assert pack_linears(own) == n_linear
    twin = int8_decode_twin(own)
    x = torch.tensor([[5, 6, 7], [8, 9, 10]])
    with torch.inference_mode():
        ref = hf(x).logits
        assert (own(x).logits - ref).abs().max() < TOL  # packed layers: float32 rounding only
        step = twin(x[:, :1]).logits  # one position: the int8 layers
    assert step.shape == (2, 1, 256) and torch.isfinite(step).all()


def test_embedded_model_matches_transformers(embedded_lm) -> None:
    from transformers import AutoModelForCausalLM

    assert embedded_lm.backend == "own"
    from dpinfer.packed import pack_linears

    hf = AutoModelForCausalLM.from_pretrained(embedded_lm.source, dtype=torch.float32).eval()
    if embedded_lm.packed_linears:  # the same linear kernels on both sides: the forward code is what is compared
        pack_linears(hf)
    prompt = embedded_lm.encode(embedded_lm.instruction_prompt("Describe the Court's procedure."))
    rows = [prompt, prompt[:-9], embedded_lm.encode("The applicant was born in 1970 and lives in")]
    worst, hf_tokens, own_tokens = run_both(hf, embedded_lm.model, rows)
    assert worst < TOL
    assert own_tokens == hf_tokens


# -------------------------------------------------------------------------------------------- chat templates
QWEN25_TEMPLATE = (
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\n<tools>\" }}\n    {%- for tool in tools %}\n        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n    {%- endfor %}\n    {{- \"\\n</tools><|im_end|>\\n\" }}\n{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n        {{- '<|im_start|>user\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n        {{- '\\n</tool_response><|im_end|>\\n' }}\n    {%- endif %}\n"
    "{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n"
)
LLAMA3_TEMPLATE = (
    "{{- bos_token }}\n{%- if not date_string is defined %}\n"
    "    {%- set date_string = strftime_now(\"%d %b %Y\") %}\n{%- endif %}\n"
    "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content']|trim %}\n"
    "    {%- set messages = messages[1:] %}\n{%- else %}\n    {%- set system_message = \"\" %}\n{%- endif %}\n"
    "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
    "{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n"
    "{{- system_message }}\n{{- \"<|eot_id|>\" }}\n{%- set ns = namespace(n=0) %}\n"
    "{%- for message in messages %}\n    {%- if message['role'] not in ['user', 'assistant'] %}\n"
    "        {{- raise_exception('roles must be user or assistant') }}\n    {%- endif %}\n"
    "    {%- set ns.n = ns.n + 1 %}\n"
    "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
    "'<|eot_id|>' }}\n    {%- if loop.index > 50 %}{% break %}{% endif %}\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n"
)
CONVERSATIONS = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "What is a kettle for?"},
     {"role": "assistant", "content": "Boiling water."}, {"role": "user", "content": "And a {\"json\": 1}?"}],
]


def _tokenizer_folder(tmp: Path, template: str, bos: str, eos: str) -> Path:
    """A tokenizer folder (tokenizer.json + tokenizer_config.json with a chat template) made here."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate([bos, eos, "<|im_start|>", "<|im_end|>", "a", "b"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="a"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp / "tokenizer.json"))
    (tmp / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": bos, "eos_token": eos, "pad_token": eos, "chat_template": template,
        "tokenizer_class": "PreTrainedTokenizerFast"}))
    return tmp


@pytest.mark.parametrize("which", ["qwen2.5", "llama3"])
def test_chat_templates_render_as_transformers(tmp_path: Path, which: str) -> None:
    from transformers import AutoTokenizer

    from dpinfer.modeling.tokenizer import Tokenizer

    if which == "qwen2.5":
        folder = _tokenizer_folder(tmp_path, QWEN25_TEMPLATE, "<|endoftext|>", "<|im_end|>")
    else:
        folder = _tokenizer_folder(tmp_path, LLAMA3_TEMPLATE, "<|begin_of_text|>", "<|eot_id|>")
    own, hf = Tokenizer(folder), AutoTokenizer.from_pretrained(folder)
    for conv in CONVERSATIONS:
        for gen in (True, False):
            assert own.apply_chat_template(conv, add_generation_prompt=gen) == hf.apply_chat_template(
                conv, tokenize=False, add_generation_prompt=gen)
    if which == "qwen2.5":
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"é": 1}}}]
        assert own.apply_chat_template(CONVERSATIONS[0], tools=tools) == hf.apply_chat_template(
            CONVERSATIONS[0], tools=tools, tokenize=False)
    else:
        with pytest.raises(Exception, match="roles must be"):
            own.apply_chat_template([{"role": "tool", "content": "x"}])
    assert (own.eos_token_id, own.pad_token_id, own.bos_token_id) == (hf.eos_token_id, hf.pad_token_id,
                                                                       hf.bos_token_id)


def test_embedded_tokenizer_as_transformers(embedded_lm) -> None:
    from transformers import AutoTokenizer

    own, hf = embedded_lm.tokenizer, AutoTokenizer.from_pretrained(embedded_lm.source)
    for conv in CONVERSATIONS:
        for gen in (True, False):
            assert own.apply_chat_template(conv, add_generation_prompt=gen) == hf.apply_chat_template(
                conv, tokenize=False, add_generation_prompt=gen)
    text = "Mr John Smith, born on 12 March 1961 — lives in Zürich.\n\n<|im_end|> ok"
    for special in (True, False):
        a = own(text, add_special_tokens=special, return_offsets_mapping=True)
        b = hf(text, add_special_tokens=special, return_offsets_mapping=True)
        assert a["input_ids"] == b["input_ids"] and a["offset_mapping"] == [tuple(o) for o in b["offset_mapping"]]
        for skip in (True, False):
            assert own.decode(a["input_ids"], skip_special_tokens=skip) == hf.decode(a["input_ids"],
                                                                                 skip_special_tokens=skip)
    assert (len(own), own.pad_token_id, own.eos_token_id) == (len(hf), hf.pad_token_id, hf.eos_token_id)


# ---------------------------------------------------------------------------------------------- the load path
def test_loading_a_supported_model_imports_no_transformers(tiny_model_dir: Path) -> None:
    code = ("import sys; from dpinfer.models import load_model; from dpinfer.engine import Engine; "
            "from dpinfer.mechanisms.sampler import Sampler; "
            f"lm = load_model({str(tiny_model_dir)!r}, device='cpu'); "
            "ids = lm.encode(lm.chat_prompt([{'role': 'user', 'content': 'hi'}])); "
            "Engine(lm).generate([ids, ids[:-2]], Sampler(temperature=0, mode='independent'), max_new_tokens=3); "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('transformers', 'scipy') "
            "or m.startswith('torch._dynamo')); print(lm.backend, bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.strip().splitlines()[-1] == "own []"


def test_backend_choice(tiny_model_dir: Path, tiny_lm, tiny_hf_lm) -> None:
    from dpinfer.errors import ConfigurationError
    from dpinfer.models import load_model

    assert (tiny_lm.backend, tiny_hf_lm.backend) == ("own", "hf")
    with pytest.raises(ConfigurationError, match="unknown backend"):
        load_model(str(tiny_model_dir), backend="vllm")
    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    assert folder_unsupported_reason(tiny_model_dir) is None
    from dpinfer.modeling import unsupported_reason

    assert "architecture 'gemma2'" in unsupported_reason({**cfg, "model_type": "gemma2"})
    assert unsupported_reason({**cfg, "model_type": "mistral", "sliding_window": 4096}) == "a sliding attention window"
