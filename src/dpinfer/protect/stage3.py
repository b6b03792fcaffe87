"""DP-GTR stage 3: the final prompt, written greedily from an exemplar and the keywords to avoid (ALGORITHMS §4).

Post-processing of released text only (the rewrites, the exemplars, the keywords): nothing here reads a prompt.

* The request is :data:`FINAL_TEMPLATE` in the model's chat template; with ``suppress="ban"`` (the default) every
  spelling of each keyword is also banned while decoding (:func:`keyword_ban`, transformers' "bad words" rule per
  row), since a small model does not follow a negative instruction reliably.
* Template echoes are stripped (:func:`strip_echoes`): the final prompt is the first line that survives, so a row
  stops as soon as that line is complete (:class:`StopAfterFirstLine`: the same final prompt in fewer steps).
* With several exemplars per prompt, one final prompt is written from each (all in ONE engine run) and the one
  released is the candidate closest to the rewrites' consensus (:func:`closest_to_consensus`, :func:`stage3_choices`).
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dpinfer.configs.protect import SUPPRESS_METHODS, check_quorum
from dpinfer.defaults import PROTECT
from dpinfer.errors import ConfigurationError
from dpinfer.mechanisms.sampler import Sampler
from dpinfer.mechanisms.transforms import BanSequences

if TYPE_CHECKING:
    from dpinfer.engine import Engine, PrefixStore
    from dpinfer.models import LM

FINAL_TEMPLATE = ("Refer to the following question to generate a new question:\n{exemplar}\n"
                  "Avoid using the following tokens:\n{keywords}\nGenerated question:\n")
"""Stage 3's prompt (ALGORITHMS §4), put in the model's chat template; decoded greedily."""

_ECHO_LINES = re.compile(
    r"^\s*(refer to the following question|avoid using the following tokens|generated question|new question|"
    r"paraphrased? (question|text)|question)\s*[:：]\s*",
    re.IGNORECASE,
)


def strip_echoes(text: str, keywords: Sequence[str] = ()) -> str:
    """The generated question without template echoes: a leading label (``Generated question:`` …) removed, lines
    that repeat the template's instructions or list the keywords dropped, the first remaining line kept, surrounding
    quotes and markdown stripped.

    >>> strip_echoes('Generated question:\\n"Where can you buy a violin?"\\nAvoid using the following tokens: violin')
    'Where can you buy a violin?'
    >>> strip_echoes("Avoid using the following tokens:\\ncity, town\\nWhat do people need?", ["city", "town"])
    'What do people need?'
    """
    listing = ", ".join(keywords).lower()
    for line in text.splitlines():
        line = line.strip()
        low = line.lower()
        if not line or low.startswith(("refer to the following question", "avoid using the following tokens")):
            continue
        if listing and low.rstrip(".") == listing:
            continue
        line = _ECHO_LINES.sub("", line.strip("*#").strip()).strip().strip("*").strip()
        line = line.strip("\"'“”‘’`").strip()
        if line:
            return line
    return ""


def closest_to_consensus(candidates: Sequence[str], rewrites: Sequence[str], embedder: Any) -> int:
    """The index of the candidate whose sentence embedding is closest (cosine) to the mean embedding of the
    non-empty ``rewrites``: the candidate that best keeps what the rewrites agree on. Reads released text only
    (post-processing); the first candidate when there is nothing to compare with.

    >>> import numpy as np
    >>> class Letters:  # a stand-in embedder: one axis per first letter
    ...     def encode(self, texts):
    ...         out = np.zeros((len(texts), 26), dtype=np.float32)
    ...         for i, t in enumerate(texts):
    ...             out[i, ord(t.strip()[:1].lower() or "a") - 97] = 1.0
    ...         return out
    >>> closest_to_consensus(["Apple?", "Banana?"], ["bread", "butter", "apple"], Letters())
    1
    """
    import numpy as np

    texts = [r for r in rewrites if r.strip()]
    if len(candidates) < 2 or not texts:
        return 0
    vectors = np.asarray(embedder.encode(texts + [c if c.strip() else "?" for c in candidates]), dtype=np.float64)
    centre = vectors[: len(texts)].mean(axis=0)  # one encoder call for the rewrites and the candidates
    norm = float(np.linalg.norm(centre))
    if norm == 0.0:
        return 0
    sims = vectors[len(texts):] @ (centre / norm)
    return int(np.argmax(sims))


_MARK = "\x00exemplar\x00"
"""A stand-in for the exemplar, to split the rendered request into the text before it and after it."""

_PARTS: weakref.WeakKeyDictionary[Any, tuple[tuple[int, ...], str, str] | None] = weakref.WeakKeyDictionary()
_PARTS_LOCK = threading.Lock()


def _request_parts(lm: LM) -> tuple[tuple[int, ...], str, str] | None:
    """The request of :data:`FINAL_TEMPLATE` in ``lm``'s chat template, split around the exemplar: (the token ids of
    the head before it, the text after it up to the keywords, the text after the keywords); rendered and tokenised
    once per tokenizer. None when the chat template does not hold the exemplar once, as given."""
    with _PARTS_LOCK:
        if lm.tokenizer in _PARTS:
            return _PARTS[lm.tokenizer]
    mark = "\x01keywords\x01"
    text = lm.instruction_prompt(FINAL_TEMPLATE.format(exemplar=_MARK, keywords=mark))
    parts = None
    if text.count(_MARK) == 1 and text.count(mark) == 1 and text.index(_MARK) < text.index(mark):
        head, tail = text.split(_MARK)
        before, after = tail.split(mark)
        parts = (tuple(lm.encode(head)), before, after)
    with _PARTS_LOCK:
        _PARTS[lm.tokenizer] = parts
    return parts


def final_prompt_head(lm: LM) -> list[int]:
    """The token ids of stage 3's request before the exemplar (public: the chat template and the template's first
    line). The ranking scores the rewrites after it (:func:`dpinfer.protect.gtr.choose_exemplars`), so that
    stage 3 reuses that pass for each exemplar's row (:class:`~dpinfer.engine.PrefixStore`)."""
    parts = _request_parts(lm)
    if parts is not None:
        return list(parts[0])
    text = lm.instruction_prompt(FINAL_TEMPLATE.format(exemplar=_MARK, keywords=""))
    return lm.encode(text.split(_MARK)[0]) if _MARK in text else lm.encode(lm.instruction_prompt(""))


def final_prompt_ids(lm: LM, exemplar: str, keywords: Sequence[str]) -> list[int]:
    """Token ids of stage 3's request (:data:`FINAL_TEMPLATE` in the chat template): the head
    (:func:`final_prompt_head`), the exemplar's own tokens, then the rest with the keywords, each part tokenised
    apart (so the exemplar's tokens are those the ranking scored; for SmolLM2 the same ids as the whole text
    tokenised at once). A chat template that does not hold the exemplar once, as given: the whole text tokenised."""
    return _request_ids(lm, exemplar, keywords)[0]


def _request_ids(lm: LM, exemplar: str, keywords: Sequence[str]) -> tuple[list[int], int]:
    """:func:`final_prompt_ids` and how many of its first tokens are the head and the exemplar (0: not split)."""
    parts = _request_parts(lm)
    if parts is None:
        text = FINAL_TEMPLATE.format(exemplar=exemplar, keywords=", ".join(keywords))
        return lm.encode(lm.instruction_prompt(text)), 0
    head, before, after = parts
    ids = [*head, *lm.encode(exemplar)]
    return [*ids, *lm.encode(before + ", ".join(keywords) + after)], len(ids)


def keyword_variants(keyword: str) -> list[str]:
    """The spellings of ``keyword`` that stage 3 bans: as is and capitalised, each with and without a leading space
    (how a tokenizer writes a word inside and at the start of a sentence).

    >>> keyword_variants("paris")
    ['paris', ' paris', 'Paris', ' Paris']
    """
    out: list[str] = []
    for form in (keyword, keyword[:1].upper() + keyword[1:]):
        for text in (form, " " + form):
            if text not in out:
                out.append(text)
    return out


def keyword_ban(lm: LM, keywords: Sequence[str]) -> list[tuple[int, ...]]:
    """The token sequences of every :func:`keyword_variants` spelling of ``keywords`` (released words only)."""
    seqs: list[tuple[int, ...]] = []
    for kw in keywords:
        for text in keyword_variants(kw):
            ids = tuple(lm.encode(text))
            if ids and ids not in seqs:
                seqs.append(ids)
    return seqs


class StopAfterFirstLine:
    """Stage 3's stopping rule: once a row's released text holds a complete line that :func:`strip_echoes` keeps, only
    EOS is left for that row (greedy decoding then stops it).

    The final prompt is :func:`strip_echoes` of the row's text, i.e. its first kept line; nothing written after that
    line's newline can change it, so stopping there releases exactly the same final prompt in fewer decode steps. It
    reads the released tokens of stage 3 and the released keywords only (post-processing), never a prompt.

    ``groups`` (a group number per row) and ``quorum``: the rows of one prompt's candidates form a group; at the
    first step at which ``quorum`` of a group's rows are complete (a kept line written, or ended by EOS), the group's
    other rows are stopped too (their text so far is their final, as at ``max_new_tokens``) and marked in
    :attr:`cut`. A group then decodes for as long as its ``quorum``-th shortest final, not its longest (most often a
    run-on line). ``quorum=None``: no group stops early.
    """

    def __init__(self, lm: LM, keywords: Sequence[Sequence[str]], groups: Sequence[int] | None = None,
                 quorum: int | None = None) -> None:
        self.lm = lm
        self.keywords = [list(k) for k in keywords]
        self.eos = sorted(lm.eos_token_ids)
        self.done = [False] * len(self.keywords)
        self.cut = [False] * len(self.keywords)
        """Rows stopped by their group's quorum before their final was complete."""
        self.groups = list(range(len(self.keywords))) if groups is None else [int(g) for g in groups]
        if len(self.groups) != len(self.keywords):
            raise ConfigurationError(f"give one group per row ({len(self.keywords)}), got {len(self.groups)}")
        check_quorum(quorum)
        self.quorum = quorum
        self._newline: dict[int, bool] = {}

    def _has_newline(self, token: int) -> bool:
        if token not in self._newline:
            self._newline[token] = "\n" in self.lm.decode([token])
        return self._newline[token]

    def _apply_quorum(self, generated: Sequence[Sequence[int]]) -> None:
        """Cut the unfinished rows of every group with ``quorum`` complete rows. A row that ended by EOS holds fewer
        tokens than the rows still running (each running row gains one per step)."""
        step = max((len(t) for t in generated), default=0)
        complete = [not self.cut[r] and (self.done[r] or len(t) < step) for r, t in enumerate(generated)]
        counts: dict[int, int] = {}
        for r, ok in enumerate(complete):
            if ok:
                counts[self.groups[r]] = counts.get(self.groups[r], 0) + 1
        for r, t in enumerate(generated):
            if not complete[r] and not self.cut[r] and len(t) == step and counts.get(self.groups[r], 0) >= self.quorum:
                self.cut[r] = True

    def __call__(self, generated: Sequence[Sequence[int]], logits: Any) -> Any:
        import torch

        if not self.eos:
            return logits
        for row, toks in enumerate(generated):
            if not self.done[row] and not self.cut[row] and toks and self._has_newline(toks[-1]):
                text = self.lm.decode(list(toks))
                self.done[row] = bool(strip_echoes(text[: text.rfind("\n")], self.keywords[row]))
        if self.quorum is not None:
            self._apply_quorum(generated)
        out = None
        for row in range(len(generated)):
            if self.done[row] or self.cut[row]:
                if out is None:
                    out = logits.clone()
                keep = out[row, self.eos].clone()
                out[row] = -torch.inf
                out[row, self.eos] = torch.where(keep.isfinite(), keep, torch.zeros_like(keep))
        return logits if out is None else out


def stage3_prompts(engine: Engine, lm: LM, items: Sequence[tuple[str, Sequence[str]]], *,
                   max_new_tokens: int, suppress: str = PROTECT.suppress,
                   timing: dict[str, float] | None = None, groups: Sequence[int] | None = None,
                   quorum: int | None = None, prefixes: PrefixStore | None = None) -> list[str]:
    """Stage 3 for several ``(exemplar, keywords)`` pairs in ONE greedy engine run (independent rows, left-padded,
    the template's common prefix prefilled once): each final prompt decoded from its exemplar and keywords only,
    template echoes stripped (the exemplar when nothing is left, or when the request does not fit the context
    window). A row stops as soon as its first kept line is complete (:class:`StopAfterFirstLine`: the same final
    prompt, fewer steps).

    ``suppress``: how the keywords are kept out of the final prompt. ``"ban"`` (default): the template asks the model
    to avoid them AND every spelling of them (:func:`keyword_ban`) is banned while decoding (:class:`BanSequences`),
    since a small model does not follow a negative instruction reliably; ``"instruct"``: the template's request only,
    as in the paper. Both are post-processing of released words.

    ``timing`` (diagnostics only): receives the engine run's ``prefill`` seconds. ``groups`` (a group number per
    item) and ``quorum``: a group's rows stop once ``quorum`` of them are complete (:class:`StopAfterFirstLine`; a row
    stopped there has its text so far as its final). ``prefixes``: the ranking's keys and values of the request's head
    and exemplar (:func:`dpinfer.protect.gtr.choose_exemplars`), for the rows whose exemplar it scored: only
    the rest of those rows is prefilled (the same request, up to floating-point rounding).
    """
    if suppress not in SUPPRESS_METHODS:
        raise ConfigurationError(f"suppress must be one of {', '.join(SUPPRESS_METHODS)}, got {suppress!r}")
    check_quorum(quorum)
    finals = [ex for ex, _ in items]
    requests = [_request_ids(lm, ex, kws) for ex, kws in items]
    rows = [r for r, _ in requests]
    fit = [i for i, r in enumerate(rows) if len(r) + max_new_tokens <= lm.context_window]
    if fit:
        seeds = None
        if prefixes is not None and len(prefixes) and prefixes.serves(engine.lm.model):
            seeds = [prefixes.get(rows[i][:requests[i][1]]) if requests[i][1] else None for i in fit]
            seeds = seeds if any(s is not None for s in seeds) else None
        bans: list[list[tuple[int, ...]]] = []
        if suppress == "ban":
            seen: dict[tuple[str, ...], list[tuple[int, ...]]] = {}
            for i in fit:
                key = tuple(items[i][1])
                if key not in seen:
                    seen[key] = keyword_ban(lm, key)
                bans.append(seen[key])
        processors: list[Any] = [BanSequences(bans)] if any(bans) else []
        processors.append(StopAfterFirstLine(lm, [items[i][1] for i in fit],
                                             None if groups is None else [groups[i] for i in fit], quorum))
        out = engine.generate([rows[i] for i in fit], Sampler(temperature=0.0), max_new_tokens=max_new_tokens,
                              seed=0, processors=processors, prefix_kv=seeds)
        for i, seq in zip(fit, out.sequences, strict=True):
            finals[i] = strip_echoes(lm.decode(seq), items[i][1]) or items[i][0]
        if timing is not None:
            timing["prefill"] = timing.get("prefill", 0.0) + out.prefill_seconds
    return finals


def stage3_choices(engine: Engine, lm: LM, groups: Sequence[tuple[Sequence[str], Sequence[str], Sequence[str]]], *,
                   max_new_tokens: int, suppress: str = PROTECT.suppress, embedder: Any = None,
                   timing: dict[str, float] | None = None,
                   quorum: int | None = PROTECT.stage3_quorum,
                   prefixes: PrefixStore | None = None) -> list[tuple[str, int]]:
    """Stage 3 with several exemplars per prompt: for each ``(exemplars, keywords, rewrites)`` group, one final
    prompt per exemplar (all groups in one :func:`stage3_prompts` batch), and the one released is the candidate
    :func:`closest_to_consensus` of the group's rewrites (``embedder``: default the offline all-MiniLM-L6-v2). Returns
    ``(final prompt, index of the exemplar it was written from)`` per group. With one exemplar per group this is
    :func:`stage3_prompts` (no embedder is loaded; ``timing`` as there). Post-processing of released text only.

    ``quorum`` (default :data:`PROTECT.stage3_quorum <dpinfer.defaults.PROTECT>`): a group stops decoding as soon as
    that many of its final prompts are complete (:class:`StopAfterFirstLine`); every final is a candidate, one cut
    there with its text so far (as a final cut by ``max_new_tokens`` is). None: every final decoded to its end.
    ``prefixes``: the ranking's pass over the exemplars, reused by the prefill (:func:`stage3_prompts`)."""
    items = [(ex, kws) for exemplars, kws, _ in groups for ex in exemplars]
    owner = [g for g, (exemplars, _, _) in enumerate(groups) for _ in exemplars]
    finals = stage3_prompts(engine, lm, items, max_new_tokens=max_new_tokens, suppress=suppress, timing=timing,
                            groups=owner, quorum=quorum, prefixes=prefixes)
    if all(len(exemplars) <= 1 for exemplars, _, _ in groups):
        return [(f, 0) for f in finals]
    if embedder is None:
        from dpinfer.eval.embeddings import shared_embedder

        embedder = shared_embedder()
    out, at = [], 0
    for exemplars, _, rewrites in groups:
        cands = finals[at:at + len(exemplars)]  # a final cut at the quorum is a candidate with its text so far
        at += len(exemplars)
        best = closest_to_consensus(cands, rewrites, embedder)
        out.append((cands[best], best))
    return out


def stage3_select(engine: Engine, lm: LM, groups: Sequence[tuple[Sequence[str], Sequence[str], Sequence[str]]], *,
                  max_new_tokens: int, suppress: str = PROTECT.suppress, embedder: Any = None,
                  quorum: int | None = PROTECT.stage3_quorum, prefixes: PrefixStore | None = None) -> list[str]:
    """The final prompts of :func:`stage3_choices` (without the exemplar each came from)."""
    return [final for final, _ in stage3_choices(engine, lm, groups, max_new_tokens=max_new_tokens,
                                                 suppress=suppress, embedder=embedder, quorum=quorum,
                                                 prefixes=prefixes)]


def stage3_prompt(engine: Engine, lm: LM, exemplar: str, keywords: Sequence[str], *, max_new_tokens: int,
                  suppress: str = PROTECT.suppress) -> str:
    """Stage 3 for one exemplar and its keywords (:func:`stage3_prompts`)."""
    return stage3_prompts(engine, lm, [(exemplar, keywords)], max_new_tokens=max_new_tokens, suppress=suppress)[0]
