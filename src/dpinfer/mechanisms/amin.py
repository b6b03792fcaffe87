"""Amin et al. (2024) private prediction for synthetic text, with a sparse-vector test and a fixed private-token cap.

ALGORITHMS §2 (baselines). The engine steps B + 1 contexts: row 0 public, rows 1..B one reference each. Per token:

1. Each private row is shifted so that its maximum is C, then clipped to ``[−C, C]``; ``ℓ̄`` is their mean.
2. Sparse-vector test (AboveThreshold, Dwork & Roth 2014 Alg. 1): with ``p̄ = softmax(ℓ̄/τ)`` and
   ``p_pub = softmax(ℓ_pub/τ_pub)``, if ``‖p̄ − p_pub‖₁ + Lap(2σ) > θ + Lap(σ)`` the token is drawn from ``p̄``
   (a *private* token, after which the threshold noise is drawn afresh); otherwise from ``p_pub`` (free).
3. After ``r`` private tokens the generation stops, so the guarantee is fixed in advance.

Privacy, ex ante, for at most ``r`` private tokens. Let ``d`` be the ℓ∞ sensitivity of ``ℓ̄``:

* under replace-by-null (dpinfer's default, sound): a row in ``[−C, C]^V`` may be replaced by another, ``d = 2C/B``;
* ``as_published=True``: ``d = C/B``, the zero-out sensitivity the InvisibleInk paper (App. B.3, "Convention in our
  experiments") grants this baseline, so that its benchmark matches the paper's comparison. Labelled as such.

Each private token is an exponential mechanism with utility sensitivity ``d/τ``: ``2d/τ`` bounded-range, i.e.
``ρ_tok = (2d/τ)²/8 = ½·(d/τ)²``-zCDP. The SVT query ``‖p̄ − p_pub‖₁`` has sensitivity
``Δ_q = min(2, e^{2d/τ} − 1)`` (each probability ratio moves by at most ``e^{±2d/τ}``), so each AboveThreshold run
(ended by a private token, or by the end of the text) is ``ε_svt = 2Δ_q/σ``-DP (threshold noise ``Lap(2Δ_q/ε_svt)``,
query noise ``Lap(4Δ_q/ε_svt)``), i.e. ``ε_svt²/2``-zCDP. At most ``r`` runs happen (the cap stops the text at the
r-th private token), so the whole text is

    ρ = r · (½·(d/τ)² + ½·(2Δ_q/σ)²)-zCDP.

With ``svt=False`` every token is private (``r = T_max``, no SVT cost): Amin et al.'s mechanism without public tokens.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from dpinfer.accounting import Guarantee
from dpinfer.accounting.accountant import calibrate_event, compose_steps, ex_ante_guarantee, grow_bracket
from dpinfer.accounting.calibration import Budget, Spec, zcdp_rho
from dpinfer.accounting.events import SparseVectorExponentialEvent
from dpinfer.checks import check_delta, positive_int, positive_number
from dpinfer.errors import ConfigurationError, InvalidInputError
from dpinfer.mechanisms.base import Mechanism, StepInfo, StepResult
from dpinfer.mechanisms.layout import check_batch_layout
from dpinfer.mechanisms.randomness import Randomness, as_random_source
from dpinfer.mechanisms.sampler import sample_probs

ADJACENCY = "replace-by-null of one reference (one reference replaced by the empty reference)"
ADJACENCY_PUBLISHED = (
    "replace-by-null of one reference, with the zero-out sensitivity C/B granted in the InvisibleInk paper's "
    "experiments"
)


def recenter_clip(private_logits: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """Shift each row so its maximum is C, then clip to ``[−C, C]`` (``−inf`` becomes ``−C``).

    >>> recenter_clip(torch.tensor([[3.0, 2.5, -9.0]]), 1.0).tolist()
    [[1.0, 0.5, -1.0]]
    """
    top = private_logits.max(dim=-1, keepdim=True).values
    return (private_logits - top + clip_norm).clamp(-clip_norm, clip_norm)


def sensitivity(clip_norm: float, batch_size: int, *, as_published: bool = False) -> float:
    """ℓ∞ sensitivity of the aggregated logits ``ℓ̄``: ``2C/B`` (replace-by-null), ``C/B`` as published."""
    return SparseVectorExponentialEvent(clip_norm, batch_size, 1.0, as_published=as_published).sensitivity


def rho_per_private_token(
    clip_norm: float, *, batch_size: int, temperature: float, svt_noise: float | None, as_published: bool = False
) -> float:
    """``½·(d/τ)² + ½·(2Δ_q/σ)²`` (second term only with the SVT), see the module docstring and
    :class:`~dpinfer.accounting.events.SparseVectorExponentialEvent`."""
    return SparseVectorExponentialEvent(clip_norm, batch_size, temperature, svt_noise, as_published).rho


class AminSVT(Mechanism):
    """Amin et al. 2024: recentre-clip-aggregate, exponential-mechanism sampling, SVT for free public tokens.

    Args:
        clip_norm: C > 0 (derive it from (ε, δ) with :meth:`calibrated`).
        batch_size: B references (the engine steps B + 1 contexts, row 0 public).
        temperature: τ of the private sampling.
        public_temperature: τ_pub of the public distribution (SVT and public tokens); default τ.
        public_top_k: optional top-k truncation of the public tokens (free: public data only).
        svt: use the sparse-vector test (else every token is private).
        svt_noise: σ (authors' reimplementation: 0.3). svt_threshold: θ (0.7).
        max_private_tokens: r, the cap (100); with ``svt=False`` it is T_max.
        as_published: the zero-out sensitivity C/B of the InvisibleInk paper's experiments instead of 2C/B.
        delta: δ of the reported guarantee.

    ``StepResult.stats``: ``private`` (1.0 for a private token) and ``distance`` (‖p̄ − p_pub‖₁): DATA-DEPENDENT.

    >>> from dpinfer.mechanisms.base import StepInfo
    >>> mech = AminSVT.calibrated(Budget(10.0, 1e-6), Spec(200, batch_size=8))
    >>> mech.guarantee(200).epsilon <= 10.0, mech.max_private_tokens
    (True, 100)
    >>> mech.start(num_contexts=9, vocab_size=6)
    >>> z = torch.randn(9, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    >>> out = mech.step(z, StepInfo(step=0, max_new_tokens=200, num_contexts=9), torch.Generator().manual_seed(0))
    >>> 0 <= int(out.tokens) < 6 and out.stats["private"] in (0.0, 1.0)
    True
    """

    name = "amin"
    mode = "joint"

    def __init__(
        self,
        *,
        clip_norm: float,
        batch_size: int,
        temperature: float = 1.0,
        public_temperature: float | None = None,
        public_top_k: int | None = None,
        svt: bool = True,
        svt_noise: float = 0.3,
        svt_threshold: float = 0.7,
        max_private_tokens: int = 100,
        as_published: bool = False,
        delta: float = 1e-6,
    ) -> None:
        self.clip_norm = positive_number(clip_norm, "clip_norm C", " (use AminSVT.calibrated(budget, spec))")
        self.batch_size = positive_int(batch_size, "batch_size B")
        self.temperature = positive_number(temperature, "temperature τ")
        self.public_temperature = (
            self.temperature
            if public_temperature is None
            else positive_number(public_temperature, "public_temperature")
        )
        self.public_top_k = None if public_top_k is None else positive_int(public_top_k, "public_top_k")
        if not isinstance(svt, bool):
            raise ConfigurationError(f"svt must be True or False, got {svt!r}")
        self.svt = svt
        self.svt_noise = positive_number(svt_noise, "svt_noise σ", " (the authors' default is 0.3)")
        if isinstance(svt_threshold, bool) or not isinstance(svt_threshold, (int, float)) or not (
            0.0 <= svt_threshold <= 2.0
        ):
            raise ConfigurationError(
                f"svt_threshold θ compares an ℓ1 distance: it must lie in [0, 2], got {svt_threshold!r}"
            )
        self.svt_threshold = float(svt_threshold)
        self.max_private_tokens = positive_int(max_private_tokens, "max_private_tokens r")
        self.as_published = bool(as_published)
        self.delta = check_delta(delta, "δ")
        self._count = 0
        self._noisy_threshold: float | None = None

    # ------------------------------------------------------------------ accounting
    def private_tokens(self, max_new_tokens: int) -> int:
        """The most private tokens a text of ``T_max`` tokens can hold: ``min(r, T_max)`` (``T_max`` without SVT)."""
        t = positive_int(max_new_tokens, "max_new_tokens")
        return min(self.max_private_tokens, t) if self.svt else t

    def loss_event(self) -> SparseVectorExponentialEvent:
        """What one private token (with its AboveThreshold run) releases, for the accountant."""
        return SparseVectorExponentialEvent(
            self.clip_norm, self.batch_size, self.temperature, self.svt_noise if self.svt else None, self.as_published
        )

    def rho(self, max_new_tokens: int) -> float:
        """The ex-ante zCDP ρ of one text (module docstring)."""
        return zcdp_rho(compose_steps(self.loss_event(), self.private_tokens(max_new_tokens)))

    @classmethod
    def calibrated(cls, budget: Budget, spec: Spec) -> AminSVT:
        """The largest C whose text of at most ``spec.max_new_tokens`` tokens is (ε, δ)-DP (bisection on ρ(C));
        ``spec.params``: ``batch_size`` B and the constructor's other keywords."""
        kw: dict[str, Any] = dict(spec.params)
        batch_size = kw.pop("batch_size", None)
        eps = budget.scalar("the target ε")
        t = positive_int(spec.max_new_tokens, "max_new_tokens")
        delta = check_delta(budget.delta, "δ")
        template = cls(clip_norm=1.0, batch_size=batch_size, delta=delta, **kw)
        steps = template.private_tokens(t)

        def event(c: float) -> SparseVectorExponentialEvent:
            return cls(clip_norm=max(c, 1e-300), batch_size=batch_size, delta=delta, **kw).loss_event()

        hi = grow_bracket(lambda c: compose_steps(event(c), steps).to_epsilon(delta) <= eps)
        clip = calibrate_event(event, steps=steps, epsilon=eps, delta=delta, lo=0.0, hi=hi, name="clip norm C")
        return cls(clip_norm=clip, batch_size=batch_size, delta=delta, **kw)

    def diagnostics(self, steps: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
        """DATA-DEPENDENT: how many tokens were private (drawn from the references' aggregate)."""
        return {"private_tokens": int(math.fsum(float(s.get("private", 0.0)) for s in steps))} if steps else {}

    def guarantee(self, max_new_tokens: int) -> Guarantee:
        """ρ-zCDP for at most ``min(r, T_max)`` private tokens, from parameters only."""
        t = positive_int(max_new_tokens, "max_new_tokens")
        return ex_ante_guarantee(
            self.loss_event(),
            steps=self.private_tokens(t),
            delta=self.delta,
            mechanism=self.name,
            adjacency=ADJACENCY_PUBLISHED if self.as_published else ADJACENCY,
            parameters={
                "clip_norm": self.clip_norm,
                "batch_size": self.batch_size,
                "temperature": self.temperature,
                "public_temperature": self.public_temperature,
                "svt": self.svt,
                "svt_noise": self.svt_noise,
                "svt_threshold": self.svt_threshold,
                "max_private_tokens": self.private_tokens(t),
                "rho": self.rho(t),
                "T_max": t,
            },
            max_new_tokens=t,
            accounting="as_published" if self.as_published else "dpinfer",
        )

    # ------------------------------------------------------------------ decoding
    def start(self, num_contexts: int, vocab_size: int) -> None:
        check_batch_layout("Amin et al.", self.batch_size, num_contexts)
        self._count = 0
        self._noisy_threshold = None

    def _laplace(self, scale: float, generator: Randomness) -> float:
        return float(as_random_source(generator).laplace(scale, 1)[0])

    def distributions(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The private ``p̄ = softmax(ℓ̄/τ)`` and public ``p_pub = softmax(ℓ_pub/τ_pub)`` (after ``public_top_k``)
        distributions over the full vocabulary, for ``(B + 1, V)`` logits: a token is drawn from one of them.

        Tokens a public processor forbade (``-inf`` in row 0) have probability 0 in both.
        """
        if logits.ndim != 2 or logits.shape[0] != self.batch_size + 1:
            raise InvalidInputError(
                f"Amin et al. with B = {self.batch_size} needs logits of shape (B + 1, V), got {tuple(logits.shape)}"
            )
        z = logits.to(torch.float64)
        if bool(torch.isnan(z).any()) or bool(torch.isposinf(z).any()):
            raise InvalidInputError("the logits contain NaN or +inf; nothing is sampled")
        pub = z[0]
        allowed = torch.isfinite(pub)  # tokens a public processor forbade stay forbidden
        agg = recenter_clip(z[1:], self.clip_norm).mean(dim=0).masked_fill(~allowed, -math.inf)
        p_priv = torch.softmax(agg / self.temperature, dim=-1)
        if self.public_top_k is not None and self.public_top_k < int(allowed.sum()):
            kth = torch.topk(pub, self.public_top_k).values[-1]
            pub = pub.masked_fill(pub < kth, -math.inf)
        return p_priv, torch.softmax(pub / self.public_temperature, dim=-1)

    def step(self, logits: torch.Tensor, info: StepInfo, generator: Randomness) -> StepResult:
        """One private or public token; ``stop`` once the private-token cap is spent."""
        if logits.ndim != 2 or logits.shape[0] != self.batch_size + 1:
            raise InvalidInputError(
                f"Amin et al. with B = {self.batch_size} needs logits of shape (B + 1, V), got {tuple(logits.shape)}"
            )
        cap = self.max_private_tokens if self.svt else info.max_new_tokens
        if self._count >= cap:
            return StepResult(tokens=torch.tensor(-1), stats={"private": 0.0}, stop=True)
        p_priv, p_pub = self.distributions(logits)
        distance = float((p_priv - p_pub).abs().sum())
        private = True
        if self.svt:
            if self._noisy_threshold is None:
                self._noisy_threshold = self.svt_threshold + self._laplace(self.svt_noise, generator)
            private = distance + self._laplace(2.0 * self.svt_noise, generator) > self._noisy_threshold
        if private:
            self._count += 1
            self._noisy_threshold = None  # a new AboveThreshold run
            token = sample_probs(p_priv, generator)
        else:
            token = sample_probs(p_pub, generator)
        return StepResult(tokens=token.to(torch.long), stats={"private": float(private), "distance": distance})
