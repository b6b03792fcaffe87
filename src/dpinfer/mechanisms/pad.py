"""PAD — privacy-aware decoding for retrieval-augmented generation (ALGORITHMS §3; issue 12).

Two registered mechanisms:

* ``pad`` (the default, rigorous). Joint mode, K = 2: row 0 is the question WITHOUT the retrieved documents (public),
  row 1 the question with them (private). Per token, from the raw logits ``ℓ_pub = ℓ_0`` and ``ℓ_ctx = ℓ_1``:

  1. **Support** ``V⁺ = {v : ℓ_pub[v] ≥ kth_largest(ℓ_pub) − 2C}`` (Top-k⁺, from the public row only: free). It holds
     the top-k tokens of ``ℓ_pub + c`` for every shift ``c`` with ``‖c‖₂ ≤ C`` (a token outside gains at most C, one
     inside loses at most C). Optionally (``min_p``) intersected with the public min-p set
     ``{v : ℓ_pub[v] ≥ max ℓ_pub + ln min_p}``: also from the public row only, so the argument below is unchanged
     (the shift is clipped on the smaller set; the noise then chooses among the tokens the public row ranks near
     its maximum).
  2. **Centre and clip** the shift on V⁺: ``s = ℓ_ctx − ℓ_pub``, ``s ← s − mean(s)`` (softmax is shift-invariant; the
     centring reads the private row only, and the null context's ``s = 0`` stays 0), ``s ← s·min(1, C/‖s‖₂)``.
  3. **Release** ``ℓ̃ = ℓ_pub + s + N(0, σ²I)`` on V⁺, the noise from the run's secure source.
  4. **Choose** ``argmax ℓ̃`` (τ = 0, the default, as the authors decode) or sample from ``softmax(ℓ̃/τ)``: both are
     post-processing of the Gaussian release.

  Privacy. Adjacency ``replace-by-null`` (default): the retrieved context of one answer replaced by nothing, so the
  neighbour's private row IS the public row, its shift is 0, and the released vector moves by ``‖s‖₂ ≤ C``: a
  Gaussian mechanism with ℓ2 sensitivity Δ = C, hence ``Δ²/(2σ²)``-zCDP per step (Bun & Steinke 2016, Prop. 1.6).
  ``replace-one`` (one retrieved context replaced by any other, which also covers a different retrieval): both shifts
  are clipped, Δ = 2C. Over at most ``T_max`` tokens (adaptive composition; restricting to V⁺ and choosing a token are
  post-processing of public data and of the release):

      ρ = T_max · Δ² / (2σ²)

  converted to (ε, δ) by the accountant over all orders. The guarantee is computed from (C, σ, T_max, adjacency)
  only. Calibration fixes σ (default 1.5) and solves C: ``ρ* = zcdp_rho_for_target(ε, δ)``, ``Δ = σ·sqrt(2ρ*/T_max)``,
  ``C = Δ`` (replace-by-null) or ``Δ/2`` (replace-one). (Solving σ for a fixed C gives σ ≫ 1 and gibberish.)

* ``pad-as-published``: the authors' step exactly (ALGORITHMS §3), on the private row alone (K = 1). It never clips
  the logits and its screening and noise scale read the private logits, so its figure ``Σ charges + ln(1/δ)/(α−1)``
  is data-dependent: it is reported by :meth:`PadAsPublished.spend` as such, never as ε, and the guarantee is none.
  The accountant is reset per answer (:meth:`~dpinfer.mechanisms.base.Mechanism.start`) unless ``carry_over=True``,
  which reproduces the authors' code (one accountant for the whole run).

>>> mech = Pad.calibrated(Budget(64.0, 1e-5), Spec(64))
>>> round(mech.clip_norm, 3), mech.sigma
(1.431, 1.5)
>>> g = mech.guarantee(64)
>>> round(g.epsilon, 2), round(g.parameters["rho"], 3)
(64.0, 29.117)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from dpinfer.accounting import DataDependentSpend, Guarantee, PrivacyLoss, zcdp_rho_for_target
from dpinfer.accounting.accountant import Adjacency, calibrate_event, compose_steps, ex_ante_guarantee
from dpinfer.accounting.calibration import Budget, Spec, zcdp_rho
from dpinfer.accounting.gaussian import GaussianShiftEvent
from dpinfer.checks import check_delta, check_probability, positive_int
from dpinfer.errors import ConfigurationError, InvalidInputError
from dpinfer.mechanisms.base import Mechanism, StepInfo, StepResult
from dpinfer.mechanisms.batch import SUPPORT_SLACK, fits_aligned, job_chunks
from dpinfer.mechanisms.invisibleink import topk_plus
from dpinfer.mechanisms.pad_batch import SHIFT_LIMIT, pad_step, pad_support
from dpinfer.mechanisms.randomness import Randomness, as_random_source
from dpinfer.mechanisms.sampler import sample_probs

ADJACENCIES = {
    Adjacency.REPLACE_BY_NULL:
        "replace-by-null of one answer's retrieved context (the documents replaced by nothing); this covers the "
        "content of that context, not whether a document is in the store (adding or removing one can change what is "
        "retrieved: use --adjacency replace-one for membership)",
    Adjacency.REPLACE_ONE:
        "replace-one of one answer's retrieved context (the documents replaced by any others, which also covers a "
        "different retrieval)",
}
DEFAULT_SIGMA = 1.5
"""σ of the rigorous PAD: fixed, and C solved from the target (issue 12)."""


def _positive(value: object, name: str, hint: str = "") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise ConfigurationError(f"{name} must be a finite number > 0, got {value!r}{hint}")
    return float(value)


def _temperature(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value >= 0):
        raise ConfigurationError(f"temperature must be a finite number ≥ 0 (0 = argmax), got {value!r}")
    return float(value)


def _check_logits(logits: torch.Tensor, rows: int, name: str, *, checked: int | None = None) -> torch.Tensor:
    """``logits`` as float64 after a shape check; the first ``checked`` rows (default: all) must hold no NaN or +inf.
    PAD checks its PUBLIC row only: a refusal that read the private row would depend on private data (and would end
    every other answer batched with it), while the clip makes any private value safe."""
    if logits.ndim != 2 or logits.shape[0] != rows:
        raise InvalidInputError(f"{name} needs logits of shape ({rows}, V), got {tuple(logits.shape)}")
    z = logits.to(torch.float64)
    total = float(z[:rows if checked is None else checked].sum())  # NaN, or +inf, anywhere shows in the sum
    if math.isnan(total) or total == math.inf:
        what = "the public row's logits contain" if checked == 1 and rows > 1 else "the logits contain"
        raise InvalidInputError(f"{what} NaN or +inf; nothing is released")
    return z


def centre_and_clip(shift: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """``s − mean(s)`` scaled to L2 norm at most ``clip_norm`` (non-finite entries first brought to ±1e6).

    >>> s = centre_and_clip(torch.tensor([3.0, -1.0, 1.0], dtype=torch.float64), 1.0)
    >>> [round(x, 4) for x in s.tolist()], round(float(s.norm()), 6)
    ([0.7071, -0.7071, 0.0], 1.0)
    >>> centre_and_clip(torch.tensor([5.0, 5.0], dtype=torch.float64), 1.0).tolist()
    [0.0, 0.0]
    """
    s = torch.nan_to_num(shift.to(torch.float64), nan=0.0, posinf=SHIFT_LIMIT, neginf=-SHIFT_LIMIT)  # NaN: no shift
    s = s.clamp(-SHIFT_LIMIT, SHIFT_LIMIT)
    s = s - s.mean()
    norm = float(s.norm())
    if norm > clip_norm:
        s = s * (clip_norm / norm)
    return s


def clip_norm_for_target(epsilon: float, delta: float, *, max_new_tokens: int, sigma: float = DEFAULT_SIGMA,
                         adjacency: Adjacency | str = Adjacency.REPLACE_BY_NULL) -> float:
    """The clip norm C whose ``T_max``-token answer with noise σ meets (ε, δ), solved by the accountant
    (:func:`~dpinfer.accounting.calibrate_event` on the composed :class:`GaussianShiftEvent`, so the reported ε never
    exceeds the target). Close to ``σ·sqrt(2ρ*/T_max) / m`` with ρ* the largest zCDP ρ meeting the target and m = 1
    (replace-by-null) or 2 (replace-one).

    >>> round(clip_norm_for_target(8.0, 1e-5, max_new_tokens=64), 3)
    0.294
    >>> round(clip_norm_for_target(8.0, 1e-5, max_new_tokens=64, adjacency="replace-one"), 3)
    0.147
    """
    eps = _positive(epsilon, "the target ε", "; smaller ε is stronger privacy (e.g. 16 per answer)")
    d = check_delta(delta)
    t = positive_int(max_new_tokens, "max_new_tokens")
    sig = _positive(sigma, "σ")
    return _solve_clip_norm(eps, d, t, sig, _adjacency(adjacency))


@functools.lru_cache(maxsize=256)
def _solve_clip_norm(eps: float, delta: float, max_new_tokens: int, sigma: float, adjacency: Adjacency) -> float:
    """:func:`clip_norm_for_target` after its checks; cached (a pure function of public parameters), so a session of
    answers at one setting bisects once instead of once per answer (about 0.1–0.5 s each on a loaded CPU)."""
    scale = 2.0 if adjacency is Adjacency.REPLACE_ONE else 1.0
    guess = sigma * math.sqrt(2.0 * zcdp_rho_for_target(eps, delta) / max_new_tokens) / scale
    return calibrate_event(lambda c: GaussianShiftEvent(scale * c, sigma), steps=max_new_tokens, epsilon=eps,
                           delta=delta, lo=guess / 2.0, hi=guess * 2.0, name="clip norm C")


def _adjacency(value: object) -> Adjacency:
    return Adjacency.of(value, choices=ADJACENCIES)


class Pad(Mechanism):
    """Rigorous PAD: release ``ℓ_pub + clip(centre(ℓ_ctx − ℓ_pub), C) + N(0, σ²I)`` on a public support.

    Args:
        clip_norm: C > 0, the L2 bound on the centred shift (use :meth:`calibrated` to derive it from (ε, δ)).
        sigma: σ > 0, the Gaussian noise scale (default 1.5).
        top_k: k of the public Top-k⁺ support (``None``: the full vocabulary).
        min_p: also drop the tokens whose PUBLIC probability is below ``min_p`` times the public maximum's
            (``ℓ_pub[v] < max ℓ_pub + ln min_p``; ``None``: no such cut). Public, so C and ε do not depend on it.
        temperature: 0 (default) releases the argmax of the noisy logits; τ > 0 samples from ``softmax(ℓ̃/τ)``.
        delta: δ of the reported (ε, δ) guarantee.
        adjacency: ``"replace-by-null"`` (default, sensitivity C) or ``"replace-one"`` (sensitivity 2C).

    ``StepResult.stats``: ``support`` (|V⁺|, public) and ``clipped`` (1.0 when the shift was scaled down:
    DATA-DEPENDENT, a diagnostic only).

    >>> mech = Pad(clip_norm=1.0, sigma=1.5, top_k=2)
    >>> mech.start(num_contexts=2, vocab_size=4)
    >>> z = torch.tensor([[4.0, 3.0, 0.0, -1.0], [0.0, 9.0, 0.0, 0.0]], dtype=torch.float64)
    >>> idx, pub, pre = mech.pre_noise_logits(z)
    >>> idx.tolist(), round(float((pre - pub).norm()), 6)
    ([0, 1], 1.0)
    >>> round(mech.rho(10), 4)
    2.2222
    """

    name = "pad"
    mode = "joint"

    def __init__(
        self,
        *,
        clip_norm: float,
        sigma: float = DEFAULT_SIGMA,
        top_k: int | None = 20,
        temperature: float = 0.0,
        delta: float = 1e-5,
        adjacency: Adjacency | str = Adjacency.REPLACE_BY_NULL,
        min_p: float | None = None,
    ) -> None:
        self.clip_norm = _positive(
            clip_norm, "clip_norm C", " (use Pad.calibrated(budget, spec) to derive it from ε)"
        )
        self.sigma = _positive(sigma, "sigma σ", f"; the default {DEFAULT_SIGMA} keeps answers readable")
        self.top_k = None if top_k is None else positive_int(top_k, "top_k (None for the full vocabulary)")
        self.temperature = _temperature(temperature)
        self.delta = check_delta(delta)
        self.adjacency = _adjacency(adjacency)
        self.min_p = None if min_p is None else check_probability(min_p, "min_p", " (or None)", low_open=True)

    @classmethod
    def calibrated(cls, budget: Budget, spec: Spec) -> Pad:
        """The PAD whose answer of at most ``spec.max_new_tokens`` tokens is (ε, δ)-DP for its retrieved context: σ
        fixed (``spec.params["sigma"]``, default 1.5), C solved (:func:`clip_norm_for_target`); ``spec.params`` also
        carries ``adjacency`` and the constructor's other keywords."""
        kw: dict[str, Any] = dict(spec.params)
        sigma = kw.pop("sigma", DEFAULT_SIGMA)
        adjacency = kw.pop("adjacency", Adjacency.REPLACE_BY_NULL)
        delta = budget.delta
        epsilon = budget.epsilon if not isinstance(budget.epsilon, Mapping) else budget.scalar()
        clip = clip_norm_for_target(epsilon, delta, max_new_tokens=spec.max_new_tokens, sigma=sigma,
                                    adjacency=adjacency)
        return cls(clip_norm=clip, sigma=sigma, delta=delta, adjacency=adjacency, **kw)

    @property
    def sensitivity(self) -> float:
        """Δ: the L2 distance the released mean can move between adjacent contexts (C or 2C)."""
        return self.clip_norm * (2.0 if self.adjacency is Adjacency.REPLACE_ONE else 1.0)

    def start(self, num_contexts: int, vocab_size: int) -> None:
        if num_contexts != 2:
            raise ConfigurationError(
                f"PAD steps K = 2 contexts (row 0 the question alone, public; row 1 with the retrieved documents), "
                f"got {num_contexts}"
            )

    def _support(self, public: torch.Tensor) -> tuple[torch.Tensor, bool]:
        mask, kth = topk_plus(public, self.top_k, self.clip_norm, 1)
        if self.min_p is not None:  # min-p relative to the PUBLIC maximum: a function of the public row only
            mask = mask & (public >= public.max() + math.log(self.min_p))
        return mask, kth is None and bool(mask.all())

    def private_columns(self, public_scores: torch.Tensor) -> torch.Tensor | None:
        """The ids of V⁺ (from the public row only): the private row is read there and nowhere else."""
        if self.batch_key() is not None and self.top_k is not None:
            pub = [public_scores.unsqueeze(0)]
            sid, real, over = pad_support([self], pub, False)
            if int(over[0]):
                sid, real, _ = pad_support([self], pub, int(over[0]))
            return sid[0][real[0]]
        mask, everything = self._support(public_scores)
        return None if everything else mask.nonzero().squeeze(-1)

    @classmethod
    def public_support(cls, mechanisms: Sequence[Mechanism], public: Sequence[torch.Tensor]
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """V⁺ of several batching jobs with a top-k at once (:func:`pad_support`, as :meth:`private_columns`)."""
        mechs = [m for m in mechanisms if isinstance(m, Pad)]
        if not mechs or mechs[0].top_k is None:
            return None
        return pad_support(mechs, public, False)

    def pre_noise_logits(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ids of V⁺, ``ℓ_pub`` on V⁺, ``ℓ_pub + clip(centre(s))`` on V⁺) for ``(2, V)`` logits: the release before
        noise. ``‖released − ℓ_pub‖₂ ≤ C`` always. Only the public row is checked (NaN or +inf there is refused); a
        NaN in the private row counts as the public value (no shift there), ±inf as ±1e6, both then clipped."""
        z = _check_logits(logits, 2, "PAD", checked=1)
        mask, _ = self._support(z[0])
        if not bool(mask.any()):
            raise InvalidInputError("the public row has no finite logit; nothing can be released")
        idx = mask.nonzero().squeeze(-1)
        cols = z.index_select(1, idx)
        pub = cols[0]
        return idx, pub, pub + centre_and_clip(cols[1] - pub, self.clip_norm)

    def step(self, logits: torch.Tensor, info: StepInfo, generator: Randomness) -> StepResult:
        """Release ``ℓ_pub + clip(s) + N(0, σ²I)`` on V⁺ and choose its argmax (or sample at τ)."""
        if (res := self.batch_of_one(logits, info, generator)) is not None:
            return res
        idx, pub, pre = self.pre_noise_logits(logits)
        src = as_random_source(generator)
        noisy = pre + self.sigma * src.normal(pre.shape, device=pre.device)
        if self.temperature == 0.0:
            j = torch.argmax(noisy)
        else:
            j = sample_probs(torch.softmax(noisy / self.temperature, dim=-1), src)
        stats = {"support": float(idx.numel()),
                 "clipped": float(float((pre - pub).norm()) >= self.clip_norm * (1 - 1e-12))}
        return StepResult(tokens=idx[j].to(torch.long), stats=stats)

    def batch_key(self) -> tuple[Any, ...] | None:
        """PAD decides in batches (:func:`pad_step`; the per-job :meth:`step` is the same computation on a batch of
        one), on the gathered public columns with a top-k, on the whole vocabulary without: jobs with the same top-k
        and min-p that all take the argmax (τ = 0) or all sample decide together (their C, σ and τ may differ)."""
        if self.top_k is not None and not fits_aligned(2 * (self.top_k + SUPPORT_SLACK)):
            return None
        return (Pad, self.top_k, self.min_p, self.temperature == 0.0)

    @classmethod
    def step_batch(cls, mechanisms: Sequence[Mechanism], logits: Sequence[torch.Tensor], infos: Sequence[StepInfo],
                   generators: Sequence[Randomness]) -> list[StepResult | Exception]:
        """Every job's centre, clip and noise on its V⁺ at once (:func:`pad_step`): each job's noise (one standard
        normal per gathered column) and, at τ > 0, its 53-bit integer from its own source; one device-to-host
        transfer for every token and statistic."""
        mechs = [m for m in mechanisms if isinstance(m, Pad)]
        srcs = [as_random_source(g) for g in generators]
        want = [i.debug_stats for i in infos]
        if mechs and mechs[0].top_k is not None:
            return pad_step(mechs, logits, srcs, want, False)
        out: list[StepResult | Exception] = []
        for part in job_chunks(len(mechs), 8 * logits[0].shape[-1] if mechs else 1):
            out += pad_step([mechs[b] for b in part], [logits[b] for b in part], [srcs[b] for b in part],
                             [want[b] for b in part], True)
        return out

    def loss_event(self) -> GaussianShiftEvent:
        """What one token releases, for the accountant: a Gaussian mechanism with sensitivity Δ and noise σ."""
        return GaussianShiftEvent(self.sensitivity, self.sigma)

    def loss(self, max_new_tokens: int) -> PrivacyLoss:
        """The ex-ante loss of one answer of at most ``max_new_tokens`` tokens (the accountant's composition)."""
        return compose_steps(self.loss_event(), positive_int(max_new_tokens, "max_new_tokens"))

    def rho(self, max_new_tokens: int) -> float:
        """``ρ = T_max·Δ²/(2σ²)``."""
        return zcdp_rho(self.loss(max_new_tokens))

    def guarantee(self, max_new_tokens: int) -> Guarantee:
        """ρ-zCDP for one answer's retrieved context over at most ``T_max`` tokens, converted to (ε, δ)."""
        t = positive_int(max_new_tokens, "max_new_tokens")
        return ex_ante_guarantee(
            self.loss_event(), steps=t, delta=self.delta, mechanism=self.name, adjacency=ADJACENCIES[self.adjacency],
            parameters={"clip_norm": self.clip_norm, "sigma": self.sigma, "top_k": self.top_k,
                        "min_p": self.min_p, "temperature": self.temperature, "adjacency": self.adjacency.value,
                        "rho": self.rho(t), "T_max": t},
            max_new_tokens=t,
        )


# ------------------------------------------------------------------------------------------------ as published
PUBLISHED = {
    "noise_scale": 0.2, "amplification": 3.0, "min_sensitivity": 0.4, "alpha": 10.0, "delta": 1e-5,
    "confidence_threshold": 0.9, "margin_threshold": 2.0, "entropy_weight": 0.3, "position_weight": 0.2,
    "confidence_weight": 0.3, "min_sigma": 0.01, "max_sigma": 10.0,
}
"""The authors' defaults (ALGORITHMS §3). ``noise_scale`` is the knob the authors call ε: it only scales the noise
(σ ∝ 1/noise_scale²) and is NOT a guarantee, so dpinfer never calls it ε."""
HEURISTIC = ("none (heuristic): the authors' per-answer figure is computed from the private logits (data-dependent) "
             "and the logits are never clipped")


def published_step_parameters(logits: torch.Tensor, step: int, **overrides: float) -> tuple[bool, float, float, float]:
    """The authors' per-token decision for ``(V,)`` logits at 0-based position ``step``:
    (charged, Δ, σ, charge). Reads the logits, so every output is DATA-DEPENDENT.

    Screening: ``p1 > τ_conf`` and margin ``m > τ_margin`` → (False, 0, σ_min, 0). Otherwise
    ``Δ = max(Δ_min, min(1, 1/(1 + ln(1 + m))))``,
    ``c = clip(1 − w_H + w_H·H(p)/ln V + w_pos/(1 + 0.1·t) + w_conf·(1 − p1), 0.1, 2)``,
    ``σ = clip((0.01/max(s, 0.01))·c·(Δ/s)·λ_amp, σ_min, σ_max)`` with ``s`` the ``noise_scale`` knob (the
    authors' "ε", not a guarantee), charge ``α·Δ²/(2σ²)``.

    Uniform logits over 4 tokens at t = 0: m = 0, Δ = 1, H/ln V = 1, p1 = 1/4, so c = 0.7 + 0.3 + 0.2 + 0.225 = 1.425,
    σ = 0.05·1.425·5·3 = 1.06875, charge = 10/(2·1.06875²):

    >>> charged, d, s, ch = published_step_parameters(torch.zeros(4, dtype=torch.float64), 0)
    >>> charged, d, round(s, 5), round(ch, 4)
    (True, 1.0, 1.06875, 4.3774)
    >>> published_step_parameters(torch.tensor([10.0, 0.0, 0.0], dtype=torch.float64), 3)[0]
    False
    """
    unknown = sorted(set(overrides) - set(PUBLISHED))
    if unknown:
        raise ConfigurationError(f"unknown PAD parameter(s) {unknown}; known: {', '.join(sorted(PUBLISHED))}")
    p = {**PUBLISHED, **overrides}
    z = logits.to(torch.float64)
    finite = torch.isfinite(z)
    vocab = int(finite.sum())
    if vocab < 1:
        raise InvalidInputError("no finite logit; nothing can be released")
    logp = torch.log_softmax(z, dim=-1)
    probs = logp.exp()
    p1 = float(probs.max())
    top2 = torch.topk(z, min(2, z.numel())).values
    margin = float(top2[0] - top2[1]) if top2.numel() > 1 and math.isfinite(float(top2[1])) else math.inf
    if p1 > p["confidence_threshold"] and margin > p["margin_threshold"]:
        return False, 0.0, p["min_sigma"], 0.0
    sens = max(p["min_sensitivity"], min(1.0, 1.0 / (1.0 + math.log1p(margin))))
    entropy = float(-(probs[finite] * logp[finite]).sum())
    norm_entropy = entropy / math.log(vocab) if vocab > 1 else 0.0
    calib = (1.0 - p["entropy_weight"]) + p["entropy_weight"] * norm_entropy \
        + p["position_weight"] / (1.0 + 0.1 * step) + p["confidence_weight"] * (1.0 - p1)
    calib = min(max(calib, 0.1), 2.0)
    knob = p["noise_scale"]
    sigma = (0.01 / max(knob, 0.01)) * calib * (sens / knob) * p["amplification"]
    sigma = min(max(sigma, p["min_sigma"]), p["max_sigma"])
    return True, sens, sigma, p["alpha"] * sens**2 / (2.0 * sigma**2)


class PadAsPublished(Mechanism):
    """The PAD authors' decoding step, exactly (ALGORITHMS §3), on the private row alone (K = 1).

    Args:
        noise_scale: the knob the authors call ε (default 0.2): it scales the noise; it is NOT a guarantee.
            ``epsilon=`` is accepted as a deprecated alias.
        delta, alpha: of the authors' reported figure ``Σ charges + ln(1/δ)/(α−1)``.
        temperature: 0 (default, the authors decode greedily) or τ > 0 to sample from the noisy logits.
        carry_over: keep the charges across answers (the authors' code never resets its accountant); default False:
            reset per answer in :meth:`start`.
        **overrides: any other key of :data:`PUBLISHED` (amplification, min_sensitivity, ...).

    The guarantee is none; :meth:`spend` returns the authors' figure as a :class:`DataDependentSpend`. Per-step stats
    (``charged``, ``sigma``, ``charge``) are DATA-DEPENDENT.

    >>> mech = PadAsPublished()
    >>> mech.start(1, 4)
    >>> out = mech.step(torch.zeros(1, 4, dtype=torch.float64), StepInfo(0, 8, 1), torch.Generator().manual_seed(0))
    >>> round(mech.spend().value, 4), mech.charged_share()
    (5.6566, 1.0)
    >>> print(mech.guarantee(8))
    pad-as-published: no privacy guarantee.
    """

    name = "pad-as-published"
    mode = "joint"

    def __init__(self, *, noise_scale: float = PUBLISHED["noise_scale"], delta: float = PUBLISHED["delta"],
                 alpha: float = PUBLISHED["alpha"], temperature: float = 0.0, carry_over: bool = False,
                 epsilon: float | None = None, **overrides: float) -> None:
        unknown = sorted(set(overrides) - set(PUBLISHED))
        if unknown:
            raise ConfigurationError(f"unknown PAD parameter(s) {unknown}; known: {', '.join(sorted(PUBLISHED))}")
        self.params = {**PUBLISHED, **{k: _positive(v, k) for k, v in overrides.items()}}
        if epsilon is not None:  # deprecated alias of noise_scale (the authors' name for it)
            noise_scale = epsilon
        self.params["noise_scale"] = _positive(noise_scale, "noise_scale (the authors' noise knob)")
        self.params["delta"] = check_delta(delta)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 1.0 < alpha < math.inf:
            raise ConfigurationError(f"alpha must be a finite Rényi order > 1, got {alpha!r}")
        self.params["alpha"] = float(alpha)
        self.temperature = _temperature(temperature)
        if not isinstance(carry_over, bool):
            raise ConfigurationError(f"carry_over must be True or False, got {carry_over!r}")
        self.carry_over = carry_over
        self._charges: list[float] = []
        self._steps = 0

    def start(self, num_contexts: int, vocab_size: int) -> None:
        if num_contexts != 1:
            raise ConfigurationError(
                f"pad-as-published decodes one context (the question with its retrieved documents), got {num_contexts}"
            )
        if not self.carry_over:
            self._charges, self._steps = [], 0

    def step(self, logits: torch.Tensor, info: StepInfo, generator: Randomness) -> StepResult:
        z = _check_logits(logits, 1, "pad-as-published")[0]
        overrides = {k: v for k, v in self.params.items() if k != "delta"}
        charged, _, sigma, charge = published_step_parameters(z, info.step, **overrides)
        src = as_random_source(generator)
        finite = torch.isfinite(z)
        noisy = torch.where(finite, z + sigma * src.normal(z.shape, device=z.device), z)
        if self.temperature == 0.0:
            tok = torch.argmax(noisy)
        else:
            tok = sample_probs(torch.softmax(noisy / self.temperature, dim=-1), src)
        self._steps += 1
        if charged:
            self._charges.append(charge)
        return StepResult(tokens=tok.to(torch.long),
                          stats={"charged": float(charged), "sigma": sigma, "charge": charge})

    def charged_share(self) -> float:
        """γ: the share of steps that were charged (data-dependent)."""
        return len(self._charges) / self._steps if self._steps else 0.0

    def spend(self) -> DataDependentSpend:
        """The authors' reported figure ``Σ charges + ln(1/δ)/(α−1)`` since the last reset: DATA-DEPENDENT."""
        a, d = self.params["alpha"], self.params["delta"]
        return DataDependentSpend(
            self.name, f"authors' heuristic figure (sum of per-step charges at order {a:g} + ln(1/δ)/(α−1), "
                       f"δ = {d:g}; read from the private logits)",
            math.fsum(self._charges) + math.log(1.0 / d) / (a - 1.0),
        )

    def diagnostics(self, steps: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
        """DATA-DEPENDENT: the authors' figure (:meth:`spend`) and the share of charged steps since the last reset."""
        return {"authors_figure": self.spend().to_dict(), "charged_share": self.charged_share()}

    def guarantee(self, max_new_tokens: int) -> Guarantee:
        """None: the authors' figure is computed from the private logits (:meth:`spend`)."""
        t = positive_int(max_new_tokens, "max_new_tokens")
        return Guarantee(math.inf, 0.0, self.name, HEURISTIC, parameters={**self.params, "carry_over": self.carry_over,
                                                                         "temperature": self.temperature},
                         max_new_tokens=t)
