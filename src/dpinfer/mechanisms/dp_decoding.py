"""DP-Decoding: mix the next-token distribution with the uniform distribution (a baseline; ALGORITHMS §5).

Majmudar, Dupuy, Peris, Smaili, Gupta & Zemel 2022, "Differentially Private Decoding in Large Language Models"
(arXiv:2205.13621). At every step the token is drawn from

    q = λ · softmax(z / τ) + (1 − λ) · uniform(V),        λ ∈ [0, 1),

over the FULL vocabulary of V tokens (V = the width of the logits). Whatever the logits z, every q(v) lies in
``[(1 − λ)/V, λ + (1 − λ)/V]``, so for any two inputs and every token v

    q(v) / q′(v) ≤ (λ + (1 − λ)/V) / ((1 − λ)/V) = (1 + (V − 1)·λ) / (1 − λ),

i.e. each token is ``ε_tok = log((1 + (V − 1)·λ)/(1 − λ))``-DP (pure DP) against ANY two inputs: the whole private
context may change. The bound comes from the mixing alone; the temperature τ does not enter it, and neither does any
property of the model. Inversely ``λ = (e^ε_tok − 1)/(V − 1 + e^ε_tok)``.

``T_max`` tokens compose adaptively. The loss is :class:`~dpinfer.accounting.PureDp` ``(ε_tok).times(T_max)`` (times
the number of independently sampled sequences, if more than one reads the private context): an RDP curve
``T_max · min(ε_tok, α·ε_tok²/2)`` that keeps the order ∞ with ``T_max · ε_tok``, so its (ε, δ) is the smaller of
basic composition ``T_max · ε_tok`` and the RDP conversion (Mironov 2017; Bun & Steinke 2016, Prop. 3.3). The RDP
route wins for small ε_tok (about ε_tok < 1 at T_max = 256, δ = 1e-5); basic composition for larger ε_tok. The
guarantee's ``parameters["composition"]`` says which.

Because V is large (49 152 for SmolLM2), λ must be tiny for any useful ε: at ε = 10 over 256 tokens λ ≈ 2.5e-6, i.e.
the output is almost uniform noise. This is the baseline's known weakness; it is reproduced here, not fixed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from dpinfer.accounting import PrivacyLoss
from dpinfer.accounting.accountant import calibrate_event, compose_steps
from dpinfer.accounting.calibration import Budget, Spec
from dpinfer.accounting.events import (
    LAMBDA_MAX,
    UniformMixtureEvent,
    check_lambda,
    check_vocab_size,
    lambda_for_epsilon,
)
from dpinfer.checks import check_delta, positive_int, positive_number
from dpinfer.errors import ConfigurationError
from dpinfer.mechanisms.base import Mechanism, Mode, RepeatedEvent, StepInfo, StepResult
from dpinfer.mechanisms.batch import sample_weights_step
from dpinfer.mechanisms.layout import check_row_layout
from dpinfer.mechanisms.randomness import Randomness

ADJACENCY = "any two private contexts (the whole document may change; local DP)"

__all__ = [
    "ADJACENCY",
    "DPDecoding",
    "dp_decoding_loss",
    "epsilon_per_token",
    "mixture_log_probs",
]


def epsilon_per_token(lam: float, vocab_size: int) -> float:
    """``ε_tok = log((1 + (V − 1)·λ)/(1 − λ))``, the pure-DP loss of one DP-Decoding token (Majmudar et al. 2022;
    :class:`~dpinfer.accounting.events.UniformMixtureEvent`).

    >>> epsilon_per_token(0.0, 10)
    0.0
    >>> round(epsilon_per_token(0.5, 4), 6) == round(math.log(5.0), 6)  # (1 + 3·0.5)/(1 − 0.5) = 5
    True
    """
    return UniformMixtureEvent(lam, vocab_size).epsilon_per_token


def mixture_log_probs(logits: torch.Tensor, lam: float, temperature: float = 1.0) -> torch.Tensor:
    """``log q`` row by row, ``q = λ·softmax(z/τ) + (1 − λ)/V``, computed in log space (``logaddexp``).

    Every entry is at least ``log((1 − λ)/V)``: tokens whose logit is ``-inf`` keep the uniform share (the support is
    always the full vocabulary). A row whose softmax is undefined (NaN, or no finite logit) is treated as uniform;
    the bound on q holds for ANY distribution in place of ``softmax(z/τ)``, so this keeps the guarantee.

    >>> z = torch.tensor([[0.0, -torch.inf]], dtype=torch.float64)
    >>> mixture_log_probs(z, 0.5).exp()
    tensor([[0.7500, 0.2500]], dtype=torch.float64)
    """
    v = logits.shape[-1]
    log_uniform = -math.log(v)
    logp = torch.log_softmax(logits.to(torch.float64) / temperature, dim=-1)
    undefined = torch.isnan(logp).any(dim=-1, keepdim=True)
    logp = torch.where(undefined, torch.full_like(logp, log_uniform), logp)
    if lam == 0.0:
        return torch.full_like(logp, log_uniform)
    return torch.logaddexp(logp + math.log(lam), torch.full_like(logp, math.log1p(-lam) + log_uniform))


def dp_decoding_loss(lam: float, vocab_size: int, num_tokens: int) -> PrivacyLoss:
    """The ex-ante loss of ``num_tokens`` DP-Decoding tokens: ``PureDp(ε_tok).times(num_tokens)``."""
    return compose_steps(UniformMixtureEvent(lam, vocab_size), positive_int(num_tokens, "the number of tokens"))


class DPDecoding(RepeatedEvent):
    """DP-Decoding (Majmudar et al. 2022): sample from ``λ·softmax(z/τ) + (1 − λ)·uniform(V)``; pure ε_tok-DP per token.

    Args:
        lam: λ ∈ [0, 1), the weight of the model's distribution (0 = uniform noise, no information).
        temperature: τ > 0 applied to the model's logits before mixing (does not change the guarantee).
        vocab_size: V, the width of the logits (``lm.vocab_size``); needed to state the guarantee before any step,
            and checked against the logits in :meth:`start`.
        mode: ``"joint"`` (default): read row ``row`` (the private context) and emit one token for every row;
            ``"independent"``: one token per row, each row being a sequence sampled from the private context.
        row: the row read in joint mode.
        num_sequences: how many sequences sampled from the private context the guarantee covers (independent mode:
            at least the number of rows).
        delta: δ of the reported (ε, δ) guarantee.

    >>> import torch
    >>> mech = DPDecoding(lam=0.5, vocab_size=4)
    >>> round(mech.epsilon_per_token, 4)  # log((1 + 3·0.5)/(1 − 0.5)) = log 5
    1.6094
    >>> z = torch.tensor([[30.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    >>> mixture_log_probs(z, mech.lam).exp().round(decimals=4)  # 0.5·(1, 0, 0, 0) + 0.5·(1/4, ...)
    tensor([[0.6250, 0.1250, 0.1250, 0.1250]], dtype=torch.float64)
    >>> info = StepInfo(step=0, max_new_tokens=1, num_contexts=1)
    >>> token = mech.step(z, info, torch.Generator().manual_seed(0)).tokens
    >>> token.shape, 0 <= int(token) < 4
    (torch.Size([]), True)
    >>> print(mech.guarantee(2))  # doctest: +NORMALIZE_WHITESPACE
    dp-decoding: (ε = 3.22, δ = 1e-05)-differential privacy against any two private contexts (the whole document may
    change; local DP); computed before reading the private data, from the mechanism's parameters and at most 2
    generated tokens.
    """

    name = "dp-decoding"
    adjacency = ADJACENCY

    def __init__(
        self,
        lam: float,
        *,
        vocab_size: int,
        temperature: float = 1.0,
        mode: Mode = "joint",
        row: int = 0,
        num_sequences: int = 1,
        delta: float = 1e-5,
    ) -> None:
        self.lam = check_lambda(lam)
        self.vocab_size = check_vocab_size(vocab_size)
        self.temperature = positive_number(
            temperature, "temperature",
            " (DP-Decoding always samples; greedy decoding of q would still be private but is not the published "
            "mechanism)",
        )
        if mode not in ("joint", "independent"):
            raise ConfigurationError(f"mode must be 'joint' or 'independent', got {mode!r}")
        if isinstance(row, bool) or not isinstance(row, int) or row < 0:
            raise ConfigurationError(f"row must be an integer ≥ 0 (the row holding the private context), got {row!r}")
        self.row = row
        self.num_sequences = positive_int(num_sequences, "num_sequences")
        self.delta = check_delta(delta, "δ")
        self.mode = mode  # type: ignore[misc]  # instance override of the class default

    @property
    def epsilon_per_token(self) -> float:
        """``ε_tok = log((1 + (V − 1)·λ)/(1 − λ))``."""
        return self.loss_event().epsilon_per_token

    def loss_event(self) -> UniformMixtureEvent:
        """What one token releases, for the accountant: :class:`~dpinfer.accounting.events.UniformMixtureEvent`."""
        return UniformMixtureEvent(self.lam, self.vocab_size)

    def loss_steps(self, max_new_tokens: int) -> int:
        """The most tokens that read the private context: ``T_max`` per sequence, ``num_sequences`` sequences."""
        return positive_int(max_new_tokens, "max_new_tokens") * self.num_sequences

    @classmethod
    def calibrated(cls, budget: Budget, spec: Spec) -> DPDecoding:
        """The DP-Decoding mechanism with the largest λ whose ex-ante guarantee meets ``budget`` (ε, δ) over
        ``spec.max_new_tokens`` tokens; ``spec.params``: ``vocab_size`` V, ``num_sequences`` (1) and the
        constructor's other keywords.

        Solved with :func:`dpinfer.accounting.calibrate` on the per-token ε_tok (λ is a smooth increasing function
        of it, ``λ = (e^ε_tok − 1)/(V − 1 + e^ε_tok)``), evaluating exactly the loss that :meth:`guarantee` reports,
        so the result always meets the target. Where the target needs λ closer to 1 than a float holds,
        :data:`LAMBDA_MAX` is returned. A target so small that only a loss converting to ε = 0 meets it (below about
        1e-4 at δ = 1e-5) raises :class:`~dpinfer.errors.InfeasibleBudgetError` naming the smallest positive ε
        reachable (the accountant's policy, see :func:`~dpinfer.accounting.calibrate`). Other parameters
        (``temperature``, ``mode``, ``row``) go to the constructor.

        >>> mech = DPDecoding.calibrated(Budget(50.0, 1e-5), Spec(256, vocab_size=49152))
        >>> mech.guarantee(256).epsilon <= 50.0, f"{mech.lam:.3g}"
        (True, '1.01e-05')
        """
        kwargs: dict[str, Any] = dict(spec.params)
        v = check_vocab_size(kwargs.pop("vocab_size", None))
        num_sequences = kwargs.pop("num_sequences", 1)
        n = positive_int(spec.max_new_tokens, "max_new_tokens") * positive_int(num_sequences, "num_sequences")
        delta = check_delta(budget.delta, "δ")
        epsilon = budget.scalar("the target ε")

        def event(eps_tok: float) -> UniformMixtureEvent:
            return UniformMixtureEvent(lambda_for_epsilon(eps_tok, v), v)

        def meets(eps_tok: float) -> bool:
            return compose_steps(event(eps_tok), n).to_epsilon(delta) <= epsilon

        cap = UniformMixtureEvent(LAMBDA_MAX, v).epsilon_per_token
        if meets(cap):
            eps_tok = cap  # λ as close to 1 as a float holds already meets the target
        else:
            # bracket: basic composition (ε/n per token) meets the target up to rounding; the RDP route may allow more
            lo = epsilon / n if epsilon / n < cap and meets(epsilon / n) else 0.0
            hi = min(max(2.0 * lo, epsilon / n), cap)
            while meets(hi):  # ends: the cap itself misses the target
                hi = min(2.0 * hi, cap)
            eps_tok = calibrate_event(event, steps=n, epsilon=epsilon, delta=delta, lo=lo, hi=hi, increasing=True,
                                      name="ε_tok")
        return cls(lambda_for_epsilon(eps_tok, v), vocab_size=v, num_sequences=num_sequences, delta=delta, **kwargs)

    def start(self, num_contexts: int, vocab_size: int) -> None:
        if vocab_size != self.vocab_size:
            raise ConfigurationError(
                f"the model's logits have {vocab_size} entries but this DP-Decoding mechanism was built for "
                f"vocab_size={self.vocab_size}; its guarantee depends on V, so build it with vocab_size=lm.vocab_size"
            )
        check_row_layout(self.mode, self.row, num_contexts, self.num_sequences, "num_sequences",
                         "sample from the private context")

    def batch_key(self) -> tuple[Any, ...] | None:
        """DP-Decoding decides in batches (:meth:`step_batch`; the per-job :meth:`step` is the same computation on a
        batch of one): one key per mode (λ and the temperatures may differ)."""
        return (DPDecoding, self.mode)

    def _weights(self, logits: torch.Tensor) -> torch.Tensor:
        """``q = λ·softmax(z/τ) + (1 − λ)/V`` of the rows this job samples, by its own kernels."""
        if logits.shape[-1] != self.vocab_size:
            raise ConfigurationError(
                f"logits of width {logits.shape[-1]} given to a DP-Decoding mechanism built for "
                f"vocab_size={self.vocab_size}"
            )
        rows = logits[self.row : self.row + 1] if self.mode == "joint" else logits
        return torch.softmax(mixture_log_probs(rows, self.lam, self.temperature), dim=-1)

    @classmethod
    def step_batch(cls, mechanisms: Sequence[Mechanism], logits: Sequence[torch.Tensor], infos: Sequence[StepInfo],
                   generators: Sequence[Randomness]) -> list[StepResult | Exception]:
        """Each job's mixture ``q`` on the full vocabulary by its own kernels, then every row's draw at once
        (:func:`~dpinfer.mechanisms.batch.sample_weights_step`)."""
        mechs = [m for m in mechanisms if isinstance(m, DPDecoding)]
        return sample_weights_step(mechs, logits, generators, lambda m, z: m._weights(z))

    step = Mechanism.step_as_batch

    def guarantee_parameters(self) -> dict[str, Any]:
        """λ, τ, V (ε_tok) and the number of sequences."""
        return {
            "lambda": self.lam,
            "temperature": self.temperature,
            "vocab_size": self.vocab_size,
            "epsilon_per_token": self.epsilon_per_token,
            "num_sequences": self.num_sequences,
        }
