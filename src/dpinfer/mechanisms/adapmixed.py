"""AdaPMixED (Flemings et al. 2024), adapted to text generation from B references: a DATA-DEPENDENT baseline.

ALGORITHMS §2 (baselines). The engine steps B + 1 contexts (row 0 public, rows 1..B one reference each). Per token,
with ``p_pub`` and ``p_i`` at temperature τ on a public support S (top-k of the public row, or the full vocabulary):

1. Per-model mixing: ``λ_i = max{λ : D↔_α((1−λ)·p_pub + λ·p_i, p_pub) ≤ b}`` (``b = α·β``; solved by
   :func:`dpinfer.mechanisms.mollify.mollify_with_divergence`), ``q_i = (1−λ_i)·p_pub + λ_i·p_i`` and
   ``p̂ = (1/B)·Σ_i q_i``.
2. Noisy screening: ``s = (1/B)·Σ_i D↔_α(q_i, p_pub) ∈ [0, b]`` has sensitivity ``b/B``; if
   ``s + N(0, (σ_s·b/B)²) ≤ γ·b`` the token is drawn from ``p_pub`` (public), else from ``p̂`` (private). The screening
   is a Gaussian mechanism: ``α/(2σ_s²)`` Rényi loss at every order α, every step.
3. The loss of a private token is computed from the realised distributions (this is what makes the method
   data-dependent): at each order a of :data:`ORDERS`, ``max_j D↔_a(p̂, p̂_{−j})`` with
   ``p̂_{−j} = p̂ + (p_pub − q_j)/B`` (reference j replaced by the null reference, whose distribution is ``p_pub``).
4. The realised losses add up order by order; the text stops before a step whose loss would take the converted
   figure above the budget ``epsilon``.

No ex-ante guarantee follows (the stopping time and the losses depend on the references): :meth:`guarantee` reports
none, and :meth:`spend` reports the realised figure as a :class:`~dpinfer.accounting.DataDependentSpend`, never ε.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from dpinfer.accounting import DataDependentSpend, Guarantee, epsilon_from_rdp
from dpinfer.accounting.calibration import Budget, Spec
from dpinfer.checks import check_alpha, check_delta, positive_int, positive_number
from dpinfer.errors import ConfigurationError, InvalidInputError
from dpinfer.mechanisms.base import Mechanism, StepInfo, StepResult
from dpinfer.mechanisms.divergences import mix, renyi_divergence
from dpinfer.mechanisms.layout import check_batch_layout
from dpinfer.mechanisms.mollify import check_tol, mollify_with_divergence
from dpinfer.mechanisms.randomness import Randomness, as_random_source
from dpinfer.mechanisms.sampler import sample_probs
from dpinfer.mechanisms.transforms import PublicSupport

ORDERS: tuple[float, ...] = (1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0)
"""Rényi orders at which the realised loss is tracked (the conversion takes the best)."""


class AdaPMixED(Mechanism):
    """AdaPMixED adapted to generation: per-reference mollified mixtures, noisy screening, data-dependent budget.

    Args:
        batch_size: B references (the engine steps B + 1 contexts).
        epsilon: the budget the realised (data-dependent) loss may reach, converted at ``delta``.
        delta: δ of that conversion.
        bound: ``b = α·β``, the per-reference divergence bound of the mixing step.
        alpha: the Rényi order α of the mixing constraint.
        temperature: τ. top_k: public-side support (None: full vocabulary).
        screening_noise: σ_s, the noise multiplier of the screening (std ``σ_s·b/B``).
        screening_threshold: γ ∈ [0, 1]: public token when the noisy mean divergence is at most ``γ·b``.

    ``StepResult.stats``: ``private``, ``mean_lambda`` and ``spent`` (the running converted figure): DATA-DEPENDENT.

    >>> from dpinfer.mechanisms.base import StepInfo
    >>> mech = AdaPMixED(batch_size=4, epsilon=8.0, top_k=None)
    >>> mech.start(num_contexts=5, vocab_size=6)
    >>> z = torch.randn(5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    >>> out = mech.step(z, StepInfo(step=0, max_new_tokens=50, num_contexts=5), torch.Generator().manual_seed(0))
    >>> 0 <= int(out.tokens) < 6, mech.guarantee(50).epsilon  # no ex-ante guarantee
    (True, inf)
    >>> "data-dependent" in str(mech.spend())
    True
    """

    name = "adapmixed"
    mode = "joint"

    def __init__(
        self,
        *,
        batch_size: int,
        epsilon: float,
        delta: float = 1e-6,
        bound: float = 0.1,
        alpha: float = 2.0,
        temperature: float = 1.0,
        top_k: int | None = 50,
        screening_noise: float = 10.0,
        screening_threshold: float = 0.5,
        tol: float = 1e-6,
    ) -> None:
        self.batch_size = positive_int(batch_size, "batch_size B")
        self.epsilon = positive_number(epsilon, "the budget ε")
        self.delta = check_delta(delta, "δ")
        self.bound = positive_number(bound, "bound b = α·β")
        self.alpha = check_alpha(alpha, "the Rényi order α", "", label="")
        self.temperature = positive_number(temperature, "temperature τ")
        self.support = PublicSupport(top_k=top_k)
        self.top_k = top_k
        self.screening_noise = positive_number(screening_noise, "screening_noise σ_s")
        if isinstance(screening_threshold, bool) or not isinstance(screening_threshold, (int, float)) or not (
            0.0 <= screening_threshold <= 1.0
        ):
            raise ConfigurationError(f"screening_threshold γ must lie in [0, 1], got {screening_threshold!r}")
        self.screening_threshold = float(screening_threshold)
        self.tol = check_tol(tol)
        self._orders = torch.tensor(ORDERS, dtype=torch.float64)
        self._spent = torch.zeros(len(ORDERS), dtype=torch.float64)
        self._private = 0

    @classmethod
    def calibrated(cls, budget: Budget, spec: Spec) -> AdaPMixED:
        """No ex-ante calibration exists: ``budget``'s ε is the cap its data-dependent accounting stops at (converted
        at its δ); ``spec.params`` are the constructor's other keywords (``batch_size``, ...)."""
        positive_int(spec.max_new_tokens, "max_new_tokens")
        return cls(epsilon=budget.scalar("the budget ε"), delta=budget.delta, **spec.params)

    def start(self, num_contexts: int, vocab_size: int) -> None:
        check_batch_layout("AdaPMixED", self.batch_size, num_contexts)
        self._spent.zero_()
        self._private = 0

    def _converted(self, rdp: torch.Tensor) -> float:
        return epsilon_from_rdp(ORDERS, rdp.tolist(), self.delta)[0]

    def step(self, logits: torch.Tensor, info: StepInfo, generator: Randomness) -> StepResult:
        """One public or private token, or ``stop`` when the realised loss would pass the budget."""
        if logits.ndim != 2 or logits.shape[0] != self.batch_size + 1:
            raise InvalidInputError(
                f"AdaPMixED with B = {self.batch_size} needs logits of shape (B + 1, V), got {tuple(logits.shape)}"
            )
        z = logits.to(torch.float64) / self.temperature
        if bool(torch.isnan(z).any()) or bool(torch.isposinf(z).any()):
            raise InvalidInputError("the logits contain NaN or +inf; nothing is sampled")
        idx = None
        if not self.support.is_full:
            idx = self.support.mask(z[0]).nonzero().squeeze(-1)
            z = z.index_select(1, idx)
        logp = torch.log_softmax(z, dim=-1)
        lp, lq = logp[0], logp[1:]
        lq = torch.where(torch.isnan(lq[:, :1]), lp.expand_as(lq), lq)
        b = self.bound
        bounds = torch.full((self.batch_size,), b, dtype=torch.float64, device=lp.device)
        lam, div = mollify_with_divergence(lp, lq, bounds, self.alpha, self.tol)
        q = mix(lp, lq, lam).exp()  # (B, S)
        p_hat = q.mean(dim=0)
        # noisy screening (a Gaussian mechanism: sensitivity b/B, std σ_s·b/B)
        screen_rdp = self._orders / (2.0 * self.screening_noise**2)
        noise = float(as_random_source(generator).normal(1)[0])
        noise *= self.screening_noise * b / self.batch_size
        private = float(div.mean()) + noise > self.screening_threshold * b
        cost = screen_rdp
        if private:
            p_pub = lp.exp()
            neighbours = (p_hat.unsqueeze(0) + (p_pub.unsqueeze(0) - q) / self.batch_size).clamp(min=0.0)
            log_hat = p_hat.log().unsqueeze(0).expand_as(neighbours)
            log_nb = neighbours.log()
            step = torch.stack([
                torch.maximum(renyi_divergence(log_hat, log_nb, a), renyi_divergence(log_nb, log_hat, a)).max()
                for a in ORDERS
            ]).cpu()
            cost = cost + step
        if self._converted(self._spent + cost) > self.epsilon:
            self._spent += screen_rdp  # the screening ran; its loss is spent even though nothing is released
            return StepResult(tokens=torch.tensor(-1), stats={"private": 0.0}, stop=True)
        self._spent += cost
        if private:
            self._private += 1
            j = sample_probs(p_hat, generator)
        else:
            j = sample_probs(lp.exp(), generator)
        token = idx[j] if idx is not None else j
        return StepResult(
            tokens=token.to(torch.long),
            stats={"private": float(private), "mean_lambda": float(lam.mean()), "spent": self._converted(self._spent)},
        )

    def spend(self) -> DataDependentSpend:
        """The realised loss of the last generation converted at δ: DATA-DEPENDENT, not a guarantee."""
        value = self._converted(self._spent) if bool((self._spent > 0).any()) else 0.0
        return DataDependentSpend(
            self.name,
            f"realised Rényi loss of {self._private} private tokens plus screening, converted at δ = {self.delta:g} "
            "(AdaPMixED's own accounting)",
            value,
        )

    def diagnostics(self, steps: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
        """DATA-DEPENDENT: the private tokens and the realised loss (:meth:`spend`) of the last generation."""
        return {"private_tokens": self._private, "spent": self.spend().to_dict()}

    def guarantee(self, max_new_tokens: int) -> Guarantee:
        """None ex ante: AdaPMixED's loss depends on the references (report :meth:`spend` ex post)."""
        positive_int(max_new_tokens, "max_new_tokens")
        return Guarantee.no_privacy(self.name)
