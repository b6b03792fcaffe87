"""A document's prompt and token contexts for sanitisation (ALGORITHMS §1, step 2), and the public limits on them.

The prompt (rewriting instruction + document, in the model's chat template; :func:`build_prompt` places the document
by construction) is tokenised in parts: the template, and each run of the document with one group mask, separately
(:func:`prepare_contexts`), so no token joins a span's characters with untagged ones. A token of a run of group g is a
token of g. The *public* context replaces the tokens of every group by the placeholder token (the id of ``_``), one for
one; the *private* context of group i replaces those of every other group. All m + 1 contexts have the same length
and positions: one batch, one KV cache (:func:`prepare_contexts`).

T_max: :func:`default_max_new_tokens` follows the document's length (public under DP-Fusion's adjacency); the
whole-document methods, whose adjacency makes the length private, use a fixed T_max and a public cap on the document
(:func:`whole_document_cap`, :func:`cut_document`).
"""

from __future__ import annotations

import itertools
import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dpinfer.defaults import SANITIZE
from dpinfer.errors import ConfigurationError, ContextTooLongError
from dpinfer.protect.stage1 import truncate_tokens
from dpinfer.taggers.base import Span

if TYPE_CHECKING:
    from dpinfer.models import LM

PLACEHOLDER = "_"

DEFAULT_INSTRUCTION = (
    "Rewrite the following document in your own words. Keep its structure and meaning. "
    "Where a part is written as underscores (_), do not guess it: write a neutral expression instead."
)
"""Default rewriting instruction (chosen from the ε sweep of ``dpinfer bench sanitize``; see docs/sanitize.md)."""

BASELINE_MAX_NEW_TOKENS = SANITIZE.whole_document_max_new_tokens
"""Default ``T_max`` of ``dp-decoding`` and ``dp-prompt``: a fixed constant, since their adjacency is any two documents
and a T_max (or a calibration) read from the document would reveal its length. Pass ``max_new_tokens`` to change it."""


@dataclass
class PreparedContexts:
    """The token contexts of one document (public first, then one private context per group)."""

    public: list[int]
    private: list[list[int]]
    original: list[int]
    group_names: list[str]
    document_tokens: int
    private_tokens: dict[str, int]
    document_start: int = 0
    """Index of the document's first token in every context (the template before it is public)."""
    placeholder: int = -1
    """The placeholder token's id."""

    def opening(self, max_tokens: int | None) -> list[int]:
        """The PUBLIC opening (:func:`public_opening`) of these contexts, at most ``max_tokens`` (None or 0: none)."""
        if not max_tokens:
            return []
        return public_opening(self.public, self.document_start, self.document_tokens, self.placeholder, max_tokens)


def public_opening(public: Sequence[int], start: int, document_tokens: int, placeholder: int,
                   max_tokens: int) -> list[int]:
    """The document's first tokens as the PUBLIC context shows them: from ``start``, up to (not including) the first
    placeholder, at most ``max_tokens``. It reads the public context only (rule: public rows never depend on private
    ones); under replace-by-null the untagged text, the placeholders' positions and the length are public, so every
    neighbouring document has the same opening and forcing it costs no privacy.

    >>> public_opening([9, 9, 5, 6, 7, 0, 8], 2, 5, 0, 16), public_opening([9, 9, 5, 6, 7, 0, 8], 2, 5, 0, 2)
    ([5, 6, 7], [5, 6])
    """
    out: list[int] = []
    for tok in public[start: start + min(int(max_tokens), int(document_tokens))]:
        if tok == placeholder:
            break
        out.append(int(tok))
    return out


def build_prompt(lm: LM, document: str, instruction: str) -> tuple[str, int]:
    """The chat prompt and the character offset of ``document`` inside it, placed by construction.

    The template is rendered once with a random sentinel in place of the document; the sentinel must occur exactly
    once, and rendering the real document must give the same prompt with the document at the sentinel's offset. The
    offset is never searched for (``prompt.find(document)`` would land on an earlier copy of the document's text, e.g.
    a document "Hugging Face" inside SmolLM2's default system prompt, and leave the real text in the public context).
    """
    sentinel = f"\x00dpinfer-document-{secrets.token_hex(16)}\x00"
    template = lm.instruction_prompt(f"{instruction}\n\n{sentinel}")
    if template.count(sentinel) != 1:
        raise ConfigurationError("the model's chat template does not place the message content verbatim exactly once; "
                                 "use a model whose template keeps message content verbatim")
    offset = template.index(sentinel)
    prompt = lm.instruction_prompt(f"{instruction}\n\n{document}")
    if prompt != template[:offset] + document + template[offset + len(sentinel):]:
        raise ConfigurationError("the model's chat template altered the document; use a model whose template "
                                 "keeps message content verbatim")
    return prompt, offset


def placeholder_id(lm: LM) -> int:
    ids = lm.encode(PLACEHOLDER)
    if len(ids) != 1:
        raise ConfigurationError(f"the tokenizer has no single token for the placeholder {PLACEHOLDER!r}")
    return ids[0]


def span_mask(document: str, spans: Sequence[Span], label_group: Mapping[str, int]) -> np.ndarray:
    """The bitmask of groups per character of ``document``: each span's characters, and the space just before it
    when that space is untagged (a public character: the placeholders absorb it whatever the span holds, as a
    byte-level tokenizer's `` word`` token would)."""
    mask = np.zeros(len(document), dtype=np.int64)
    for s in spans:
        gi = label_group.get(s.label)
        if gi is not None:
            mask[s.start: s.end] |= 1 << gi
    for s in spans:
        gi = label_group.get(s.label)
        if gi is not None and s.start > 0 and document[s.start - 1] == " " and mask[s.start - 1] == 0:
            mask[s.start - 1] = 1 << gi
    return mask


def segments(document: str, mask: np.ndarray) -> list[tuple[str, int]]:
    """``document`` cut into maximal runs of one group mask: ``[(text, mask), ...]`` (0: untagged)."""
    if not len(document):
        return []
    cuts = [0, *(np.flatnonzero(mask[1:] != mask[:-1]) + 1).tolist(), len(document)]
    return [(document[a:b], int(mask[a])) for a, b in itertools.pairwise(cuts)]


def prepare_contexts(lm: LM, document: str, spans: Sequence[Span], groups: Mapping[str, Sequence[str]],
                     instruction: str) -> PreparedContexts:
    """Build the public and per-group private contexts (ALGORITHMS §1).

    The template before and after the document and every run of the document with one group mask (untagged text,
    or the characters of one or more groups' spans, :func:`span_mask`) are tokenised SEPARATELY, so no token joins
    private characters with public ones: each untagged run's tokens are a function of its own text, and the public
    context (hence the opening) is the same for every document that differs only inside its spans (up to the
    spans' token lengths, public under the adjacency). A token of a run of group g is a token of g."""
    prompt, offset = build_prompt(lm, document, instruction)
    names = list(groups)
    label_group = {lab: gi for gi, name in enumerate(names) for lab in groups[name]}
    pieces = [(prompt[:offset], 0), *segments(document, span_mask(document, spans, label_group)),
              (prompt[offset + len(document):], 0)]
    texts = [t for t, _ in pieces]
    encoded = lm.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    ids_list: list[int] = []
    mask_list: list[int] = []
    for (text, m), toks in zip(pieces, encoded, strict=True):
        if text and not toks:
            raise ConfigurationError("the tokenizer gave no token for a part of the prompt; use a model whose "
                                     "tokenizer is byte-level (every character has a token)")
        ids_list.extend(int(t) for t in toks)
        mask_list.extend([m] * len(toks))
    if lm.tokenizer.decode(ids_list, skip_special_tokens=False, clean_up_tokenization_spaces=False) != prompt:
        raise ConfigurationError("the tokenizer does not tokenise the prompt's parts verbatim (it adds or drops "
                                 "characters at their edges); nothing was generated. Use a model with a byte-level "
                                 "BPE tokenizer")
    ids = np.asarray(ids_list, dtype=np.int64)
    token_mask = np.asarray(mask_list, dtype=np.int64)
    ph = placeholder_id(lm)
    public = np.where(token_mask != 0, ph, ids)
    private = []
    counts = {}
    for gi, name in enumerate(names):
        others = token_mask & ~(1 << gi)
        private.append(np.where(others != 0, ph, ids).tolist())
        counts[name] = int(((token_mask >> gi) & 1).sum())
    start = len(encoded[0]) if encoded else 0  # the template's token count: public
    doc_tokens = len(ids_list) - start - (len(encoded[-1]) if encoded else 0)
    return PreparedContexts(public=public.tolist(), private=private, original=ids.tolist(), group_names=names,
                            document_tokens=doc_tokens, private_tokens=counts, document_start=start, placeholder=ph)


def default_max_new_tokens(document_tokens: int, cap: int | None = SANITIZE.max_new_tokens_cap) -> int:
    """DP-Fusion's default ``T_max``: a rewrite about as long as the document, ``ceil(1.1 · document tokens) + 16``,
    at most ``cap`` (:data:`~dpinfer.defaults.SANITIZE` ``.max_new_tokens_cap``; ``None``: no cap).

    It reads the document's token count, which is public under DP-Fusion's adjacency (replace-by-null and replace-one
    keep every token's position: the public context has the document's length); the cap is a constant. It is NOT
    used for ``dp-decoding`` and ``dp-prompt``, whose adjacency is any two documents: they use
    :data:`BASELINE_MAX_NEW_TOKENS`. A longer rewrite: pass ``max_new_tokens`` (every token is charged).

    >>> default_max_new_tokens(100), default_max_new_tokens(737, cap=None), default_max_new_tokens(737, cap=256)
    (127, 827, 256)
    """
    t = math.ceil(1.1 * document_tokens) + 16
    return t if cap is None else min(t, int(cap))


INPUT_MARGIN = 4
"""Tokens allowed for the tokenizer merging the document's first or last token with the template around it."""


def whole_document_cap(lm: LM, instruction: str, *, max_new_tokens: int, max_input_tokens: int | None) -> int:
    """The PUBLIC cap on a document's tokens for the methods whose neighbour is any other document (``dp-decoding``,
    ``dp-prompt``): ``max_input_tokens``, or (None) all that the context window leaves after the instruction template
    (+ :data:`INPUT_MARGIN`) and ``max_new_tokens``. Settings that leave no room are refused here, by the settings and
    the model alone: no refusal or message of these methods depends on the document's length."""
    template = len(lm.encode(build_prompt(lm, "", instruction)[0])) + INPUT_MARGIN
    room = lm.context_window - template - max_new_tokens
    cap = room if max_input_tokens is None else int(max_input_tokens)
    if cap < 1 or cap > room:
        what = f"max_input_tokens={max_input_tokens} with " if max_input_tokens is not None else ""
        raise ContextTooLongError(
            f"{what}the instruction template ({template} tokens) and max_new_tokens={max_new_tokens} exceed the "
            f"model's context window ({lm.context_window}); lower --max-input-tokens or --max-new-tokens"
        )
    return cap


def cut_document(lm: LM, text: str, spans: list[Span], cap: int, instruction: str) -> tuple[str, list[Span]]:
    """``text`` cut to its first ``cap`` tokens (a prefix, at a token boundary; its prompt then fits the public
    bound of :func:`whole_document_cap`), and the spans that lie inside it. Silent: the length is private."""
    bound = len(lm.encode(build_prompt(lm, "", instruction)[0])) + INPUT_MARGIN + cap
    keep = cap
    cut = truncate_tokens(lm, text, keep)
    while keep > 1 and len(lm.encode(build_prompt(lm, cut, instruction)[0])) > bound:  # rare: template merges
        keep -= 1
        cut = truncate_tokens(lm, text, keep)
    if cut == text:
        return text, spans
    return cut, [sp for sp in spans if sp.end <= len(cut)]
