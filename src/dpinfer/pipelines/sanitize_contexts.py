"""A document's prompt and token contexts for sanitisation (ALGORITHMS §1, step 2), and the public limits on them.

The prompt (rewriting instruction + document, in the model's chat template) is tokenised ONCE with character
offsets (:func:`build_prompt` places the document by construction). A token overlapping a span of group g is a token
of g. The *public* context replaces the tokens of every group by the placeholder token (the id of ``_``), one for
one; the *private* context of group i replaces those of every other group. All m + 1 contexts have the same length
and positions: one batch, one KV cache (:func:`prepare_contexts`).

T_max: :func:`default_max_new_tokens` follows the document's length (public under DP-Fusion's adjacency); the
whole-document methods, whose adjacency makes the length private, use a fixed T_max and a public cap on the document
(:func:`whole_document_cap`, :func:`cut_document`).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dpinfer.defaults import SANITIZE
from dpinfer.errors import ConfigurationError, ContextTooLongError
from dpinfer.pipelines.protect_prompt import truncate_tokens
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


def prepare_contexts(lm: LM, document: str, spans: Sequence[Span], groups: Mapping[str, Sequence[str]],
                     instruction: str) -> PreparedContexts:
    """Tokenise the prompt once and build the public and per-group private contexts (ALGORITHMS §1)."""
    prompt, offset = build_prompt(lm, document, instruction)
    enc = lm.tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)
    ids = np.asarray(enc["input_ids"], dtype=np.int64)
    offsets = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
    names = list(groups)
    label_group = {lab: gi for gi, name in enumerate(names) for lab in groups[name]}
    # bitmask of groups per character of the prompt, then OR-reduced per token span
    char_mask = np.zeros(len(prompt) + 1, dtype=np.int64)
    for s in spans:
        gi = label_group.get(s.label)
        if gi is not None:
            char_mask[offset + s.start: offset + s.end] |= 1 << gi
    token_mask = np.zeros(len(ids), dtype=np.int64)
    nonempty = offsets[:, 1] > offsets[:, 0]
    if nonempty.any():
        starts = offsets[nonempty, 0]
        ends = offsets[nonempty, 1]
        # OR over [start, end) per token: via cumulative counts per bit (tokens are short; groups ≤ 63)
        for gi in range(len(names)):
            bit = ((char_mask >> gi) & 1).astype(np.int64)
            csum = np.concatenate([[0], np.cumsum(bit)])
            hit = (csum[ends] - csum[starts]) > 0
            token_mask[np.flatnonzero(nonempty)[hit]] |= 1 << gi
    _check_spans_covered(char_mask, token_mask, offsets)
    ph = placeholder_id(lm)
    public = np.where(token_mask != 0, ph, ids)
    private = []
    counts = {}
    for gi, name in enumerate(names):
        others = token_mask & ~(1 << gi)
        private.append(np.where(others != 0, ph, ids).tolist())
        counts[name] = int(((token_mask >> gi) & 1).sum())
    in_doc = (offsets[:, 0] >= offset) & (offsets[:, 0] < offset + len(document))
    doc_tokens = int(in_doc.sum())
    start = int(np.argmax(in_doc)) if doc_tokens else len(ids)  # a function of the template's length: public
    return PreparedContexts(public=public.tolist(), private=private, original=ids.tolist(), group_names=names,
                            document_tokens=doc_tokens, private_tokens=counts, document_start=start, placeholder=ph)


def _check_spans_covered(char_mask: np.ndarray, token_mask: np.ndarray, offsets: np.ndarray) -> None:
    """Fail closed unless every private character lies inside a token that the public context replaces."""
    covered = np.zeros(len(char_mask) + 1, dtype=np.int64)
    hidden = (token_mask != 0) & (offsets[:, 1] > offsets[:, 0])
    np.add.at(covered, offsets[hidden, 0], 1)
    np.add.at(covered, offsets[hidden, 1], -1)
    exposed = (char_mask != 0) & (np.cumsum(covered)[: len(char_mask)] <= 0)
    if exposed.any():
        raise ConfigurationError(
            f"{int(exposed.sum())} tagged characters are not covered by a replaced token (the tokenizer's offsets "
            "miss them); nothing was generated. Use a model whose fast tokenizer returns character offsets"
        )


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
