"""The mechanism protocol: how K next-token distributions become tokens and a privacy-cost record.

The engine (:mod:`dpinfer.engine`) runs the model; a mechanism never sees the model, the prompt or the text. At each
step it receives the logits of the K contexts the engine steps together and returns

* in ``"joint"`` mode ONE token, which the engine appends to every row (DP-Fusion, InvisibleInk, PAD);
* in ``"independent"`` mode one token per row (plain sampling, DP-Prompt / DP-GTR rewrites).

A mechanism also states its guarantee *ex ante*, from its parameters and the maximum number of tokens ``T_max`` only
(:meth:`Mechanism.guarantee`). Figures computed from realised distributions (mixing weights, divergences) are returned
per step in :attr:`StepResult.stats`, which is data-dependent by construction and never called ε.

Every mechanism has the same two entry points besides its constructor: :meth:`Mechanism.calibrated` (``budget``: the
target ε and δ, ``spec``: ``T_max`` and its other public parameters) solves its knob so that :meth:`guarantee` meets
the target, and :meth:`Mechanism.diagnostics` summarises a finished generation's data-dependent figures.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

import torch

from dpinfer.accounting import Guarantee
from dpinfer.errors import ConfigurationError

if TYPE_CHECKING:
    from dpinfer.accounting.calibration import Budget, Spec
    from dpinfer.mechanisms.randomness import Randomness

Mode = Literal["joint", "independent"]
M = TypeVar("M", bound="Mechanism")


@dataclass(frozen=True)
class StepInfo:
    """What a mechanism may know about the step besides the logits (all public)."""

    step: int
    """0-based index of the token being generated."""
    max_new_tokens: int
    """``T_max``: the most tokens this generation may produce (the ex-ante guarantee is computed for it)."""
    num_contexts: int
    """K, the number of rows stepped together."""
    finished: torch.Tensor | None = None
    """Independent mode: ``(K,)`` bool, rows that already emitted EOS (their tokens are ignored)."""
    debug_stats: bool = True
    """Whether the caller wants the step's DATA-DEPENDENT statistics (:attr:`StepResult.stats`). A mechanism that
    decides on the device (:meth:`Mechanism.step_batch`) leaves them there, unfetched, when no job asks: the engine
    asks only for a job run with ``debug_stats`` (``--debug-stats``); a direct call of :meth:`Mechanism.step` gets
    them by default."""


@dataclass
class StepResult:
    """What a mechanism returns for one step.

    ``tokens`` is a 0-d (joint) or ``(K,)`` (independent) ``torch.long`` tensor.
    ``stats`` maps a name to a float or a 1-d array (e.g. one λ per group): DATA-DEPENDENT figures, kept for
    diagnostics; they are not a privacy guarantee. ``stop`` ends a joint generation without releasing a token.
    """

    tokens: torch.Tensor
    stats: Mapping[str, float | list[float]] | None = field(default=None)
    stop: bool = False
    """Joint mode: end the generation before this step's token (e.g. a baseline's fixed private-token budget is
    spent). ``tokens`` is then ignored and the finish reason is ``"budget"``."""
    host_tokens: list[int] | None = field(default=None, repr=False)
    """``tokens`` as Python ints when the mechanism holds them on the host already (a batched step, from its one
    device-to-host transfer): the engine records these and reads nothing more."""


class Mechanism(ABC):
    """Turns the K rows of next-token logits into token(s); states its ex-ante guarantee.

    Subclasses validate their parameters in ``__init__`` with an actionable message
    (raise :class:`dpinfer.errors.ConfigurationError`), set :attr:`name` and :attr:`mode`, and implement :meth:`step`.
    """

    name: ClassVar[str] = "mechanism"
    mode: ClassVar[Mode] = "joint"

    @classmethod
    def calibrated(cls: type[M], budget: Budget, spec: Spec) -> M:
        """The mechanism whose generation of at most ``spec.max_new_tokens`` tokens meets ``budget`` (ε, δ) ex ante,
        from public parameters only (``spec.params``: the constructor's other keywords). The same signature for every
        mechanism; this default refuses: a mechanism without a calibration is built from its parameters."""
        raise ConfigurationError(f"{cls.name} has no calibration to a target ε; build it from its parameters")

    def diagnostics(self, steps: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
        """DATA-DEPENDENT figures of the last generation, from the per-step ``stats`` it returned (``steps``, as the
        engine collects them) and its own state: for diagnostics only, never ε, never in a release.

        The default: the mean of each numeric statistic over the steps (``{"mean_<stat>": ...}``)."""
        sums: dict[str, list[float]] = {}
        for stats in steps:
            for key, value in stats.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    sums.setdefault(key, []).append(float(value))
        return {f"mean_{k}": math.fsum(v) / len(v) for k, v in sums.items()}

    def start(self, num_contexts: int, vocab_size: int) -> None:  # noqa: B027 - optional hook
        """Called once before the first step; check that the context layout fits (e.g. K = m + 1)."""

    @abstractmethod
    def step(self, logits: torch.Tensor, info: StepInfo, generator: Randomness) -> StepResult:
        """Choose the next token(s).

        Args:
            logits: ``(K, V)`` float64 raw logits of the K contexts, on the engine's device, never clamped.
            info: public step information.
            generator: the run's source of randomness, a :class:`~dpinfer.mechanisms.randomness.RandomSource`
                (secure by default, seeded for tests) or a ``torch.Generator`` (wrap it with
                :func:`~dpinfer.mechanisms.randomness.as_random_source`). ALL randomness must come from it.
        """

    def batch_key(self) -> Hashable | None:
        """A key from public parameters: the engine's jobs whose mechanisms give the same key decide together, in one
        :meth:`step_batch` call per step; ``None`` (the default): this mechanism decides alone (:meth:`step`).

        A mechanism that returns a key makes its per-job :meth:`step` the same computation as :meth:`step_batch` on a
        batch of one, row-wise throughout, so that a job's tokens are bit for bit the same on both paths and whatever
        jobs sit beside it."""
        return None

    @classmethod
    def step_batch(cls, mechanisms: Sequence[Mechanism], logits: Sequence[torch.Tensor], infos: Sequence[StepInfo],
                   generators: Sequence[Randomness]) -> list[StepResult | Exception]:
        """One step of several jobs whose mechanisms share a :meth:`batch_key`: ``logits[b]`` is job b's ``(K, V)``
        logits (after its public processors; any float dtype), ``generators[b]`` its own source. A job's refusal is
        returned in its place (the other jobs still advance). The default steps each job alone."""
        out: list[StepResult | Exception] = []
        for mech, z, info, gen in zip(mechanisms, logits, infos, generators, strict=True):
            try:
                out.append(mech.step(z.to(torch.float64), info, gen))
            except Exception as err:
                out.append(err)
        return out

    def batch_of_one(self, logits: torch.Tensor, info: StepInfo, generator: Randomness) -> StepResult | None:
        """This job's step as :meth:`step_batch` on a batch of one when the mechanism batches (a :meth:`batch_key`),
        so that the per-job and batched paths are one computation (a refusal raised); ``None`` otherwise."""
        if self.batch_key() is None:
            return None
        (res,) = self.step_batch([self], [logits], [info], [generator])
        if isinstance(res, Exception):
            raise res
        return res

    def step_as_batch(self, logits: torch.Tensor, info: StepInfo, generator: Randomness) -> StepResult:
        """:meth:`step` for a mechanism that always decides in batches (``step = Mechanism.step_as_batch``):
        :meth:`batch_of_one`."""
        res = self.batch_of_one(logits, info, generator)
        if res is None:
            raise ConfigurationError(f"{self.name} has no batch key: it needs a step of its own")
        return res

    def private_columns(self, public_scores: torch.Tensor) -> torch.Tensor | None:
        """Joint mode, rows 1..K−1: the token ids whose logits :meth:`step` reads, decided from the public row 0
        (``(V,)`` float64, after the public processors) alone; ``None`` (the default) means every column.

        A mechanism that reads the private rows on a public support only (InvisibleInk's Top-k⁺) returns it, and the
        engine then runs the output head of the private rows on those columns only; the other entries are ``-inf``.
        """
        return None

    @classmethod
    def public_support(cls, mechanisms: Sequence[Mechanism], public: Sequence[torch.Tensor]
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """:meth:`private_columns` of several jobs whose mechanisms share a :meth:`batch_key`, on the device
        (``public[b]``: job b's public row ``(1, V)`` as :meth:`private_columns` is given it): per job its support
        ids ``(n, W)``, ascending with the support's ids first, the mask of those ``(n, W)``, and ``(n,)`` nonzero
        where the support may reach beyond the ``W`` columns (the job's :meth:`private_columns` then says). ``None``
        (the default): no batched support; each job's :meth:`private_columns` is called."""
        return None

    @property
    def restricts_private_columns(self) -> bool:
        """Whether :meth:`private_columns` may return a subset: the engine splits the output head only then (a
        mechanism that always reads every column is cheaper with one head call for all rows)."""
        return type(self).private_columns is not Mechanism.private_columns

    @property
    def public_row(self) -> bool:
        """Whether row 0 is a public context whose logits must not depend on rows 1..K−1 in any way, bit for bit
        (rule 2): every joint mechanism (DP-Fusion, InvisibleInk, Amin, AdaPMixED; the joint sampler reads row 0
        only). The engine then prefills row 0 alone and decodes it at a public width (:mod:`dpinfer.engine`)."""
        return self.mode == "joint"

    def guarantee(self, max_new_tokens: int) -> Guarantee:
        """The ex-ante guarantee of a generation of at most ``max_new_tokens`` tokens (no private data read)."""
        return Guarantee.no_privacy(mechanism=self.name)


class RepeatedEvent(Mechanism):
    """A mechanism whose ex-ante loss is :meth:`loss_steps` repetitions of one :meth:`loss_event` (DP-Prompt,
    DP-Decoding): :meth:`loss` and :meth:`guarantee` are made from those, :attr:`adjacency`, ``delta`` and
    :meth:`guarantee_parameters` alone (no private data read), so both report the loss that ``calibrated`` searches."""

    adjacency: ClassVar[str]
    delta: float

    @abstractmethod
    def loss_event(self) -> Any:
        """What one token releases, for the accountant (a frozen event of :mod:`dpinfer.accounting.events`)."""

    @abstractmethod
    def loss_steps(self, max_new_tokens: int) -> int:
        """The most tokens that read the private input."""

    @abstractmethod
    def guarantee_parameters(self) -> dict[str, Any]:
        """The public parameters the guarantee is computed from (written into it; ``T_max`` is added)."""

    def loss(self, max_new_tokens: int) -> Any:
        """The ex-ante loss of at most ``max_new_tokens`` tokens per output."""
        from dpinfer.accounting.accountant import compose_steps

        return compose_steps(self.loss_event(), self.loss_steps(max_new_tokens))

    def guarantee(self, max_new_tokens: int) -> Guarantee:
        """(ε, δ) of at most ``max_new_tokens`` tokens per output, from the parameters only."""
        from dpinfer.accounting.accountant import ex_ante_guarantee

        return ex_ante_guarantee(
            self.loss_event(),
            steps=self.loss_steps(max_new_tokens),
            delta=self.delta,
            mechanism=self.name,
            adjacency=self.adjacency,
            max_new_tokens=max_new_tokens,
            parameters={**self.guarantee_parameters(), "T_max": max_new_tokens},
            route=True,
        )
