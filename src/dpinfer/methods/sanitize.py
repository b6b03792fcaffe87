"""The methods of sanitisation (``dpinfer sanitize --method``), one :class:`~dpinfer.methods.table.Method` entry each,
baselines included, and their builders.

Every method decodes the same prompt on the same engine (ALGORITHMS §5); an entry says which rows it decodes
(``contexts``: ``"fusion"``, the public context and one private context per privacy group; ``"original"``, the full
document; ``"public"``, the document with every span replaced), what its guarantee covers (``protects``: ``"spans"``,
the content of each group's spans; ``"document"``, the whole document, whose length is then private too;
``"nothing"``), the kind of guarantee, and its builder ``"module:callable"``. A builder is called as
``build(config, runtime)`` through :meth:`MethodTable.build <dpinfer.methods.table.MethodTable.build>` with the
:class:`~dpinfer.configs.sanitize.SanitizeConfig` and, as its runtime, the :class:`BuildArgs` of one planned document
(the model and what the plan knows of the document's groups), and returns the calibrated mechanism. DP-Fusion's
``checker`` refuses a target no calibration reaches (:func:`check_fusion`).

The table is light: listing it (``--help``, the CLI's checks) imports no mechanism, no accountant and no torch; a
builder imports its mechanism when it runs. Adding a method is a module with a builder plus one entry
(``TABLE.register(Method(...))``).

>>> TABLE.names()
['dp-fusion', 'dp-decoding', 'dp-prompt', 'original', 'ner-scrub']
>>> TABLE.get("ner-scrub").contexts, TABLE.get("ner-scrub").protects, TABLE.get("dp-prompt").protects
('public', 'spans', 'document')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dpinfer.configs.sanitize import SanitizeConfig
from dpinfer.defaults import SANITIZE
from dpinfer.methods.table import Method, MethodTable

if TYPE_CHECKING:
    from dpinfer.accounting import Guarantee
    from dpinfer.mechanisms.base import Mechanism

_HERE = "dpinfer.methods.sanitize"


@dataclass(frozen=True)
class BuildArgs:
    """What a builder may read besides the config: the model (``lm``: vocabulary, chat template), the privacy groups
    present (their names and labels only: the private contents stay in the rows), the ε target of each group, T_max,
    and the release's public ``settings`` (a builder records there what it changed, e.g. ``top_k`` off)."""

    lm: Any
    groups: Mapping[str, Sequence[str]]
    targets: Mapping[str, float]
    max_new_tokens: int
    settings: dict[str, Any]
    clip_bounds: Callable[[], tuple[float, float]] = field(default=lambda: (0.0, 0.0))
    """The model's public clip bounds for DP-Prompt (computed on first call, from public text only)."""
    mechanism: str = ""
    """The registry name of the entry's mechanism (set by :func:`mechanism` before its builder runs)."""


def check_fusion(config: SanitizeConfig, method: Method) -> None:
    """Refuse a DP-Fusion target no calibration reaches, from the settings alone (no document, no model, no torch).

    Every T_max shares the same floor: as the per-step bound goes to 0 the guarantee goes down to the cost of
    converting the Rényi bound at α to (ε, δ) (:func:`dpinfer.checks.rdp_conversion_cost`), so a target at or below it
    is unreachable and any target above it is reachable.
    """
    from dpinfer.checks import dp_fusion_floor_message, rdp_conversion_cost
    from dpinfer.errors import InfeasibleBudgetError

    targets = {"": config.epsilon, **{str(k): float(v) for k, v in (config.group_epsilon or {}).items()}}
    floor = rdp_conversion_cost(config.alpha, config.delta)
    for name, eps in targets.items():
        if eps <= floor:
            raise InfeasibleBudgetError(dp_fusion_floor_message(eps, config.delta, config.alpha, group=name,
                                                                alpha_name=config.name("alpha")))


def build_sampler(config: SanitizeConfig, args: BuildArgs) -> Mechanism:
    """The plain sampler (the baselines, and DP-Fusion when nothing was tagged)."""
    from dpinfer.mechanisms import get_mechanism

    return get_mechanism("sampler", temperature=config.temperature, top_k=config.top_k, mode="joint")


def build_fusion(config: SanitizeConfig, args: BuildArgs) -> Mechanism:
    """DP-Fusion calibrated to each group's ε target at order α (its top-k and min-p support read the public row)."""
    from dpinfer.accounting.calibration import Budget, Spec
    from dpinfer.mechanisms.dp_fusion import DPFusion

    args.settings["group_epsilon"] = dict(args.targets)
    return DPFusion.calibrated(
        Budget(dict(args.targets), config.delta),
        Spec(args.max_new_tokens, alpha=config.alpha, accounting=config.accounting, adjacency=config.adjacency,
             temperature=config.temperature, top_k=config.top_k, min_p=config.min_p))


def build_decoding(config: SanitizeConfig, args: BuildArgs) -> Mechanism:
    """DP-Decoding on the full vocabulary (its guarantee needs every token)."""
    from dpinfer.accounting.calibration import Budget, Spec
    from dpinfer.mechanisms.dp_decoding import DPDecoding

    args.settings["top_k"] = None
    return DPDecoding.calibrated(Budget(config.epsilon, config.delta),
                                 Spec(args.max_new_tokens, vocab_size=args.lm.vocab_size,
                                      temperature=config.temperature))


def build_prompt(config: SanitizeConfig, args: BuildArgs) -> Mechanism:
    """DP-Prompt with the model's public clip bounds, on the full vocabulary."""
    from dpinfer.accounting.calibration import Budget, Spec
    from dpinfer.mechanisms.dp_prompt import DPPrompt

    args.settings["top_k"] = None
    lo, hi = args.clip_bounds()
    args.settings["clip"] = [lo, hi]
    return DPPrompt.calibrated(Budget(config.epsilon, config.delta),
                               Spec(args.max_new_tokens, clip_min=lo, clip_max=hi, mode="joint"))


def build_registered(config: SanitizeConfig, args: BuildArgs) -> Mechanism:
    """Any whole-document mechanism of :data:`dpinfer.mechanisms.REGISTRY` calibrated as
    ``cls.calibrated(Budget(epsilon, delta), Spec(max_new_tokens))`` (a registered mechanism needs only a table entry
    with this builder)."""
    from dpinfer.accounting.calibration import Budget, Spec
    from dpinfer.mechanisms import REGISTRY

    return REGISTRY.get(args.mechanism).cls.calibrated(Budget(config.epsilon, config.delta),
                                                       Spec(args.max_new_tokens))


TABLE = MethodTable("sanitize", [
    Method("dp-fusion", "sanitize", build=f"{_HERE}:build_fusion", contexts="fusion", protects="spans",
           checker=f"{_HERE}:check_fusion",
           summary="DP-Fusion: per-group mollified mixture of public and private contexts"),
    Method("dp-decoding", "sanitize", build=f"{_HERE}:build_decoding", contexts="original", protects="document",
           summary="DP-Decoding (Majmudar et al. 2022): mix with the uniform distribution"),
    Method("dp-prompt", "sanitize", build=f"{_HERE}:build_prompt", contexts="original", protects="document",
           summary="DP-Prompt (Utpala et al. 2023): clipped logits, full-vocabulary sampling"),
    Method("original", "sanitize", build=f"{_HERE}:build_sampler", mechanism="sampler", contexts="original",
           protects="nothing", guarantee="none", baseline=True,
           summary="the plain sampler on the full document (no privacy)"),
    Method("ner-scrub", "sanitize", build=f"{_HERE}:build_sampler", mechanism="sampler", contexts="public",
           protects="spans", guarantee="zero", baseline=True,
           summary="the plain sampler on the public context, spans replaced (ε = 0 for their content)"),
], default=SANITIZE.method)
"""The sanitisation methods: DP-Fusion (the default), the whole-document DP-Decoding and DP-Prompt, and the
baselines ``original`` (no privacy) and ``ner-scrub`` (ε = 0 for the spans' content: it never reads them)."""


def method(name: object) -> Method:
    """The entry of ``name`` (an unknown method is refused with the table's names)."""
    return TABLE.get(name)


def rows(entry: Method, public: list[int], private: list[list[int]], original: list[int]) -> list[list[int]]:
    """The rows ``entry`` decodes: the public context and the private ones (``fusion``; the public alone when nothing
    was tagged: the output then depends on no protected content), the public context, or the full document."""
    if entry.contexts == "fusion":
        return [public, *private] if private else [public]
    return [public] if entry.contexts == "public" else [original]


def mechanism(entry: Method, config: SanitizeConfig, args: BuildArgs) -> Mechanism:
    """``entry``'s calibrated mechanism (the plain sampler for a fusion method with nothing tagged)."""
    if entry.contexts == "fusion" and not args.groups:
        return build_sampler(config, args)
    return TABLE.build(entry.name, config, dataclasses.replace(args, mechanism=entry.mechanism))


def decodes_one_row(entry: Method, groups: Mapping[str, Any]) -> bool:
    """Whether the method samples one row with the plain sampler (a baseline, or fusion with nothing tagged): the
    row's own min-p then applies."""
    return entry.baseline or (entry.contexts == "fusion" and not groups)


def guarantee(entry: Method, mech: Mechanism, groups: Mapping[str, Sequence[str]], config: SanitizeConfig,
              t_max: int) -> Guarantee:
    """The ex-ante guarantee of ``entry`` on a document with these privacy groups (parameters and T_max only)."""
    from dpinfer.accounting import Guarantee

    if entry.protects == "spans" and not groups:
        return Guarantee.no_privacy(entry.name)  # nothing tagged (allow_untagged): nothing was protected
    if entry.guarantee == "zero":
        return zero_guarantee(entry.name, groups, config.delta, t_max)
    return mech.guarantee(t_max)


def zero_guarantee(name: str, groups: Mapping[str, Sequence[str]], delta: float, t_max: int) -> Guarantee:
    """A method that decodes the public context only: the output does not depend on the content of any tagged span,
    so ε = 0 for every group under the same adjacency as DP-Fusion."""
    from dpinfer.accounting import GroupGuarantee, Guarantee, PureDp
    from dpinfer.accounting.sanitize_text import FUSION_ADJACENCY

    return Guarantee(
        epsilon=0.0, delta=delta, mechanism=name, adjacency=FUSION_ADJACENCY, parameters={"T_max": t_max},
        max_new_tokens=t_max, groups=tuple(GroupGuarantee(g, 0.0, delta, {}, loss=PureDp(0.0)) for g in groups),
    )
