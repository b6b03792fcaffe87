"""The settings of one sanitisation (:func:`dpinfer.sanitize`), as one frozen, checked value.

:class:`SanitizeConfig` holds every parameter of a rewrite that does not depend on the document: the method, the
budget, the decoding transforms, the tagging options. Its defaults are :data:`dpinfer.defaults.SANITIZE`; its
``__post_init__`` checks every scalar with :mod:`dpinfer.checks` (one-line messages naming the parameter, never input
text) and stores the converted values, so a config that exists is valid and reads without sentinels
(``top_k=None`` is the full vocabulary, ``no_repeat_ngram=None`` and ``min_p=None`` are off). The checks that need the
method table or the taggers (a known method, greedy decoding for a baseline only, labels of ``groups``) are
:func:`dpinfer.validation.check_sanitize_config`'s.

The pipeline, the command line, the corpus job and the server build a config once and pass it on:

>>> cfg = SanitizeConfig(epsilon=20, group_epsilon={"PERSON": 10})
>>> cfg.epsilon, cfg.top_k, cfg.temperature, dict(cfg.group_epsilon)
(20.0, 40, 0.7, {'PERSON': 10.0})
>>> SanitizeConfig(delta=2)
Traceback (most recent call last):
...
dpinfer.errors.ConfigurationError: delta must lie strictly between 0 and 1, got 2 (e.g. 1e-5)
>>> SanitizeConfig(max_new_tokens=0, spelling="cli")
Traceback (most recent call last):
...
dpinfer.errors.ConfigurationError: --max-new-tokens must be an integer ≥ 1, got 0
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dpinfer.checks import (
    check_alpha,
    check_delta,
    check_probability,
    check_seed,
    check_temperature,
    int_at_least,
    one_of,
    positive_number,
)
from dpinfer.configs.base import Config, option
from dpinfer.defaults import SANITIZE
from dpinfer.errors import ConfigurationError, InvalidInputError

ACCOUNTINGS = ("dpinfer", "as_published")
"""``accounting``: dpinfer's own, or the DP-Fusion authors' 4·β per step (for comparison)."""

ADJACENCIES = ("replace-by-null", "replace-one")
"""DP-Fusion's neighbouring documents."""

_DEFAULT = "default"  # the older API's spelling of "the default" for top_k, no_repeat_ngram and min_p


def _optional_int(value: object, name: str) -> int | None:
    return None if value is None else int_at_least(value, name, 1, " (or None)")


def _copied_map(value: object, what: str) -> dict[str, Any] | None:
    """A copy of ``value`` (a plain dict: configs travel to worker processes, which a mapping proxy cannot)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidInputError(f"{what} must map names to values")
    return dict(value)


@dataclass(frozen=True)
class SanitizeConfig(Config):
    """Every setting of :func:`dpinfer.sanitize` except the document, its spans and the runtime (model, engine); the
    fields are its keyword arguments of the same names. ``spelling="cli"`` makes messages name CLI options;
    the fields declared with a help text are the options of ``dpinfer sanitize`` (:mod:`dpinfer.cli.sanitize`).

    Attributes:
        method: ``dp-fusion`` | ``original`` | ``ner-scrub`` | ``dp-decoding`` | ``dp-prompt``
            (:data:`dpinfer.methods.sanitize.TABLE`).
        epsilon: target ε for every group (DP-Fusion) or the whole document (whole-document methods); default 40.
        group_epsilon: per-group targets by group name or label, e.g. ``{"PERSON": 10, "DATETIME": 60}``.
        delta: δ of every guarantee.
        tagger: ``"presidio"`` (default), ``"regex"``, or a :class:`~dpinfer.taggers.Tagger`; None with spans only.
        groups: group name → labels, to merge types into groups (``{"ID": ["PERSON", "CODE"]}``).
        instruction: the rewriting instruction (None: the default one, chosen from the ε sweep of
            ``dpinfer bench sanitize``).
        max_new_tokens: ``T_max``. None: for the methods that protect spans it follows the document's length (public
            under DP-Fusion's adjacency); for ``dp-decoding`` and ``dp-prompt`` a fixed 256, since under their
            adjacency (any two documents) the length is private.
        alpha: Rényi order at which DP-Fusion's bound is enforced and charged.
        temperature, top_k: decoding transforms (DP-Fusion's top-k support is computed from the public context
            only). ``top_k=None`` samples from the full vocabulary.
        seed: for tests and benchmarks only (the same seed reproduces the output). Without it the noise comes from
            the operating system's secure generator. With it the guarantee holds only while the seed stays secret
            (``guarantee.seeded`` is set and the statement says so); the seed is never written into a release.
        accounting: ``"dpinfer"`` or ``"as_published"`` (the authors' 4·β per step, DP-Fusion only).
        adjacency: DP-Fusion's neighbouring documents: ``"replace-by-null"`` (one group's spans replaced by
            placeholders) or ``"replace-one"`` (one group's values swapped for any others; the bound is enforced at
            order 2α, so the same ε costs more noise). The other methods' guarantees do not depend on it.
        label_map: translation of span labels to TAB types, for spans files with other labels.
        min_new_tokens: EOS is masked for every context alike before this many tokens (benchmarks; a public
            transform that leaves the guarantee, computed for ``max_new_tokens``, unchanged).
        no_repeat_ngram: ban repeating any n-gram of the generated tokens (a public transform: it reads released
            tokens only); None disables it.
        max_input_tokens: ``dp-decoding`` and ``dp-prompt`` only (their adjacency makes the document's length
            private): a PUBLIC cap on the document's tokens; a longer document is cut to its first tokens, silently.
            None: all that the context window leaves after the instruction template and ``T_max``.
        min_p: keep only tokens at least ``min_p`` times as likely as the most likely one, measured on the PUBLIC
            context (DP-Fusion's support, like top-k: the guarantee is unchanged); the baselines apply it to the row
            they decode. None disables it.
        opening_tokens: a public opening: the rewrite starts with the document's first tokens as the PUBLIC context
            shows them (untagged text, public under replace-by-null), up to the first placeholder and at most this
            many; the methods that protect the whole document never use one. None or 0 disables it.
        allow_untagged: rewrite even when no span was given or found (the methods that protect spans refuse by
            default: with nothing tagged nothing is protected).
        tag_uncovered: with spans given, fail closed on partial spans: the tagger tags the document for the entity
            types the given spans leave uncovered and its spans are merged in (the release records it in
            ``settings["span_source"]``). The command line does this unless ``--spans-only``.
        debug: keep the DATA-DEPENDENT per-step statistics (λ, divergences) for
            :meth:`~dpinfer.pipelines.sanitize.SanitizeResult.diagnostics`; a warning says so on standard error.

    Choosing ε. The default ε = 40 per group bounds, for each group separately, how much the rewrite can change the
    odds of any conclusion about the content of that group's spans: by a factor e^40 (≈ 2·10^17), except with
    probability δ. As a worst-case bound that is weak; it is still useful because (1) it is per group and only the
    content of the spans is at stake, (2) about 10 of the 40 is the fixed cost of converting a Rényi bound to (ε, δ)
    at α = 2, δ = 1e-5, paid before any token, and (3) measured attacks stay near chance (docs/sanitize.md: the LOSS
    attack picks the true value among 5 candidates 0.24 of the time at ε = 40 and 0.22 at ε = 12; chance 0.20).
    Choose a smaller ε (above 10.13 at α = 2; ``alpha=8`` reaches ≈ 1.22) for stronger protection at lower fluency,
    and ``group_epsilon`` for the groups that matter most; the worst group's ε is the headline.
    """

    method: str = option(SANITIZE.method, cli=False, request=True)
    epsilon: float = option(SANITIZE.epsilon, type=float, request=True,
                            help="target ε per group (default {default}: a per-group bound e^{default} on the odds; "
                                 "see below and docs/threat-model.md)")
    group_epsilon: Mapping[str, float] | None = option(None, cli=False, request=True)
    delta: float = option(SANITIZE.delta, request=True, help="δ (default {default})")
    tagger: Any = SANITIZE.tagger  # a name or a Tagger (--tagger is the command's own option)
    groups: Mapping[str, Sequence[str]] | None = option(None, cli=False, request=True)
    instruction: str | None = option(None, cli=False)
    max_new_tokens: int | None = option(
        None, type=int, request=True,
        help="T_max. Default for dp-fusion: about the document's length (public under its adjacency); "
             f"for dp-decoding and dp-prompt: a fixed {SANITIZE.whole_document_max_new_tokens} (the "
             "length is private under theirs)")
    alpha: float = option(SANITIZE.alpha, request=True, help="Rényi order of DP-Fusion's bound (default {default})")
    temperature: float = option(SANITIZE.temperature, request=True, help="sampling temperature (default {default})")
    top_k: int | None = option(SANITIZE.top_k, type=int, request=True,
                               help="public top-k support (default {default}; 0 = full vocabulary)")
    seed: int | None = option(None, cli=False)
    accounting: str = option(SANITIZE.accounting, choices=ACCOUNTINGS,
                             help="as_published: the DP-Fusion authors' 4β-per-step accounting, for comparison")
    adjacency: str = option(SANITIZE.adjacency, choices=ADJACENCIES, request=True,
                            help="DP-Fusion's neighbouring documents: replace-by-null (default; a group's spans "
                                 "replaced by placeholders) or replace-one (a group's values swapped for any others; "
                                 "bound enforced at order 2α, more noise for the same ε)")
    label_map: Mapping[str, str | None] | None = option(None, cli=False)
    min_new_tokens: int = option(0, cli=False)
    no_repeat_ngram: int | None = option(SANITIZE.no_repeat_ngram, type=int,
                                         help="ban repeating any n-gram of the rewrite (public transform; default "
                                              "{default}; 0 = off)")
    max_input_tokens: int | None = option(
        SANITIZE.whole_document_max_input_tokens, type=int,
        help="dp-decoding and dp-prompt: a public cap on the document; a longer one is cut to its first N tokens, "
             "silently (the length is private under their adjacency). Default: all that the context window leaves "
             "after the instruction and T_max")
    min_p: float | None = option(SANITIZE.min_p, cli=False)
    opening_tokens: int | None = option(SANITIZE.opening_tokens, cli=False)
    allow_untagged: bool = option(False, request=True,
                                  help="rewrite even if no span is given or found (refused by default: "
                                       "nothing would be protected)")
    tag_uncovered: bool = option(False, cli=False)
    debug: bool = option(False, cli=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        n = self.name
        put = self._put
        if not isinstance(self.method, str) or not self.method:
            raise ConfigurationError(f"{n('method')} must be a method name, got {self.method!r}")
        put("epsilon", SANITIZE.epsilon if self.epsilon is None else positive_number(self.epsilon, n("epsilon")))
        put("groups", _check_groups(self.groups))
        group_eps = _copied_map(self.group_epsilon, "group_epsilon")
        if group_eps is not None:
            put("group_epsilon", {str(k): positive_number(v, f"the ε of group {k}") for k, v in group_eps.items()})
        put("delta", check_delta(self.delta, n("delta")))
        put("alpha", check_alpha(self.alpha, n("alpha")))
        # ≥ 0 here; a private mechanism must sample (> 0): validation.check_sanitize_config, which knows the methods
        put("temperature", SANITIZE.temperature if self.temperature is None
            else check_temperature(self.temperature, n("temperature"), allow_zero=True))
        put("top_k", SANITIZE.top_k if self.top_k == _DEFAULT else _optional_int(self.top_k, n("top_k")))
        if self.max_new_tokens is not None:
            put("max_new_tokens", int_at_least(self.max_new_tokens, n("max_new_tokens"), 1))
        put("no_repeat_ngram", SANITIZE.no_repeat_ngram if self.no_repeat_ngram == _DEFAULT
            else _optional_int(self.no_repeat_ngram, n("no_repeat_ngram")))
        put("seed", check_seed(self.seed, n("seed")))
        one_of(self.accounting, n("accounting"), ACCOUNTINGS)
        one_of(self.adjacency, n("adjacency"), ADJACENCIES)
        if self.adjacency == "replace-one" and self.accounting == "as_published":
            raise ConfigurationError("accounting 'as_published' reproduces the authors' replace-by-null charge; use "
                                     "accounting 'dpinfer' with adjacency 'replace-one'")
        if self.instruction is not None and not isinstance(self.instruction, str):
            raise ConfigurationError(f"{n('instruction')} must be a string, got {type(self.instruction).__name__}")
        put("label_map", _copied_map(self.label_map, "label_map"))
        put("min_new_tokens", int_at_least(self.min_new_tokens, n("min_new_tokens"), 0))
        if self.max_input_tokens is not None:
            put("max_input_tokens", int_at_least(self.max_input_tokens, n("max_input_tokens"), 1,
                                                 " (a public cap on the document's tokens)"))
        put("min_p", SANITIZE.min_p if self.min_p == _DEFAULT
            else None if self.min_p is None else check_probability(self.min_p, n("min_p"), low_open=True))
        if self.opening_tokens is not None:
            put("opening_tokens", int_at_least(self.opening_tokens, n("opening_tokens"), 0) or None)
        for flag in ("allow_untagged", "tag_uncovered", "debug"):
            put(flag, bool(getattr(self, flag)))

    def _put(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)


def _check_groups(groups: object) -> dict[str, tuple[str, ...]] | None:
    """``groups`` as a mapping of non-empty names to label tuples (the labels themselves are checked against
    the tagger's label set by :func:`dpinfer.validation.check_groups`)."""
    if groups is None:
        return None
    if not isinstance(groups, Mapping):
        raise InvalidInputError("groups must map group names to lists of labels")
    out: dict[str, tuple[str, ...]] = {}
    for name, labels in groups.items():
        if not isinstance(name, str) or not name:
            raise InvalidInputError("group names must be non-empty strings")
        if isinstance(labels, str) or not isinstance(labels, Iterable):
            raise InvalidInputError(f"group {name!r} must list its labels, e.g. ['PERSON', 'CODE']")
        out[name] = tuple(labels)
    return out


FIELDS: tuple[str, ...] = SanitizeConfig.field_names()
"""The names of :class:`SanitizeConfig`'s fields (the keyword arguments of :func:`dpinfer.sanitize` it holds)."""
