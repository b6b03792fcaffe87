"""InvisibleInk (Vinod et al. 2025): DP synthetic long-form text from a batch of B private references.

ALGORITHMS §2. The engine steps B + 1 contexts together: row 0 is the public prompt (the instruction alone), row i
(1 ≤ i ≤ B) the instruction with reference i. Per token, from the raw logits ``ℓ_pub = ℓ_0`` and ``ℓ_i``:

1. **DClip**: ``ℓ̃_i = ℓ_pub + clip(ℓ_i − ℓ_pub, −C, C)`` coordinate-wise, and ``ℓ̄ = (1/B)·Σ_i ℓ̃_i``.
2. **Top-k⁺**: ``V⁺ = {v : ℓ_pub[v] ≥ kth_largest(ℓ_pub) − 2C/B}``, from the public logits only (free). It contains
   the top-k tokens of every standalone contribution ``ℓ_pub + clip(ℓ_i − ℓ_pub, −C, C)/B``.
3. Sample from ``softmax(ℓ̄[V⁺]/τ)``.

Privacy (replace-by-null adjacency: one reference replaced by the null reference ⊥, whose context is the public
prompt, so its logits are ``ℓ_pub`` and its clipped difference is 0). Replacing reference i by ⊥ moves one clipped
difference from ``[−C, C]`` to 0, so ``ℓ̄`` moves by at most ``C/B`` in every coordinate. Sampling from
``softmax(ℓ̄/τ)`` is then an exponential mechanism with utility sensitivity ``C/(Bτ)``: it is ``ε₀ = 2C/(Bτ)``
bounded-range and so ``ρ₀ = ε₀²/8 = ½·(C/(Bτ))²``-zCDP (Cesar & Rogers 2021; InvisibleInk Theorem 2). Restricting
to ``V⁺`` is post-processing of public data. Over at most ``T_max`` tokens (adaptive composition):

    ρ = T_max · C² / (2·B²·τ²)

and many texts from disjoint, data-independent batches keep the same ρ (parallel composition). Calibration solves
``C = B·τ·sqrt(2ρ/T_max)`` with ρ the largest zCDP value whose (ε, δ) conversion meets the target.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dpinfer.accounting import Guarantee, zcdp_rho_for_target
from dpinfer.accounting.accountant import compose_steps, ex_ante_guarantee
from dpinfer.accounting.calibration import Budget, Spec, zcdp_rho
from dpinfer.accounting.events import ClippedExponentialEvent
from dpinfer.checks import check_delta, optional_positive_int, positive_int, positive_number
from dpinfer.errors import InvalidInputError
from dpinfer.mechanisms.base import Mechanism, StepInfo, StepResult
from dpinfer.mechanisms.batch import (
    SUPPORT_SLACK,
    ascending,
    draw_integers,
    fits_aligned,
    host_tensor,
    in_aligned_chunks,
    job_chunks,
    release_tokens,
    topk_plus_columns,
    whole_vocabulary,
)
from dpinfer.mechanisms.layout import check_batch_layout
from dpinfer.mechanisms.randomness import Randomness
from dpinfer.mechanisms.sampler import sample_probs

ADJACENCY = (
    "replace-by-null of one reference (one reference replaced by the empty reference, whose context is the public "
    "prompt)"
)


def dclip_aggregate(logits: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """``ℓ̄ = ℓ_pub + (1/B)·Σ_i clip(ℓ_i − ℓ_pub, −C, C)`` for ``(B + 1, V)`` logits (row 0 public).

    A coordinate the public row forbids (``−inf``) stays forbidden; a private ``−inf`` clips to ``−C``.

    >>> z = torch.tensor([[0.0, 1.0, 2.0], [5.0, 1.0, -5.0], [0.0, 0.0, 2.5]], dtype=torch.float64)
    >>> dclip_aggregate(z, 1.0).tolist()
    [0.5, 0.5, 1.75]
    """
    pub, priv = logits[0], logits[1:]
    diff = (priv - pub).clamp(-clip_norm, clip_norm)
    diff = torch.nan_to_num(diff, nan=0.0)  # −inf − (−inf): the public row forbids it anyway
    return pub + diff.mean(dim=0)


def topk_plus(public_logits: torch.Tensor, top_k: int | None, clip_norm: float,
              batch_size: int) -> tuple[torch.Tensor, float | None]:
    """Boolean mask of ``V⁺ = {v : ℓ_pub[v] ≥ kth_largest(ℓ_pub) − 2C/B}`` and the public k-th largest logit.

    With ``top_k=None`` (or k at least the number of finite public logits) V⁺ is every finite public entry and the
    threshold is None.
    """
    finite = torch.isfinite(public_logits)
    if top_k is None or top_k >= int(finite.sum()):
        return finite, None
    kth = float(torch.topk(public_logits, top_k).values[-1])
    return public_logits >= kth - 2.0 * clip_norm / batch_size, kth


def topk_plus_mask(public_logits: torch.Tensor, top_k: int | None, clip_norm: float, batch_size: int) -> torch.Tensor:
    """The mask of :func:`topk_plus`.

    >>> m = topk_plus_mask(torch.tensor([3.0, 2.9, 2.0, 0.0]), top_k=1, clip_norm=0.2, batch_size=2)
    >>> m.tolist()
    [True, True, False, False]
    """
    return topk_plus(public_logits, top_k, clip_norm, batch_size)[0]


def clip_norm_for_rho(rho: float, *, batch_size: int, temperature: float, max_new_tokens: int) -> float:
    """``C = B·τ·sqrt(2ρ/T_max)``: the clip norm whose generation of ``T_max`` tokens is ρ-zCDP.

    >>> round(clip_norm_for_rho(1.539, batch_size=7, temperature=1.1, max_new_tokens=500), 3)
    0.604
    """
    return batch_size * temperature * math.sqrt(2.0 * rho / max_new_tokens)


def rho_for_clip_norm(clip_norm: float, *, batch_size: int, temperature: float, max_new_tokens: int) -> float:
    """``ρ = T_max·C²/(2·B²·τ²)`` (ALGORITHMS §2): :class:`~dpinfer.accounting.events.ClippedExponentialEvent`
    composed over ``T_max`` tokens by the accountant.

    >>> rho_for_clip_norm(0.5, batch_size=2, temperature=1.0, max_new_tokens=4)
    0.125
    """
    loss = compose_steps(ClippedExponentialEvent(clip_norm, batch_size, temperature), max_new_tokens)
    return zcdp_rho(loss)


class InvisibleInk(Mechanism):
    """InvisibleInk: DClip + Top-k⁺ + exponential-mechanism sampling over B references (ALGORITHMS §2).

    Row 0 of the logits is the public context (no reference), rows 1..B the private contexts (one reference each).

    Args:
        clip_norm: C > 0, the DClip bound on ``ℓ_i − ℓ_pub`` (use :meth:`calibrated` to derive it from (ε, δ)).
        batch_size: B, the number of references (the engine steps B + 1 contexts).
        temperature: τ > 0 (the paper finds 1.0–1.2 best).
        top_k: k of Top-k⁺ (``None``: the full vocabulary; 50–100 suits open-ended text).
        delta: δ of the reported (ε, δ) guarantee.

    ``StepResult.stats`` holds ``support`` (|V⁺|, public), ``clipped`` (share of clipped coordinates on V⁺) and
    ``expanded`` (1.0 when the token lies outside the public top-k): the last two are DATA-DEPENDENT diagnostics.

    >>> from dpinfer.mechanisms.base import StepInfo
    >>> mech = InvisibleInk.calibrated(Budget(10.0, 1e-6), Spec(500, batch_size=7, temperature=1.1))
    >>> round(mech.clip_norm, 3), round(mech.rho(500), 3)
    (0.604, 1.539)
    >>> mech.start(num_contexts=8, vocab_size=5)
    >>> z = torch.randn(8, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> out = mech.step(z, StepInfo(step=0, max_new_tokens=500, num_contexts=8), torch.Generator().manual_seed(0))
    >>> 0 <= int(out.tokens) < 5
    True
    >>> round(mech.guarantee(500).epsilon, 2)
    10.0
    """

    name = "invisibleink"
    mode = "joint"

    def __init__(
        self,
        *,
        clip_norm: float,
        batch_size: int,
        temperature: float = 1.0,
        top_k: int | None = 50,
        delta: float = 1e-6,
    ) -> None:
        self.clip_norm = positive_number(
            clip_norm, "clip_norm C", " (use InvisibleInk.calibrated(budget, spec) to derive it from a target ε)"
        )
        self.batch_size = positive_int(batch_size, "batch_size B (references per generated text)")
        self.temperature = positive_number(
            temperature, "temperature τ", "; InvisibleInk samples (the exponential mechanism), τ = 1.0 is the default"
        )
        self.top_k = optional_positive_int(top_k, "top_k (None for the full vocabulary)", "")
        self.delta = check_delta(delta, "δ")

    @classmethod
    def calibrated(cls, budget: Budget, spec: Spec) -> InvisibleInk:
        """The mechanism whose generation of at most ``spec.max_new_tokens`` tokens is (ε, δ)-DP per reference
        (``spec.params``: ``batch_size`` B, ``temperature`` τ (default 1.0), the constructor's other keywords).

        ``ρ = zcdp_rho_for_target(ε, δ)`` then ``C = B·τ·sqrt(2ρ/T_max)``.
        """
        kw: dict[str, Any] = dict(spec.params)
        eps = budget.scalar("the target ε", "; smaller ε is stronger privacy (e.g. 10)")
        t = positive_int(spec.max_new_tokens, "max_new_tokens")
        b = positive_int(kw.pop("batch_size", None), "batch_size B")
        tau = positive_number(kw.pop("temperature", 1.0), "temperature τ")
        delta = check_delta(budget.delta, "δ")
        rho = zcdp_rho_for_target(eps, delta)
        clip = clip_norm_for_rho(rho, batch_size=b, temperature=tau, max_new_tokens=t)
        return cls(clip_norm=clip, batch_size=b, temperature=tau, delta=delta, **kw)

    def diagnostics(self, steps: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
        """DATA-DEPENDENT: the share of tokens drawn outside the public top-k (the Top-k⁺ expansion) and the share of
        clipped coordinates on V⁺, over the generation's steps."""
        if not steps:
            return {}
        n = len(steps)
        return {"expanded_token_share": math.fsum(float(s.get("expanded", 0.0)) for s in steps) / n,
                "clipped_share": math.fsum(float(s.get("clipped", 0.0)) for s in steps) / n}

    def start(self, num_contexts: int, vocab_size: int) -> None:
        check_batch_layout("InvisibleInk", self.batch_size, num_contexts)

    def _check(self, logits: torch.Tensor) -> torch.Tensor:
        if logits.ndim != 2 or logits.shape[0] != self.batch_size + 1:
            raise InvalidInputError(
                f"InvisibleInk with B = {self.batch_size} needs logits of shape (B + 1, V), got {tuple(logits.shape)}"
            )
        z = logits.to(torch.float64)
        total = float(z.sum())  # NaN, or +inf (alone or next to −inf), anywhere shows in the sum
        if math.isnan(total) or total == math.inf:
            raise InvalidInputError("the logits contain NaN or +inf; nothing is sampled")
        return z

    def _released(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, float | None]:
        """``softmax(ℓ̄[V⁺]/τ)`` on the ids of V⁺ (None: the full vocabulary) and the public k-th largest logit.

        Only the columns of V⁺ are aggregated: V⁺ comes from the public row alone, so this is the same distribution
        as aggregating everything and masking, at the cost of |V⁺| columns instead of V.
        """
        support, kth = topk_plus(z[0], self.top_k, self.clip_norm, self.batch_size)
        if not bool(support.any()):
            raise InvalidInputError("the public row has no finite logit; nothing can be sampled")
        idx = None
        if not bool(support.all()):
            idx = support.nonzero().squeeze(-1)
            z = z.index_select(1, idx)
        agg = dclip_aggregate(z, self.clip_norm) / self.temperature
        return torch.softmax(agg, dim=-1), idx, kth

    @property
    def restricts_private_columns(self) -> bool:
        return self.top_k is not None  # without a top-k V⁺ is every finite public entry: the head is not split

    def private_columns(self, public_scores: torch.Tensor) -> torch.Tensor | None:
        """The ids of V⁺ (from the public row only): the private rows are read there and nowhere else."""
        if self.batch_key() is not None and self.top_k is not None:
            pub = [public_scores.unsqueeze(0)]
            sid, real, _, over = _ink_support([self], pub, False)
            if int(over[0]):
                sid, real, _, _ = _ink_support([self], pub, int(over[0]))
            return sid[0][real[0]]
        support, kth = topk_plus(public_scores, self.top_k, self.clip_norm, self.batch_size)
        return None if kth is None else support.nonzero().squeeze(-1)

    @classmethod
    def public_support(cls, mechanisms: Sequence[Mechanism], public: Sequence[torch.Tensor]
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """V⁺ of several batching jobs with a top-k at once (:func:`_ink_support`, as :meth:`private_columns`)."""
        mechs = [m for m in mechanisms if isinstance(m, InvisibleInk)]
        if not mechs or mechs[0].top_k is None:
            return None
        sid, real, _, over = _ink_support(mechs, public, False)
        return sid, real, over

    def distribution(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The released distribution over the full vocabulary (V,) and the Top-k⁺ mask, for ``(B + 1, V)`` logits."""
        if self.batch_key() is not None:
            mix = _ink_mixture([self], [logits], self.top_k is None)
            if int(mix.over[0]):
                mix = _ink_mixture([self], [logits], int(mix.over[0]))
            code = int(mix.code[0])
            if code:
                raise InvalidInputError(_ERRORS[code])
            vocab = logits.shape[1]
            probs = torch.zeros(vocab, dtype=torch.float64, device=mix.probs.device)
            probs.index_put_((mix.ids[0],), mix.probs[0], accumulate=True)  # padding: weight 0 on a real id
            support = torch.zeros(vocab, dtype=torch.bool, device=mix.probs.device)
            support[mix.ids[0][mix.real[0]]] = True
            return probs, support
        z = self._check(logits)
        probs, idx, _ = self._released(z)
        support = torch.ones(z.shape[1], dtype=torch.bool, device=z.device)
        if idx is not None:
            full = torch.zeros(z.shape[1], dtype=torch.float64, device=z.device)
            probs = full.index_copy_(0, idx, probs)
            support = torch.zeros_like(support).index_fill_(0, idx, True)
        return probs, support

    def step(self, logits: torch.Tensor, info: StepInfo, generator: Randomness) -> StepResult:
        """Sample one token from ``softmax(ℓ̄[V⁺]/τ)``."""
        if (res := self.batch_of_one(logits, info, generator)) is not None:
            return res
        z = self._check(logits)
        probs, idx, kth = self._released(z)
        j = sample_probs(probs, generator)
        token = idx[j] if idx is not None else j
        cols = z if idx is None else z.index_select(1, idx)
        stats: dict[str, float] = {
            "support": float(probs.numel()),
            "clipped": float(((cols[1:] - cols[0]).abs() > self.clip_norm).double().mean()),
        }
        if kth is not None:
            stats["expanded"] = float(float(z[0, token]) < kth)
        return StepResult(tokens=token.to(torch.long), stats=stats)

    def batch_key(self) -> tuple[Any, ...] | None:
        """InvisibleInk decides in batches (:func:`_ink_step`; the per-job :meth:`step` is the same computation on a
        batch of one), on the gathered public columns with a top-k (Top-k⁺), on the whole vocabulary without: jobs
        with the same B and top-k decide together (their clip norms and temperatures may differ)."""
        if self.top_k is not None and not fits_aligned((self.batch_size + 1) * (self.top_k + SUPPORT_SLACK)):
            return None
        return (InvisibleInk, self.batch_size, self.top_k)

    @classmethod
    def step_batch(cls, mechanisms: Sequence[Mechanism], logits: Sequence[torch.Tensor], infos: Sequence[StepInfo],
                   generators: Sequence[Randomness]) -> list[StepResult | Exception]:
        """Every job's DClip, mean and softmax on its Top-k⁺ at once (:func:`_ink_step`), one 53-bit integer per job
        from its own source, one device-to-host transfer for every token and statistic."""
        mechs = [m for m in mechanisms if isinstance(m, InvisibleInk)]
        ints, srcs = draw_integers(generators, [1] * len(mechs))
        first = [int(i[0]) for i in ints]
        want = [i.debug_stats for i in infos]
        if mechs and mechs[0].top_k is not None:
            return _ink_step(mechs, logits, first, srcs, want, False)
        out: list[StepResult | Exception] = []
        for part in job_chunks(len(mechs), (mechs[0].batch_size + 1) * logits[0].shape[-1] if mechs else 1):
            out += _ink_step([mechs[b] for b in part], [logits[b] for b in part], [first[b] for b in part],
                             [srcs[b] for b in part], [want[b] for b in part], True)
        return out

    def loss_event(self) -> ClippedExponentialEvent:
        """What one token releases, for the accountant: :class:`~dpinfer.accounting.events.ClippedExponentialEvent`."""
        return ClippedExponentialEvent(self.clip_norm, self.batch_size, self.temperature)

    def rho(self, max_new_tokens: int) -> float:
        """``ρ = T_max·C²/(2B²τ²)``."""
        return zcdp_rho(compose_steps(self.loss_event(), positive_int(max_new_tokens, "max_new_tokens")))

    def guarantee(self, max_new_tokens: int) -> Guarantee:
        """ρ-zCDP per reference over at most ``T_max`` tokens, converted to (ε, δ); from parameters only."""
        t = positive_int(max_new_tokens, "max_new_tokens")
        return ex_ante_guarantee(
            self.loss_event(),
            steps=t,
            delta=self.delta,
            mechanism=self.name,
            adjacency=ADJACENCY,
            parameters={
                "clip_norm": self.clip_norm,
                "batch_size": self.batch_size,
                "temperature": self.temperature,
                "top_k": self.top_k,
                "rho": self.rho(t),
                "T_max": t,
            },
            max_new_tokens=t,
        )


# ------------------------------------------------------------------------------------------------ batched decisions
_NEG_INF = -math.inf
_ERRORS = {1: "the logits contain NaN or +inf; nothing is sampled",
           2: "the public row has no finite logit; nothing can be sampled"}


def _ink_support(mechs: Sequence[InvisibleInk], public: Sequence[torch.Tensor], full: bool | int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """V⁺ of each job from its public row only (``public[b]``: ``(1, V)``, any float dtype): the finite public
    logits ``≥ kth_largest − 2C/B`` on the gathered columns (``full``: an int, exactly that many: a job redone alone
    with its support's size; True: the whole vocabulary; without a top-k, V⁺ is every finite public entry on the
    whole vocabulary, not ranked); ``(ids (n, W) ascending, real (n, W), kth (n,), over (n,): 0, or the size of V⁺
    when it reaches beyond the gathered columns)``."""
    m0 = mechs[0]
    vocab = public[0].shape[-1]
    if m0.top_k is None:
        _, ids, real = whole_vocabulary(public)
        return ids, real, real.new_zeros(real.shape[0], dtype=torch.float64), real.new_zeros(real.shape[0])
    margin = host_tensor([2.0 * m.clip_norm / m.batch_size for m in mechs], torch.float64,
                         public[0].device).unsqueeze(-1)
    _, ids, keep, kth, size = topk_plus_columns(public, m0.top_k, margin, full)
    sid, real = ascending(ids, keep, vocab)
    return sid, real, kth, size


@dataclass
class _InkMixture:
    probs: torch.Tensor  # (n, W) softmax(ℓ̄/τ) on V⁺ (0 on the padding)
    ids: torch.Tensor  # (n, W) token ids (ascending; the padding clamped to a valid id)
    real: torch.Tensor  # (n, W) the columns of V⁺
    public: torch.Tensor  # (n, W) the public logits there (float64)
    kth: torch.Tensor  # (n,) the public k-th largest logit
    clipped: torch.Tensor  # (n,) clipped coordinates on V⁺ (a count, exact)
    code: torch.Tensor  # (n,) 0, or the _ERRORS key of the job's refusal
    over: torch.Tensor  # (n,) 0, or |V⁺| when it reaches beyond the gathered columns: redo the job on that many


def _ink_mixture(mechs: Sequence[InvisibleInk], logits: Sequence[torch.Tensor], full: bool | int) -> _InkMixture:
    """``softmax(ℓ̄[V⁺]/τ)`` of every job, without a host synchronisation: DClip and the mean over the B references
    element-wise (the sum over references written out, batch-invariant)."""
    b_ref = mechs[0].batch_size
    for z in logits:
        if z.ndim != 2 or z.shape[0] != b_ref + 1:
            raise InvalidInputError(
                f"InvisibleInk with B = {b_ref} needs logits of shape (B + 1, V), got {tuple(z.shape)}")
    device = logits[0].device
    public = [z[:1] for z in logits]
    sid, real, kth, over = _ink_support(mechs, public, full)
    if mechs[0].top_k is None:
        z = torch.stack(list(logits)).to(torch.float64)
    else:
        z = torch.stack([x.index_select(-1, sid[b]) for b, x in enumerate(logits)]).to(torch.float64)
    # a public row is checked whole (its maximum: NaN propagates), a private row on V⁺ only (where it is read)
    top = torch.stack([p[0].amax() for p in public]).to(torch.float64)
    bad = ((torch.isnan(z) | (z == math.inf)) & real.unsqueeze(1)).flatten(1).any(dim=-1)
    bad = bad | torch.isnan(top) | (top == math.inf)
    no_public = ~real.any(dim=-1)
    clip = host_tensor([m.clip_norm for m in mechs], torch.float64, device).unsqueeze(-1)
    temp = host_tensor([m.temperature for m in mechs], torch.float64, device).unsqueeze(-1)
    z = torch.where(real.unsqueeze(1), z, torch.zeros_like(z))  # the padding: finite, masked out below

    def aggregate(z: torch.Tensor, real: torch.Tensor, clip: torch.Tensor, temp: torch.Tensor
                  ) -> tuple[torch.Tensor, ...]:
        return _ink_math(z, real, clip, temp)

    if full is not False:  # a job alone on its whole support, on both paths (or whole vocabularies: exact
        probs, clipped = aggregate(z, real, clip, temp)  # element-wise operations and row-wise kernels only)
    else:
        probs, clipped = in_aligned_chunks(aggregate, z, real, clip, temp, per_row=z[0].numel())
    code = torch.where(bad, 1, torch.where(no_public, 2, 0))
    return _InkMixture(probs, sid, real, z[:, 0], kth, clipped, code, over)


def _ink_math(z: torch.Tensor, real: torch.Tensor, clip: torch.Tensor, temp: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``softmax((ℓ_pub + (1/B)·Σ_i clip(ℓ_i − ℓ_pub, −C, C))/τ)`` on the real columns (n, W) and the count of
    clipped coordinates there (n,), from the gathered logits (n, B + 1, W): element-wise and row-wise operations."""
    pub = z[:, 0]
    b_ref = z.shape[1] - 1
    c = clip
    acc = None
    clipped = None
    for i in range(1, b_ref + 1):
        raw = z[:, i] - pub
        d = torch.nan_to_num(torch.maximum(torch.minimum(raw, c), -c), nan=0.0)  # −inf − (−inf): forbidden anyway
        n_clip = ((raw.abs() > c) & real).sum(dim=-1)
        acc = d if acc is None else acc + d
        clipped = n_clip if clipped is None else clipped + n_clip
    agg = (pub + acc / b_ref) / temp
    probs = torch.softmax(agg.masked_fill(~real, _NEG_INF), dim=-1)
    return probs, clipped.to(torch.float64)


def _ink_step(mechs: Sequence[InvisibleInk], logits: Sequence[torch.Tensor], ints: Sequence[int],
              srcs: Sequence[Any], want: Sequence[bool], full: bool | int) -> list[StepResult | Exception]:
    """One token per job from its ``softmax(ℓ̄[V⁺]/τ)`` with its own 53-bit integer (``ints[b]``, drawn before: the
    same draw the per-job step makes), in one transfer (:func:`~dpinfer.mechanisms.batch.release_tokens`; the
    statistics only for the jobs that ask, ``want``); a job whose V⁺ reaches beyond the gathered columns is redone
    alone on exactly |V⁺| columns (its size, public, fetched in the same transfer) with the same integer."""
    mix = _ink_mixture(mechs, logits, full)

    def stats(j: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return mix.real.sum(dim=-1), mix.clipped, mix.public.gather(-1, j.unsqueeze(-1)).squeeze(-1), mix.kth

    def describe(b: int, row: list[float], exact: int | None) -> dict[str, float]:
        public_logit = row[2] if exact is None else float(mix.public[b, exact])
        out = {"support": row[0], "clipped": row[1] / (mechs[b].batch_size * row[0])}
        if mechs[b].top_k is not None:
            out["expanded"] = float(public_logit < row[3])
        return out

    return release_tokens(
        mix.ids, mix.code, mix.over, probs=mix.probs, ints=ints, srcs=srcs, want=want, stats=stats, errors=_ERRORS,
        redo=lambda b, size: _ink_step([mechs[b]], [logits[b]], [ints[b]], [srcs[b]], [want[b]], size)[0],
        describe=describe)
