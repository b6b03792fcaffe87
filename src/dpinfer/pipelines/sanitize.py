"""Document sanitisation: rewrite a sensitive document with a per-group (ε, δ) guarantee (DP-Fusion, ALGORITHMS §1).

Steps of :func:`sanitize`:

1. **Tag** the document (``tagger="presidio"`` / ``"regex"``) or take the user's ``spans``; fail closed: if tagging
   fails nothing is generated. Labels are TAB's 8 types; by default each type present is one privacy group, and
   ``groups=`` merges types into named groups.
2. **Contexts**: the prompt (rewriting instruction + document, in the model's chat template) is tokenised ONCE with
   character offsets. A token overlapping a span of group g is a token of g. The *public* context replaces the tokens
   of every group by the placeholder token (the id of ``_``), one for one; the *private* context of group i replaces
   those of every other group. All m + 1 contexts have the same length and positions: one batch, one KV cache, and
   the instruction before the first private token is prefilled once.
3. **Decode** with the chosen method on the engine (joint mode), ``T_max = max_new_tokens`` tokens at most.

Methods (same engine, same prompt; ALGORITHMS §5): ``dp-fusion`` (the default), ``original`` (private context, no
privacy), ``ner-scrub`` (public context only: the output does not depend on the tagged content at all, ε = 0 for it),
``dp-decoding`` (Majmudar et al. 2022, on the private context) and ``dp-prompt`` (Utpala et al. 2023, on the private
context). The two baselines protect the whole document (any two documents are adjacent), DP-Fusion and NER-scrub the
content of the tagged spans only, and none of them protects what the tagger missed.

Documents longer than the model's context window raise :class:`~dpinfer.errors.ContextTooLongError` (no silent
truncation).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from dpinfer.errors import ConfigurationError, ContextTooLongError, InvalidInputError
from dpinfer.taggers.base import TAB_LABELS, Span, validate_spans

if TYPE_CHECKING:
    from dpinfer.accounting import Guarantee
    from dpinfer.models import LM

METHODS = ("dp-fusion", "original", "ner-scrub", "dp-decoding", "dp-prompt")
PLACEHOLDER = "_"

DEFAULT_INSTRUCTION = (
    "Rewrite the following document in your own words. Keep its structure and meaning. "
    "Where a part is written as underscores (_), do not guess it: write a neutral expression instead."
)
"""Default rewriting instruction (chosen from the ε sweep of ``dpinfer bench sanitize``; see docs/sanitize.md)."""

DEFAULTS: dict[str, Any] = {
    "epsilon": 40.0,
    "temperature": 0.7,
    "top_k": 40,
    "support_margin": 0.0,
    "no_repeat_ngram": 3,
}
"""Decoding defaults for the embedded 135M model (see docs/sanitize.md for the sweep that chose them). The top-k
support is computed from the PUBLIC context only and applied to every context, which keeps the guarantee."""

FUSION_ADJACENCY = (
    "replace-by-null of one privacy group's tagged spans (the content of the spans is protected; their existence, "
    "positions and token lengths, and anything the tagger missed, are not)"
)


@dataclass
class SanitizeResult:
    """Output of :func:`sanitize`.

    Attributes:
        text: the released rewrite.
        guarantee: the ex-ante guarantee (``.epsilon`` is the worst group's, ``.groups`` has one entry per group).
        spans: the spans used (offsets into the input document).
        groups: group name → the TAB labels it covers (only groups present in the document).
        method: the method used.
        data_dependent: per-step statistics of the realised decoding (mixing weights λ and divergences per group,
            summaries). DATA-DEPENDENT: they describe this run, they are not a privacy guarantee.
    """

    text: str
    guarantee: Guarantee
    spans: list[Span]
    token_ids: list[int]
    groups: dict[str, list[str]]
    method: str
    finish_reason: str
    prompt_tokens: int
    generated_tokens: int
    max_new_tokens: int
    seconds: float
    settings: dict[str, Any] = field(default_factory=dict)
    data_dependent: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        g = self.guarantee.to_dict()
        return {
            "text": self.text,
            "method": self.method,
            "guarantee": g,
            "spans": [s.to_dict() for s in self.spans],
            "groups": self.groups,
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "max_new_tokens": self.max_new_tokens,
            "seconds": round(self.seconds, 3),
            "settings": self.settings,
            "data_dependent": {"note": "data-dependent statistics of this run; not a privacy guarantee",
                               **self.data_dependent},
        }


@dataclass
class PreparedContexts:
    """The token contexts of one document (public first, then one private context per group)."""

    public: list[int]
    private: list[list[int]]
    original: list[int]
    group_names: list[str]
    document_tokens: int
    private_tokens: dict[str, int]


# ---------------------------------------------------------------------------------------------------------- groups
def resolve_groups(spans: Sequence[Span], groups: Mapping[str, Sequence[str]] | None) -> dict[str, list[str]]:
    """Group name → labels, restricted to labels present in ``spans``; default one group per label present."""
    present = sorted({s.label for s in spans}, key=TAB_LABELS.index)
    if groups is None:
        return {label: [label] for label in present}
    seen: dict[str, str] = {}
    out: dict[str, list[str]] = {}
    for name, labels in groups.items():
        if not isinstance(name, str) or not name:
            raise InvalidInputError("group names must be non-empty strings")
        for label in labels:
            if label not in TAB_LABELS:
                raise InvalidInputError(f"unknown label {label!r} in group {name!r}; labels: {', '.join(TAB_LABELS)}")
            if label in seen:
                raise InvalidInputError(f"label {label} is in two groups ({seen[label]!r} and {name!r})")
            seen[label] = name
        members = [lab for lab in labels if lab in present]
        if members:
            out[name] = members
    missing = [lab for lab in present if lab not in seen]
    for lab in missing:  # labels the user did not group keep a group of their own
        if lab in out:
            raise InvalidInputError(f"group name {lab!r} clashes with an ungrouped label of the same name")
        out[lab] = [lab]
    return out


def resolve_group_epsilon(group_names: Sequence[str], groups: Mapping[str, Sequence[str]], epsilon: float | None,
                          group_epsilon: Mapping[str, float] | None) -> dict[str, float]:
    """Target ε per group: ``group_epsilon`` by group name (or by a label of the group), else ``epsilon``."""
    targets: dict[str, float] = {}
    given = dict(group_epsilon or {})
    for key in given:
        if key not in TAB_LABELS and key not in group_names and key not in groups:
            raise InvalidInputError(
                f"--group-epsilon names {key!r}, which is neither a group nor a label; labels: {', '.join(TAB_LABELS)}"
            )
    for name in group_names:
        value = given.get(name)
        if value is None:
            hits = [given[lab] for lab in groups[name] if lab in given]
            value = min(hits) if hits else epsilon
        if value is None:
            value = DEFAULTS["epsilon"]
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ConfigurationError(f"ε for group {name} must be a finite number > 0, got {value!r}")
        targets[name] = float(value)
    return targets


# ---------------------------------------------------------------------------------------------------------- contexts
def build_prompt(lm: LM, document: str, instruction: str) -> tuple[str, int]:
    """The chat prompt and the character offset of ``document`` inside it."""
    prompt = lm.instruction_prompt(f"{instruction}\n\n{document}")
    offset = prompt.find(document)
    if offset < 0:
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
    ph = placeholder_id(lm)
    public = np.where(token_mask != 0, ph, ids)
    private = []
    counts = {}
    for gi, name in enumerate(names):
        others = token_mask & ~(1 << gi)
        private.append(np.where(others != 0, ph, ids).tolist())
        counts[name] = int(((token_mask >> gi) & 1).sum())
    doc_tokens = int(((offsets[:, 0] >= offset) & (offsets[:, 0] < offset + len(document))).sum())
    return PreparedContexts(public=public.tolist(), private=private, original=ids.tolist(), group_names=names,
                            document_tokens=doc_tokens, private_tokens=counts)


def default_max_new_tokens(document_tokens: int) -> int:
    """A rewrite about as long as the document: ``ceil(1.1 · document tokens) + 16``."""
    return math.ceil(1.1 * document_tokens) + 16


# ---------------------------------------------------------------------------------------------------------- run
def _get_spans(text: str, spans: Any, tagger: Any, label_map: Mapping[str, str | None] | None) -> list[Span]:
    from dpinfer.taggers import Tagger, get_tagger, load_spans

    if spans is not None:
        if isinstance(spans, Sequence) and spans and all(isinstance(s, Span) for s in spans):
            loaded = list(spans)
        else:
            loaded = load_spans(spans, label_map=label_map)
        return validate_spans(loaded, len(text))
    if tagger is None:
        raise ConfigurationError("give spans= or a tagger (e.g. tagger='presidio' or 'regex')")
    tg = tagger if isinstance(tagger, Tagger) else get_tagger(tagger, **({"label_map": label_map} if label_map else {}))
    return tg.tag(text)


def sanitize(
    text: str,
    *,
    lm: LM | str | None = None,
    method: str = "dp-fusion",
    epsilon: float | None = None,
    group_epsilon: Mapping[str, float] | None = None,
    delta: float = 1e-5,
    spans: Any = None,
    tagger: Any = "presidio",
    groups: Mapping[str, Sequence[str]] | None = None,
    instruction: str | None = None,
    max_new_tokens: int | None = None,
    alpha: float = 2.0,
    temperature: float | None = None,
    top_k: int | str | None = "default",
    seed: int | None = None,
    accounting: str = "dpinfer",
    adjacency: str = "replace-by-null",
    label_map: Mapping[str, str | None] | None = None,
    min_new_tokens: int = 0,
    no_repeat_ngram: int | str | None = "default",
    progress: Callable[[int, int], None] | None = None,
) -> SanitizeResult:
    """Rewrite ``text`` with a per-group differential-privacy guarantee (see the module docstring).

    Args:
        text: the private document.
        lm: model (default: the embedded SmolLM2-135M-Instruct).
        method: ``dp-fusion`` | ``original`` | ``ner-scrub`` | ``dp-decoding`` | ``dp-prompt``.
        epsilon: target ε for every group (DP-Fusion) or the whole document (baselines); default 40.
        group_epsilon: per-group targets by group name or label, e.g. ``{"PERSON": 10, "DATETIME": 60}``.
        delta: δ of every guarantee.
        spans: user-given spans (list of :class:`Span`, a spans file path, JSON string or parsed JSON); skips the
            tagger.
        tagger: ``"presidio"`` (default), ``"regex"``, or a :class:`~dpinfer.taggers.Tagger`.
        groups: group name → labels, to merge types into groups (``{"ID": ["PERSON", "CODE"]}``).
        instruction: the rewriting instruction (default :data:`DEFAULT_INSTRUCTION`).
        max_new_tokens: ``T_max`` (default follows the document's length, :func:`default_max_new_tokens`).
        alpha: Rényi order at which DP-Fusion's bound is enforced and charged.
        temperature, top_k: decoding transforms (defaults :data:`DEFAULTS`; DP-Fusion's top-k support is computed
            from the public context only). ``top_k=None`` samples from the full vocabulary.
        seed: for tests and benchmarks only (the same seed reproduces the output). Without it (the default) the noise
            comes from the operating system's secure generator. With it the guarantee holds only while the seed stays
            secret (``guarantee.seeded`` is set and the statement says so); the seed is never written into the result.
        accounting: ``"dpinfer"`` or ``"as_published"`` (the authors' 4·β per step, DP-Fusion only).
        adjacency: DP-Fusion's neighbouring documents: ``"replace-by-null"`` (default: one group's spans replaced by
            placeholders) or ``"replace-one"`` (one group's values swapped for any others; the bound is enforced at
            order 2α and charged ``((α − ½)/(α − 1) + 1)·b`` inside the mixture formula, so the same ε costs more
            noise). The baselines' guarantees do not depend on it.
        label_map: translation of span labels to TAB types, for spans files with other labels.
        no_repeat_ngram: ban repeating any n-gram of the generated tokens (a public transform applied to every
            context alike: it reads released tokens only); ``None`` disables it.
        progress: called as ``progress(tokens_done, T_max)`` after every generated token.
        min_new_tokens: EOS is masked for every context alike before this many tokens (benchmarks; a public
            transform that leaves the guarantee, which is computed for ``max_new_tokens``, unchanged).
    """
    from dpinfer.engine import Engine
    from dpinfer.generation import resolve_lm
    from dpinfer.mechanisms.transforms import NoRepeatNGram
    from dpinfer.validation import check_sanitize_params, check_text

    if method not in METHODS:
        raise ConfigurationError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    check_text(text, "the document")
    check_sanitize_params(method=method, epsilon=epsilon, group_epsilon=group_epsilon, delta=delta, alpha=alpha,
                          temperature=temperature, top_k=top_k, max_new_tokens=max_new_tokens,
                          no_repeat_ngram=no_repeat_ngram, seed=seed, accounting=accounting, adjacency=adjacency,
                          tagger=tagger if spans is None else None, groups=groups)  # all before the model loads
    if epsilon is not None and not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise ConfigurationError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    if not 0 < delta < 1:
        raise ConfigurationError(f"delta must lie in (0, 1), got {delta!r}")
    if method == "dp-fusion":
        from dpinfer.mechanisms.dp_fusion import _check_adjacency

        _check_adjacency(adjacency, accounting)  # before the document is tagged or read
    model = resolve_lm(lm)
    instruction = DEFAULT_INSTRUCTION if instruction is None else instruction
    temp = DEFAULTS["temperature"] if temperature is None else float(temperature)
    k = DEFAULTS["top_k"] if top_k == "default" else top_k

    used_spans = _get_spans(text, spans, tagger, label_map)  # fail closed: any tagging error propagates here
    group_map = resolve_groups(used_spans, groups)
    prep = prepare_contexts(model, text, used_spans, group_map, instruction)
    t_max = default_max_new_tokens(prep.document_tokens) if max_new_tokens is None else int(max_new_tokens)
    if t_max < 1:
        raise ConfigurationError(f"max_new_tokens must be ≥ 1, got {max_new_tokens!r}")
    if len(prep.original) + t_max > model.context_window:
        raise ContextTooLongError(
            f"the prompt ({len(prep.original)} tokens) plus max_new_tokens={t_max} exceeds the model's context window "
            f"({model.context_window}); split the document into parts and sanitise each (each part's guarantee "
            "composes: charge every part's T_max to the same groups), or lower --max-new-tokens"
        )
    settings: dict[str, Any] = {"temperature": temp, "top_k": k, "alpha": alpha, "delta": delta,
                                "instruction": "default" if instruction == DEFAULT_INSTRUCTION else "custom",
                                "model": model.name}  # never the seed (it would let anyone replay the noise)
    if method == "dp-fusion":
        settings["adjacency"] = adjacency

    contexts, mech = _mechanism(method, model, prep, group_map, epsilon, group_epsilon, delta, t_max, alpha, temp, k,
                                accounting, settings, adjacency)
    t0 = time.perf_counter()
    ngram = DEFAULTS["no_repeat_ngram"] if no_repeat_ngram == "default" else no_repeat_ngram
    settings["no_repeat_ngram"] = ngram
    processors = [NoRepeatNGram(int(ngram))] if ngram else []
    box: list[Any] = []
    for event in Engine(model).stream(contexts, mech, max_new_tokens=t_max, seed=seed, processors=processors,
                                      min_new_tokens=min(min_new_tokens, t_max), result=box):
        if progress is not None:
            progress(event.step + 1, t_max)
    out = box[0]
    seconds = time.perf_counter() - t0
    ids = out.sequences[0]
    if method == "ner-scrub" or (method == "dp-fusion" and not prep.group_names):
        guarantee = _scrub_guarantee(method, group_map, delta, t_max)
    else:
        guarantee = mech.guarantee(t_max)
    if seed is not None:
        guarantee = dataclasses.replace(guarantee, seeded=True)
    return SanitizeResult(
        text=model.decode(ids).strip(), guarantee=guarantee, token_ids=list(ids),
        spans=used_spans, groups=group_map, method=method, finish_reason=out.finish_reasons[0],
        prompt_tokens=len(prep.original), generated_tokens=len(ids), max_new_tokens=t_max, seconds=seconds,
        settings=settings, data_dependent=_summarise_steps(out.steps, prep.group_names) if method == "dp-fusion"
        else {},
    )


def _scrub_guarantee(method: str, groups: Mapping[str, Sequence[str]], delta: float, t_max: int) -> Guarantee:
    """NER scrubbing (or DP-Fusion with nothing tagged) decodes the public context only: the output does not depend on
    the content of any tagged span, so ε = 0 for every group under the same adjacency as DP-Fusion."""
    from dpinfer.accounting import GroupGuarantee, Guarantee

    return Guarantee(
        epsilon=0.0, delta=delta, mechanism=method, adjacency=FUSION_ADJACENCY,
        parameters={"T_max": t_max}, max_new_tokens=t_max,
        groups=tuple(GroupGuarantee(name, 0.0, delta, {}) for name in groups),
    )


def _mechanism(method: str, lm: LM, prep: PreparedContexts, groups: Mapping[str, Sequence[str]],
               epsilon: float | None, group_epsilon: Mapping[str, float] | None, delta: float, t_max: int,
               alpha: float, temp: float, top_k: int | None, accounting: str,
               settings: dict[str, Any], adjacency: str = "replace-by-null") -> tuple[list[list[int]], Any]:
    from dpinfer.mechanisms import get_mechanism

    if method == "original":
        return [prep.original], get_mechanism("sampler", temperature=temp, top_k=top_k, mode="joint")
    if method == "ner-scrub":
        return [prep.public], get_mechanism("sampler", temperature=temp, top_k=top_k, mode="joint")
    eps = DEFAULTS["epsilon"] if epsilon is None else epsilon
    if method == "dp-decoding":
        from dpinfer.mechanisms.dp_decoding import DPDecoding

        settings["top_k"] = None  # the baseline's guarantee needs the full vocabulary
        mech = DPDecoding.calibrated(eps, delta=delta, max_new_tokens=t_max, vocab_size=lm.vocab_size,
                                     temperature=temp)
        return [prep.original], mech
    if method == "dp-prompt":
        from dpinfer.mechanisms.dp_prompt import DPPrompt, public_clip_bounds

        settings["top_k"] = None
        lo, hi = public_clip_bounds(lm)
        settings["clip"] = [lo, hi]
        mech = DPPrompt.calibrated(eps, delta=delta, max_new_tokens=t_max, clip_min=lo, clip_max=hi, mode="joint")
        return [prep.original], mech
    # dp-fusion
    from dpinfer.mechanisms.dp_fusion import DPFusion

    if not prep.group_names:
        # nothing tagged: the output depends on no protected content; decode the (identical) public context
        return [prep.public], get_mechanism("sampler", temperature=temp, top_k=top_k, mode="joint")
    targets = resolve_group_epsilon(prep.group_names, groups, epsilon, group_epsilon)
    settings["group_epsilon"] = targets
    mech = DPFusion.calibrated(targets, max_new_tokens=t_max, delta=delta, alpha=alpha, accounting=accounting,
                               adjacency=adjacency,
                               temperature=temp, top_k=top_k)
    return [prep.public, *prep.private], mech


def _summarise_steps(steps: Sequence[Mapping[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    if not steps or "lambda" not in steps[0]:
        return {}
    lam = np.asarray([s["lambda"] for s in steps], dtype=np.float64).reshape(len(steps), -1)
    div = np.asarray([s.get("divergence", [math.nan] * lam.shape[1]) for s in steps], dtype=np.float64)
    div = div.reshape(lam.shape)
    return {
        "groups": {
            name: {"mean_lambda": float(lam[:, i].mean()), "share_lambda_1": float((lam[:, i] >= 1.0).mean()),
                   "max_divergence": float(np.nanmax(div[:, i])) if np.isfinite(div[:, i]).any() else None}
            for i, name in enumerate(names)
        },
        "lambda_per_step": lam.round(6).tolist(),
        "divergence_per_step": div.round(8).tolist(),
    }
