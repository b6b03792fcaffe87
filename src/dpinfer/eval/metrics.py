"""Evaluation metrics for released text (ALGORITHMS §6): perplexity, the LOSS token-recovery attack, verbatim leaks.

All scores are computed with the same LM, teacher-forced, in float64 from its logits.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from dpinfer.errors import InvalidInputError
from dpinfer.eval.intervals import Z95, wilson
from dpinfer.taggers.base import Span


def continuation_nll(lm, contexts: Sequence[Sequence[int]], output: Sequence[int]) -> list[float]:
    """Total negative log-likelihood (nats) of ``output`` after each context, in one left-padded batch."""
    if not output:
        return [0.0] * len(contexts)
    n = len(output)
    rows = [list(c) + list(output) for c in contexts]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), lm.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.as_tensor(r)
        mask[i, width - len(r):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    target = torch.as_tensor(list(output), dtype=torch.long)
    out: list[float] = []
    with torch.inference_mode():
        logits = lm.model(input_ids=ids.to(lm.device), attention_mask=mask.to(lm.device),
                          position_ids=pos.to(lm.device), logits_to_keep=n + 1, use_cache=False).logits
        for i in range(len(rows)):
            lp = torch.log_softmax(logits[i, :-1].to(torch.float64), dim=-1).cpu()
            out.append(float(-lp.gather(1, target[:, None]).sum()))
    return out


def perplexity(lm, context: Sequence[int], output: Sequence[int]) -> float:
    """``exp(mean NLL)`` of ``output`` given ``context`` (the rewriting prompt with the ORIGINAL document)."""
    if not output:
        return math.nan
    return math.exp(continuation_nll(lm, [context], output)[0] / len(output))


def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """95% Wilson score interval of a proportion (0 and n successes too): :func:`dpinfer.eval.intervals.wilson`."""
    return wilson(successes, n, z)


def repeated_ngram_share(tokens: Sequence[int], n: int = 4) -> float:
    """Share of the output's token n-grams that already occurred earlier in it (0 = no loops; degenerate text → 1).

    >>> repeated_ngram_share([1, 2, 3, 1, 2, 3, 1, 2, 3], n=3)
    0.5714285714285714
    """
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    if not grams:
        return 0.0
    return 1.0 - len(set(grams)) / len(grams)


def verbatim_leak_rate(text: str, secrets: Sequence[str], min_chars: int = 3) -> tuple[int, int]:
    """(how many distinct gold private strings appear verbatim in ``text``, how many were checked)."""
    distinct = sorted({s.strip() for s in secrets if len(s.strip()) >= min_chars})
    return sum(1 for s in distinct if s in text), len(distinct)


@dataclass(frozen=True)
class AttackGame:
    """One LOSS-attack game: the attacked entity type and whether the original (candidate 0) scored best."""

    label: str
    win: float  # 1 if candidate 0 wins, 1/t if it ties t ways for the best score, else 0
    candidates: int


def replace_mentions(text: str, spans: Sequence[Span], label: str, mapping: Mapping[str, str]) -> str:
    """``text`` with every span of ``label`` replaced by ``mapping[its string]``."""
    out = text
    for s in sorted((s for s in spans if s.label == label), key=lambda s: s.start, reverse=True):
        out = out[: s.start] + mapping[text[s.start:s.end]] + out[s.end:]
    return out


def loss_attack(lm, build_context, text: str, spans: Sequence[Span], output: Sequence[int],
                pool: Mapping[str, Sequence[str]], *, labels: Sequence[str] = ("CODE", "PERSON", "DATETIME"),
                num_candidates: int = 5, rng: random.Random | None = None) -> list[AttackGame]:
    """The LOSS token-recovery game of ALGORITHMS §6 for each attacked type present in ``spans``.

    Candidate 0 is the original document; candidates 1..|C|−1 replace every distinct mention of the type by random
    values of the same type from ``pool`` (mentions from OTHER documents). The attacker scores ``output`` by its
    log-likelihood under the rewriting prompt of each candidate (``build_context(text) -> ids``) and picks the best;
    chance is ``1/num_candidates``.
    """
    if num_candidates < 2:
        raise InvalidInputError("the LOSS attack needs at least 2 candidates")
    rng = rng or random.Random(0)
    games: list[AttackGame] = []
    for label in labels:
        mentions = sorted({text[s.start:s.end] for s in spans if s.label == label})
        choices = [v for v in pool.get(label, ()) if v not in mentions]
        if not mentions or len(choices) < len(mentions):
            continue
        candidates = [text]
        for _ in range(num_candidates - 1):
            values = rng.sample(choices, len(mentions))
            candidates.append(replace_mentions(text, spans, label, dict(zip(mentions, values, strict=True))))
        scores = continuation_nll(lm, [build_context(c) for c in candidates], output)
        best = min(scores)
        tied = [i for i, sc in enumerate(scores) if sc <= best + 1e-9]
        games.append(AttackGame(label, (1.0 / len(tied)) if 0 in tied else 0.0, num_candidates))
    return games
