"""The methods of the synthesize task (``dpinfer synth --method``, :func:`dpinfer.synthesize`'s ``method=``): one
:class:`~dpinfer.methods.table.Method` entry each in :data:`TABLE`, the baseline included, and their builders.

A builder, ``build(config, runtime)``, turns a :class:`~dpinfer.configs.synth.SynthConfig` into the calibrated
mechanism from the parameters alone (no reference, no model: an unreachable ε is refused before the model loads). A
method decodes one of two context layouts (its ``contexts``), built by :func:`batch_contexts`:

* ``"batch"``: the public prompt (row 0) and one private prompt per reference of the batch (rows 1..B);
* ``"public"``: the public prompt alone (``public``, the baseline: it reads no reference, ε = 0).

Adding a method: its mechanism (``dpinfer.mechanisms``, with ``calibrated(budget, spec)``), a builder here (or in its
own module) and one :data:`TABLE` entry. Importing this module imports no mechanism and no torch.

>>> TABLE.names()
['invisibleink', 'adapmixed', 'amin', 'public']
>>> build(SynthConfig(epsilon=10.0, batch_size=4, max_new_tokens=50)).guarantee(50).epsilon <= 10.0
True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dpinfer.accounting import Guarantee, PureDp
from dpinfer.accounting.calibration import Budget, Spec
from dpinfer.checks import check_temperature, one_of
from dpinfer.configs.synth import PromptTemplate, SynthConfig
from dpinfer.defaults import SYNTH
from dpinfer.errors import ConfigurationError, InvalidInputError
from dpinfer.mechanisms.registry import REGISTRY
from dpinfer.methods.table import Method, MethodTable

if TYPE_CHECKING:
    from dpinfer.mechanisms.base import Mechanism
    from dpinfer.models import LM
    from dpinfer.references import Reference


def _calibrated(name: str, config: SynthConfig, **params: Any) -> Mechanism:
    """``cls.calibrated(Budget(ε, δ), Spec(T_max, batch_size=B, temperature=τ, **params, **options))``."""
    if config.epsilon is None:
        raise ConfigurationError(f"epsilon is required (the target ε per reference) for method {config.method!r}")
    return REGISTRY.get(name).cls.calibrated(
        Budget(config.epsilon, config.delta),
        Spec(config.max_new_tokens, batch_size=config.batch_size, temperature=config.temperature,
             **params, **config.options))


def build_invisibleink(config: SynthConfig, runtime: Any = None) -> Mechanism:
    """InvisibleInk: C solved from (ε, δ, B, τ, T_max); ``top_k`` is the k of Top-k⁺."""
    return _calibrated("invisibleink", config, top_k=config.top_k)


def build_amin(config: SynthConfig, runtime: Any = None) -> Mechanism:
    """Amin et al.: C solved by bisection (its own public top-k is an option: ``public_top_k``)."""
    return _calibrated("amin", config)


def build_adapmixed(config: SynthConfig, runtime: Any = None) -> Mechanism:
    """AdaPMixED: ε is the cap of its data-dependent accounting; ``top_k`` is its public support."""
    return _calibrated("adapmixed", config, top_k=config.top_k)


def build_public(config: SynthConfig, runtime: Any = None) -> Mechanism:
    """The plain sampler on the public prompt (``top_k``: plain top-k; τ = 0 is greedy)."""
    return REGISTRY.build("sampler", temperature=config.temperature, top_k=config.top_k, mode="joint")


_CHECK = "dpinfer.methods.synthesize:check_settings"

TABLE = MethodTable("synthesize", [
    Method("invisibleink", "synthesize", build="dpinfer.methods.synthesize:build_invisibleink", contexts="batch",
           protects="references", guarantee="ex-ante", checker=_CHECK,
           summary="InvisibleInk: DClip + Top-k+ exponential mechanism"),
    Method("adapmixed", "synthesize", build="dpinfer.methods.synthesize:build_adapmixed", contexts="batch",
           protects="references", guarantee="data-dependent", checker=_CHECK,
           summary="AdaPMixED (Flemings et al. 2024): data-dependent, no ex-ante guarantee"),
    Method("amin", "synthesize", build="dpinfer.methods.synthesize:build_amin", contexts="batch",
           protects="references", guarantee="ex-ante", checker=_CHECK,
           summary="Amin et al. 2024: clipped average with a sparse-vector test"),
    Method("public", "synthesize", build="dpinfer.methods.synthesize:build_public", mechanism="sampler",
           contexts="public", protects="references", guarantee="zero", baseline=True, checker=_CHECK,
           summary="the public prompt only (reads no reference; ε = 0)"),
], default=SYNTH.method)
"""The synthesize task's methods: the default first, the mechanisms, then the baseline."""


def reads_references(method: str) -> bool:
    """Whether ``method`` decodes the references (every method but the ``"public"``-context baseline)."""
    return TABLE.get(method).contexts != "public"


def check(config: SynthConfig) -> Method:
    """The entry of ``config.method`` with its checks made (:meth:`Method.check`, :func:`check_settings`); messages
    spelled as the config's :attr:`~dpinfer.configs.base.Config.spelling`."""
    return TABLE.check(one_of(config.method, config.name("method"), TABLE.names()), config)


def check_settings(config: SynthConfig, entry: Method) -> None:
    """The checks of ``config`` that depend on its method (every entry's checker): ε given unless the method reads no
    reference, τ > 0 for a method that reads them."""
    n = config.name
    reads = entry.contexts != "public"
    if config.epsilon is None and reads:
        free = [m for m in TABLE.names() if TABLE.get(m).contexts == "public"]
        raise ConfigurationError(f"{n('epsilon')} is required (the target ε per reference), except with "
                                 f"{n('method')} {', '.join(free)}")
    check_temperature(config.temperature, n("temperature"), allow_zero=not reads)


def check_corpus_size(config: SynthConfig, references: int) -> None:
    """At least one batch of B references for a method that reads them (before the model loads)."""
    if reads_references(config.method) and references < config.batch_size:
        raise InvalidInputError(f"{references} references are fewer than one batch of B = {config.batch_size}; lower "
                                "--batch-size or add references")


def build(config: SynthConfig, runtime: Any = None) -> Mechanism:
    """The calibrated mechanism of ``config.method`` (after :func:`check`), through :data:`TABLE` only."""
    check(config)
    mech: Mechanism = TABLE.build(config.method, config, runtime)
    return mech


def public_guarantee(delta: float, t_max: int) -> Guarantee:
    """ε = 0 for the references: the method reads none of them."""
    return Guarantee(epsilon=0.0, delta=delta, mechanism="public", loss=PureDp(0.0),
                     adjacency="any change to the references (the public prompt reads none)",
                     parameters={"T_max": t_max}, max_new_tokens=t_max)


def guarantee(config: SynthConfig, mechanism: Mechanism) -> Guarantee:
    """The ex-ante guarantee of one text (per reference), marked ``seeded`` when the config has a seed."""
    g = (mechanism.guarantee(config.max_new_tokens) if reads_references(config.method)
         else public_guarantee(config.delta, config.max_new_tokens))
    return dataclasses.replace(g, seeded=True) if config.seed is not None else g


# ------------------------------------------------------------------------------------------------------ contexts
REFERENCE_SLACK = 8
"""Tokens added to ``max_reference_tokens`` in :func:`public_pad_width` for merges at the template boundaries."""


def _encode_reference(lm: LM, text: str, max_tokens: int | None) -> str:
    if max_tokens is None:
        return text
    ids = lm.encode(text)
    return text if len(ids) <= max_tokens else lm.decode(ids[:max_tokens], skip_special_tokens=False)


def batch_contexts(lm: LM, template: PromptTemplate, batch: Sequence[Reference],
                   max_reference_tokens: int | None = SYNTH.max_reference_tokens) -> list[list[int]]:
    """Token ids of the public prompt (row 0) and of one private prompt per reference (rows 1..B).

    The labels of the batch's first reference fill the templates (a batch shares its labels). An empty reference is
    the null reference ⊥ of the adjacency: its row is the public prompt. References are cut to
    ``max_reference_tokens`` tokens (a function of that reference alone).
    """
    labels = batch[0].labels
    prefix = template.render_prefix(labels)
    public = lm.encode(lm.instruction_prompt(template.render_public(labels)) + prefix)
    rows = [public]
    for ref in batch:
        if not ref.text.strip():
            rows.append(public)
            continue
        body = _encode_reference(lm, ref.text, max_reference_tokens)
        rows.append(lm.encode(lm.instruction_prompt(template.render_private(body, labels)) + prefix))
    return rows


def public_pad_width(lm: LM, template: PromptTemplate, labels: Mapping[str, str],
                     max_reference_tokens: int | None) -> int | None:
    """The engine's padding width for a batch, from PUBLIC parameters only (rule 2: the public row's computation never
    sees the private rows' lengths): the private template with an empty reference, plus ``max_reference_tokens`` and
    :data:`REFERENCE_SLACK`. A private context longer than that still decodes exactly (in a second batch, slower).
    ``None`` when references are not cut (no public bound: the engine pads to the public row)."""
    if max_reference_tokens is None:
        return None
    empty = lm.encode(lm.instruction_prompt(template.render_private("", labels)) + template.render_prefix(labels))
    return len(empty) + max_reference_tokens + REFERENCE_SLACK
