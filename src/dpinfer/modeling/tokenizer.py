"""A model folder's tokenizer without transformers: ``tokenizer.json`` through the ``tokenizers`` library, the special
tokens from ``tokenizer_config.json``, and the chat template rendered with jinja2 exactly as transformers renders it
(its sandboxed environment, ``trim_blocks``/``lstrip_blocks``, ``loopcontrols``, the globals ``raise_exception``,
``strftime_now``, ``dict``, ``namespace`` and the ``tojson`` filter; the named special tokens passed to the template).

:class:`Tokenizer` has the part of a transformers fast tokenizer dpinfer uses: calling it on one text
(``input_ids``, ``attention_mask``, ``offset_mapping``), ``decode``, the special tokens and their ids,
``chat_template`` and ``apply_chat_template(messages, tokenize=False, add_generation_prompt=...)``, ``len()``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
"""The named special tokens (transformers' ``SPECIAL_TOKENS_ATTRIBUTES``), passed to a chat template by name."""

VERY_LARGE = int(1e30)
"""transformers' ``model_max_length`` when the folder gives none."""


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


@functools.lru_cache(maxsize=16)
def compile_template(template: str) -> Any:
    """A chat template compiled in transformers' jinja2 environment (``_cached_compile_jinja_template``; the
    ``{% generation %}`` tag renders its body, as transformers does without an assistant mask)."""
    import datetime

    import jinja2
    import jinja2.ext
    import jinja2.nodes
    import jinja2.utils
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(jinja2.ext.Extension):
        tags = frozenset({"generation"})

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller: Any) -> str:
            return str(caller())

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.datetime.now().strftime(fmt)

    class TemplateDict:
        def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError("chat templates cannot store underscore-prefixed attributes on "
                                                      "a namespace")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env.from_string(template)


def _clean_up_tokenization(text: str) -> str:
    """transformers' ``clean_up_tokenization`` (WordPiece-era spacing before punctuation and contractions)."""
    for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
                 (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(a, b)
    return text


class Tokenizer:
    """The tokenizer of a model folder (module docstring)."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as _Backend

        self.path = path
        self.backend = _Backend.from_file(str(path / "tokenizer.json"))
        cfg_file = path / "tokenizer_config.json"
        cfg: dict[str, Any] = json.loads(cfg_file.read_text(encoding="utf-8")) if cfg_file.is_file() else {}
        self.special: dict[str, str] = {}
        for name in SPECIAL_TOKENS:
            text = _token_text(cfg.get(name))
            if text is not None:
                self.special[name] = text
        template: Any = None
        jinja_file = path / "chat_template.jinja"
        if jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
        elif cfg.get("chat_template"):
            template = cfg["chat_template"]
            if isinstance(template, list):
                template = {t["name"]: t["template"] for t in template}
        self.chat_template: str | dict[str, str] | None = template
        self.model_max_length = int(cfg.get("model_max_length") or VERY_LARGE)
        self.clean_up_tokenization_spaces = bool(cfg.get("clean_up_tokenization_spaces", False)) and (
            type(self.backend.model).__name__ != "BPE")

    # ----------------------------------------------------------------------------------------- special tokens
    def convert_tokens_to_ids(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def _special_id(self, name: str) -> int | None:
        text = self.special.get(name)
        return None if text is None else self.backend.token_to_id(text)

    @property
    def eos_token(self) -> str | None:
        return self.special.get("eos_token")

    @property
    def pad_token(self) -> str | None:
        return self.special.get("pad_token")

    @property
    def bos_token(self) -> str | None:
        return self.special.get("bos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._special_id("eos_token")

    @property
    def pad_token_id(self) -> int | None:
        return self._special_id("pad_token")

    @property
    def bos_token_id(self) -> int | None:
        return self._special_id("bos_token")

    @property
    def special_tokens_map(self) -> dict[str, str]:
        return dict(self.special)

    def __len__(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    # ------------------------------------------------------------------------------------ encode and decode
    def __call__(self, text: str | Sequence[str], *, add_special_tokens: bool = True,
                 return_offsets_mapping: bool = False, **kwargs: Any) -> dict[str, Any]:
        """``text`` encoded as transformers' fast tokenizers do: one string gives lists, a list of strings gives one
        list per string (each encoded on its own)."""
        if kwargs:
            raise TypeError(f"unsupported tokenizer options: {', '.join(sorted(kwargs))}")
        if isinstance(text, str):
            encs, single = [self.backend.encode(text, add_special_tokens=add_special_tokens)], True
        elif isinstance(text, (list, tuple)) and all(isinstance(t, str) for t in text):
            encs = self.backend.encode_batch(list(text), add_special_tokens=add_special_tokens) if text else []
            single = False
        else:
            raise TypeError("dpinfer's tokenizer encodes a string or a list of strings")
        out: dict[str, Any] = {"input_ids": [list(e.ids) for e in encs],
                               "attention_mask": [list(e.attention_mask) for e in encs]}
        if return_offsets_mapping:
            out["offset_mapping"] = [[tuple(o) for o in e.offsets] for e in encs]
        return {k: v[0] for k, v in out.items()} if single else out

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int] | int, skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool | None = None) -> str:
        ids = [int(ids)] if isinstance(ids, int) else [int(i) for i in ids]
        text = self.backend.decode(ids, skip_special_tokens=skip_special_tokens)
        clean = self.clean_up_tokenization_spaces if clean_up_tokenization_spaces is None else \
            clean_up_tokenization_spaces
        return _clean_up_tokenization(text) if clean else text

    # ------------------------------------------------------------------------------------------ chat template
    def _template(self) -> str:
        template = self.chat_template
        if isinstance(template, dict):
            if "default" not in template:
                raise ValueError("this model has several chat templates and none named 'default'")
            template = template["default"]
        if not template:
            raise ValueError("this tokenizer has no chat template")
        return template

    def apply_chat_template(self, messages: Sequence[dict[str, Any]], *, tokenize: bool = False,
                            add_generation_prompt: bool = False, **kwargs: Any) -> Any:
        """``messages`` rendered with the chat template (transformers' ``render_jinja_template`` for one
        conversation; ``tools`` and ``documents`` as JSON-schema dicts); token ids when ``tokenize``."""
        chat = []
        for m in messages:  # transformers' reasoning-field aliases
            reasoning = next((m[k] for k in ("reasoning_content", "thinking", "reasoning") if m.get(k) is not None),
                             None)
            chat.append(dict(m) if reasoning is None else {"thinking": reasoning, **m, "reasoning_content": reasoning})
        tools, documents = kwargs.pop("tools", None), kwargs.pop("documents", None)
        text = compile_template(self._template()).render(
            messages=chat, tools=tools, documents=documents, add_generation_prompt=add_generation_prompt,
            **{**self.special, **kwargs})
        return self.encode(text, add_special_tokens=False) if tokenize else text
