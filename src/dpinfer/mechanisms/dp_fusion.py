"""DP-Fusion: token-level DP for document sanitisation by mollifying each privacy group's distribution (ALGORITHMS §1).

Thareja et al., "DP-Fusion: Token-Level Differentially Private Inference for Large Language
Models" (ICLR 2026, https://openreview.net/forum?id=WLK37mn0El). The document's sensitive spans are tagged into m
privacy groups X_1..X_m. The engine steps m + 1 contexts of the same length together: row 0 is the PUBLIC context
(every tagged token replaced by a placeholder), row i the PRIVATE context of group i (every tagged token replaced
except those of group i). At every step, with ``p_pub`` and ``p_i`` the (temperature-scaled, public-support-truncated)
next-token distributions,

    λ_i = max { λ ∈ [0, 1] : D↔_α((1 − λ)·p_pub + λ·p_i, p_pub) ≤ b_i },      b_i = α·β_i (the paper's convention),
    q_i = (1 − λ_i)·p_pub + λ_i·p_i,         p_out = (1/m)·Σ_i q_i,         x_t ~ p_out,

where ``D_α(P‖Q) = 1/(α−1)·log Σ_v P_v^α Q_v^(1−α)`` and ``D↔_α(P, Q) = max(D_α(P‖Q), D_α(Q‖P))`` (this module's
:func:`renyi_divergence`, :func:`symmetric_renyi`, :func:`mix`, :func:`mollify`).

Privacy (the proof and the formulas are in :mod:`dpinfer.accounting.dp_fusion`): adjacency is replace-by-null of one
group's tagged spans; by joint convexity each group's per-token loss is at most :func:`step_epsilon` (b_i, m, α) at
the order α only, composed over ``T_max`` tokens and converted at that order (≈ 10.1 of conversion cost at α = 2,
δ = 1e-5; ≈ 1.2 at α = 8).

The guarantee covers the content of the tagged spans, not their existence, positions or token lengths (the
placeholders reveal those), and nothing the tagger missed. Temperature and truncation to a token set S are applied to
every row before mollification, with S computed from the PUBLIC logits only (:class:`~dpinfer.mechanisms.transforms.
PublicSupport`), so the bound is checked on the distributions actually sampled from and S costs nothing.

Numerics. S also drops the tokens whose public probability is below ``e^{(α−1)/α·(−708 + log m + min b)}`` (≈ e^-353
at α = 2; a public choice like top-k), so every mollified row, hence ``p_out``, is ≥ e^-708 on S for every document:
the support of the released distribution is the same public set for adjacent documents. ``p_out`` is formed in log
space (``logsumexp``), and λ is solved against ``b·(1 − 1e-9)`` so that the bound still holds when the divergence is
re-evaluated with other rounding.

The authors' library charges ``4·β_i = 4·b_i/α`` per step (a constant inherited from PMixED's replace-one
analysis); ``accounting="as_published"`` reproduces it and flags the guarantee as such.

The realised λ_i and ``D↔_α(q_i, p_pub)`` returned per step (``StepResult.stats``) are DATA-DEPENDENT diagnostics,
never a privacy guarantee.

>>> import torch
>>> logp_pub = torch.log(torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64))
>>> logp_priv = torch.log(torch.tensor([[0.1, 0.1, 0.8]], dtype=torch.float64))
>>> lam = mollify(logp_pub, logp_priv, [0.05], alpha=2.0)
>>> q = mix(logp_pub, logp_priv, lam)
>>> bool(symmetric_renyi(q, logp_pub, 2.0)[0] <= 0.05), round(float(lam[0]), 4)
(True, 0.1508)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from dpinfer.accounting import GroupGuarantee, Guarantee
from dpinfer.accounting.calibration import Budget, Spec
from dpinfer.accounting.dp_fusion import (
    ACCOUNTINGS,
    ADJACENCIES,
    ADJACENCY,
    ADJACENCY_REPLACE_ONE,
    ALPHA_HINT,
    bound_for_step_epsilon,
    calibrate_bound,
    check_accounting,
    check_adjacency,
    conversion_cost,
    enforcement_order,
    group_guarantees,
    group_loss,
    per_step_rdp,
    replace_one_factor,
    step_epsilon,
)
from dpinfer.checks import check_alpha, check_delta, positive_int, positive_number
from dpinfer.errors import ConfigurationError, InvalidInputError
from dpinfer.mechanisms.base import Mechanism, StepInfo, StepResult
from dpinfer.mechanisms.batch import SUPPORT_SLACK, draw_integers, fits_aligned
from dpinfer.mechanisms.divergences import mix, renyi_divergence, symmetric_renyi
from dpinfer.mechanisms.dp_fusion_batch import ERRORS, batch_support, fusion_mixture, fusion_step
from dpinfer.mechanisms.mollify import check_tol, mollify, mollify_with_divergence
from dpinfer.mechanisms.randomness import Randomness
from dpinfer.mechanisms.sampler import sample_probs
from dpinfer.mechanisms.transforms import PublicSupport

__all__ = [  # the divergences, the solver and the accounting are re-exported: DP-Fusion's API always offered them here
    "ACCOUNTINGS", "ADJACENCIES", "ADJACENCY", "ADJACENCY_REPLACE_ONE", "DPFusion", "bound_for_step_epsilon",
    "calibrate_bound", "conversion_cost", "enforcement_order", "group_guarantees", "group_loss", "mix", "mollify",
    "mollify_with_divergence", "per_step_rdp", "renyi_divergence", "replace_one_factor", "step_epsilon",
    "symmetric_renyi",
]
_check_adjacency = check_adjacency  # the former private name, still read by pipelines/sanitize.py

_NEG_INF = -math.inf
_LOG_TINY = -708.0
"""log of a normal float64 (e^-708 ≈ 3e-308): every released probability on the support is at least this."""


class DPFusion(Mechanism):
    """DP-Fusion (Thareja et al.): mollify each privacy group's distribution towards the public one, average, sample.

    Row 0 of the logits is the public context, row i (1 ≤ i ≤ m) the private context of group ``group_names[i−1]``.
    Per step: temperature, then truncation to a support S computed from row 0 only (``top_k``/``top_p``/
    ``support_margin``, as :class:`~dpinfer.mechanisms.transforms.PublicSupport`; without truncation, the public
    row's finite entries, which differ from the vocabulary when a processor bans tokens), applied to every row; then
    ``λ_i = max{λ : D↔_α((1−λ)p_pub + λp_i, p_pub) ≤ b_i}`` (:func:`mollify`) and one token drawn from
    ``p_out = (1/m)·Σ_i ((1−λ_i)p_pub + λ_i p_i)``.

    Args:
        bounds: ``b_i = α·β_i > 0``, one per group (the paper's αβ ∈ {0.01 … 0.10}).
        group_names: one distinct name per group (e.g. ``"PERSON"``), in the order of the private rows.
        alpha: the Rényi order α > 1 at which the bound is enforced and accounted.
        temperature: τ > 0 (DP-Fusion must sample: greedy decoding has no DP guarantee).
        top_k, top_p, support_margin: public-side truncation (``support_margin`` widens a top-k set by that many
            logits, after temperature).
        min_p: public-side truncation relative to the public maximum: S keeps ``{v : p_pub[v] ≥ min_p·max p_pub}``
            (after temperature), so a flat public step cannot release a token the public context itself finds
            unlikely; a function of row 0 only, so the guarantee is unchanged.
        delta: δ of the reported guarantee.
        accounting: ``"dpinfer"`` (:func:`step_epsilon` per token) or ``"as_published"`` (the authors' 4·β).
        tol: mollification tolerance on λ.
        adjacency: ``"replace-by-null"`` (default; ALGORITHMS §1) or ``"replace-one"`` (a group's values swapped
            for others): the bound is then enforced at order 2α and each group is charged
            ``step_epsilon(replace_one_factor(α)·b_i, m, α)`` per token (:func:`per_step_rdp`).

    ``StepResult.stats`` holds the realised ``"lambda"`` and ``"divergence"`` (``D↔_α(q_i, p_pub)`` at the enforced
    order) per group:
    DATA-DEPENDENT diagnostics that must not be reported as ε.

    >>> import torch
    >>> from dpinfer.mechanisms.base import StepInfo
    >>> mech = DPFusion(bounds=[0.05, 0.05], group_names=["PERSON", "LOC"], temperature=0.8, top_k=3)
    >>> mech.start(num_contexts=3, vocab_size=5)
    >>> z = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0],
    ...                   [0.0, 3.0, 0.5, 0.0, 9.0],
    ...                   [2.0, 1.0, 2.5, 0.0, -1.0]], dtype=torch.float64)
    >>> out = mech.step(z, StepInfo(step=0, max_new_tokens=100, num_contexts=3), torch.Generator().manual_seed(0))
    >>> int(out.tokens) in (0, 1, 2), [round(x, 3) for x in out.stats["lambda"]]
    (True, [0.122, 0.144])
    >>> g = mech.guarantee(max_new_tokens=100)
    >>> round(g.epsilon, 3), g.order, [group.name for group in g.groups]
    (12.658, 2.0, ['PERSON', 'LOC'])
    """

    name = "dp-fusion"
    mode = "joint"

    def __init__(
        self,
        *,
        bounds: Sequence[float],
        group_names: Sequence[str],
        alpha: float = 2.0,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        support_margin: float = 0.0,
        delta: float = 1e-5,
        accounting: str = "dpinfer",
        tol: float = 1e-6,
        adjacency: str = "replace-by-null",
        min_p: float | None = None,
    ) -> None:
        if isinstance(bounds, (str, bytes)) or not isinstance(bounds, Sequence) or len(bounds) == 0:
            raise ConfigurationError(
                f"bounds must be a non-empty sequence with one b_i = α·β_i > 0 per privacy group, got {bounds!r}"
            )
        for b in bounds:
            if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0.0 < b < math.inf:
                raise ConfigurationError(
                    f"every bound b_i = α·β_i must be a finite number > 0, got {list(bounds)!r} (the paper uses "
                    "αβ between 0.01 and 0.10; use DPFusion.calibrated(budget, spec) to derive them from a target ε)"
                )
        if isinstance(group_names, (str, bytes)) or not isinstance(group_names, Sequence):
            raise ConfigurationError(f"group_names must be a sequence of names, got {group_names!r}")
        names = list(group_names)
        if len(names) != len(bounds):
            raise ConfigurationError(
                f"group_names and bounds must have the same length (one bound per privacy group), got "
                f"{len(names)} names and {len(bounds)} bounds"
            )
        if not all(isinstance(n, str) and n for n in names):
            raise ConfigurationError(f"group names must be non-empty strings, got {names!r}")
        if len(set(names)) < len(names):
            raise ConfigurationError(f"group names must be distinct, got {names!r}")
        self.alpha = check_alpha(alpha, "the Rényi order α", ALPHA_HINT, label="")
        self.temperature = positive_number(
            temperature, "temperature",
            ": DP-Fusion must sample from the mollified mixture; greedy decoding (τ = 0) is a deterministic function "
            "of the private contexts and has no DP guarantee. For readable text from a small model use e.g. "
            "temperature=0.7 with top_k.",
        )
        if support_margin and top_k is None:
            raise ConfigurationError(
                f"support_margin={support_margin!r} widens a top-k support; set top_k as well (or leave the margin 0)"
            )
        self.support = PublicSupport(top_k=top_k, top_p=top_p, margin=support_margin, min_p=min_p)
        self.delta = check_delta(delta, "δ")
        self.accounting = check_accounting(accounting)
        self.adjacency = check_adjacency(adjacency, self.accounting)
        self.tol = check_tol(tol)
        self.bounds = tuple(float(b) for b in bounds)
        self.group_names = tuple(names)
        self.top_k, self.top_p, self.support_margin = top_k, top_p, float(support_margin)
        self.min_p = self.support.min_p
        self._bounds_t: torch.Tensor | None = None
        a = self.enforced_order
        # log q_i ≥ α/(α−1)·log p_pub − b_i for every mollified row (one term of D_α(p_pub‖q_i) ≤ b_i), so on tokens
        # with log p_pub ≥ this floor every q_i, hence p_out, stays ≥ e^-708 > 0 for EVERY document: the released
        # support is a public set, identical for adjacent documents (no underflow makes supports differ)
        self.log_floor = min((a - 1.0) / a * (_LOG_TINY + math.log(len(self.bounds)) + min(self.bounds)), -1e-3)

    @property
    def num_groups(self) -> int:
        """m, the number of privacy groups (the engine steps m + 1 contexts)."""
        return len(self.bounds)

    @property
    def enforced_order(self) -> float:
        """The order at which λ_i holds the bound: α, or 2α under replace-one adjacency."""
        return enforcement_order(self.alpha, self.adjacency)

    @property
    def betas(self) -> tuple[float, ...]:
        """β_i = b_i/α, the paper's per-group budget."""
        return tuple(b / self.alpha for b in self.bounds)

    @classmethod
    def calibrated(cls, budget: Budget, spec: Spec) -> DPFusion:
        """The DP-Fusion mechanism whose group i meets ``(budget.epsilon[i], budget.delta)`` over
        ``spec.max_new_tokens`` tokens (``budget.epsilon``: group name → target ε; ``spec.params``: ``alpha`` (2),
        ``accounting`` ("dpinfer"), ``adjacency`` ("replace-by-null") and the constructor's other keywords).

        Each b_i is the largest bound with ``SingleOrderRdp(α, T_max·step_epsilon(b_i, m, α)).to_epsilon(δ) ≤ ε_i``
        (:func:`dpinfer.accounting.calibrate`), i.e. exactly the loss :meth:`guarantee` reports. A target below the
        single-order conversion cost (≈ 10.1 at α = 2, δ = 1e-5) raises
        :class:`~dpinfer.errors.InfeasibleBudgetError` with the smallest reachable ε.

        >>> mech = DPFusion.calibrated(Budget({"PERSON": 15.0, "CODE": 12.0}, 1e-5), Spec(200))
        >>> [round(b, 4) for b in mech.bounds], mech.guarantee(200).epsilon <= 15.0
        ([0.0482, 0.0186], True)
        """
        group_epsilon = budget.epsilon
        kw: dict[str, Any] = dict(spec.params)
        max_new_tokens, delta = spec.max_new_tokens, budget.delta
        alpha = kw.pop("alpha", 2.0)
        accounting = kw.pop("accounting", "dpinfer")
        adjacency = kw.pop("adjacency", "replace-by-null")
        if not isinstance(group_epsilon, Mapping) or len(group_epsilon) == 0:
            raise ConfigurationError(
                f"group_epsilon must map each privacy group's name to its target ε, got {group_epsilon!r}"
            )
        m = len(group_epsilon)
        bounds = []
        for name, eps in group_epsilon.items():
            eps = positive_number(eps, f"the target ε of group {name!r}")
            bounds.append(
                calibrate_bound(
                    eps,
                    num_groups=m,
                    max_new_tokens=max_new_tokens,
                    delta=delta,
                    alpha=alpha,
                    accounting=accounting,
                    group=str(name),
                    adjacency=adjacency,
                )
            )
        return cls(
            bounds=bounds, group_names=list(group_epsilon), alpha=alpha, delta=delta, accounting=accounting,
            adjacency=adjacency, **kw
        )

    def diagnostics(self, steps: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
        """DATA-DEPENDENT: per group, the mean λ, the share of steps at λ = 1 and the largest realised divergence,
        and the per-step λ and divergences (exact functions of the private contexts: never released)."""
        if not steps:
            return {}
        m = self.num_groups
        lam = torch.tensor([s["lambda"] for s in steps], dtype=torch.float64).reshape(len(steps), m)
        div = torch.tensor([s["divergence"] for s in steps], dtype=torch.float64).reshape(len(steps), m)
        finite = div.isfinite()
        return {
            "groups": {
                name: {"mean_lambda": float(lam[:, i].mean()),
                       "share_lambda_1": float((lam[:, i] >= 1.0).double().mean()),
                       "max_divergence": float(div[finite[:, i], i].max()) if finite[:, i].any() else None}
                for i, name in enumerate(self.group_names)
            },
            "lambda_per_step": lam.round(decimals=6).tolist(),
            "divergence_per_step": div.round(decimals=8).tolist(),
        }

    def start(self, num_contexts: int, vocab_size: int) -> None:
        m = self.num_groups
        if num_contexts != m + 1:
            raise ConfigurationError(
                f"DP-Fusion with m = {m} privacy groups ({', '.join(self.group_names)}) steps m + 1 = {m + 1} contexts "
                f"(row 0 public, row i the private context of group i), got {num_contexts}; build one private "
                "context per group, in the order of group_names"
            )

    def _scaled(self, logits: torch.Tensor) -> torch.Tensor:
        z = logits.to(torch.float64)
        return z * (1.0 / self.temperature) if self.temperature != 1.0 else z

    def _support_ids(self, z_pub: torch.Tensor) -> torch.Tensor | None:
        """The ids of S from the public row (after temperature) only; ``None`` for the whole vocabulary. Without
        truncation S is the public row's finite entries (e.g. EOS banned for every row alike): a public choice,
        applied to every row like a top-k support, so the solver works on a full support."""
        if not self.support.is_full:
            keep = self.support.mask(z_pub)
        elif bool((z_pub == _NEG_INF).any()):
            keep = z_pub > _NEG_INF
        else:
            keep = None
        # public-only floor: drop tokens whose PUBLIC probability on S is below e^log_floor (at most e^-353 at α = 2),
        # so that every released probability is a normal float > 0 on S for every document (see log_floor)
        zs = z_pub if keep is None else z_pub.masked_fill(~keep, _NEG_INF)
        lps = torch.log_softmax(zs, dim=-1)
        low = lps < min(self.log_floor, float(lps.max()))  # the public mode always stays
        if keep is None:
            if not bool(low.any()):
                return None
            keep = ~low
        else:
            keep = keep & ~low
        return keep.nonzero().squeeze(-1)

    def private_columns(self, public_scores: torch.Tensor) -> torch.Tensor | None:
        """The ids of the public support S, exactly as :meth:`step` computes it: the private rows are read there and
        nowhere else."""
        if self.batch_key() is not None:
            pub = [public_scores.unsqueeze(0)]
            sid, real, over = batch_support([self], pub, False)
            if bool(over[0]):
                sid, real, _ = batch_support([self], pub, True)
            return sid[0][real[0]]
        return self._support_ids(self._scaled(public_scores))

    @classmethod
    def public_support(cls, mechanisms: Sequence[Mechanism], public: Sequence[torch.Tensor]
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """S of several batching jobs at once (:func:`batch_support`, as :meth:`private_columns` computes it)."""
        mechs = [m for m in mechanisms if isinstance(m, DPFusion)]
        return batch_support(mechs, public, False)

    def batch_key(self) -> tuple[Any, ...] | None:
        """With a top-k support (and no top-p) DP-Fusion decides on the gathered support, in batches
        (:func:`fusion_step`: the per-job :meth:`step` is the same computation on a batch of one): jobs with the same
        group count, top-k, margin, min-p, enforced order and tolerance decide together (their bounds and
        temperatures may differ)."""
        if self.top_k is None or self.top_p is not None:
            return None
        if not fits_aligned((self.num_groups + 1) * (self.top_k + SUPPORT_SLACK)):
            return None  # a support too wide for one aligned chunk: the full-vocabulary solver, job by job
        return (DPFusion, self.num_groups, self.top_k, self.support_margin, self.min_p, self.enforced_order, self.tol)

    @classmethod
    def step_batch(cls, mechanisms: Sequence[Mechanism], logits: Sequence[torch.Tensor], infos: Sequence[StepInfo],
                   generators: Sequence[Randomness]) -> list[StepResult | Exception]:
        """Every job's step at once (:func:`fusion_step`), the λ search of every job and group together in a fixed
        number of bisection rounds, one device-to-host transfer for every token and statistic."""
        mechs = [m for m in mechanisms if isinstance(m, DPFusion)]
        ints, srcs = draw_integers(generators, [1] * len(mechs))
        return fusion_step(mechs, logits, [int(i[0]) for i in ints], srcs, [i.debug_stats for i in infos], False)

    @property
    def restricts_private_columns(self) -> bool:
        return not self.support.is_full

    def _mixture(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """``p_out`` on the public support S, the ids of S (None for the full vocabulary), λ and the divergences."""
        m = self.num_groups
        if logits.ndim != 2 or logits.shape[0] != m + 1:
            raise InvalidInputError(
                f"DP-Fusion with m = {m} groups needs logits of shape (m + 1, V) = ({m + 1}, V), got "
                f"{tuple(logits.shape)}"
            )
        z = self._scaled(logits)
        if bool(torch.isnan(z.sum(dim=-1)).any()):  # a NaN (or +inf next to -inf) anywhere makes its row sum NaN
            raise InvalidInputError("the logits contain NaN (or +inf); nothing is sampled")
        idx = self._support_ids(z[0])  # S from the public row only, applied to every row
        if idx is not None:
            z = z.index_select(1, idx)
        logp = torch.log_softmax(z, dim=-1)
        lp, lq = logp[0], logp[1:]
        if not bool(lp.max() > _NEG_INF):  # NaN (no finite public logit) compares False
            raise InvalidInputError("the public row has no finite logit; nothing can be sampled")
        undefined = torch.isnan(lq[:, :1])  # a private row with no finite logit on S is NaN throughout
        if bool(undefined.any()):
            lq = torch.where(undefined, lp.expand_as(lq), lq)  # use p_pub: then q_i = p_pub whatever λ_i
        if self._bounds_t is None or self._bounds_t.device != lq.device:
            self._bounds_t = torch.tensor(self.bounds, dtype=torch.float64, device=lq.device)
        lam, div = mollify_with_divergence(lp, lq, self._bounds_t, self.enforced_order, self.tol)
        # p_out = (1/m)·Σ_i ((1 − λ_i)·p_pub + λ_i·p_i) = (1 − mean λ)·p_pub + Σ_i (λ_i/m)·p_i, formed in log space
        # (a linear-space sum underflows where p_pub < e^-745 while λ_i·p_i > 0, and supports would differ)
        terms = torch.cat([(torch.log1p(-lam.mean()) + lp).unsqueeze(0), (torch.log(lam / m).unsqueeze(-1) + lq)])
        probs = torch.logsumexp(terms, dim=0).exp()
        return probs, idx, lam, div

    def distribution(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The released distribution ``p_out`` over the full vocabulary (V,), with λ (m,) and ``D↔_α(q_i, p_pub)``
        (m,) for the ``(m + 1, V)`` logits: what :meth:`step` samples from. λ and the divergences are
        DATA-DEPENDENT."""
        if self.batch_key() is not None:
            mix = fusion_mixture([self], [logits], False)
            if bool(mix.over[0]):
                mix = fusion_mixture([self], [logits], True)
            code = int(mix.code[0])
            if code:
                raise InvalidInputError(ERRORS[code])
            probs = torch.zeros(logits.shape[1], dtype=torch.float64, device=mix.probs.device)
            probs.index_put_((mix.ids[0],), mix.probs[0], accumulate=True)  # padding: weight 0 on a real id
            return probs, mix.lam[0], mix.div[0]
        probs, idx, lam, div = self._mixture(logits)
        if idx is not None:
            probs = torch.zeros(logits.shape[1], dtype=torch.float64, device=probs.device).index_copy_(0, idx, probs)
        return probs, lam, div

    def step(self, logits: torch.Tensor, info: StepInfo, generator: Randomness) -> StepResult:
        """Sample one token from ``p_out`` with ``generator``; stats (with ``info.debug_stats``) hold the
        DATA-DEPENDENT λ and divergences."""
        if (res := self.batch_of_one(logits, info, generator)) is not None:
            return res
        probs, idx, lam, div = self._mixture(logits)
        j = sample_probs(probs, generator)
        token = idx[j] if idx is not None else j
        stats = {"lambda": lam.tolist(), "divergence": div.tolist()} if info.debug_stats else None
        return StepResult(tokens=token.to(torch.long), stats=stats)

    def group_guarantees(self, max_new_tokens: int) -> tuple[GroupGuarantee, ...]:
        """One ex-ante guarantee per group over at most ``max_new_tokens`` tokens."""
        return group_guarantees(
            self.bounds,
            self.group_names,
            alpha=self.alpha,
            delta=self.delta,
            max_new_tokens=max_new_tokens,
            accounting=self.accounting,
            adjacency=self.adjacency,
        )

    def guarantee(self, max_new_tokens: int) -> Guarantee:
        """(ε, δ) per group at order α from b_i, m, α, δ and T_max only; the headline is the worst group."""
        t = positive_int(max_new_tokens, "max_new_tokens (T_max)")
        groups = self.group_guarantees(t)
        worst_loss = max(
            (group_loss(b, self.num_groups, self.alpha, t, self.accounting, self.adjacency) for b in self.bounds),
            key=lambda loss: loss.epsilon,
        )
        return Guarantee.from_loss(
            worst_loss,
            delta=self.delta,
            mechanism=self.name,
            adjacency=ADJACENCY if self.adjacency == "replace-by-null" else ADJACENCY_REPLACE_ONE,
            parameters={
                "alpha": self.alpha,
                "bounds": dict(zip(self.group_names, self.bounds, strict=True)),
                "beta": dict(zip(self.group_names, self.betas, strict=True)),
                "num_groups": self.num_groups,
                "temperature": self.temperature,
                "top_k": self.top_k,
                "top_p": self.top_p,
                "support_margin": self.support_margin,
                **({"min_p": self.min_p} if self.min_p is not None else {}),
                "T_max": t,
                "tol": self.tol,
                "adjacency": self.adjacency,
                "enforced_order": self.enforced_order,
            },
            max_new_tokens=t,
            groups=groups,
            accounting=self.accounting,
        )
