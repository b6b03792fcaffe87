"""One audit scenario per registered mechanism: the mechanism calibrated to a modest claim, and two neighbouring
inputs on a small-vocabulary stand-in (synthetic logit rows, the same at every step, V = 16).

The stand-in keeps every mechanism exact (it only ever sees ``(K, V)`` logits) and fast. The rows are crafted to be
worst-case-ish: the public row favours token ``A = 0``; the private row of D puts its mass on token ``X = V − 1``,
where the public row has little, and as far from the public row as any clipping allows (logits ±4000, so every
clipped difference sits at ±C). Its neighbour D′ follows the mechanism's adjacency:

* DP-Fusion (replace-by-null of one group, K = m + 1 rows, m = 1): the private row of D′ equals the public row.
* InvisibleInk, Amin et al., AdaPMixED (replace-by-null of one reference, K = B + 1, B = 2): reference 1 of D′ is the
  null reference, whose row is the public row; reference 2 is the same mild row in both.
* DP-Decoding, the sampler (local DP, any two inputs, K = 1): two different rows, one favouring X and one favouring A.
* DP-Prompt in DP-GTR's stage-1 layout (local DP, K = 2 rewrites of 2 tokens, every token observed): rows at the
  clip bounds, favouring X on D and A on D′.
* PAD (replace-by-null of one answer's context, K = 2): a public row with two finite logits (A and X, so the public
  support is {A, X}) and, on D, a private row ±4000 along X − A, so the clipped shift is exactly ``(C/√2)(e_X − e_A)``:
  the direction that moves the argmax most. The released token is then a one-bit view of a Gaussian shift of
  ``C/σ`` standard deviations per step, which makes a σ too small or a C too large visible (a shift spread over many
  tokens, as on the group pairs, barely moves the argmax).

The batch and group mechanisms get two candidate pairs, a public row with logit 2 on A ("moderate": X keeps enough
mass for a clipped or mollified shift to show) and one with logit 8 ("peaked": X is nearly impossible publicly, so
an unbounded shift or a corrupted public row shows); the runner picks one on the selection trials only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from dpinfer.accounting.calibration import Budget, Spec
from dpinfer.audit.broken import BROKEN
from dpinfer.errors import ConfigurationError
from dpinfer.mechanisms import Mechanism, StepInfo, StepResult, available_mechanisms
from dpinfer.mechanisms.adapmixed import AdaPMixED
from dpinfer.mechanisms.amin import AminSVT
from dpinfer.mechanisms.dp_decoding import DPDecoding
from dpinfer.mechanisms.dp_fusion import DPFusion
from dpinfer.mechanisms.dp_prompt import DPPrompt
from dpinfer.mechanisms.invisibleink import InvisibleInk
from dpinfer.mechanisms.pad import Pad, PadAsPublished
from dpinfer.mechanisms.sampler import Sampler
from dpinfer.mechanisms.static_noise import StaticNoise

if TYPE_CHECKING:
    from dpinfer.accounting import Guarantee
    from dpinfer.mechanisms.randomness import Randomness

VOCAB = 16
"""V of the stand-in."""
TOKEN_A, TOKEN_X = 0, VOCAB - 1
EPSILON = 4.0
"""The claimed ε every rigorous mechanism is calibrated to."""
DELTA = 1e-5
FAR = 4000.0
"""The magnitude of the crafted private row: every difference to the public row clips at ±C."""


@dataclass(frozen=True)
class InputPair:
    """Two neighbouring inputs: the ``(K, V)`` logits of D and of D′ (the same at every step)."""

    label: str
    d: torch.Tensor
    d_prime: torch.Tensor


@dataclass(frozen=True)
class Scenario:
    """What one audit runs: a fresh mechanism per call of ``build``, and candidate pairs of neighbouring inputs."""

    mechanism: str
    variant: str | None
    build: Callable[[], Mechanism]
    pairs: tuple[InputPair, ...]
    max_new_tokens: int
    adjacency: str
    inputs: str


def _row(favour: int, height: float) -> torch.Tensor:
    z = torch.zeros(VOCAB, dtype=torch.float64)
    z[favour] = height
    return z


def _far_row() -> torch.Tensor:
    z = torch.full((VOCAB,), -FAR, dtype=torch.float64)
    z[TOKEN_X] = FAR
    return z


PUBLIC_HEIGHTS = {"moderate": 2.0, "peaked": 8.0}
"""The public row's logit on A in the candidate pairs of the batch and group mechanisms."""


def _group_pairs() -> tuple[InputPair, ...]:
    out = []
    for label, height in PUBLIC_HEIGHTS.items():
        pub = _row(TOKEN_A, height)
        out.append(InputPair(label, torch.stack([pub, _far_row()]), torch.stack([pub, pub])))
    return tuple(out)


def _batch_pairs() -> tuple[InputPair, ...]:
    out = []
    for label, height in PUBLIC_HEIGHTS.items():
        pub = _row(TOKEN_A, height)
        mild = pub + torch.linspace(-1.0, 1.0, VOCAB, dtype=torch.float64)
        out.append(InputPair(label, torch.stack([pub, _far_row(), mild]), torch.stack([pub, pub, mild])))
    return tuple(out)


def _local_pair(d: torch.Tensor, d_prime: torch.Tensor) -> tuple[InputPair, ...]:
    return (InputPair("local", d[None], d_prime[None]),)


_GROUP_INPUTS = ("public row: logit 2 (moderate) or 8 (peaked) on A, 0 elsewhere; D: private row ±4000 (+ on X); "
                 "D′: private row = public row (the group's values replaced by placeholders)")
_BATCH_INPUTS = ("public row: logit 2 (moderate) or 8 (peaked) on A, 0 elsewhere; D: reference 1 ±4000 (+ on X); "
                 "D′: reference 1 = the null reference (public row); reference 2: the public row + a ramp from −1 to "
                 "1, the same in both")
_LOCAL = "any two inputs (local DP)"


def _dp_fusion(variant: str | None) -> Scenario:
    cls = BROKEN["dp-fusion"][variant] if variant else DPFusion
    t = 4

    def build() -> Mechanism:
        return cls.calibrated(Budget({"GROUP": EPSILON}, DELTA), Spec(t, alpha=8.0))

    return Scenario("dp-fusion", variant, build, _group_pairs(), t, "replace-by-null of one group (K = m + 1 = 2)",
                    _GROUP_INPUTS + "; α = 8")


def _invisibleink(variant: str | None) -> Scenario:
    cls = BROKEN["invisibleink"][variant] if variant else InvisibleInk
    t = 4

    def build() -> Mechanism:
        return cls.calibrated(Budget(EPSILON, DELTA), Spec(t, batch_size=2, top_k=None))

    return Scenario("invisibleink", variant, build, _batch_pairs(), t, "replace-by-null of one reference (B = 2)",
                    _BATCH_INPUTS + "; full vocabulary")


def _amin(variant: str | None) -> Scenario:
    t = 2

    def build() -> Mechanism:
        return AminSVT.calibrated(Budget(EPSILON, DELTA), Spec(t, batch_size=2))

    return Scenario("amin", variant, build, _batch_pairs(), t, "replace-by-null of one reference (B = 2)",
                    _BATCH_INPUTS + "; SVT on (σ = 0.3, θ = 0.7)")


def _adapmixed(variant: str | None) -> Scenario:
    t = 2

    def build() -> Mechanism:
        return AdaPMixED(batch_size=2, epsilon=EPSILON, delta=DELTA, top_k=None)

    return Scenario("adapmixed", variant, build, _batch_pairs(), t, "replace-by-null of one reference (B = 2)",
                    _BATCH_INPUTS + f"; data-dependent budget ε = {EPSILON:g} (no ex-ante claim)")


def _dp_decoding(variant: str | None) -> Scenario:
    t = 1

    def build() -> Mechanism:
        return DPDecoding.calibrated(Budget(EPSILON, DELTA), Spec(t, vocab_size=VOCAB))

    pairs = _local_pair(_row(TOKEN_X, 40.0), _row(TOKEN_A, 40.0))
    return Scenario("dp-decoding", variant, build, pairs, t, _LOCAL,
                    "D: logit 40 on X, 0 elsewhere; D′: logit 40 on A, 0 elsewhere")


class _RewriteAfterRewrite(Mechanism):
    """DP-Prompt in DP-GTR's stage-1 layout for the audit: ``n`` independent rewrites of ``t`` tokens each (one row per
    rewrite), released as ONE sequence of ``n·t`` tokens, rewrite after rewrite, so the audit's test sees every token
    of every rewrite. Its claim is the inner mechanism's guarantee for ``n`` rewrites of ``t`` tokens."""

    name = "dp-prompt"
    mode = "joint"

    def __init__(self, inner: DPPrompt, tokens_per_rewrite: int) -> None:
        self.inner, self.t = inner, tokens_per_rewrite

    def start(self, num_contexts: int, vocab_size: int) -> None:
        self.inner.start(num_contexts, vocab_size)

    def step(self, logits: torch.Tensor, info: StepInfo, generator: Randomness) -> StepResult:
        row = min(info.step // self.t, logits.shape[0] - 1)
        one = StepInfo(step=info.step % self.t, max_new_tokens=self.t, num_contexts=1,
                       finished=torch.zeros(1, dtype=torch.bool))
        return StepResult(tokens=self.inner.step(logits[row:row + 1], one, generator).tokens[0])

    def guarantee(self, max_new_tokens: int) -> Guarantee:
        return self.inner.guarantee(max(1, math.ceil(max_new_tokens / self.inner.num_rewrites)))


def _dp_prompt(variant: str | None) -> Scenario:
    n, t = 2, 2  # DP-GTR stage 1: n rewrites of the same prompt, t tokens each, in independent mode

    def build() -> Mechanism:
        inner = DPPrompt.calibrated(Budget(EPSILON, DELTA), Spec(t, clip_min=0.0, clip_max=4.0, num_rewrites=n))
        return _RewriteAfterRewrite(inner, t)

    d, d_prime = _row(TOKEN_X, 4.0), 4.0 - _row(TOKEN_X, 4.0)
    pairs = (InputPair("local", torch.stack([d, d]), torch.stack([d_prime, d_prime])),)
    return Scenario("dp-prompt", variant, build, pairs, n * t, _LOCAL,
                    f"DP-GTR stage 1: {n} rewrites × {t} tokens (one row each, all {n * t} tokens observed); clip "
                    "bounds [0, 4]; D: 4 on X, 0 elsewhere; D′: 0 on X, 4 elsewhere")


def _sampler(variant: str | None) -> Scenario:
    t = 1

    def build() -> Mechanism:
        return Sampler(temperature=1.0)

    pairs = _local_pair(_row(TOKEN_X, 8.0), _row(TOKEN_A, 8.0))
    return Scenario("sampler", variant, build, pairs, t, _LOCAL,
                    "D: logit 8 on X, 0 elsewhere; D′: logit 8 on A, 0 elsewhere; τ = 1")


PAD_MARGIN = 1.0
"""The public row's lead of A over X in PAD's shift pair (the grid in docs/audit.md)."""


def _pad_pairs() -> tuple[InputPair, ...]:
    """PAD's pair: the public row has two finite logits, A (``PAD_MARGIN``) and X (0), so V⁺ = {A, X}; on D the
    private row is ±4000 along X − A, so the centred shift is clipped exactly to ``(C/√2)(e_X − e_A)``, the direction
    in which a clipped Gaussian shift moves the argmax between the two most; on D′ it is the public row."""
    pub = torch.full((VOCAB,), -math.inf, dtype=torch.float64)
    pub[TOKEN_A], pub[TOKEN_X] = PAD_MARGIN, 0.0
    private = pub.clone()
    private[TOKEN_A], private[TOKEN_X] = -FAR, FAR
    return (InputPair("shift", torch.stack([pub, private]), torch.stack([pub, pub])),)


def _pad(variant: str | None) -> Scenario:
    cls = BROKEN["pad"][variant] if variant else Pad
    t = 4

    def build() -> Mechanism:
        return cls.calibrated(Budget(EPSILON, DELTA), Spec(t, top_k=None))

    return Scenario("pad", variant, build, _pad_pairs(), t,
                    "replace-by-null of one answer's retrieved context (K = 2)",
                    f"public row: logit {PAD_MARGIN:g} on A, 0 on X, −∞ elsewhere (V⁺ = {{A, X}}); D: private row "
                    "−4000 on A, +4000 on X (the shift clips to norm C along X − A); D′: private row = public row (no "
                    "retrieved context); σ = 1.5, argmax")


def _pad_as_published(variant: str | None) -> Scenario:
    t = 2

    def build() -> Mechanism:
        return PadAsPublished()

    pairs = _local_pair(_row(TOKEN_X, 8.0), _row(TOKEN_A, 8.0))
    return Scenario("pad-as-published", variant, build, pairs, t, "none (heuristic); any two retrieved contexts, K = 1",
                    "D: logit 8 on X, 0 elsewhere; D′: logit 8 on A, 0 elsewhere; the authors' defaults, greedy")


def _static(variant: str | None) -> Scenario:
    t = 1

    def build() -> Mechanism:
        return StaticNoise(sigma=1.0)

    pairs = _local_pair(_row(TOKEN_X, 8.0), _row(TOKEN_A, 8.0))
    return Scenario("static", variant, build, pairs, t, "none; any two retrieved contexts, K = 1",
                    "D: logit 8 on X, 0 elsewhere; D′: logit 8 on A, 0 elsewhere; σ = 1, argmax")


_SCENARIOS: dict[str, Callable[[str | None], Scenario]] = {
    "adapmixed": _adapmixed,
    "amin": _amin,
    "dp-decoding": _dp_decoding,
    "dp-fusion": _dp_fusion,
    "dp-prompt": _dp_prompt,
    "invisibleink": _invisibleink,
    "pad": _pad,
    "pad-as-published": _pad_as_published,
    "sampler": _sampler,
    "static": _static,
}


def broken_variants(mechanism: str) -> list[str]:
    """The ``--broken`` variants the audit has for ``mechanism``."""
    return sorted(BROKEN.get(mechanism, {}))


def scenario(mechanism: str, variant: str | None = None) -> Scenario:
    """The audit scenario of the registered ``mechanism`` (optionally its broken ``variant``)."""
    registered = available_mechanisms()
    if mechanism not in registered:
        raise ConfigurationError(f"unknown mechanism {mechanism!r}; available: {', '.join(registered)}")
    if mechanism not in _SCENARIOS:
        raise ConfigurationError(
            f"mechanism {mechanism!r} has no audit scenario yet; add one to dpinfer.audit.scenarios"
        )
    if variant is not None and variant not in BROKEN.get(mechanism, {}):
        have = broken_variants(mechanism)
        raise ConfigurationError(
            f"no broken variant {variant!r} for {mechanism}; "
            + (f"choose one of: {', '.join(have)}" if have else "it has none (audit it without --broken)")
        )
    return _SCENARIOS[mechanism](variant)
