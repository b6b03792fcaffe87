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
3. **Decode** with the chosen method on the engine (joint mode), ``T_max = max_new_tokens`` tokens at most (default:
   the document's length for DP-Fusion, public under its adjacency; a fixed :data:`BASELINE_MAX_NEW_TOKENS` for the
   whole-document baselines).
4. **Release** :meth:`SanitizeResult.to_dict`: the rewrite and the ex-ante guarantee with what it leaves public;
   data-dependent statistics only with ``debug=True``.

Fail closed: no span given or found, spans made for another document, or a chat template that does not keep the
document verbatim are refused before the model loads (the template check needs the tokenizer).

Methods (same engine, same prompt; ALGORITHMS §5): every mechanism registered for ``"sanitize"``
(:func:`dpinfer.methods.method_names`) and the baselines of :data:`dpinfer.methods.BASELINES`: ``dp-fusion`` (the
default), ``original`` (private context, no privacy), ``ner-scrub`` (public context only: the output does not depend
on the tagged content at all, ε = 0 for it), ``dp-decoding`` (Majmudar et al. 2022, on the private context) and
``dp-prompt`` (Utpala et al. 2023, on the private context). The two whole-document mechanisms protect the whole
document (any two documents are adjacent), DP-Fusion and NER-scrub the content of the tagged spans only, and none of
them protects what the tagger missed. :func:`method_plan` says how a method runs: its mechanism, the contexts it
decodes, what it protects and its builder (:data:`BUILDERS`, for mechanisms that need sanitisation-specific
construction; any other mechanism registered for the task is calibrated with ``cls.calibrated(Budget(epsilon,
delta), Spec(max_new_tokens))`` on the full document).

Documents longer than the model's context window raise :class:`~dpinfer.errors.ContextTooLongError` (no silent
truncation).

Many documents: :func:`sanitize` is :func:`plan_sanitize` (steps 1-2 and the calibrated mechanism, as an
:class:`~dpinfer.engine.EngineJob`), the engine (step 3) and :func:`finish_sanitize` (step 4).
:func:`sanitize_many` plans every :class:`Record` of a corpus, runs all planned jobs through ONE
:meth:`Engine.run_jobs <dpinfer.engine.Engine.run_jobs>` call (a batching engine serves them together) and finishes
each as it completes; a record that cannot be planned is reported in its :class:`RecordOutcome` and the others go
on. ``dpinfer sanitize --corpus`` (docs/corpus.md) writes the outcomes to a resumable JSONL file.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from dpinfer.accounting.calibration import Budget, Spec
from dpinfer.checks import format_up
from dpinfer.defaults import SANITIZE
from dpinfer.errors import ConfigurationError, ContextTooLongError, InvalidInputError
from dpinfer.taggers.base import TAB_LABELS, Span, validate_spans
from dpinfer.taggers.spans import ResolvedSpans, fill_uncovered

if TYPE_CHECKING:
    from dpinfer.accounting import Guarantee
    from dpinfer.accounting.ledger import Cost
    from dpinfer.engine import Engine, EngineJob, EngineOutput
    from dpinfer.mechanisms.base import Mechanism
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

NOT_PROTECTED = (
    "the existence, position and token length of each tagged span",
    "which privacy groups (entity types) the document contains",
    "anything the tagger missed",
    "how long the rewrite took (timing)",
)
"""What DP-Fusion's (and NER scrubbing's) adjacency leaves public: released as ``guarantee.not_protected``."""

BASELINE_NOT_PROTECTED = ("that a document was rewritten with these settings", "how long the rewrite took (timing)")
"""What the whole-document baselines' adjacency (any two documents) leaves public."""

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
        spans: the spans used (offsets into the input document; overlapping spans merged).
        groups: group name → the TAB labels it covers (only groups present in the document).
        method: the method used.
        data_dependent: per-step statistics of the realised decoding (mixing weights λ and divergences per group,
            summaries), filled only with ``sanitize(..., debug=True)``. DATA-DEPENDENT: exact functions of the
            private content (they reveal it), never a privacy guarantee, never part of the release.

    :meth:`to_dict` is the release: the rewrite, the guarantee (with ``not_protected``: what the adjacency leaves
    public) and public settings. The spans, the prompt length, the timing and the per-step statistics are functions
    of the private document and appear only when ``debug`` is set.
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
    debug: bool = False

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def not_protected(self) -> tuple[str, ...]:
        """What the guarantee leaves public (empty for ``original``, which protects nothing; :func:`not_protected`)."""
        return not_protected(self)

    def to_dict(self) -> dict[str, Any]:
        """The release as a JSON-ready dict: no data-dependent statistic unless the result was made with ``debug``."""
        g = self.guarantee.to_dict()
        g["not_protected"] = list(self.not_protected) if self.not_protected else "everything (no privacy protection)"
        g["sentence"] = guarantee_sentence(self)
        g["details"] = guarantee_details(self)
        g["caveats"] = guarantee_caveats(self)
        out: dict[str, Any] = {
            "text": self.text,
            "method": self.method,
            "guarantee": g,
            "finish_reason": self.finish_reason,
            "generated_tokens": self.generated_tokens,
            "max_new_tokens": self.max_new_tokens,
            "settings": self.settings,
        }
        if method_plan(self.method).protects == "spans":
            out["groups"] = self.groups  # public under their adjacency (one group per entity type present)
        if self.debug:
            out["debug"] = {
                "warning": DEBUG_WARNING,
                "spans": [s.to_dict() for s in self.spans],
                "prompt_tokens": self.prompt_tokens,
                "seconds": round(self.seconds, 3),
                **self.data_dependent,
            }
        return out


DEBUG_WARNING = (
    "debug statistics are data-dependent: they are exact functions of the private document (λ and divergences per "
    "step, spans, prompt length, timing), reveal its content, are not covered by the guarantee, and must not be "
    "released"
)


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
    from dpinfer.validation import check_groups

    check_groups(groups)
    seen = {label: name for name, labels in groups.items() for label in labels}
    out: dict[str, list[str]] = {}
    for name, labels in groups.items():
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
            value = SANITIZE.epsilon
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ConfigurationError(f"ε for group {name} must be a finite number > 0, got {value!r}")
        targets[name] = float(value)
    return targets


# ---------------------------------------------------------------------------------------------------------- contexts
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
    doc_tokens = int(((offsets[:, 0] >= offset) & (offsets[:, 0] < offset + len(document))).sum())
    return PreparedContexts(public=public.tolist(), private=private, original=ids.tolist(), group_names=names,
                            document_tokens=doc_tokens, private_tokens=counts)


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


# ---------------------------------------------------------------------------------------------------------- run
def resolve_spans(
    text: str,
    *,
    spans: Any = None,
    tagger: Any = SANITIZE.tagger,
    label_map: Mapping[str, str | None] | None = None,
    method: str = SANITIZE.method,
    allow_untagged: bool = False,
    tag_uncovered: bool = False,
) -> list[Span]:
    """The private spans of ``text`` (:func:`resolve_span_source` without where they came from)."""
    return resolve_span_source(text, spans=spans, tagger=tagger, label_map=label_map, method=method,
                               allow_untagged=allow_untagged, tag_uncovered=tag_uncovered).spans


def resolve_span_source(
    text: str,
    *,
    spans: Any = None,
    tagger: Any = SANITIZE.tagger,
    label_map: Mapping[str, str | None] | None = None,
    method: str = SANITIZE.method,
    allow_untagged: bool = False,
    tag_uncovered: bool = False,
) -> ResolvedSpans:
    """The private spans of ``text``: the user's ``spans`` checked against THIS document, or the tagger's; fail closed.

    Needs no model, so callers (the CLI) run it before loading one. User spans must fit the document; a spans file
    that carries the document's ``text`` must carry exactly this text, and each span's ``span_text`` (when present)
    must equal the text at its offsets, so spans made for another document are refused. Overlapping spans are MERGED
    (one span covering their union, labelled by the longest member, as the taggers do:
    :func:`~dpinfer.taggers.base.merge_overlaps`), never dropped. With no span at all, ``dp-fusion`` and
    ``ner-scrub`` would release the document without protecting anything, so they refuse unless ``allow_untagged``.
    Errors name indices, offsets and labels, never text. With ``tag_uncovered`` (and a ``tagger``), given spans that
    leave some entity types uncovered are completed by the tagger for those types
    (:func:`~dpinfer.taggers.spans.fill_uncovered`). A :class:`~dpinfer.taggers.spans.ResolvedSpans` passed as
    ``spans`` (resolved earlier, e.g. by the command line before the model loads) is returned as it is.
    """
    from dpinfer.taggers import Tagger, get_tagger, load_spans
    from dpinfer.taggers.base import merge_overlaps

    if not isinstance(text, str) or not text.strip():
        raise InvalidInputError("the document is empty")
    if isinstance(spans, ResolvedSpans):
        validate_spans(spans.spans, len(text))
        return spans

    def build_tagger() -> Any:
        kw = {"label_map": label_map} if label_map else {}
        return tagger if isinstance(tagger, Tagger) else get_tagger(tagger, **kw)

    if spans is not None:
        if isinstance(spans, Sequence) and not isinstance(spans, str) and all(isinstance(s, Span) for s in spans):
            loaded = list(spans)
        else:
            loaded = load_spans(spans, text=text, label_map=label_map)
        given = merge_overlaps(validate_spans(loaded, len(text)))
        if tag_uncovered and tagger is not None:
            resolved = fill_uncovered(text, given, build_tagger())  # fail closed: a tagging error propagates
            source = f"the spans given are empty and the {resolved.tagger} tagger found nothing"
        else:
            resolved = ResolvedSpans(given, "given")
            source = "the spans given are empty"
    else:
        if tagger is None:
            raise ConfigurationError("give spans= or a tagger (e.g. tagger='presidio' or 'regex')")
        tg = build_tagger()
        resolved = ResolvedSpans(tg.tag(text), "tagger", tagger=getattr(tg, "name", "given"))  # errors propagate
        source = f"the {resolved.tagger} tagger found nothing"
    found = resolved.spans
    if not found and method_plan(method).protects == "spans" and not allow_untagged:
        raise InvalidInputError(
            f"no private span to protect ({source}): the rewrite would read the whole document and protect nothing; "
            "give spans (--spans FILE) or another tagger, or pass --allow-untagged (API: allow_untagged=True) to "
            "rewrite it without protection"
        )
    return resolved


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


def _cut_document(lm: LM, text: str, spans: list[Span], cap: int, instruction: str) -> tuple[str, list[Span]]:
    """``text`` cut to its first ``cap`` tokens (a prefix, at a token boundary; its prompt then fits the public
    bound of :func:`whole_document_cap`), and the spans that lie inside it. Silent: the length is private."""
    from dpinfer.pipelines.protect_prompt import truncate_tokens

    bound = len(lm.encode(build_prompt(lm, "", instruction)[0])) + INPUT_MARGIN + cap
    keep = cap
    cut = truncate_tokens(lm, text, keep)
    while keep > 1 and len(lm.encode(build_prompt(lm, cut, instruction)[0])) > bound:  # rare: template merges
        keep -= 1
        cut = truncate_tokens(lm, text, keep)
    if cut == text:
        return text, spans
    return cut, [sp for sp in spans if sp.end <= len(cut)]


def sanitize(
    text: str,
    *,
    lm: LM | str | None = None,
    method: str = SANITIZE.method,
    epsilon: float | None = None,
    group_epsilon: Mapping[str, float] | None = None,
    delta: float = SANITIZE.delta,
    spans: Any = None,
    tagger: Any = SANITIZE.tagger,
    groups: Mapping[str, Sequence[str]] | None = None,
    instruction: str | None = None,
    max_new_tokens: int | None = None,
    alpha: float = SANITIZE.alpha,
    temperature: float | None = None,
    top_k: int | str | None = "default",
    seed: int | None = None,
    accounting: str = SANITIZE.accounting,
    adjacency: str = SANITIZE.adjacency,
    label_map: Mapping[str, str | None] | None = None,
    min_new_tokens: int = 0,
    no_repeat_ngram: int | str | None = "default",
    max_input_tokens: int | None = SANITIZE.whole_document_max_input_tokens,
    min_p: float | str | None = "default",
    progress: Callable[[int, int], None] | None = None,
    allow_untagged: bool = False,
    debug: bool = False,
    ledger: Any = None,
    unit: str | None = None,
    tag_uncovered: bool = False,
) -> SanitizeResult:
    """Rewrite ``text`` with a per-group differential-privacy guarantee (see the module docstring).

    Args:
        text: the private document.
        lm: model (default: the embedded SmolLM2-135M-Instruct).
        method: ``dp-fusion`` | ``original`` | ``ner-scrub`` | ``dp-decoding`` | ``dp-prompt``.
        epsilon: target ε for every group (DP-Fusion) or the whole document (baselines); default 40 (see below).
        group_epsilon: per-group targets by group name or label, e.g. ``{"PERSON": 10, "DATETIME": 60}``.
        delta: δ of every guarantee.
        spans: user-given spans (list of :class:`Span`, a spans file path, JSON string or parsed JSON); used instead
            of the tagger unless ``tag_uncovered``. They are checked against this document (:func:`resolve_spans`);
            overlapping spans are merged.
        tagger: ``"presidio"`` (default), ``"regex"``, or a :class:`~dpinfer.taggers.Tagger`.
        groups: group name → labels, to merge types into groups (``{"ID": ["PERSON", "CODE"]}``).
        instruction: the rewriting instruction (default :data:`DEFAULT_INSTRUCTION`).
        max_new_tokens: ``T_max``. Default for ``dp-fusion``, ``ner-scrub`` and ``original``: it follows the
            document's length (:func:`default_max_new_tokens`; the token length is public under DP-Fusion's
            adjacency). Default for ``dp-decoding`` and ``dp-prompt``: the fixed :data:`BASELINE_MAX_NEW_TOKENS`
            (256), since under their adjacency (any two documents) the length is private.
        alpha: Rényi order at which DP-Fusion's bound is enforced and charged.
        temperature, top_k: decoding transforms (defaults: :data:`dpinfer.defaults.SANITIZE`; DP-Fusion's top-k
            support is computed from the public context only). ``top_k=None`` samples from the full vocabulary.
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
        min_p: keep only tokens at least ``min_p`` times as likely as the most likely one, measured on the PUBLIC
            context (DP-Fusion's support, like top-k: the guarantee is unchanged); the baselines apply it to the row
            they decode. ``None`` disables it (default :data:`~dpinfer.defaults.SANITIZE` ``.min_p``).
        progress: called as ``progress(0, T_max)`` once planned, then ``progress(tokens_done, T_max)`` after every
            generated token.
        min_new_tokens: EOS is masked for every context alike before this many tokens (benchmarks; a public
            transform that leaves the guarantee, which is computed for ``max_new_tokens``, unchanged).
        max_input_tokens: ``dp-decoding`` and ``dp-prompt`` only (their adjacency makes the document's length
            private): a PUBLIC cap on the document's tokens; a longer document is cut to its first
            ``max_input_tokens`` tokens, silently (:func:`whole_document_cap`). Default: all that the model's context
            window leaves after the instruction template and ``T_max``.
        allow_untagged: rewrite even when no span was given or found (``dp-fusion``/``ner-scrub`` refuse by
            default: with nothing tagged nothing is protected).
        debug: keep the DATA-DEPENDENT per-step statistics (λ, divergences), spans, prompt length and timing in
            :meth:`SanitizeResult.to_dict`; they reveal the private content, and a warning says so on stderr.
        ledger: a :class:`~dpinfer.Ledger` (or its path) that this rewrite is charged to, per privacy group, before
            the model loads (:mod:`dpinfer.pipelines.budget`; refused with
            :class:`~dpinfer.errors.BudgetExceededError` when the unit cannot afford it); None: no ledger.
        unit: the document's unit on the ledger (default: a keyed hash of the text, ``ledger.unit_for_text``).
        tag_uncovered: with ``spans``, fail closed on partial spans: the ``tagger`` tags the document for the entity
            types the given spans leave uncovered and its spans are merged in
            (:func:`~dpinfer.taggers.spans.fill_uncovered`; the release records it in ``settings["span_source"]``). The
            command line does this unless ``--spans-only``.

    Choosing ε. The default ε = 40 per group bounds, for each group separately, how much the rewrite can change the
    odds of any conclusion about the content of that group's spans: by a factor e^40 (≈ 2·10^17), except with
    probability δ. As a worst-case bound that is weak; it is still useful because (1) it is per group and only the
    content of the spans is at stake (the rest of the document is meant to be kept), (2) about 10 of the 40 is the
    fixed cost of converting a Rényi bound to (ε, δ) at α = 2, δ = 1e-5, paid before any token, and (3) measured
    attacks stay near chance: in docs/sanitize.md the LOSS attack picks the true value among 5 candidates 0.24 of the
    time at ε = 40 and 0.22 at ε = 12 (chance 0.20; NER scrubbing 0.22). Choose a smaller ε (above 10.13 at α = 2;
    ``alpha=8`` reaches ≈ 1.22) for stronger protection at lower fluency, and ``group_epsilon`` for the groups that
    matter most; the worst group's ε is the headline.
    """
    from dpinfer.engine import Engine
    from dpinfer.pipelines.budget import start_spend

    spend = start_spend(ledger, unit, scope="document", default_unit=lambda book: book.unit_for_text(text))
    try:
        plan = plan_sanitize(
            text, lm=lm, method=method, epsilon=epsilon, group_epsilon=group_epsilon, delta=delta, spans=spans,
            tagger=tagger, groups=groups, instruction=instruction, max_new_tokens=max_new_tokens, alpha=alpha,
            temperature=temperature, top_k=top_k, seed=seed, accounting=accounting, adjacency=adjacency,
            label_map=label_map, min_new_tokens=min_new_tokens, no_repeat_ngram=no_repeat_ngram, min_p=min_p,
            max_input_tokens=max_input_tokens, allow_untagged=allow_untagged, debug=debug, tag_uncovered=tag_uncovered,
            on_groups=None if spend is None else lambda group_map: spend.reserve(
                estimate_cost(method, group_map, epsilon, group_epsilon, delta, alpha), mechanism=method))
        if spend is not None:
            spend.settle(plan.guarantee)  # the exact cost, before any token
        job = plan.job
        if progress is not None:
            progress(0, job.max_new_tokens)  # the total (T_max, public) is known before prefill
        t0 = time.perf_counter()
        run = Engine(plan.lm).stream(job.contexts, job.mechanism, max_new_tokens=job.max_new_tokens, seed=job.seed,
                                     processors=job.processors, min_new_tokens=job.min_new_tokens)
        for event in run:
            if progress is not None:
                progress(event.step + 1, job.max_new_tokens)
        if debug:
            print(f"dpinfer: warning: {DEBUG_WARNING}", file=sys.stderr)
        result = finish_sanitize(plan, run.output, seconds=time.perf_counter() - t0)
    except BaseException:
        if spend is not None:
            spend.cancel()
        raise
    if spend is not None:
        spend.commit()
    return result


def estimate_cost(method: str, group_map: Mapping[str, Sequence[str]], epsilon: float | None,
                  group_epsilon: Mapping[str, float] | None, delta: float, alpha: float) -> Cost | None:
    """What a rewrite by ``method`` costs its document, from the parameters and the groups alone (before the model
    loads): DP-Fusion's per-group target at order α, NER scrubbing's ε = 0, ``original``'s ε = ∞; None for the
    whole-document mechanisms, whose exact cost is settled once the release is planned."""
    from dpinfer.accounting import PureDp
    from dpinfer.accounting.ledger import Cost
    from dpinfer.pipelines.budget import NO_PRIVACY, single_order_estimate

    plan = method_plan(method)
    if plan.protects == "nothing" or (plan.protects == "spans" and not group_map):
        return NO_PRIVACY
    if plan.protects != "spans":
        return None
    if plan.baseline:
        return Cost({name: PureDp(0.0) for name in group_map})
    targets = resolve_group_epsilon(list(group_map), group_map, epsilon, group_epsilon)
    return single_order_estimate(targets, alpha=alpha, delta=delta)


@dataclass
class SanitizePlan:
    """One document planned for the engine (:func:`plan_sanitize`): the :class:`~dpinfer.engine.EngineJob` and what
    :func:`finish_sanitize` needs to turn its output into a :class:`SanitizeResult`. It holds the private document's
    contexts and spans: never log or serialise it."""

    job: EngineJob
    lm: LM
    method: str
    spans: list[Span]
    groups: dict[str, list[str]]
    group_names: list[str]
    guarantee: Guarantee
    prompt_tokens: int
    settings: dict[str, Any]
    debug: bool = False


def plan_sanitize(
    text: str,
    *,
    lm: LM | str | None = None,
    method: str = SANITIZE.method,
    epsilon: float | None = None,
    group_epsilon: Mapping[str, float] | None = None,
    delta: float = SANITIZE.delta,
    spans: Any = None,
    tagger: Any = SANITIZE.tagger,
    groups: Mapping[str, Sequence[str]] | None = None,
    instruction: str | None = None,
    max_new_tokens: int | None = None,
    alpha: float = SANITIZE.alpha,
    temperature: float | None = None,
    top_k: int | str | None = "default",
    seed: int | None = None,
    accounting: str = SANITIZE.accounting,
    adjacency: str = SANITIZE.adjacency,
    label_map: Mapping[str, str | None] | None = None,
    min_new_tokens: int = 0,
    no_repeat_ngram: int | str | None = "default",
    max_input_tokens: int | None = SANITIZE.whole_document_max_input_tokens,
    min_p: float | str | None = "default",
    allow_untagged: bool = False,
    debug: bool = False,
    checked: bool = False,
    on_groups: Callable[[dict[str, list[str]]], None] | None = None,
    tag_uncovered: bool = False,
) -> SanitizePlan:
    """Everything :func:`sanitize` does before the engine runs: every check, the spans, the prompt and its contexts,
    the calibrated mechanism and the ex-ante guarantee, as an :class:`~dpinfer.engine.EngineJob` (arguments: see
    :func:`sanitize`). ``checked=True`` skips the parameter checks that do not depend on the document (a caller that
    made them once for many documents, e.g. :func:`sanitize_many`). ``on_groups(groups)`` is called with the
    privacy groups before the model loads (a ledger's reservation). Raises what :func:`sanitize` raises, before any
    token is generated.
    """
    from dpinfer.engine import EngineJob
    from dpinfer.generation import resolve_lm
    from dpinfer.mechanisms.transforms import MinP, NoRepeatNGram
    from dpinfer.validation import check_sanitize_params, check_text, int_at_least

    check_text(text, "the document")
    if not checked:
        check_sanitize_params(method=method, epsilon=epsilon, group_epsilon=group_epsilon, delta=delta, alpha=alpha,
                              temperature=temperature, top_k=top_k, max_new_tokens=max_new_tokens,
                              no_repeat_ngram=no_repeat_ngram, seed=seed, accounting=accounting,
                              adjacency=adjacency, tagger=tagger if spans is None or tag_uncovered else None,
                              groups=groups)  # all before the model loads
    plan = method_plan(method)
    instruction = DEFAULT_INSTRUCTION if instruction is None else instruction
    temp = SANITIZE.temperature if temperature is None else float(temperature)
    k = SANITIZE.top_k if top_k == "default" else top_k
    mp = SANITIZE.min_p if min_p == "default" else min_p
    if mp is not None:
        MinP(mp)  # checked before the model loads

    # fail closed before the model loads: spans checked against this document, nothing tagged refused
    resolved = resolve_span_source(text, spans=spans, tagger=tagger, label_map=label_map, method=method,
                                   allow_untagged=allow_untagged, tag_uncovered=tag_uncovered)
    used_spans = resolved.spans
    group_map = resolve_groups(used_spans, groups)
    if max_input_tokens is not None:
        int_at_least(max_input_tokens, "max_input_tokens", 1, " (a public cap on the document's tokens)")
    if on_groups is not None:
        on_groups(group_map)
    model = resolve_lm(lm)
    if plan.protects == "document":  # any two documents are adjacent: the length is private
        t_max = BASELINE_MAX_NEW_TOKENS if max_new_tokens is None else int(max_new_tokens)
        cap = whole_document_cap(model, instruction, max_new_tokens=t_max, max_input_tokens=max_input_tokens)
        text, used_spans = _cut_document(model, text, used_spans, cap, instruction)
    prep = prepare_contexts(model, text, used_spans, group_map, instruction)
    if max_new_tokens is not None:
        t_max_from = "max_new_tokens"
    elif plan.protects == "document":
        t_max_from = "fixed default"
    else:
        t_max_from = "document length"
    if plan.protects != "document":
        # the length is public under DP-Fusion's adjacency
        t_max = default_max_new_tokens(prep.document_tokens) if max_new_tokens is None else int(max_new_tokens)
    if len(prep.original) + t_max > model.context_window:
        raise ContextTooLongError(
            f"the prompt ({len(prep.original)} tokens) plus max_new_tokens={t_max} exceeds the model's context window "
            f"({model.context_window}); split the document into parts and sanitise each (each part's guarantee "
            "composes: charge every part's T_max to the same groups), or lower --max-new-tokens"
        )
    settings: dict[str, Any] = {"temperature": temp, "top_k": k, "min_p": mp, "alpha": alpha, "delta": delta,
                                "instruction": "default" if instruction == DEFAULT_INSTRUCTION else "custom",
                                "model": model.name,  # never the seed (it would let anyone replay the noise)
                                "max_new_tokens_from": t_max_from, "span_source": resolved.to_dict()}
    if plan.protects == "document":
        settings["max_input_tokens"] = cap
    if plan.contexts == "fusion":
        settings["adjacency"] = adjacency

    contexts, mech = _mechanism(plan, BuildArgs(
        lm=model, prep=prep, groups=group_map, epsilon=SANITIZE.epsilon if epsilon is None else float(epsilon),
        group_epsilon=group_epsilon, delta=delta, max_new_tokens=t_max, alpha=alpha, temperature=temp, top_k=k,
        accounting=accounting, adjacency=adjacency, settings=settings, min_p=mp))
    ngram = SANITIZE.no_repeat_ngram if no_repeat_ngram == "default" else no_repeat_ngram
    settings["no_repeat_ngram"] = ngram
    processors: list[Any] = [NoRepeatNGram(int(ngram))] if ngram else []
    if mp is not None and (plan.baseline or (plan.contexts == "fusion" and not prep.group_names)):
        processors.append(MinP(mp, temp))  # one decoded row (the sampler's): its own min-p
    if plan.protects == "spans" and not prep.group_names:
        from dpinfer.accounting import Guarantee

        guarantee = Guarantee.no_privacy(method)  # nothing tagged (allow_untagged): nothing was protected
    elif plan.baseline and plan.protects == "spans":
        guarantee = _scrub_guarantee(method, group_map, delta, t_max)
    else:
        guarantee = mech.guarantee(t_max)
    if seed is not None:
        guarantee = dataclasses.replace(guarantee, seeded=True)
    job = EngineJob(contexts=contexts, mechanism=mech, max_new_tokens=t_max, min_new_tokens=min(min_new_tokens, t_max),
                    seed=seed, processors=processors)
    return SanitizePlan(job=job, lm=model, method=method, spans=used_spans, groups=group_map,
                        group_names=prep.group_names, guarantee=guarantee, prompt_tokens=len(prep.original),
                        settings=settings, debug=bool(debug))


def finish_sanitize(plan: SanitizePlan, output: EngineOutput, *, seconds: float = 0.0) -> SanitizeResult:
    """The :class:`SanitizeResult` of a planned document (:func:`plan_sanitize`) from its engine output."""
    ids = output.sequences[0]
    stats: dict[str, Any] = {}
    if plan.debug and method_plan(plan.method).contexts == "fusion":
        stats = _summarise_steps(output.steps, plan.group_names)
    return SanitizeResult(
        text=plan.lm.decode(ids).strip(), guarantee=plan.guarantee, token_ids=list(ids),
        spans=plan.spans, groups=plan.groups, method=plan.method, finish_reason=output.finish_reasons[0],
        prompt_tokens=plan.prompt_tokens, generated_tokens=len(ids), max_new_tokens=plan.job.max_new_tokens,
        seconds=seconds, settings=plan.settings, data_dependent=stats, debug=plan.debug,
    )


@dataclass(frozen=True)
class Record:
    """One document of a corpus for :func:`sanitize_many`: its ``id`` (a string or an integer, unique in the corpus),
    its ``text`` and its ``spans`` (a list of spans or a spans object in a format :func:`resolve_spans` accepts, e.g.
    TAB's ``entity_mentions``; ``None``: the tagger tags it). A string is not accepted as ``spans`` here (it would be
    read as a file path)."""

    id: str | int
    text: str
    spans: Any = None


@dataclass
class RecordOutcome:
    """What :func:`sanitize_many` yields per record: its ``result``, or ``error``, a one-line message that quotes no
    private text (the record was refused and nothing was generated for it)."""

    id: str | int
    result: SanitizeResult | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def record_seed(seed: int | None, record_id: str | int) -> int | None:
    """The seed of one record in a seeded corpus run: a hash of the run's seed and the record's id, so that a record's
    output depends neither on the other records nor on their order, on any backend (tests and benchmarks only).

    >>> record_seed(None, "a") is None, record_seed(7, "a") == record_seed(7, "a")
    (True, True)
    >>> record_seed(7, "a") != record_seed(7, 1) != record_seed(8, 1)
    True
    """
    if seed is None:
        return None
    import hashlib
    import json

    key = json.dumps([int(seed), record_id], ensure_ascii=False).encode("utf-8")
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") >> 1


def record_error(exc: BaseException) -> str:
    """A per-record error as one line that quotes no input: dpinfer's own messages (they name offsets, indices and
    sizes, never text), or the type of an unexpected error with its message withheld."""
    from dpinfer.errors import DPInferError

    if isinstance(exc, DPInferError):
        msg = " ".join(str(exc).split())
        return f"{type(exc).__name__}: {msg}"
    return f"unexpected {type(exc).__name__} (message withheld: it may quote the input)"


SANITIZE_MANY_OPTIONS = frozenset({
    "method", "epsilon", "group_epsilon", "delta", "groups", "instruction", "max_new_tokens", "alpha", "temperature",
    "top_k", "accounting", "adjacency", "label_map", "min_new_tokens", "no_repeat_ngram", "allow_untagged",
    "tag_uncovered", "min_p",
})
"""The :func:`sanitize` keyword arguments that :func:`sanitize_many` applies to every record."""


def sanitize_many(
    records: Iterable[Record],
    *,
    lm: LM | str | None = None,
    tagger: Any = SANITIZE.tagger,
    seed: int | None = None,
    engine: Engine | None = None,
    on_planned: Callable[[str | int, Guarantee], None] | None = None,
    **options: Any,
) -> Iterator[RecordOutcome]:
    """Sanitise many documents: plan each (:func:`plan_sanitize`), run every planned job through ONE
    :meth:`Engine.run_jobs <dpinfer.engine.Engine.run_jobs>` call, and yield a :class:`RecordOutcome` per record as it
    finishes (records refused while planning first, in input order; then in the order the engine finishes them).

    Each record's result equals ``sanitize(record.text, spans=record.spans, seed=record_seed(seed, record.id),
    **options)``: every record is its own release with its own guarantee (the documents are separate; a corpus does
    not compose them). ``options`` are :func:`sanitize`'s keyword arguments in :data:`SANITIZE_MANY_OPTIONS`, checked
    once before the model loads; a record without spans is tagged by ``tagger`` (built once). A record that cannot
    be planned (empty text, bad spans, nothing tagged, too long for the context window...) is yielded with its
    one-line ``error`` and the others go on. With a seed (tests and benchmarks only) each record's noise comes from
    :func:`record_seed`. ``on_planned(record_id, guarantee)`` is called once a record is planned, before any of its
    tokens (a ledger prices its charge there: :class:`~dpinfer.pipelines.budget.LedgerCharges`); what it raises is
    the record's error.
    """
    from dpinfer.generation import resolve_lm
    from dpinfer.validation import check_sanitize_params

    unknown = sorted(set(options) - SANITIZE_MANY_OPTIONS)
    if unknown:
        raise ConfigurationError(f"sanitize_many does not take {', '.join(unknown)}; options: "
                                 f"{', '.join(sorted(SANITIZE_MANY_OPTIONS))}")
    check_sanitize_params(seed=seed, tagger=tagger if isinstance(tagger, str) else None,
                          **{k: v for k, v in options.items()
                             if k not in ("instruction", "label_map", "min_new_tokens", "allow_untagged",
                                          "tag_uncovered", "min_p")})
    from dpinfer.engine import Engine
    from dpinfer.taggers import Tagger, get_tagger

    tg: Any = tagger if isinstance(tagger, Tagger) else None

    def record_tagger() -> Any:  # built once, and only if a record has no spans (presidio takes seconds to load)
        nonlocal tg
        if tg is None and tagger is not None:
            label_map = options.get("label_map")
            tg = get_tagger(tagger, **({"label_map": label_map} if label_map else {}))
        return tg

    model = resolve_lm(lm) if engine is None else engine.lm
    eng = engine if engine is not None else Engine(model)
    plans: list[tuple[str | int, SanitizePlan]] = []
    for i, rec in enumerate(records):
        if not isinstance(rec, Record):
            raise InvalidInputError(f"record {i} must be a dpinfer.pipelines.sanitize.Record, got "
                                    f"{type(rec).__name__}")
        # a tagger that cannot be built stops the run (it is not a per-record error: every record would fail)
        record_tg = record_tagger() if rec.spans is None or options.get("tag_uncovered") else None
        try:
            if isinstance(rec.spans, (str, bytes)):
                raise InvalidInputError("the spans field must be a list of spans or an object (e.g. TAB entity "
                                        "mentions), not a string")
            plan = plan_sanitize(rec.text, lm=model, spans=rec.spans, tagger=record_tg,
                                 seed=record_seed(seed, rec.id), checked=True, **options)
            if on_planned is not None:
                on_planned(rec.id, plan.guarantee)
        except Exception as exc:  # a per-record refusal: reported in its record, the run goes on
            yield RecordOutcome(rec.id, error=record_error(exc))
            continue
        plans.append((rec.id, plan))
    if not plans:
        return
    for index, output in eng.run_jobs([p.job for _, p in plans]):
        rid, plan = plans[index]
        yield RecordOutcome(rid, result=finish_sanitize(plan, output,
                                                        seconds=output.prefill_seconds + output.decode_seconds))
        plans[index] = (rid, None)  # type: ignore[assignment]  # free the finished job's contexts


def _span_words(result: SanitizeResult) -> tuple[str, str]:
    """(what found the spans, what the guarantee cannot cover because of it), true for this run."""
    spans_from = result.settings.get("span_source") or {}
    source, tagger = spans_from.get("from", "tagger"), spans_from.get("tagger", "the")
    if source == "given":
        return "the spans given", "anything the given spans do not cover"
    if source == "given+tagger":
        return (f"the spans given, completed by the {tagger} tagger for the types they left out",
                "anything the spans and the tagger missed")
    return f"the {tagger} tagger", "anything the tagger missed"


def _t_max_words(result: SanitizeResult) -> str:
    """How T_max was set in this run, in words."""
    t = result.guarantee.max_new_tokens
    how = result.settings.get("max_new_tokens_from")
    if how == "max_new_tokens":
        return f"a limit of {t} generated tokens, set with max-new-tokens"
    if how == "document length":
        return (f"a limit of {t} generated tokens that follows the document's length (which this adjacency leaves "
                "public)")
    return f"a fixed limit of {t} generated tokens"


def not_protected(result: SanitizeResult) -> tuple[str, ...]:
    """What the guarantee of ``result`` leaves public, true for this run (given spans: what they do not cover; tagged:
    what the tagger missed)."""
    protects = method_plan(result.method).protects
    if protects == "spans":
        if not result.groups:
            return ()
        missed = _span_words(result)[1]
        return tuple(missed if item == "anything the tagger missed" else item for item in NOT_PROTECTED)
    if protects == "document":
        return BASELINE_NOT_PROTECTED
    return ()


def guarantee_sentence(result: SanitizeResult) -> str:
    """The guarantee of a :class:`SanitizeResult` in ONE plain sentence: what is protected, ε, what is not (printed by
    ``dpinfer sanitize``, in ``--json`` as ``guarantee.sentence``). ε is rounded UP to the digits shown. The details
    are :func:`guarantee_details`, the caveats :func:`guarantee_caveats`."""
    g = result.guarantee
    plan = method_plan(result.method)
    if plan.protects == "spans" and not result.groups:
        return ("Guarantee: none. Nothing was tagged, so nothing in the document was protected: the rewrite was "
                "generated from the full document (allowed with --allow-untagged).")
    if math.isinf(g.epsilon):
        return ("Guarantee: none. This output was generated from the full private document without a privacy "
                "mechanism.")
    flag = " (authors' published accounting, for comparison only)" if g.accounting == "as_published" else ""
    if plan.protects != "spans":
        return (f"Guarantee{flag}: the whole document is protected with ε = {format_up(g.epsilon)} "
                f"(δ = {format_up(g.delta)}); not protected: {', and '.join(not_protected(result))}.")
    types = [gr.name for gr in g.groups]
    named = types[0] if len(types) == 1 else ", ".join(types[:-1]) + " and " + types[-1]
    missed = _span_words(result)[1]
    if g.epsilon == 0:
        return (f"Guarantee: the rewrite reveals nothing about what the tagged {named} spans say (ε = 0: it was "
                f"written without reading them); not protected: where the spans are and how long they are, and "
                f"{missed}.")
    values = {format_up(gr.epsilon) for gr in g.groups}
    if len(values) == 1:
        eps = f"ε = {values.pop()} for each entity type" if len(types) > 1 else f"ε = {format_up(g.epsilon)}"
    else:
        eps = ", ".join(f"{gr.name} ε = {format_up(gr.epsilon)}" for gr in g.groups)
    against = ", against any other values in the same spans," if "replace-one" in (g.adjacency or "") else ""
    return (f"Guarantee{flag}: what the tagged {named} spans say is protected{against} with {eps} "
            f"(δ = {format_up(g.delta)}); not protected: where the spans are and how long they are, and {missed}.")


def guarantee_details(result: SanitizeResult) -> str | None:
    """What the guarantee sentence means, in full (``dpinfer sanitize --explain``; ``guarantee.details`` in
    ``--json``): the odds bound, how ε was fixed (T_max as set in this run) and everything left public."""
    g = result.guarantee
    plan = method_plan(result.method)
    if math.isinf(g.epsilon) or (plan.protects == "spans" and not result.groups):
        return None
    if plan.protects == "spans":
        scope = "the content of one entity type's spans"
        if "replace-one" in (g.adjacency or ""):
            scope += ", compared with any other values in the same spans"
        found = f" The spans were found by {_span_words(result)[0]}."
    else:
        scope, found = "the document", ""
    return (f"Whatever else anyone knows, this rewrite changes the odds of any conclusion about {scope} by a factor "
            f"of at most e^ε, except with probability δ = {format_up(g.delta)}. ε was fixed before the document was "
            f"read, from the method's settings and {_t_max_words(result)}.{found} Not protected: "
            f"{'; '.join(not_protected(result))}.")


def guarantee_caveats(result: SanitizeResult) -> list[str]:
    """What a reader must know beside the sentence: a large ε (what e^ε means there, where to read how to choose
    ε), and a seed (the guarantee then holds only while it is secret)."""
    from dpinfer.accounting.guarantee import SEEDED_NOTE, epsilon_caveat

    g = result.guarantee
    out: list[str] = []
    if not math.isinf(g.epsilon):
        caveat = epsilon_caveat(g.epsilon, "the protected spans" if g.groups else "the document")
        if caveat:
            out.append(caveat)
    if g.seeded and g.epsilon > 0:
        out.append(SEEDED_NOTE)
    return out


def _scrub_guarantee(method: str, groups: Mapping[str, Sequence[str]], delta: float, t_max: int) -> Guarantee:
    """NER scrubbing decodes the public context only: the output does not depend on the content of any tagged span,
    so ε = 0 for every group under the same adjacency as DP-Fusion."""
    from dpinfer.accounting import GroupGuarantee, Guarantee, PureDp

    return Guarantee(
        epsilon=0.0, delta=delta, mechanism=method, adjacency=FUSION_ADJACENCY,
        parameters={"T_max": t_max}, max_new_tokens=t_max,
        groups=tuple(GroupGuarantee(name, 0.0, delta, {}, loss=PureDp(0.0)) for name in groups),
    )


@dataclass(frozen=True)
class BuildArgs:
    """What a builder may read to construct a method's mechanism: the parameters, the model (vocabulary, public
    calibration) and the prepared contexts (their group names only: the private contents stay in the rows)."""

    lm: LM
    prep: PreparedContexts
    groups: Mapping[str, Sequence[str]]
    epsilon: float
    group_epsilon: Mapping[str, float] | None
    delta: float
    max_new_tokens: int
    alpha: float
    temperature: float
    top_k: int | None
    accounting: str
    adjacency: str
    settings: dict[str, Any]
    """The release's public settings; a builder records what it changed (e.g. ``top_k`` off)."""
    min_p: float | None = None
    """DP-Fusion's min-p support, computed from the public row only (like ``top_k``)."""


@dataclass(frozen=True)
class Builder:
    """How sanitisation runs a registered mechanism: ``build`` constructs it, ``contexts`` names the rows it decodes
    (``"fusion"``: the public context and one private context per group; ``"original"``: the full document;
    ``"public"``: the document with every span replaced), ``protects`` what its guarantee covers (``"spans"``: the
    content of each group's spans; ``"document"``: the whole document; ``"nothing"``)."""

    build: Callable[[BuildArgs], Mechanism]
    contexts: str = "original"
    protects: str = "document"


@dataclass(frozen=True)
class MethodPlan:
    """How a method runs (:func:`method_plan`)."""

    method: str
    mechanism: str
    contexts: str
    protects: str
    build: Callable[[BuildArgs], Mechanism]
    baseline: bool = False


def _build_sampler(a: BuildArgs) -> Mechanism:
    from dpinfer.mechanisms import get_mechanism

    return get_mechanism("sampler", temperature=a.temperature, top_k=a.top_k, mode="joint")


def _build_fusion(a: BuildArgs) -> Mechanism:
    from dpinfer.mechanisms import REGISTRY

    targets = resolve_group_epsilon(a.prep.group_names, a.groups, a.epsilon, a.group_epsilon)
    a.settings["group_epsilon"] = targets
    return REGISTRY.get("dp-fusion").cls.calibrated(
        Budget(targets, a.delta), Spec(a.max_new_tokens, alpha=a.alpha, accounting=a.accounting,
                                       adjacency=a.adjacency, temperature=a.temperature, top_k=a.top_k, min_p=a.min_p))


def _build_decoding(a: BuildArgs) -> Mechanism:
    from dpinfer.mechanisms import REGISTRY

    a.settings["top_k"] = None  # the baseline's guarantee needs the full vocabulary
    return REGISTRY.get("dp-decoding").cls.calibrated(
        Budget(a.epsilon, a.delta), Spec(a.max_new_tokens, vocab_size=a.lm.vocab_size, temperature=a.temperature))


def _build_prompt(a: BuildArgs) -> Mechanism:
    from dpinfer.mechanisms import REGISTRY
    from dpinfer.pipelines.clip_bounds import clip_bounds

    a.settings["top_k"] = None
    lo, hi = clip_bounds(a.lm).bounds
    a.settings["clip"] = [lo, hi]
    return REGISTRY.get("dp-prompt").cls.calibrated(
        Budget(a.epsilon, a.delta), Spec(a.max_new_tokens, clip_min=lo, clip_max=hi, mode="joint"))


BUILDERS: dict[str, Builder] = {
    "dp-fusion": Builder(_build_fusion, contexts="fusion", protects="spans"),
    "dp-decoding": Builder(_build_decoding),
    "dp-prompt": Builder(_build_prompt),
}
"""Sanitisation-specific construction, per registered mechanism. A mechanism registered for ``"sanitize"`` without
an entry runs on the full document and is built as ``cls.calibrated(Budget(epsilon, delta), Spec(max_new_tokens))``."""


def _build_calibrated(name: str) -> Callable[[BuildArgs], Mechanism]:
    def build(a: BuildArgs) -> Mechanism:
        from dpinfer.mechanisms import REGISTRY

        return REGISTRY.get(name).cls.calibrated(Budget(a.epsilon, a.delta), Spec(a.max_new_tokens))

    return build


def method_plan(method: str) -> MethodPlan:
    """How ``method`` runs: a baseline of :data:`dpinfer.methods.BASELINES` (the sampler on one context), a
    mechanism with a :data:`BUILDERS` entry, or another mechanism registered for ``"sanitize"``."""
    from dpinfer.methods import baseline

    b = baseline("sanitize", method)
    if b is not None:
        return MethodPlan(method, b.mechanism, b.context, b.protects, _build_sampler, baseline=True)
    builder = BUILDERS.get(method)
    if builder is not None:
        return MethodPlan(method, method, builder.contexts, builder.protects, builder.build)
    return MethodPlan(method, method, "original", "document", _build_calibrated(method))


def _mechanism(plan: MethodPlan, a: BuildArgs) -> tuple[list[list[int]], Mechanism]:
    """The rows to decode and the mechanism of ``plan``."""
    if plan.contexts == "fusion":
        if not a.prep.group_names:
            # nothing tagged: the output depends on no protected content; decode the (identical) public context
            return [a.prep.public], _build_sampler(a)
        return [a.prep.public, *a.prep.private], plan.build(a)
    rows = a.prep.public if plan.contexts == "public" else a.prep.original
    return [rows], plan.build(a)


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
