"""DP-GTR (Li et al. 2025) after stage 1: the exemplars, the keywords and the final prompt, from the rewrites only.

Stage 2 (post-processing of the released rewrites): the *exemplars* are the rewrites with the lowest perplexity
after the PUBLIC head of stage 3's request (:func:`~dpinfer.protect.stage3.final_prompt_head`, no private text)
among those with at least :data:`MIN_CONTENT_WORDS` content words (:func:`choose_exemplars`, one packed forward:
:func:`perplexities`; stage 3 reuses that forward's keys and values for each exemplar's request); the
*keywords* are counted over the rewrites and released as the top K (``ndp``) or by the Joint Exponential Mechanism
(``jem``: :mod:`dpinfer.protect.keywords`). Stage 3: :mod:`dpinfer.protect.stage3`.

:class:`GroupTextRewrite` is the ``dp-gtr`` entry of the prompt method table (:mod:`dpinfer.methods.prompt`); the
pipeline (:func:`dpinfer.protect_prompt`) runs stage 1 and hands it the rewrites, never the prompt.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from dpinfer.configs.protect import ProtectConfig
from dpinfer.defaults import PROTECT
from dpinfer.protect.keywords import keyword_counts, top_k_jem, top_k_ndp, words
from dpinfer.protect.stage3 import final_prompt_head, stage3_choices

if TYPE_CHECKING:
    from dpinfer.engine import Engine, PrefixKV, PrefixStore
    from dpinfer.mechanisms.randomness import RandomSource
    from dpinfer.models import LM

MIN_CONTENT_WORDS = 3

_PUBLIC_CONTEXTS: weakref.WeakKeyDictionary[Any, dict[tuple[int, ...], tuple[Any, Any, Any]]] = (
    weakref.WeakKeyDictionary())
"""Per model, the context pass of :func:`perplexities` for PUBLIC contexts (``reuse_context=True``): per layer its
keys and values, its last logits (float64) and their log-normaliser. Kept for the process, so that the ranking's
public head is run once per process, not once per release."""

PUBLIC_CONTEXTS_PER_MODEL = 4
"""Public contexts kept per model (the oldest dropped first)."""

_PUBLIC_CONTEXTS_LOCK = threading.Lock()
"""Guards :data:`_PUBLIC_CONTEXTS` (a service may score from several threads)."""


def _context_pass(lm: LM, context: Sequence[int], reuse: bool) -> tuple[Any, Any, Any]:
    """The context's per-layer (keys, values), last logits (float64, CPU) and their logsumexp; reused from
    :data:`_PUBLIC_CONTEXTS` when ``reuse`` (the same tensors a fresh pass computes: the same model, the same tokens,
    the same shapes)."""
    import torch

    from dpinfer.engine.cache import cache_kwargs as _cache_kwargs
    from dpinfer.engine.cache import new_kv_cache

    key = tuple(int(t) for t in context)
    with _PUBLIC_CONTEXTS_LOCK:
        kept = _PUBLIC_CONTEXTS.setdefault(lm.model, {}) if reuse else None
        if kept is not None and key in kept:
            return kept[key]
    ctx = torch.as_tensor([list(key)], dtype=torch.long, device=lm.device)
    cache = new_kv_cache(lm)
    first = lm.model(**_cache_kwargs(lm.model, dict(input_ids=ctx, attention_mask=torch.ones_like(ctx),
                                                     past_key_values=cache)), use_cache=True,
                     logits_to_keep=1).logits[0, -1].to(torch.float64).cpu()
    entry = ([(layer.keys, layer.values) for layer in cache.layers], first, torch.logsumexp(first, dim=-1))
    if kept is not None:
        with _PUBLIC_CONTEXTS_LOCK:
            while len(kept) >= PUBLIC_CONTEXTS_PER_MODEL:
                kept.pop(next(iter(kept)))
            kept[key] = entry
    return entry


def perplexities(lm: LM, context: Sequence[int], outputs: Sequence[Sequence[int]], *,
                 reuse_context: bool = False) -> list[float]:
    """``exp(mean NLL)`` of each of ``outputs`` after the same ``context`` (float64 log-normaliser); ``inf`` for an
    empty output.

    ONE pass over the context (its key/value cache shared by every output, its last logits scoring every output's
    first token), then ONE forward over all outputs packed end to end, without padding: a 4-D additive mask lets each
    output attend to the context and to its own earlier tokens only, and its position ids restart after the context,
    so each output's score is what it would be alone (up to float rounding). Only the log-probability of each
    realised token is formed (``logsumexp − logit``), never a full float64 log-softmax.

    ``reuse_context``: the context is PUBLIC (the ranking's head): its pass is kept for the process and reused by
    later calls with the same model and tokens (the same scores, without running it again). Never for a context that
    holds private text (it would stay in memory).
    """
    return _score(lm, context, outputs, reuse_context=reuse_context, keep_kv=False)[0]


def _score(lm: LM, context: Sequence[int], outputs: Sequence[Sequence[int]], *, reuse_context: bool,
           keep_kv: bool) -> tuple[list[float], Callable[[int], PrefixKV]]:
    """:func:`perplexities`, and a function that gives the keys and values of ``context + outputs[i]``
    (:class:`~dpinfer.engine.PrefixKV`) for a non-empty output. With ``keep_kv`` the packed forward runs each
    output's last token too (its logits are not computed), so that a later request that starts with the same tokens
    can reuse them; without, that function refuses."""
    import torch

    from dpinfer.engine.cache import cache_kwargs as _cache_kwargs
    from dpinfer.engine.cache import new_kv_cache
    from dpinfer.engine.prefill import PrefixKV

    result = [math.inf] * len(outputs)
    rows = [(i, list(o)) for i, o in enumerate(outputs) if o]
    spans: dict[int, tuple[int, int]] = {}
    cache: Any = None

    def entry(i: int) -> PrefixKV:
        if not keep_kv or i not in spans:
            raise ValueError("keys and values are kept for the non-empty outputs of a keep_kv pass only")
        lo, hi = spans[i]
        return PrefixKV(tuple(int(t) for t in context) + tuple(int(t) for t in outputs[i]), tuple(
            (torch.cat([layer.keys[0, :, :start], layer.keys[0, :, lo:hi]], dim=1),
             torch.cat([layer.values[0, :, :start], layer.values[0, :, lo:hi]], dim=1))
            for layer in cache.layers))

    if not rows:
        return result, entry
    device = lm.device
    start = len(context)
    runs = [o if keep_kv else o[:-1] for _, o in rows]  # a row's last token predicts nothing: run only to keep it
    packed = [t for r in runs for t in r]
    scored = []  # packed positions whose logits score a next token
    at = 0
    for (_, o), r in zip(rows, runs, strict=True):
        scored.extend(range(at, at + len(o) - 1))
        at += len(r)
    with torch.inference_mode():
        layers, first, first_lse = _context_pass(lm, context, reuse_context)
        cache = new_kv_cache(lm)
        for j, (k, v) in enumerate(layers):
            cache.update(k, v, j)  # a copy: the kept tensors are never written
        logits = None
        if packed:
            n = len(packed)
            dtype = lm.model.dtype if lm.model.dtype.is_floating_point else torch.float32
            seen = torch.zeros((n, start + n), dtype=torch.bool)
            seen[:, :start] = True
            positions = torch.empty(n, dtype=torch.long)
            at = 0
            for r in runs:
                m = len(r)
                seen[at:at + m, start + at:start + at + m] = torch.ones((m, m), dtype=torch.bool).tril()
                positions[at:at + m] = torch.arange(start, start + m)
                at += m
            mask = torch.where(seen, torch.zeros((), dtype=dtype), torch.finfo(dtype).min)[None, None]
            logits = lm.model(**_cache_kwargs(lm.model, dict(
                input_ids=torch.as_tensor([packed], dtype=torch.long, device=device), attention_mask=mask.to(device),
                position_ids=positions[None].to(device), past_key_values=cache)), use_cache=True,
                logits_to_keep=torch.as_tensor(scored, dtype=torch.long, device=device)).logits[0]
    at = at_run = 0
    for (i, o), r in zip(rows, runs, strict=True):
        toks = torch.as_tensor(o, dtype=torch.long)
        nll = float(first_lse - first[toks[0]])
        m = len(o) - 1
        if m and logits is not None:
            z = logits[at:at + m].to(torch.float64).cpu()
            nll += float((torch.logsumexp(z, dim=-1) - z.gather(1, toks[1:, None])[:, 0]).sum())
        at += m
        result[i] = math.exp(nll / len(o))
        spans[i] = (start + at_run, start + at_run + len(r))
        at_run += len(r)
    return result, entry


def choose_exemplars(lm: LM, rewrites: Sequence[str], k: int = 1, *,
                     min_content_words: int = MIN_CONTENT_WORDS, prefixes: PrefixStore | None = None) -> list[str]:
    """Stage 2: the ``k`` rewrites with the lowest perplexity after stage 3's request head
    (:func:`~dpinfer.protect.stage3.final_prompt_head`: public), best first, among those with at least
    ``min_content_words`` content words (else among the non-empty ones; ``[""]`` if every rewrite is empty).

    ``prefixes``: receives the keys and values of the head and each chosen exemplar, which stage 3's request for
    that exemplar starts with (:func:`~dpinfer.protect.stage3.stage3_prompts` reuses them)."""
    nonempty = [r for r in rewrites if r.strip()]
    candidates = [r for r in nonempty if len(words(r)) >= min_content_words] or nonempty
    if not candidates:
        return [""]
    context = final_prompt_head(lm)
    room = max(1, lm.context_window - len(context))
    ids = [lm.encode(r)[:room] for r in candidates]
    store = prefixes if prefixes is not None and prefixes.serves(lm.model) else None
    scores, entry = _score(lm, context, ids, reuse_context=True, keep_kv=store is not None)
    best = _best(scores)[:k]
    if store is not None:
        for i in best:
            if ids[i]:
                store.put(entry(i))
    return [candidates[i] for i in best]


def _best(scores: Sequence[float]) -> list[int]:
    """Indices by increasing perplexity (ties and non-finite scores by index)."""
    return sorted(range(len(scores)), key=lambda i: (scores[i] if math.isfinite(scores[i]) else math.inf, i))


def choose_exemplar(lm: LM, rewrites: Sequence[str], *, min_content_words: int = MIN_CONTENT_WORDS) -> str:
    """Stage 2: the rewrite with the lowest perplexity (:func:`choose_exemplars` with ``k = 1``)."""
    return choose_exemplars(lm, rewrites, 1, min_content_words=min_content_words)[0]


def release_keywords(rewrites: Sequence[str], *, method: str, k: int, jem_epsilon: float,
                     generator: RandomSource) -> list[str]:
    """Stage 2: the keywords of the rewrites, by ``ndp`` (top K as is) or ``jem`` (ε₂ = ``jem_epsilon``)."""
    counts = keyword_counts(rewrites)
    if method == "ndp":
        return top_k_ndp(counts, k)
    return top_k_jem(counts, k, jem_epsilon, generator)


class _TimedEmbedder:
    """An encoder wrapper that adds the seconds of its ``encode`` calls to ``stages["embedding"]`` (diagnostics)."""

    def __init__(self, embedder: Any, stages: dict[str, float]) -> None:
        self.embedder, self.stages, self.seconds = embedder, stages, 0.0

    def encode(self, texts: Sequence[str]) -> Any:
        t = time.perf_counter()
        out = self.embedder.encode(texts)
        spent = time.perf_counter() - t
        self.seconds += spent
        self.stages["embedding"] = self.stages.get("embedding", 0.0) + spent
        return out


class GroupTextRewrite:
    """The ``dp-gtr`` method: stages 2 and 3 on each prompt's released rewrites (module docstring)."""

    name = "dp-gtr"

    def __init__(self, config: ProtectConfig) -> None:
        self.config = config

    @property
    def rewrites(self) -> int:
        """Stage 1's rewrites (default :data:`PROTECT.n_rewrites <dpinfer.defaults.PROTECT>`)."""
        return PROTECT.n_rewrites if self.config.n_rewrites is None else int(self.config.n_rewrites)

    uses_stage3 = True
    """Whether the method decodes a stage 3 (the pipeline then offers it the runtime's int8 engine)."""

    @property
    def uses_embedder(self) -> bool:
        """Whether stage 3 picks among several final prompts with a sentence encoder."""
        return self.config.n_exemplars > 1

    def settings(self) -> dict[str, Any]:
        """The public settings that apply to this method."""
        c = self.config
        return {"n_keywords": c.n_keywords, "keywords": c.keywords,
                "jem_epsilon": c.jem_epsilon if c.keywords == "jem" else None, "suppress": c.suppress,
                "n_exemplars": c.n_exemplars, "stage3_quorum": c.stage3_quorum, "stage3_int8": c.stage3_int8}

    def parameters(self) -> dict[str, Any]:
        """What the guarantee's parameters record of stages 2 and 3 (JEM's ε₂ is post-processing here: not added)."""
        c = self.config
        out: dict[str, Any] = {"keywords": c.keywords, "n_keywords": c.n_keywords, "suppress": c.suppress,
                               "n_exemplars": c.n_exemplars, "stage3_quorum": c.stage3_quorum}
        if c.keywords == "jem":
            out["jem_epsilon"] = c.jem_epsilon
            out["jem_note"] = ("ε₂ of the keyword release against one rewrite replaced (sensitivity 2); "
                               "post-processing for the headline adjacency, not added to ε")
        return out

    def finish(self, engine: Engine, lm: LM, rewrites: Sequence[Sequence[str]], sources: Sequence[RandomSource], *,
               embedder: Any = None, lap: Callable[[str], None] | None = None,
               stages: dict[str, float] | None = None, stage3_engine: Engine | None = None,
               ) -> list[tuple[str, str, list[str]]]:
        """``(final prompt, the exemplar it was written from, keywords)`` for each prompt's rewrites, each prompt's
        keyword release drawn from its own source; stage 3 of every prompt in one engine run, on ``stage3_engine``
        (the runtime's int8 engine, :attr:`dpinfer.runtime.Runtime.int8_engine`) when given, else on ``engine``.
        The ranking always runs on ``lm``'s float32 layers. ``lap`` / ``stages``: diagnostics only (seconds per
        stage)."""
        from dpinfer.engine.prefill import PrefixStore  # torch: imported once stage 1 has run

        c = self.config
        tick = lap or (lambda name: None)
        groups = []
        s3 = engine if stage3_engine is None else stage3_engine
        prefixes = PrefixStore(lm.model)  # the ranking's pass over each exemplar, for stage 3's prefill; this call only
        for rw, src in zip(rewrites, sources, strict=True):
            exemplars = choose_exemplars(lm, rw, c.n_exemplars, prefixes=prefixes)
            tick("ranking")
            kws = release_keywords(rw, method=c.keywords, k=c.n_keywords, jem_epsilon=c.jem_epsilon, generator=src)
            tick("stage2")
            groups.append((exemplars, kws, list(rw)))
        timed = _TimedEmbedder(embedder, stages) if embedder is not None and stages is not None else embedder
        timing: dict[str, float] = {}
        chosen = stage3_choices(s3, s3.lm, groups, max_new_tokens=c.max_new_tokens, suppress=c.suppress,
                                embedder=timed, timing=timing, quorum=c.stage3_quorum, prefixes=prefixes)
        tick("stage3")
        if stages is not None and "prefill" in timing:
            stages["stage3_prefill"] = timing["prefill"]  # part of stage3: the final requests' prefill
        if isinstance(timed, _TimedEmbedder) and stages is not None and "stage3" in stages:
            stages["stage3"] -= timed.seconds  # the consensus pick's encoder time, counted apart from decoding
        return [(final, g[0][i], list(g[1])) for (final, i), g in zip(chosen, groups, strict=True)]


def build(config: ProtectConfig, runtime: Any = None) -> GroupTextRewrite:
    """The ``dp-gtr`` entry's builder (:mod:`dpinfer.methods.prompt`)."""
    return GroupTextRewrite(config)
