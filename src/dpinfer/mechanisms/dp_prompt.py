"""DP-Prompt: clipped-logit sampling as an exponential mechanism (a baseline, and stage 1 of DP-GTR; ALGORITHMS §4, §5).

Utpala, Hooker & Chen 2023, "Locally Differentially Private Document Generation Using Zero Shot Prompting" (EMNLP
Findings); restated by Li et al. 2025 (DP-GTR, Appendix A). At every step the logits are clipped to
``[b_min, b_max]`` and the token is drawn from the FULL vocabulary with probability

    p(v) ∝ exp(clip(z_v, b_min, b_max) / τ).

This is the exponential mechanism with utility ``clip(z)``, whose every coordinate may change by at most
``Δ = b_max − b_min`` between ANY two prompts, so for every token v

    log p(v) − log p′(v) = (u_v − u′_v)/τ − (log Z − log Z′) ∈ [−2Δ/τ, 2Δ/τ]:

each token is ``ε_tok = 2(b_max − b_min)/τ``-DP (local DP; adjacency: any two prompts). The privacy loss
``log p(v) − log p′(v)`` also ranges over an interval of width at most 2Δ/τ = ε_tok whatever v, so the mechanism is
ε_tok-bounded-range (Durfee & Rogers 2019), hence ``min(ε_tok, α·ε_tok²/8)``-RDP (Cesar & Rogers 2021, Lemma 3.2):
:class:`~dpinfer.accounting.PureDp` ``(ε_tok, bounded_range=True)``. n rewrites of at most L_max tokens compose
adaptively to ``n·L_max`` tokens; the (ε, δ) is the smaller of basic composition ``n·L_max·ε_tok`` and the RDP
conversion.

Top-k or top-p truncation would make the support depend on the private logits (a token outside it has probability 0
for one prompt and not for another: ε = ∞); the authors' code left transformers' default ``top_k = 50`` on. This
implementation never truncates and rejects ``top_k`` / ``top_p``.

The clip bounds must not be computed from the private data. :func:`dpinfer.clip_bounds.clip_bounds` gives
them as in DP-GTR (Appendix A.2): ``(μ, μ + 4σ)`` of all logits the model produces while paraphrasing a public corpus,
measured once per model and stored (``dpinfer calibrate-clip``; the embedded model's ship with the package). This
module never runs a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from dpinfer.accounting import PrivacyLoss, PureDp
from dpinfer.accounting.accountant import calibrate_event, compose_steps
from dpinfer.accounting.calibration import Budget, Spec
from dpinfer.accounting.events import ClippedLogitsEvent, check_clip_bounds, check_prompt_temperature
from dpinfer.checks import check_delta, positive_int
from dpinfer.errors import ConfigurationError
from dpinfer.mechanisms.base import Mechanism, Mode, RepeatedEvent, StepInfo, StepResult
from dpinfer.mechanisms.batch import sample_weights_step
from dpinfer.mechanisms.layout import check_row_layout
from dpinfer.mechanisms.randomness import Randomness

ADJACENCY = "any two private prompts (the whole text may change; local DP)"


def epsilon_per_token(clip_min: float, clip_max: float, temperature: float) -> float:
    """``ε_tok = 2(b_max − b_min)/τ``, the pure-DP loss of one DP-Prompt token (Utpala et al. 2023;
    :class:`~dpinfer.accounting.events.ClippedLogitsEvent`).

    >>> epsilon_per_token(-1.0, 2.0, 0.5)  # 2·3/0.5
    12.0
    """
    return ClippedLogitsEvent(clip_min, clip_max, temperature).epsilon_per_token


def clipped_log_probs(logits: torch.Tensor, clip_min: float, clip_max: float, temperature: float) -> torch.Tensor:
    """``log p`` row by row, ``p ∝ exp(clip(z, b_min, b_max)/τ)`` over the full vocabulary.

    ``-inf`` logits are clipped to ``b_min`` like any other (the support is always the full vocabulary), and NaN
    logits are read as ``b_min``: any utility within ``[b_min, b_max]`` keeps the guarantee.

    >>> z = torch.tensor([[5.0, 0.0, -torch.inf]], dtype=torch.float64)
    >>> import math
    >>> clipped_log_probs(z, 0.0, math.log(2.0), 1.0).exp()  # utilities (log 2, 0, 0) → (2, 1, 1)/4
    tensor([[0.5000, 0.2500, 0.2500]], dtype=torch.float64)
    """
    u = torch.nan_to_num(logits.to(torch.float64), nan=clip_min).clamp(clip_min, clip_max)
    return torch.log_softmax(u / temperature, dim=-1)


def clipped_weights(logits: torch.Tensor, clip_min: float, clip_max: float, temperature: float) -> torch.Tensor:
    """The unnormalised sampling weights ``exp((u − max u)/τ)`` with ``u = clip(z, b_min, b_max)``, row by row: the
    same distribution as :func:`clipped_log_probs` after normalisation, with one exponential pass over the vocabulary
    instead of a log-softmax and a softmax (the step of :class:`DPPrompt`;
    :func:`~dpinfer.mechanisms.sampler.sample_probs` normalises exactly). Subtracting the row's largest utility (not
    ``b_max``) keeps the most likely token at weight 1 whatever τ: at ``(b_max − b_min)/τ`` > 745 the far tokens
    underflow to 0 in float64 exactly as they do in a softmax. NaN logits are read as ``b_min`` (``fmax`` ignores NaN),
    ``±inf`` are clipped like any other value. A new tensor: ``logits`` is not modified.

    >>> z = torch.tensor([[5.0, 0.0, -torch.inf, torch.nan]], dtype=torch.float64)
    >>> import math
    >>> w = clipped_weights(z, 0.0, math.log(2.0), 1.0)
    >>> (w / w.sum()).tolist()  # utilities (log 2, 0, 0, 0) → (2, 1, 1, 1)/5
    [[0.4, 0.2, 0.2, 0.2]]
    >>> torch.allclose(w / w.sum(), clipped_log_probs(z, 0.0, math.log(2.0), 1.0).exp())
    True
    >>> w = clipped_weights(torch.tensor([[0.5, 0.0]], dtype=torch.float64), 0.0, 1000.0, 0.001)  # no underflow
    >>> w.tolist()  # the top token keeps weight 1 (the other is e^-500)
    [[1.0, 7.124576406741286e-218]]
    """
    z = logits if logits.dtype == torch.float64 else logits.to(torch.float64)
    u = torch.fmax(z, z.new_tensor(clip_min)).clamp_(max=clip_max)  # a new tensor; NaN → b_min
    return u.sub_(u.amax(dim=-1, keepdim=True)).div_(temperature).exp_()


def dp_prompt_loss(epsilon_tok: float, num_tokens: int) -> PrivacyLoss:
    """The ex-ante loss of ``num_tokens`` DP-Prompt tokens: ``PureDp(ε_tok, bounded_range=True).times(num_tokens)``."""
    return PureDp(epsilon_tok, bounded_range=True).times(positive_int(num_tokens, "the number of tokens"))


class DPPrompt(RepeatedEvent):
    """DP-Prompt (Utpala et al. 2023): clip the logits to ``[b_min, b_max]``, sample at τ from the full vocabulary.

    Per token ``ε_tok = 2(b_max − b_min)/τ``-DP and ε_tok-bounded-range (RDP ``min(ε_tok, α·ε_tok²/8)``) against any
    two prompts; ``num_rewrites`` rewrites of at most ``T_max`` tokens compose to ``num_rewrites · T_max`` tokens.

    Args:
        clip_min, clip_max: ``b_min < b_max``, from PUBLIC data only
            (:func:`dpinfer.clip_bounds.clip_bounds`).
        temperature: τ > 0.
        mode: ``"independent"`` (default): each row is one rewrite of the private prompt and gets its own token;
            ``"joint"``: read row ``row`` and emit one token for every row.
        row: the row read in joint mode.
        num_rewrites: how many rewrites read the private prompt (independent mode: at least the number of rows).
        delta: δ of the reported (ε, δ) guarantee.
        top_k, top_p: rejected unless None (``top_p=1.0`` is accepted): truncation voids the guarantee.

    >>> import torch
    >>> mech = DPPrompt(clip_min=0.0, clip_max=10.0, temperature=2.0, num_rewrites=3)
    >>> mech.epsilon_per_token  # 2·10/2
    10.0
    >>> z = torch.tensor([[1.0, 50.0, -50.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    >>> tokens = mech.step(z, StepInfo(step=0, max_new_tokens=1, num_contexts=2), torch.Generator().manual_seed(0))
    >>> tokens.tokens.shape
    torch.Size([2])
    >>> print(mech.guarantee(1))  # 3 tokens, basic composition: 3·10  # doctest: +NORMALIZE_WHITESPACE
    dp-prompt: (ε = 30, δ = 1e-05)-differential privacy against any two private prompts (the whole text may change;
    local DP); computed before reading the private data, from the mechanism's parameters and at most 1 generated
    tokens.
    >>> DPPrompt(clip_min=0.0, clip_max=10.0, top_k=50)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dpinfer.errors.ConfigurationError: DP-Prompt samples from the full vocabulary: top_k=50 ... voids the guarantee ...
    """

    name = "dp-prompt"
    adjacency = ADJACENCY

    def __init__(
        self,
        clip_min: float,
        clip_max: float,
        temperature: float = 1.0,
        *,
        mode: Mode = "independent",
        row: int = 0,
        num_rewrites: int = 1,
        delta: float = 1e-5,
        top_k: int | None = None,
        top_p: float | None = None,
    ) -> None:
        for knob, value in (("top_k", top_k), ("top_p", top_p)):
            if value is not None and not (knob == "top_p" and value == 1.0):
                raise ConfigurationError(
                    f"DP-Prompt samples from the full vocabulary: {knob}={value!r} makes the support depend on the "
                    "private logits and voids the guarantee (the authors' code left transformers' default top_k = 50 "
                    f"on by mistake). Drop {knob}; to make the output less random, lower the temperature (which "
                    "raises ε_tok = 2(b_max − b_min)/τ)."
                )
        self.clip_min, self.clip_max = check_clip_bounds(clip_min, clip_max)
        self.temperature = check_prompt_temperature(temperature)
        if mode not in ("joint", "independent"):
            raise ConfigurationError(f"mode must be 'joint' or 'independent', got {mode!r}")
        if isinstance(row, bool) or not isinstance(row, int) or row < 0:
            raise ConfigurationError(f"row must be an integer ≥ 0 (the row holding the private prompt), got {row!r}")
        self.row = row
        self.num_rewrites = positive_int(num_rewrites, "num_rewrites")
        self.delta = check_delta(delta, "δ")
        self.mode = mode  # type: ignore[misc]  # instance override of the class default

    @property
    def epsilon_per_token(self) -> float:
        """``ε_tok = 2(b_max − b_min)/τ``."""
        return self.loss_event().epsilon_per_token

    def loss_event(self) -> ClippedLogitsEvent:
        """What one token releases, for the accountant: :class:`~dpinfer.accounting.events.ClippedLogitsEvent`."""
        return ClippedLogitsEvent(self.clip_min, self.clip_max, self.temperature)

    def loss_steps(self, max_new_tokens: int) -> int:
        """The most tokens that read the private prompt: ``num_rewrites`` rewrites of ``T_max`` tokens."""
        return positive_int(max_new_tokens, "max_new_tokens") * self.num_rewrites

    @classmethod
    def calibrated(cls, budget: Budget, spec: Spec) -> DPPrompt:
        """The DP-Prompt mechanism with the smallest temperature τ whose ex-ante guarantee meets ``budget`` (ε, δ) over
        ``spec.max_new_tokens`` tokens; ``spec.params``: ``clip_min``, ``clip_max``, ``num_rewrites`` (1) and the
        constructor's other keywords (``mode``, ``row``).

        The loss decreases in τ; :func:`dpinfer.accounting.calibrate` bisects τ between a bracket found from basic
        composition (``τ = 2(b_max − b_min)·n·T_max/ε`` always meets the target), evaluating exactly the loss that
        :meth:`guarantee` reports. A target so small that only a loss converting to ε = 0 meets it (below about 1e-4
        at δ = 1e-5) raises :class:`~dpinfer.errors.InfeasibleBudgetError` naming the smallest positive ε reachable
        (the accountant's policy, see :func:`~dpinfer.accounting.calibrate`).

        >>> mech = DPPrompt.calibrated(Budget(100.0, 1e-5), Spec(256, clip_min=0.0, clip_max=10.0))
        >>> mech.guarantee(256).epsilon <= 100.0, round(mech.temperature, 3), round(mech.epsilon_per_token, 4)
        (True, 15.584, 1.2834)
        """
        kwargs: dict[str, Any] = dict(spec.params)
        lo_clip, hi_clip = check_clip_bounds(kwargs.pop("clip_min", None), kwargs.pop("clip_max", None))
        num_rewrites = kwargs.pop("num_rewrites", 1)
        n = positive_int(spec.max_new_tokens, "max_new_tokens") * positive_int(num_rewrites, "num_rewrites")
        delta = check_delta(budget.delta, "δ")
        epsilon = budget.scalar("the target ε")
        width = hi_clip - lo_clip

        def event(tau: float) -> ClippedLogitsEvent:
            return ClippedLogitsEvent(lo_clip, hi_clip, tau)

        def meets(tau: float) -> bool:
            return compose_steps(event(tau), n).to_epsilon(delta) <= epsilon

        hi = 2.0 * width * n / epsilon  # basic composition: n·ε_tok = ε, up to rounding
        while not meets(hi):
            hi *= 2.0
        lo = hi / 2.0
        for _ in range(1100):  # ε_tok → ∞ as τ → 0, so a small enough τ misses any finite target
            if not meets(lo):
                break
            hi, lo = lo, lo / 2.0
        tau = calibrate_event(event, steps=n, epsilon=epsilon, delta=delta, lo=lo, hi=hi, increasing=False,
                              name="temperature τ")
        return cls(lo_clip, hi_clip, tau, num_rewrites=num_rewrites, delta=delta, **kwargs)

    def start(self, num_contexts: int, vocab_size: int) -> None:
        check_row_layout(self.mode, self.row, num_contexts, self.num_rewrites, "num_rewrites",
                         "rewrite the private prompt")

    def batch_key(self) -> tuple[Any, ...] | None:
        """DP-Prompt decides in batches (:meth:`step_batch`; the per-job :meth:`step` is the same computation on a
        batch of one): one key per mode (the clip bounds and temperatures may differ)."""
        return (DPPrompt, self.mode)

    @classmethod
    def step_batch(cls, mechanisms: Sequence[Mechanism], logits: Sequence[torch.Tensor], infos: Sequence[StepInfo],
                   generators: Sequence[Randomness]) -> list[StepResult | Exception]:
        """Each job's :func:`clipped_weights` on the full vocabulary by its own kernels, then every row's draw at once
        (:func:`~dpinfer.mechanisms.batch.sample_weights_step`)."""
        mechs = [m for m in mechanisms if isinstance(m, DPPrompt)]
        return sample_weights_step(mechs, logits, generators,
                                   lambda m, z: clipped_weights(m._rows(z), m.clip_min, m.clip_max, m.temperature))

    def _rows(self, logits: torch.Tensor) -> torch.Tensor:
        return logits[self.row : self.row + 1] if self.mode == "joint" else logits

    step = Mechanism.step_as_batch

    def guarantee_parameters(self) -> dict[str, Any]:
        """b_min, b_max, τ (ε_tok) and the number of rewrites."""
        return {
            "clip_min": self.clip_min,
            "clip_max": self.clip_max,
            "temperature": self.temperature,
            "epsilon_per_token": self.epsilon_per_token,
            "num_rewrites": self.num_rewrites,
        }
