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
import operator
from typing import Any

import torch

from dpinfer.accounting import Guarantee, PrivacyLoss, PureDp, calibrate, conversion_route
from dpinfer.errors import ConfigurationError
from dpinfer.mechanisms import register
from dpinfer.mechanisms._checks import check_row_layout, positive_int
from dpinfer.mechanisms.base import Mechanism, Mode, StepInfo, StepResult
from dpinfer.mechanisms.randomness import Randomness
from dpinfer.mechanisms.sampler import sample_rows

ADJACENCY = "any two private contexts (the whole document may change; local DP)"

LAMBDA_MAX = math.nextafter(1.0, 0.0)
"""The largest λ < 1 a float represents; calibration never returns more (ε_tok ≈ 36.7 + log V there)."""


def _check_vocab_size(vocab_size: object) -> int:
    if isinstance(vocab_size, bool):
        raise ConfigurationError(f"vocab_size must be an integer ≥ 2, got {vocab_size!r}")
    try:
        v = operator.index(vocab_size)  # type: ignore[arg-type]
    except TypeError:
        raise ConfigurationError(
            f"vocab_size must be an integer ≥ 2 (the width of the model's logits, lm.vocab_size), got {vocab_size!r}"
        ) from None
    if v < 2:
        raise ConfigurationError(f"vocab_size must be ≥ 2 (the width of the model's logits), got {v}")
    return v


def _check_lambda(lam: object) -> float:
    if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not 0.0 <= lam < 1.0:
        raise ConfigurationError(
            f"lam (the weight of the model's distribution) must lie in [0, 1), got {lam!r}; λ = 1 would sample from "
            "the model alone and has no guarantee. Use DPDecoding.calibrated(epsilon, ...) to pick λ for a target ε."
        )
    return float(lam)



def epsilon_per_token(lam: float, vocab_size: int) -> float:
    """``ε_tok = log((1 + (V − 1)·λ)/(1 − λ))``, the pure-DP loss of one DP-Decoding token (Majmudar et al. 2022).

    >>> epsilon_per_token(0.0, 10)
    0.0
    >>> round(epsilon_per_token(0.5, 4), 6) == round(math.log(5.0), 6)  # (1 + 3·0.5)/(1 − 0.5) = 5
    True
    """
    lam, v = _check_lambda(lam), _check_vocab_size(vocab_size)
    return math.log1p((v - 1) * lam) - math.log1p(-lam)


def lambda_for_epsilon(epsilon: float, vocab_size: int) -> float:
    """The λ whose per-token loss is ``epsilon``: ``λ = (e^ε − 1)/(V − 1 + e^ε)``, capped at :data:`LAMBDA_MAX`.

    >>> lam = lambda_for_epsilon(math.log(5.0), 4)
    >>> round(lam, 12)
    0.5
    """
    if not (isinstance(epsilon, (int, float)) and epsilon >= 0.0):
        raise ConfigurationError(f"a per-token ε must be a number ≥ 0, got {epsilon!r}")
    v = _check_vocab_size(vocab_size)
    if epsilon > 700.0:  # e^ε overflows; λ is 1 to double precision
        return LAMBDA_MAX
    return min(math.expm1(epsilon) / (v - 1 + math.exp(epsilon)), LAMBDA_MAX)


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
    return PureDp(epsilon_per_token(lam, vocab_size)).times(positive_int(num_tokens, "the number of tokens"))


@register(
    "dp-decoding",
    tasks=("sanitize",),
    summary="DP-Decoding (Majmudar et al. 2022): mix with the uniform distribution",
)
class DPDecoding(Mechanism):
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
        self.lam = _check_lambda(lam)
        self.vocab_size = _check_vocab_size(vocab_size)
        if isinstance(temperature, bool) or not (
            isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0
        ):
            raise ConfigurationError(
                f"temperature must be a finite number > 0, got {temperature!r} (DP-Decoding always samples; "
                "greedy decoding of q would still be private but is not the published mechanism)"
            )
        if mode not in ("joint", "independent"):
            raise ConfigurationError(f"mode must be 'joint' or 'independent', got {mode!r}")
        if isinstance(row, bool) or not isinstance(row, int) or row < 0:
            raise ConfigurationError(f"row must be an integer ≥ 0 (the row holding the private context), got {row!r}")
        if not (isinstance(delta, (int, float)) and 0.0 < delta < 1.0):
            raise ConfigurationError(f"δ must lie strictly between 0 and 1, got {delta!r}; 1e-5 is a common choice")
        self.temperature = float(temperature)
        self.row = row
        self.num_sequences = positive_int(num_sequences, "num_sequences")
        self.delta = float(delta)
        self.mode = mode  # type: ignore[misc]  # instance override of the class default

    @property
    def epsilon_per_token(self) -> float:
        """``ε_tok = log((1 + (V − 1)·λ)/(1 − λ))``."""
        return epsilon_per_token(self.lam, self.vocab_size)

    @classmethod
    def calibrated(
        cls,
        epsilon: float,
        *,
        delta: float,
        max_new_tokens: int,
        vocab_size: int,
        num_sequences: int = 1,
        **kwargs: Any,
    ) -> DPDecoding:
        """The DP-Decoding mechanism with the largest λ whose ex-ante guarantee meets ``(epsilon, delta)``.

        Solved with :func:`dpinfer.accounting.calibrate` on the per-token ε_tok (λ is a smooth increasing function
        of it, ``λ = (e^ε_tok − 1)/(V − 1 + e^ε_tok)``), evaluating exactly the loss that :meth:`guarantee` reports,
        so the result always meets the target. Where the target needs λ closer to 1 than a float holds,
        :data:`LAMBDA_MAX` is returned. A target so small that only a loss converting to ε = 0 meets it (below about
        1e-4 at δ = 1e-5) raises :class:`~dpinfer.errors.InfeasibleBudgetError` naming the smallest positive ε
        reachable (the accountant's policy, see :func:`~dpinfer.accounting.calibrate`). Other keyword arguments
        (``temperature``, ``mode``, ``row``) go to the constructor.

        >>> mech = DPDecoding.calibrated(50.0, delta=1e-5, max_new_tokens=256, vocab_size=49152)
        >>> mech.guarantee(256).epsilon <= 50.0, f"{mech.lam:.3g}"
        (True, '1.01e-05')
        """
        v = _check_vocab_size(vocab_size)
        n = positive_int(max_new_tokens, "max_new_tokens") * positive_int(num_sequences, "num_sequences")
        if not (isinstance(delta, (int, float)) and 0.0 < delta < 1.0):
            raise ConfigurationError(f"δ must lie strictly between 0 and 1, got {delta!r}; 1e-5 is a common choice")
        if isinstance(epsilon, bool) or not (isinstance(epsilon, (int, float)) and 0.0 < epsilon < math.inf):
            raise ConfigurationError(f"the target ε must be a finite number > 0, got {epsilon!r}")

        def loss(eps_tok: float) -> PrivacyLoss:
            return dp_decoding_loss(lambda_for_epsilon(eps_tok, v), v, n)

        cap = epsilon_per_token(LAMBDA_MAX, v)
        if loss(cap).to_epsilon(delta) <= epsilon:
            eps_tok = cap  # λ as close to 1 as a float holds already meets the target
        else:
            # bracket: basic composition (ε/n per token) meets the target up to rounding; the RDP route may allow more
            lo = epsilon / n if epsilon / n < cap and loss(epsilon / n).to_epsilon(delta) <= epsilon else 0.0
            hi = min(max(2.0 * lo, epsilon / n), cap)
            while loss(hi).to_epsilon(delta) <= epsilon:  # ends: the cap itself misses the target
                hi = min(2.0 * hi, cap)
            eps_tok = calibrate(loss, epsilon=epsilon, delta=delta, lo=lo, hi=hi, increasing=True, name="ε_tok")
        return cls(lambda_for_epsilon(eps_tok, v), vocab_size=v, num_sequences=num_sequences, delta=delta, **kwargs)

    def start(self, num_contexts: int, vocab_size: int) -> None:
        if vocab_size != self.vocab_size:
            raise ConfigurationError(
                f"the model's logits have {vocab_size} entries but this DP-Decoding mechanism was built for "
                f"vocab_size={self.vocab_size}; its guarantee depends on V, so build it with vocab_size=lm.vocab_size"
            )
        check_row_layout(self.mode, self.row, num_contexts, self.num_sequences, "num_sequences",
                         "sample from the private context")

    def step(self, logits: torch.Tensor, info: StepInfo, generator: Randomness) -> StepResult:
        if logits.shape[-1] != self.vocab_size:
            raise ConfigurationError(
                f"logits of width {logits.shape[-1]} given to a DP-Decoding mechanism built for "
                f"vocab_size={self.vocab_size}"
            )
        rows = logits[self.row : self.row + 1] if self.mode == "joint" else logits
        tokens = sample_rows(mixture_log_probs(rows, self.lam, self.temperature), generator)
        return StepResult(tokens=tokens[0] if self.mode == "joint" else tokens)

    def loss(self, max_new_tokens: int) -> PrivacyLoss:
        """The ex-ante loss of at most ``max_new_tokens`` tokens per sequence, for ``num_sequences`` sequences."""
        n = positive_int(max_new_tokens, "max_new_tokens") * self.num_sequences
        return dp_decoding_loss(self.lam, self.vocab_size, n)

    def guarantee(self, max_new_tokens: int) -> Guarantee:
        """(ε, δ) of at most ``max_new_tokens`` tokens (per sequence), from λ, V and T_max only."""
        loss = self.loss(max_new_tokens)
        return Guarantee.from_loss(
            loss,
            delta=self.delta,
            mechanism=self.name,
            adjacency=ADJACENCY,
            max_new_tokens=max_new_tokens,
            parameters={
                "lambda": self.lam,
                "temperature": self.temperature,
                "vocab_size": self.vocab_size,
                "epsilon_per_token": self.epsilon_per_token,
                "num_sequences": self.num_sequences,
                "T_max": max_new_tokens,
                "composition": conversion_route(loss, self.delta),
            },
        )
