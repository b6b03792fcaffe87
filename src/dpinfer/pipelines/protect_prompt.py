"""Prompt protection: DP-GTR (Li et al. 2025) and its baseline DP-Prompt (Utpala et al. 2023), ALGORITHMS §4.

A user wants to send a question to a remote LLM without revealing its exact wording or identifiers. dpinfer rewrites it
locally with local differential privacy and hands back the protected prompt.

**Stage 1** (the only stage that reads the prompt): ``n`` paraphrases of the chat-templated prompt
(:data:`~dpinfer.pipelines.clip_bounds.PARAPHRASE_INSTRUCTION`, the instruction the clip bounds were
measured with) are decoded in ONE batch on the engine's independent mode with
:class:`~dpinfer.mechanisms.dp_prompt.DPPrompt`: logits clipped to the model's public bounds
(:func:`~dpinfer.pipelines.clip_bounds.clip_bounds`), a token drawn from the full vocabulary at temperature τ (no top-k
or top-p: the mechanism refuses them), at most ``T_max = max_new_tokens`` tokens each, a number fixed before the prompt
is read (never derived from its length). Per token ``ε_tok = 2(b_max − b_min)/τ`` against any two prompts; the ``n``
rewrites compose to ``n·T_max`` tokens, converted to (ε, δ) by the accountant (the smaller of basic composition and
the bounded-range RDP curve ``min(ε_tok, α·ε_tok²/8)`` per token). That is the headline guarantee.

**Stage 2** (post-processing of the rewrites): the *exemplar* is the rewrite with the lowest perplexity under a PUBLIC
instruction (:data:`EXEMPLAR_INSTRUCTION`, which holds no private text) among the rewrites with at least
:data:`MIN_CONTENT_WORDS` content words (all non-empty rewrites when none has); *keywords* are counted over the
rewrites and released as the top K (``ndp``) or with the Joint Exponential Mechanism (``jem``, ε₂ over a fixed public
word universe): :mod:`dpinfer.pipelines.keywords`. JEM is ε₂-DP with respect to one rewrite; for the adjacency of the
headline (any two prompts) it is post-processing, so ε₂ is recorded as a parameter and NOT added.

**Stage 3** (post-processing): the final prompt is generated greedily from the exemplar and the keywords only, with
the ALGORITHMS §4 template (:data:`FINAL_TEMPLATE`; the keywords are words to AVOID), every spelling of the keywords
banned while decoding (``suppress="ban"``, the default: the paper's "Stage-3 suppresses the identified keywords", which
a small model does not do from the instruction alone; ``"instruct"`` keeps the instruction only), and template echoes
are stripped (:func:`strip_echoes`). With ``n_exemplars > 1`` (default 5) a final prompt is written from each of the
``n_exemplars`` lowest-perplexity rewrites and the one closest to the rewrites' consensus is released
(:func:`stage3_select`, :func:`closest_to_consensus`). The original prompt never reaches stages 2 and 3 nor any scorer.

``method="dp-prompt"``: one DP-Prompt rewrite, released as is (the baseline).

What the authors' code got wrong and this implementation does not repeat: top_k = 50 sampling (voids the exponential
mechanism); ``max_new_tokens`` = the private prompt's length + 20 (leaks the length); no clipping on the large model;
JEM with the wrong sensitivity over the observed words only; case-sensitive keywords; only the per-token ε reported.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dpinfer.accounting.calibration import Budget, Spec
from dpinfer.defaults import PROTECT
from dpinfer.errors import ConfigurationError
from dpinfer.pipelines.budget import charged, current_spend, pure_steps_estimate
from dpinfer.pipelines.clip_bounds import PARAPHRASE_INSTRUCTION

if TYPE_CHECKING:
    from dpinfer.accounting import Guarantee
    from dpinfer.engine import Engine
    from dpinfer.errors import DPInferError
    from dpinfer.mechanisms.dp_prompt import DPPrompt
    from dpinfer.mechanisms.randomness import RandomSource
    from dpinfer.models import LM

METHODS = ("dp-gtr", "dp-prompt")
KEYWORD_METHODS = ("ndp", "jem")
SUPPRESS_METHODS = ("ban", "instruct")
ADJACENCY = "any two private prompts (the whole prompt may change; local DP)"

DEFAULT_N_REWRITES = PROTECT.n_rewrites
DEFAULT_N_KEYWORDS = PROTECT.n_keywords
DEFAULT_MAX_NEW_TOKENS = PROTECT.max_new_tokens
DEFAULT_TEMPERATURE = PROTECT.temperature
DEFAULT_JEM_EPSILON = PROTECT.jem_epsilon
"""ε₂ of the JEM keyword release (:data:`dpinfer.defaults.PROTECT`).

Over a 73k-word universe, JEM picks mostly random words below ε₂ ≈ 4·ln(73k^K)/n
(≈ 45 for K = n = 10); ε₂ protects one rewrite, whose stage-1 loss is T_max·ε_tok (thousands), so a large ε₂ costs
nothing the headline does not already state (docs/prompt-protection.md)."""
MIN_CONTENT_WORDS = 3

EXEMPLAR_INSTRUCTION = "Write a short question."
"""The PUBLIC instruction under which stage 2 scores the rewrites' perplexity (no private text)."""
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


@dataclass
class ProtectedPrompt:
    """The release of :func:`protect_prompt`: ``prompt`` (the protected prompt) and the ex-ante ``guarantee``.

    ``exemplar``, ``keywords`` and ``rewrites`` are the intermediate releases (all covered by the same guarantee:
    everything here is post-processing of stage 1's rewrites). ``epsilon_per_token`` is ε_tok = 2(b_max − b_min)/τ;
    the guarantee's ε composes it over ``n_rewrites × T_max`` tokens. ``settings`` never hold the seed or the
    original prompt. Nothing here depends on the prompt beyond the release and the guarantee's parameters: timings
    are diagnostics, handed to the caller only on request (``protect_prompt(profile=…)``), never next to a release
    (wall time is not protected).
    """

    prompt: str
    exemplar: str
    keywords: list[str]
    rewrites: list[str]
    guarantee: Guarantee
    method: str
    epsilon_per_token: float
    settings: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.prompt

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (without the original prompt, which the result never holds)."""
        from dpinfer._json import plain

        return plain({
            "prompt": self.prompt, "method": self.method, "exemplar": self.exemplar, "keywords": list(self.keywords),
            "rewrites": list(self.rewrites), "epsilon_per_token": self.epsilon_per_token,
            "guarantee": self.guarantee.to_dict(), "settings": self.settings,
        })


# ---------------------------------------------------------------------------------------------------------- checks
def check_protect_params(*, method: object = "dp-gtr", epsilon: object = None, temperature: object = None,
                         delta: object = 1e-5, n_rewrites: object = None, n_keywords: object = DEFAULT_N_KEYWORDS,
                         keywords: object = "ndp", max_new_tokens: object = DEFAULT_MAX_NEW_TOKENS,
                         jem_epsilon: object = DEFAULT_JEM_EPSILON, seed: object = None,
                         suppress: object = PROTECT.suppress, n_exemplars: object = PROTECT.n_exemplars,
                         max_input_tokens: object = PROTECT.max_input_tokens, cli: bool = False) -> int:
    """Every parameter of :func:`protect_prompt`, checked before any model loads; returns the number of rewrites.

    ``cli`` spells the names as options (``--n-rewrites``).
    """
    from dpinfer.checks import check_delta, check_seed, int_at_least, one_of, positive_number

    def n(name: str) -> str:
        return "--" + name.replace("_", "-") if cli else name

    one_of(method, "method", METHODS)
    one_of(keywords, "keywords method", KEYWORD_METHODS)
    one_of(suppress, n("suppress"), SUPPRESS_METHODS)
    if epsilon is not None and temperature is not None:
        raise ConfigurationError(f"give exactly one of {n('epsilon')} or {n('temperature')}, not both (ε fixes τ)")
    if epsilon is not None:
        positive_number(epsilon, n("epsilon"), " (the target ε of all rewrites together)")
    if temperature is not None:
        positive_number(temperature, n("temperature"), " (ε_tok = 2(b_max − b_min)/τ is infinite at τ = 0)")
    check_delta(delta, n("delta"))
    if n_rewrites is None:
        count = 1 if method == "dp-prompt" else DEFAULT_N_REWRITES
    else:
        count = int_at_least(n_rewrites, n("n_rewrites"), 1)
        if method == "dp-prompt" and count != 1:
            other = "--method dp-gtr" if cli else "method='dp-gtr'"
            raise ConfigurationError(f"dp-prompt makes exactly one rewrite; drop {n('n_rewrites')} or use {other}")
    int_at_least(n_keywords, n("n_keywords"), 1)
    int_at_least(n_exemplars, n("n_exemplars"), 1)
    int_at_least(max_input_tokens, n("max_input_tokens"), 1, " (a public cap on the prompt's tokens)")
    int_at_least(max_new_tokens, n("max_new_tokens"), 1, " (T_max: fixed in advance, never the prompt's length)")
    positive_number(jem_epsilon, n("jem_epsilon"))
    check_seed(seed, n("seed"))
    return count


def _check_prompt(prompt: object) -> str:
    from dpinfer.validation import check_text

    return check_text(prompt, "the prompt")


# ---------------------------------------------------------------------------------------------------------- stages
def stage1_mechanism(*, clip: tuple[float, float], n_rewrites: int, max_new_tokens: int, delta: float,
                     epsilon: float | None = None, temperature: float | None = None) -> DPPrompt:
    """Stage 1's mechanism: :class:`DPPrompt` in independent mode covering ``n_rewrites`` rows of ``max_new_tokens``
    tokens, at ``temperature`` or calibrated to ``epsilon`` (exactly one; neither: :data:`DEFAULT_TEMPERATURE`)."""
    from dpinfer.mechanisms.dp_prompt import DPPrompt

    lo, hi = clip
    if epsilon is not None:
        return DPPrompt.calibrated(Budget(epsilon, delta),
                                   Spec(max_new_tokens, clip_min=lo, clip_max=hi, num_rewrites=n_rewrites))
    tau = DEFAULT_TEMPERATURE if temperature is None else temperature
    return DPPrompt(lo, hi, tau, num_rewrites=n_rewrites, delta=delta)


def paraphrase_ids(lm: LM, prompt: str) -> list[int]:
    """Token ids of stage 1's chat-templated paraphrase request for ``prompt``."""
    return lm.encode(lm.instruction_prompt(PARAPHRASE_INSTRUCTION.format(text=prompt)))


def stage1_rewrites(engine: Engine, lm: LM, prompt_ids: Sequence[int], mech: DPPrompt, *, max_new_tokens: int,
                    generator: RandomSource) -> list[str]:
    """The ``mech.num_rewrites`` DP-Prompt rewrites, decoded in one independent-mode batch on the engine."""
    rows = [list(prompt_ids)] * mech.num_rewrites
    out = engine.generate(rows, mech, max_new_tokens=max_new_tokens, generator=generator)
    return [lm.decode(seq).strip() for seq in out.sequences]


def perplexities(lm: LM, context: Sequence[int], outputs: Sequence[Sequence[int]]) -> list[float]:
    """``exp(mean NLL)`` of each of ``outputs`` after the same ``context`` (float64 log-normaliser); ``inf`` for an
    empty output.

    ONE pass over the context (its key/value cache shared by every output, its last logits scoring every output's
    first token), then ONE forward over all outputs packed end to end, without padding: a 4-D additive mask lets each
    output attend to the context and to its own earlier tokens only, and its position ids restart after the context,
    so each output's score is what it would be alone (up to float rounding). Only the log-probability of each
    realised token is formed (``logsumexp − logit``), never a full float64 log-softmax.
    """
    import torch
    from transformers import DynamicCache

    from dpinfer.engine.cache import cache_kwargs as _cache_kwargs

    result = [math.inf] * len(outputs)
    rows = [(i, list(o)) for i, o in enumerate(outputs) if o]
    if not rows:
        return result
    device = lm.device
    ctx = torch.as_tensor([list(context)], dtype=torch.long, device=device)
    start = ctx.shape[1]
    packed = [t for _, o in rows for t in o[:-1]]  # a row's last token predicts nothing
    with torch.inference_mode():
        cache = DynamicCache(config=lm.model.config)
        first = lm.model(**_cache_kwargs(lm.model, dict(input_ids=ctx, attention_mask=torch.ones_like(ctx),
                                                         past_key_values=cache)), use_cache=True,
                         logits_to_keep=1).logits[0, -1].to(torch.float64).cpu()
        first_lse = torch.logsumexp(first, dim=-1)
        logits = None
        if packed:
            n = len(packed)
            dtype = lm.model.dtype if lm.model.dtype.is_floating_point else torch.float32
            seen = torch.zeros((n, start + n), dtype=torch.bool)
            seen[:, :start] = True
            positions = torch.empty(n, dtype=torch.long)
            at = 0
            for _, o in rows:
                m = len(o) - 1
                seen[at:at + m, start + at:start + at + m] = torch.ones((m, m), dtype=torch.bool).tril()
                positions[at:at + m] = torch.arange(start, start + m)
                at += m
            mask = torch.where(seen, torch.zeros((), dtype=dtype), torch.finfo(dtype).min)[None, None]
            logits = lm.model(**_cache_kwargs(lm.model, dict(
                input_ids=torch.as_tensor([packed], dtype=torch.long, device=device), attention_mask=mask.to(device),
                position_ids=positions[None].to(device), past_key_values=cache)), use_cache=True).logits[0]
    at = 0
    for i, o in rows:
        toks = torch.as_tensor(o, dtype=torch.long)
        nll = float(first_lse - first[toks[0]])
        m = len(o) - 1
        if m and logits is not None:
            z = logits[at:at + m].to(torch.float64).cpu()
            nll += float((torch.logsumexp(z, dim=-1) - z.gather(1, toks[1:, None])[:, 0]).sum())
        at += m
        result[i] = math.exp(nll / len(o))
    return result


def choose_exemplars(lm: LM, rewrites: Sequence[str], k: int = 1, *,
                     min_content_words: int = MIN_CONTENT_WORDS) -> list[str]:
    """Stage 2: the ``k`` rewrites with the lowest perplexity under :data:`EXEMPLAR_INSTRUCTION` (public), best
    first, among those with at least ``min_content_words`` content words (else among the non-empty ones; ``[""]`` if
    every rewrite is empty)."""
    from dpinfer.pipelines.keywords import words

    nonempty = [r for r in rewrites if r.strip()]
    candidates = [r for r in nonempty if len(words(r)) >= min_content_words] or nonempty
    if not candidates:
        return [""]
    context = lm.encode(lm.instruction_prompt(EXEMPLAR_INSTRUCTION))
    room = max(1, lm.context_window - len(context))
    scores = perplexities(lm, context, [lm.encode(r)[:room] for r in candidates])
    order = sorted(range(len(candidates)), key=lambda i: (scores[i] if math.isfinite(scores[i]) else math.inf, i))
    return [candidates[i] for i in order[:k]]


def choose_exemplar(lm: LM, rewrites: Sequence[str], *, min_content_words: int = MIN_CONTENT_WORDS) -> str:
    """Stage 2: the rewrite with the lowest perplexity (:func:`choose_exemplars` with ``k = 1``)."""
    return choose_exemplars(lm, rewrites, 1, min_content_words=min_content_words)[0]


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


def release_keywords(rewrites: Sequence[str], *, method: str, k: int, jem_epsilon: float,
                     generator: RandomSource) -> list[str]:
    """Stage 2: the keywords of the rewrites, by ``ndp`` (top K as is) or ``jem`` (ε₂ = ``jem_epsilon``)."""
    from dpinfer.pipelines.keywords import keyword_counts, top_k_jem, top_k_ndp

    counts = keyword_counts(rewrites)
    if method == "ndp":
        return top_k_ndp(counts, k)
    return top_k_jem(counts, k, jem_epsilon, generator)


def final_prompt_ids(lm: LM, exemplar: str, keywords: Sequence[str]) -> list[int]:
    """Token ids of stage 3's request (:data:`FINAL_TEMPLATE` in the chat template)."""
    text = FINAL_TEMPLATE.format(exemplar=exemplar, keywords=", ".join(keywords))
    return lm.encode(lm.instruction_prompt(text))


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
    """

    def __init__(self, lm: LM, keywords: Sequence[Sequence[str]]) -> None:
        self.lm = lm
        self.keywords = [list(k) for k in keywords]
        self.eos = sorted(lm.eos_token_ids)
        self.done = [False] * len(self.keywords)
        self._newline: dict[int, bool] = {}

    def _has_newline(self, token: int) -> bool:
        if token not in self._newline:
            self._newline[token] = "\n" in self.lm.decode([token])
        return self._newline[token]

    def __call__(self, generated: Sequence[Sequence[int]], logits: Any) -> Any:
        import torch

        if not self.eos:
            return logits
        out = None
        for row, toks in enumerate(generated):
            if not self.done[row] and toks and self._has_newline(toks[-1]):
                text = self.lm.decode(list(toks))
                self.done[row] = bool(strip_echoes(text[: text.rfind("\n")], self.keywords[row]))
            if self.done[row]:
                if out is None:
                    out = logits.clone()
                keep = out[row, self.eos].clone()
                out[row] = -torch.inf
                out[row, self.eos] = torch.where(keep.isfinite(), keep, torch.zeros_like(keep))
        return logits if out is None else out


def stage3_prompts(engine: Engine, lm: LM, items: Sequence[tuple[str, Sequence[str]]], *,
                   max_new_tokens: int, suppress: str = PROTECT.suppress) -> list[str]:
    """Stage 3 for several ``(exemplar, keywords)`` pairs in ONE greedy engine run (independent rows, left-padded,
    the template's common prefix prefilled once): each final prompt decoded from its exemplar and keywords only,
    template echoes stripped (the exemplar when nothing is left, or when the request does not fit the context
    window). A row stops as soon as its first kept line is complete (:class:`StopAfterFirstLine`: the same final
    prompt, fewer steps).

    ``suppress``: how the keywords are kept out of the final prompt. ``"ban"`` (default): the template asks the model
    to avoid them AND every spelling of them (:func:`keyword_ban`) is banned while decoding (:class:`BanSequences`),
    since a small model does not follow a negative instruction reliably; ``"instruct"``: the template's request only,
    as in the paper. Both are post-processing of released words.
    """
    from dpinfer.mechanisms.sampler import Sampler
    from dpinfer.mechanisms.transforms import BanSequences

    if suppress not in SUPPRESS_METHODS:
        raise ConfigurationError(f"suppress must be one of {', '.join(SUPPRESS_METHODS)}, got {suppress!r}")
    finals = [ex for ex, _ in items]
    rows = [final_prompt_ids(lm, ex, kws) for ex, kws in items]
    fit = [i for i, r in enumerate(rows) if len(r) + max_new_tokens <= lm.context_window]
    if fit:
        bans: list[list[tuple[int, ...]]] = []
        if suppress == "ban":
            seen: dict[tuple[str, ...], list[tuple[int, ...]]] = {}
            for i in fit:
                key = tuple(items[i][1])
                if key not in seen:
                    seen[key] = keyword_ban(lm, key)
                bans.append(seen[key])
        processors: list[Any] = [BanSequences(bans)] if any(bans) else []
        processors.append(StopAfterFirstLine(lm, [items[i][1] for i in fit]))
        out = engine.generate([rows[i] for i in fit], Sampler(temperature=0.0), max_new_tokens=max_new_tokens,
                              seed=0, processors=processors)
        for i, seq in zip(fit, out.sequences, strict=True):
            finals[i] = strip_echoes(lm.decode(seq), items[i][1]) or items[i][0]
    return finals


def stage3_choices(engine: Engine, lm: LM, groups: Sequence[tuple[Sequence[str], Sequence[str], Sequence[str]]], *,
                   max_new_tokens: int, suppress: str = PROTECT.suppress,
                   embedder: Any = None) -> list[tuple[str, int]]:
    """Stage 3 with several exemplars per prompt: for each ``(exemplars, keywords, rewrites)`` group, one final
    prompt per exemplar (all groups in one :func:`stage3_prompts` batch), and the one released is the candidate
    :func:`closest_to_consensus` of the group's rewrites (``embedder``: default the offline all-MiniLM-L6-v2). Returns
    ``(final prompt, index of the exemplar it was written from)`` per group. With one exemplar per group this is
    :func:`stage3_prompts` (no embedder is loaded). Post-processing of released text only."""
    items = [(ex, kws) for exemplars, kws, _ in groups for ex in exemplars]
    finals = stage3_prompts(engine, lm, items, max_new_tokens=max_new_tokens, suppress=suppress)
    if all(len(exemplars) <= 1 for exemplars, _, _ in groups):
        return [(f, 0) for f in finals]
    if embedder is None:
        from dpinfer.eval.embeddings import shared_embedder

        embedder = shared_embedder()
    out, at = [], 0
    for exemplars, _, rewrites in groups:
        cands = finals[at:at + len(exemplars)]
        at += len(exemplars)
        best = closest_to_consensus(cands, rewrites, embedder)
        out.append((cands[best], best))
    return out


def stage3_select(engine: Engine, lm: LM, groups: Sequence[tuple[Sequence[str], Sequence[str], Sequence[str]]], *,
                  max_new_tokens: int, suppress: str = PROTECT.suppress, embedder: Any = None) -> list[str]:
    """The final prompts of :func:`stage3_choices` (without the exemplar each came from)."""
    return [final for final, _ in stage3_choices(engine, lm, groups, max_new_tokens=max_new_tokens,
                                                 suppress=suppress, embedder=embedder)]


def stage3_prompt(engine: Engine, lm: LM, exemplar: str, keywords: Sequence[str], *, max_new_tokens: int,
                  suppress: str = PROTECT.suppress) -> str:
    """Stage 3 for one exemplar and its keywords (:func:`stage3_prompts`)."""
    return stage3_prompts(engine, lm, [(exemplar, keywords)], max_new_tokens=max_new_tokens, suppress=suppress)[0]


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


REQUEST_MARGIN = 4
"""Tokens allowed for the tokenizer merging the prompt's first or last token with the template around it."""


def request_bound(lm: LM, max_input_tokens: int) -> int:
    """The most tokens stage 1's paraphrase request may have: the template's own tokens + ``max_input_tokens`` +
    :data:`REQUEST_MARGIN`. Public: from the model's template and the setting, never from a prompt."""
    return len(paraphrase_ids(lm, "")) + max_input_tokens + REQUEST_MARGIN


def check_request_fits(lm: LM, *, max_input_tokens: int, max_new_tokens: int) -> None:
    """Refuse settings whose longest paraphrase request plus ``max_new_tokens`` exceeds the context window (a check on
    the settings and the model alone: the message holds no number read from a prompt)."""
    from dpinfer.errors import ContextTooLongError

    bound = request_bound(lm, max_input_tokens)
    if bound + max_new_tokens > lm.context_window:
        raise ContextTooLongError(
            f"max_input_tokens={max_input_tokens} with the paraphrase template ({bound - max_input_tokens} tokens) "
            f"and max_new_tokens={max_new_tokens} exceeds the model's context window of {lm.context_window} tokens; "
            "lower max_input_tokens or max_new_tokens"
        )


def truncate_tokens(lm: LM, text: str, max_tokens: int) -> str:
    """``text`` cut to its first ``max_tokens`` tokens (a prefix of ``text``, cut at a token boundary); as is when it
    has no more. Says nothing about whether it cut: under any-two-inputs adjacency the length is private."""
    enc = lm.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    offsets = enc["offset_mapping"]
    if len(offsets) <= max_tokens:
        return text
    return text[: offsets[max_tokens - 1][1]] if max_tokens > 0 else ""


def capped_paraphrase_ids(lm: LM, prompt: str, max_input_tokens: int) -> list[int]:
    """Stage 1's request for ``prompt`` cut to ``max_input_tokens`` tokens (:func:`truncate_tokens`), at most
    :func:`request_bound` tokens long (cut further, a token at a time, in the rare case the template's merges add
    some). A prompt within the cap gives exactly :func:`paraphrase_ids`."""
    cap = max_input_tokens
    bound = request_bound(lm, max_input_tokens)
    while True:
        ids = paraphrase_ids(lm, truncate_tokens(lm, prompt, cap))
        if len(ids) <= bound or cap <= 0:
            return ids[:bound]
        cap -= 1


def _release_terms(model: LM, mech: DPPrompt, clip_source: str, *, n: int, method: str, epsilon: float | None,
                   delta: float, n_keywords: int, keywords: str, max_new_tokens: int, jem_epsilon: float,
                   suppress: str, n_exemplars: int, max_input_tokens: int, seeded: bool
                   ) -> tuple[Guarantee, dict[str, Any]]:
    """The guarantee and the settings of a release: from the parameters alone (never the prompt, never the seed)."""
    from dpinfer.accounting import Guarantee

    parameters: dict[str, Any] = {
        "clip_min": mech.clip_min, "clip_max": mech.clip_max, "clip_source": clip_source,
        "temperature": mech.temperature, "epsilon_per_token": mech.epsilon_per_token, "num_rewrites": n,
        "T_max": max_new_tokens, "composed_tokens": n * max_new_tokens,
        "composition": mech.guarantee(max_new_tokens).parameters["composition"],
    }
    if method == "dp-gtr":
        parameters["keywords"] = keywords
        parameters["n_keywords"] = n_keywords
        parameters["suppress"] = suppress
        parameters["n_exemplars"] = n_exemplars
        if keywords == "jem":
            parameters["jem_epsilon"] = jem_epsilon
            parameters["jem_note"] = ("ε₂ of the keyword release against one rewrite replaced (sensitivity 2); "
                                      "post-processing for the headline adjacency, not added to ε")
    guarantee = Guarantee.from_loss(mech.loss(max_new_tokens), delta=delta, mechanism=method, adjacency=ADJACENCY,
                                    parameters=parameters, max_new_tokens=max_new_tokens)
    if seeded:
        guarantee = dataclasses.replace(guarantee, seeded=True)
    settings = {"method": method, "epsilon": epsilon, "temperature": mech.temperature, "delta": delta,
                "n_rewrites": n, "n_keywords": n_keywords if method == "dp-gtr" else 0,
                "keywords": keywords if method == "dp-gtr" else None, "max_new_tokens": max_new_tokens,
                "jem_epsilon": jem_epsilon if method == "dp-gtr" and keywords == "jem" else None,
                "suppress": suppress if method == "dp-gtr" else None,
                "n_exemplars": n_exemplars if method == "dp-gtr" else None,
                "max_input_tokens": max_input_tokens, "model": model.name}
    return guarantee, settings


# ---------------------------------------------------------------------------------------------------------- API
@charged("prompt-source", what="protect_prompt")
def protect_prompt(
    prompt: str,
    *,
    lm: LM | str | None = None,
    method: str = PROTECT.method,
    epsilon: float | None = None,
    temperature: float | None = None,
    delta: float = PROTECT.delta,
    n_rewrites: int | None = None,
    n_keywords: int = DEFAULT_N_KEYWORDS,
    keywords: str = PROTECT.keywords,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    jem_epsilon: float = DEFAULT_JEM_EPSILON,
    suppress: str = PROTECT.suppress,
    n_exemplars: int = PROTECT.n_exemplars,
    max_input_tokens: int = PROTECT.max_input_tokens,
    seed: int | None = None,
    embedder: Any = None,
    profile: dict[str, float] | None = None,
    ledger: Any = None,
    unit: str | None = None,
    runtime: Any = None,
) -> ProtectedPrompt:
    """Protect ``prompt`` with DP-GTR (default) or DP-Prompt; see the module docstring.

    Args:
        prompt: the private prompt (never logged, never in an error message, never in the result).
        lm: model (default: the embedded SmolLM2-135M-Instruct); its clip bounds come from
            :func:`~dpinfer.pipelines.clip_bounds.clip_bounds` (shipped, stored, or measured once on public text).
        method: ``"dp-gtr"`` (n rewrites, keywords, final prompt) or ``"dp-prompt"`` (one rewrite, the baseline).
        epsilon: target ε of ALL rewrites together (τ is calibrated to it); or
        temperature: τ of stage 1 (ε follows); exactly one of the two (neither: τ = 0.75).
        delta: δ of the (ε, δ) guarantee.
        n_rewrites: stage 1's rewrites (default 10 for dp-gtr; dp-prompt makes exactly 1).
        n_keywords: K, the keywords released in stage 2.
        keywords: ``"ndp"`` (top K as is) or ``"jem"`` (Joint Exponential Mechanism at ``jem_epsilon``).
        max_new_tokens: T_max of every rewrite and of the final prompt, fixed in advance (default 48).
        jem_epsilon: ε₂ of JEM (recorded in the guarantee's parameters, not added: see the module docstring).
        suppress: how stage 3 keeps the keywords out of the final prompt: ``"ban"`` (default; asked AND banned while
            decoding) or ``"instruct"`` (asked only, as in the paper): :func:`stage3_prompts`.
        n_exemplars: stage 3 writes a final prompt from each of the ``n_exemplars`` lowest-perplexity rewrites and
            releases the one closest to the rewrites' consensus (:func:`stage3_select`); 1 = the paper's single
            exemplar.
        max_input_tokens: a PUBLIC cap on the prompt's tokens (default 256): a longer prompt is cut to its first
            ``max_input_tokens`` tokens before stage 1, silently (under this adjacency the prompt's length is private,
            so nothing may say whether it was cut). With it the paraphrase request has at most
            :func:`request_bound` tokens, a number fixed by the settings and the model.
        seed: tests and benchmarks only (the guarantee then holds only while the seed is secret; never stored).
        embedder: the sentence encoder of stage 3's consensus pick (default: the offline all-MiniLM-L6-v2, loaded
            once per process: :func:`~dpinfer.eval.embeddings.shared_embedder`).
        profile: diagnostics only: a dict that receives the seconds spent per stage (``loading``, ``stage1``,
            ``ranking``, ``stage2`` (keywords), ``stage3``, ``embedding``, ``total``). Wall time depends on the prompt
            and is not protected: it is never part of the release.
        ledger: a :class:`~dpinfer.Ledger` (or its path) this release is charged to (:mod:`dpinfer.pipelines.budget`):
            reserved before the model loads when ``epsilon`` is given (its cost follows from the parameters), else
            priced once the clip bounds are known, always before any token; None: no ledger.
        unit: the prompt source on the ledger (a user or a tenant: local DP composes over every prompt protected
            for it); required with a ledger.
        runtime: a :class:`~dpinfer.runtime.Runtime` whose model, engine and embedder to use (instead of ``lm`` and
            ``embedder``; a server's engine batches the three stages with its other requests).

    Raises (before the model loads): :class:`~dpinfer.errors.InvalidInputError` for an empty prompt,
    :class:`~dpinfer.errors.ConfigurationError` for bad parameters (ε ≤ 0, both ε and τ, …). After the tokenizer
    loads and before the prompt is read: :class:`~dpinfer.errors.ContextTooLongError` when
    :func:`request_bound` plus ``max_new_tokens`` exceeds the context window (a check on the settings alone).
    """
    from dpinfer.engine import Engine
    from dpinfer.generation import resolve_lm
    from dpinfer.mechanisms.randomness import random_source
    from dpinfer.pipelines.clip_bounds import clip_bounds

    _check_prompt(prompt)
    n = check_protect_params(method=method, epsilon=epsilon, temperature=temperature, delta=delta,
                             n_rewrites=n_rewrites, n_keywords=n_keywords, keywords=keywords,
                             max_new_tokens=max_new_tokens, jem_epsilon=jem_epsilon, seed=seed,
                             suppress=suppress, n_exemplars=n_exemplars, max_input_tokens=max_input_tokens)
    spend = current_spend()
    if spend is not None and epsilon is not None:  # the cost from the parameters alone, before the model loads
        spend.reserve(pure_steps_estimate(epsilon, delta, n * max_new_tokens, bounded_range=True), mechanism=method)
    stages: dict[str, float] = {} if profile is None else profile
    stages.clear()
    t0 = clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        stages[name] = stages.get(name, 0.0) + now - clock
        clock = now

    model = runtime.lm if runtime is not None else resolve_lm(lm)
    check_request_fits(model, max_input_tokens=max_input_tokens, max_new_tokens=max_new_tokens)
    bounds = clip_bounds(model)
    mech = stage1_mechanism(clip=bounds.bounds, n_rewrites=n, max_new_tokens=max_new_tokens, delta=delta,
                            epsilon=epsilon, temperature=temperature)
    if spend is not None:  # the exact cost, before any token
        spend.settle(mech.loss(max_new_tokens), mechanism=method)
    source = random_source(seed)
    engine = runtime.engine if runtime is not None else Engine(model)
    if method == "dp-gtr" and n_exemplars > 1 and embedder is None:
        from dpinfer.eval.embeddings import shared_embedder

        embedder = runtime.embedder if runtime is not None else shared_embedder()
    lap("loading")
    ids = capped_paraphrase_ids(model, prompt, max_input_tokens)
    rewrites = stage1_rewrites(engine, model, ids, mech, max_new_tokens=max_new_tokens, generator=source)
    del prompt, ids  # nothing below reads the original prompt
    lap("stage1")
    if method == "dp-prompt":
        exemplar, kws, final = rewrites[0], [], rewrites[0]
    else:
        exemplars = choose_exemplars(model, rewrites, n_exemplars)
        lap("ranking")
        kws = release_keywords(rewrites, method=keywords, k=n_keywords, jem_epsilon=jem_epsilon, generator=source)
        lap("stage2")
        timed = _TimedEmbedder(embedder, stages) if embedder is not None else None
        final, chosen = stage3_choices(engine, model, [(exemplars, kws, rewrites)], max_new_tokens=max_new_tokens,
                                       suppress=suppress, embedder=timed)[0]
        exemplar = exemplars[chosen]  # the exemplar the released final prompt was written from
        lap("stage3")
        if timed is not None:  # the consensus pick's encoder time, counted apart from stage 3's decoding
            stages["stage3"] -= timed.seconds
    stages["total"] = time.perf_counter() - t0
    guarantee, settings = _release_terms(model, mech, bounds.source, n=n, method=method, epsilon=epsilon, delta=delta,
                                         n_keywords=n_keywords, keywords=keywords, max_new_tokens=max_new_tokens,
                                         jem_epsilon=jem_epsilon, suppress=suppress, n_exemplars=n_exemplars,
                                         max_input_tokens=max_input_tokens, seeded=seed is not None)
    return ProtectedPrompt(prompt=final, exemplar=exemplar, keywords=list(kws), rewrites=rewrites,
                           guarantee=guarantee, method=method, epsilon_per_token=mech.epsilon_per_token,
                           settings=settings)


def protect_prompts(
    prompts: Sequence[str],
    *,
    lm: LM | str | None = None,
    method: str = PROTECT.method,
    epsilon: float | None = None,
    temperature: float | None = None,
    delta: float = PROTECT.delta,
    n_rewrites: int | None = None,
    n_keywords: int = DEFAULT_N_KEYWORDS,
    keywords: str = PROTECT.keywords,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    jem_epsilon: float = DEFAULT_JEM_EPSILON,
    suppress: str = PROTECT.suppress,
    n_exemplars: int = PROTECT.n_exemplars,
    max_input_tokens: int = PROTECT.max_input_tokens,
    seeds: Sequence[int | None] | None = None,
    embedder: Any = None,
) -> list[ProtectedPrompt | DPInferError]:
    """:func:`protect_prompt` for several prompts (each a different person's: separate releases that do not compose)
    sharing the engine's steps: stage 1 of every prompt as one job of :meth:`Engine.run_jobs
    <dpinfer.engine.Engine.run_jobs>` (one forward per step for all prompts' rows; each prompt's rows drawn from its
    own source, ``seeds[i]`` or a fresh secure source; every job padded to the PUBLIC width :func:`request_bound`, so
    no prompt's computation depends on another's content or length: the slot engine's rules), stage 2 per prompt,
    stage 3 of every prompt in ONE engine run (post-processing of released rewrites only), one encoder for every
    consensus pick. Returns one item per prompt: its
    :class:`ProtectedPrompt`, or the :class:`~dpinfer.errors.DPInferError` that refused it (an empty prompt; the
    messages never quote a prompt). Parameters are checked once, before the model loads (a bad one raises)."""
    from dpinfer.engine import Engine, EngineJob
    from dpinfer.errors import DPInferError
    from dpinfer.generation import resolve_lm
    from dpinfer.mechanisms.randomness import random_source
    from dpinfer.pipelines.clip_bounds import clip_bounds

    n = check_protect_params(method=method, epsilon=epsilon, temperature=temperature, delta=delta,
                             n_rewrites=n_rewrites, n_keywords=n_keywords, keywords=keywords,
                             max_new_tokens=max_new_tokens, jem_epsilon=jem_epsilon, seed=None,
                             suppress=suppress, n_exemplars=n_exemplars, max_input_tokens=max_input_tokens)
    seeds = [None] * len(prompts) if seeds is None else list(seeds)
    if len(seeds) != len(prompts):
        raise ConfigurationError(f"give one seed per prompt ({len(prompts)}), got {len(seeds)}")
    out: list[ProtectedPrompt | DPInferError | None] = [None] * len(prompts)
    ok: list[int] = []
    for i, p in enumerate(prompts):
        try:
            _check_prompt(p)
        except DPInferError as err:
            out[i] = err
        else:
            ok.append(i)
    if not ok:
        return [o for o in out if o is not None]
    model = resolve_lm(lm)
    check_request_fits(model, max_input_tokens=max_input_tokens, max_new_tokens=max_new_tokens)
    bounds = clip_bounds(model)
    mech = stage1_mechanism(clip=bounds.bounds, n_rewrites=n, max_new_tokens=max_new_tokens, delta=delta,
                            epsilon=epsilon, temperature=temperature)
    sources = [random_source(seeds[i]) for i in ok]
    engine = Engine(model)
    bound = request_bound(model, max_input_tokens)
    jobs = [EngineJob(contexts=[capped_paraphrase_ids(model, prompts[i], max_input_tokens)] * n,
                      mechanism=stage1_mechanism(clip=bounds.bounds, n_rewrites=n, max_new_tokens=max_new_tokens,
                                                 delta=delta, temperature=mech.temperature),
                      max_new_tokens=max_new_tokens, generator=src, pad_width=bound)
            for i, src in zip(ok, sources, strict=True)]
    seqs: dict[int, list[list[int]]] = {}
    for j, result in engine.run_jobs(jobs):  # one forward per step for every prompt's rows, public shapes
        seqs[j] = result.sequences
    del jobs  # nothing below reads a prompt
    texts = [model.decode(seq).strip() for j in range(len(ok)) for seq in seqs[j]]
    per = [texts[j * n:(j + 1) * n] for j in range(len(ok))]
    if method == "dp-prompt":
        finals = [(rw[0], rw[0], []) for rw in per]
    else:
        if n_exemplars > 1 and embedder is None:
            from dpinfer.eval.embeddings import shared_embedder

            embedder = shared_embedder()
        groups = []
        for rw, src in zip(per, sources, strict=True):
            exemplars = choose_exemplars(model, rw, n_exemplars)
            kws = release_keywords(rw, method=keywords, k=n_keywords, jem_epsilon=jem_epsilon, generator=src)
            groups.append((exemplars, kws, rw))
        chosen = stage3_choices(engine, model, groups, max_new_tokens=max_new_tokens, suppress=suppress,
                                embedder=embedder)
        finals = [(final, g[0][c], list(g[1])) for (final, c), g in zip(chosen, groups, strict=True)]
    for j, i in enumerate(ok):
        final, exemplar, kws = finals[j]
        guarantee, settings = _release_terms(model, mech, bounds.source, n=n, method=method, epsilon=epsilon,
                                             delta=delta, n_keywords=n_keywords, keywords=keywords,
                                             max_new_tokens=max_new_tokens, jem_epsilon=jem_epsilon,
                                             suppress=suppress, n_exemplars=n_exemplars,
                                             max_input_tokens=max_input_tokens, seeded=seeds[i] is not None)
        out[i] = ProtectedPrompt(prompt=final, exemplar=exemplar, keywords=kws, rewrites=per[j], guarantee=guarantee,
                                 method=method, epsilon_per_token=mech.epsilon_per_token, settings=settings)
    return [o for o in out if o is not None]


def guarantee_lines(res: ProtectedPrompt) -> list[str]:
    """The guarantee for the command line: one plain sentence, a caveat when ε is too large to bound anything useful
    (what e^ε means there, where to choose ε), then the details: per-token ε and composed ε side by side."""
    from dpinfer.accounting.guarantee import epsilon_caveat
    from dpinfer.checks import format_up

    g = res.guarantee
    p = g.parameters
    caveat = epsilon_caveat(g.epsilon, "the prompt")
    lines = [f"Guarantee: the whole prompt is protected with ε = {format_up(g.epsilon)} (δ = {format_up(g.delta)}) "
             "against any other prompt; not protected: that a prompt was protected with these settings, and timing.",
             *([caveat] if caveat else []),
             "Details: " + str(g),
             f"per token: ε_tok = 2(b_max − b_min)/τ = 2·({p['clip_max']:.3g} − {p['clip_min']:.3g})/"
             f"{p['temperature']:.3g} = {res.epsilon_per_token:.4g}; composed over {p['num_rewrites']} rewrites × "
             f"T_max {p['T_max']} = "
             f"{p['composed_tokens']} tokens: ε = {g.epsilon:.4g} at δ = {g.delta:g} ({p['composition']})."]
    if "jem_epsilon" in p:
        lines.append(f"keywords by JEM at ε₂ = {p['jem_epsilon']:g} per rewrite (post-processing here; not added).")
    return lines


__all__ = [
    "ADJACENCY",
    "FINAL_TEMPLATE",
    "KEYWORD_METHODS",
    "METHODS",
    "SUPPRESS_METHODS",
    "ProtectedPrompt",
    "check_protect_params",
    "choose_exemplar",
    "choose_exemplars",
    "closest_to_consensus",
    "guarantee_lines",
    "keyword_ban",
    "keyword_variants",
    "protect_prompt",
    "protect_prompts",
    "release_keywords",
    "stage1_mechanism",
    "stage1_rewrites",
    "stage3_choices",
    "stage3_prompt",
    "stage3_prompts",
    "stage3_select",
    "strip_echoes",
]
