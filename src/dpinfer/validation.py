"""Checks shared by the command line and the API, run before any model loads.

Parameter checks (:func:`check_sanitize_params`, :func:`check_synth_params`, :func:`check_generate_params`) are
plain Python: no model, no torch, a few microseconds (the method list is read without importing the mechanisms:
:mod:`dpinfer.methods`). Budget checks (:func:`check_sanitize_budget`; for synthesis
:func:`dpinfer.pipelines.synthesize.check_synth_budget`) calibrate the mechanism from the parameters alone (they
import torch, still no model).
Path helpers refuse an output path that cannot be written, or that is the input, before any work is done, and write
results atomically (a temporary file in the same folder, then :func:`os.replace`).

Every message names parameters, values, sizes and paths only, never input text.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# ------------------------------------------------------------------------------------------------------ scalars
# The scalar checks live in dpinfer.checks (the bottom layer, shared with the accountant and the mechanisms); they are
# re-exported here under the names this module always had.
from dpinfer.checks import (
    check_alpha,
    check_delta,
    check_seed,
    check_temperature,
    check_top_p,
    dp_fusion_floor_message,
    int_at_least,
    one_of,
    positive_number,
    rdp_conversion_cost,
)
from dpinfer.checks import is_number as _is_number  # noqa: F401
from dpinfer.defaults import GENERATE, SANITIZE, SYNTH
from dpinfer.errors import ConfigurationError, InvalidInputError

# File reading and atomic writing live in dpinfer.io; re-exported here under the names this module always had.
from dpinfer.io import (  # noqa: F401
    MAX_TEXT_BYTES,
    atomic_open,
    atomic_write_text,
    check_output_path,
    decode_text,
    input_file,
    rescue_write_text,
    sniff_text_file,
)


def _namer(cli: bool) -> Any:
    """Parameter names as the API spells them (``max_new_tokens``) or as the CLI does (``--max-new-tokens``)."""
    return (lambda name: "--" + name.replace("_", "-")) if cli else (lambda name: name)


def _optional_k(value: object, name: str) -> None:
    """None (off / full vocabulary), ``"default"``, or an integer ≥ 1."""
    if value is None or value == "default":
        return
    int_at_least(value, name, 1, " (or None)")


# ------------------------------------------------------------------------------------------------------ commands
def check_method(task: str, method: object, name: str = "method") -> str:
    """``method`` as one of ``task``'s methods (:func:`dpinfer.methods.method_names`: the mechanisms registered for
    the task and its baselines); an unknown one is refused with the list (torch-free while no mechanism is imported).
    """
    from dpinfer.methods import method_names

    return one_of(method, name, method_names(task))


def check_groups(groups: object) -> None:
    """``groups`` (group name → TAB labels) is None or a mapping of non-empty names to label lists, no label twice."""
    if groups is None:
        return
    from dpinfer.taggers.base import TAB_LABELS

    if not isinstance(groups, Mapping):
        raise InvalidInputError("groups must map group names to lists of labels")
    seen: dict[str, str] = {}
    for gname, labels in groups.items():
        if not isinstance(gname, str) or not gname:
            raise InvalidInputError("group names must be non-empty strings")
        if isinstance(labels, str) or not isinstance(labels, Iterable):
            raise InvalidInputError(f"group {gname!r} must list its labels, e.g. ['PERSON', 'CODE']")
        for label in labels:
            if label not in TAB_LABELS:
                raise InvalidInputError(f"unknown label in group {gname!r}; labels: {', '.join(TAB_LABELS)}")
            if label in seen:
                raise InvalidInputError(f"label {label} is in two groups ({seen[label]!r} and {gname!r})")
            seen[label] = gname


def check_sanitize_params(*, method: object = SANITIZE.method, epsilon: object = None,
                          group_epsilon: Mapping[str, object] | None = None, delta: object = SANITIZE.delta,
                          alpha: object = SANITIZE.alpha, temperature: object = None, top_k: object = "default",
                          max_new_tokens: object = None, no_repeat_ngram: object = "default", seed: object = None,
                          accounting: object = SANITIZE.accounting, adjacency: object = SANITIZE.adjacency,
                          tagger: object = None, groups: Mapping[str, Any] | None = None,
                          cli: bool = False) -> None:
    """Every parameter of :func:`dpinfer.sanitize` that can be checked without the document or the model
    (``cli=True``: messages name the command-line options, e.g. ``--max-new-tokens``).

    >>> check_sanitize_params(epsilon=10)
    >>> check_sanitize_params(epsilon=-1)
    Traceback (most recent call last):
    dpinfer.errors.ConfigurationError: epsilon must be > 0 (a finite number), got -1
    """
    from dpinfer.methods import is_baseline

    n = _namer(cli)
    check_method("sanitize", method, n("method"))
    if epsilon is not None:
        positive_number(epsilon, n("epsilon"))
    from dpinfer.taggers.base import TAB_LABELS

    check_groups(groups)
    if group_epsilon is not None:
        if not isinstance(group_epsilon, Mapping):
            raise ConfigurationError("group_epsilon must map group names or labels to numbers")
        for name, value in group_epsilon.items():
            if name not in TAB_LABELS and name not in (groups or {}):
                raise InvalidInputError(f"{'--group-epsilon' if cli else 'group_epsilon'} names {name!r}, which is "
                                        f"neither a group nor a label; labels: {', '.join(TAB_LABELS)}")
            positive_number(value, f"the ε of group {name}")
    check_delta(delta, n("delta"))
    check_alpha(alpha, n("alpha"))
    if temperature is not None:
        # greedy decoding only for a baseline (a private mechanism must sample)
        check_temperature(temperature, n("temperature"), allow_zero=is_baseline("sanitize", method))
    _optional_k(top_k, n("top_k"))
    if max_new_tokens is not None:
        int_at_least(max_new_tokens, n("max_new_tokens"), 1)
    _optional_k(no_repeat_ngram, n("no_repeat_ngram"))
    check_seed(seed, n("seed"))
    one_of(accounting, n("accounting"), ("dpinfer", "as_published"))
    one_of(adjacency, n("adjacency"), ("replace-by-null", "replace-one"))
    if adjacency == "replace-one" and accounting == "as_published":
        raise ConfigurationError("accounting 'as_published' reproduces the authors' replace-by-null charge; use "
                                 "accounting 'dpinfer' with adjacency 'replace-one'")
    if isinstance(tagger, str):
        from dpinfer.taggers.registry import available_taggers

        one_of(tagger, n("tagger"), available_taggers())


def conversion_cost(alpha: float, delta: float) -> float:
    """The cost of converting a Rényi bound held at the single order α to (ε, δ), the infimum of every ε DP-Fusion
    reaches at that α and δ (:func:`dpinfer.checks.rdp_conversion_cost`, which the accountant uses too).

    >>> round(conversion_cost(2.0, 1e-5), 4)
    10.1266
    """
    return rdp_conversion_cost(alpha, delta)


def check_sanitize_budget(*, method: str = SANITIZE.method, epsilon: float | None = None,
                          group_epsilon: Mapping[str, float] | None = None, delta: float = SANITIZE.delta,
                          alpha: float = SANITIZE.alpha, cli: bool = False) -> None:
    """Refuse a DP-Fusion target no calibration reaches, from the parameters alone (no document, no model, no torch).

    Every T_max shares the same floor: as the per-step bound goes to 0 the guarantee goes down to
    :func:`conversion_cost`, so a target at or below it is unreachable and any target above it is reachable.
    """
    from dpinfer.errors import InfeasibleBudgetError

    if method != "dp-fusion":
        return
    targets = {"": SANITIZE.epsilon if epsilon is None else float(epsilon)}
    targets.update({str(k): float(v) for k, v in (group_epsilon or {}).items()})
    floor = conversion_cost(alpha, delta)
    for name, eps in targets.items():
        if eps <= floor:
            raise InfeasibleBudgetError(dp_fusion_floor_message(eps, delta, alpha, group=name,
                                                                alpha_name="--alpha" if cli else "alpha"))


def check_synth_params(*, method: object = SYNTH.method, epsilon: object = None, delta: object = SYNTH.delta,
                       batch_size: object = SYNTH.batch_size, max_new_tokens: object = SYNTH.max_new_tokens,
                       top_k: object = SYNTH.top_k, temperature: object = SYNTH.temperature, seed: object = None,
                       max_texts: object = None, max_reference_tokens: object = SYNTH.max_reference_tokens,
                       limit: object = None, cli: bool = False) -> None:
    """Every parameter of :func:`dpinfer.synthesize` that can be checked without the corpus or the model
    (``cli=True``: messages name the command-line options).

    >>> check_synth_params(epsilon=10)
    >>> check_synth_params(epsilon=10, batch_size=0)
    Traceback (most recent call last):
    dpinfer.errors.ConfigurationError: batch_size must be an integer ≥ 1, got 0
    """
    from dpinfer.methods import is_baseline

    n = _namer(cli)
    check_method("synthesize", method, n("method"))
    public = is_baseline("synthesize", method)  # reads no reference: needs no ε
    if epsilon is None and not public:
        raise ConfigurationError(f"{n('epsilon')} is required (the target ε per reference), except with "
                                 f"{n('method')} {', '.join(_baselines('synthesize'))}")
    if epsilon is not None:
        positive_number(epsilon, n("epsilon"))
    check_delta(delta, n("delta"))
    int_at_least(batch_size, n("batch_size"), 1)
    int_at_least(max_new_tokens, n("max_new_tokens"), 1)
    _optional_k(top_k, n("top_k"))
    check_temperature(temperature, n("temperature"), allow_zero=public)
    check_seed(seed, n("seed"))
    if max_texts is not None:
        int_at_least(max_texts, n("max_texts"), 1)
    if max_reference_tokens is not None:
        int_at_least(max_reference_tokens, n("max_reference_tokens"), 1, " (None: no cut)")
    if limit is not None:
        int_at_least(limit, n("limit"), 1)


def _baselines(task: str) -> list[str]:
    from dpinfer.methods import BASELINES

    return list(BASELINES[task])


def check_corpus_size(*, method: str, references: int, batch_size: int) -> None:
    """At least one batch of B references for a method that reads them (before the model loads)."""
    from dpinfer.methods import is_baseline

    if not is_baseline("synthesize", method) and references < batch_size:
        raise InvalidInputError(f"{references} references are fewer than one batch of B = {batch_size}; lower "
                                "--batch-size or add references")


def check_generate_params(*, max_new_tokens: object = GENERATE.max_new_tokens,
                          temperature: object = GENERATE.temperature, top_k: object = GENERATE.top_k,
                          top_p: object = GENERATE.top_p, seed: object = None, cli: bool = False) -> None:
    """Every parameter of plain :func:`dpinfer.generate`."""
    n = _namer(cli)
    int_at_least(max_new_tokens, n("max_new_tokens"), 1)
    check_temperature(temperature, n("temperature"), allow_zero=True)
    if top_k is not None:
        int_at_least(top_k, n("top_k"), 1, " (or None)")
    check_top_p(top_p, n("top_p"))
    check_seed(seed, n("seed"))


def check_text(value: object, what: str) -> str:
    """``value`` if it is a string holding more than white space; the message says the expected type otherwise."""
    if not isinstance(value, str):
        raise InvalidInputError(f"{what} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise InvalidInputError(f"{what} is empty (or only white space)")
    return value
