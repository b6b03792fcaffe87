"""The settings of one private-RAG answer (:meth:`dpinfer.PrivateRAG.ask`, ``dpinfer rag ask``, serve's RAG model).

A frozen :class:`AskConfig`: defaults from :data:`dpinfer.defaults.RAG`, every value checked once in
``__post_init__`` (before the store is read or the model loads). What a setting means for each method, and which
method a name stands for, is the method table's business (:mod:`dpinfer.methods.rag`).

>>> AskConfig().mechanism, AskConfig(epsilon=8).epsilon, AskConfig().adjacency
('pad', 8.0, <Adjacency.REPLACE_BY_NULL: 'replace-by-null'>)
>>> AskConfig(max_new_tokens=0)
Traceback (most recent call last):
...
dpinfer.errors.ConfigurationError: max_new_tokens must be an integer ≥ 1, got 0
>>> AskConfig(sigma=-1, spelling="cli")
Traceback (most recent call last):
...
dpinfer.errors.ConfigurationError: --sigma must be > 0 (a finite number), got -1
"""

from __future__ import annotations

from dataclasses import dataclass

from dpinfer.accounting.accountant import Adjacency
from dpinfer.checks import (
    check_delta,
    check_probability,
    check_seed,
    int_at_least,
    non_negative_number,
    positive_int,
    positive_number,
)
from dpinfer.configs.base import Config, option
from dpinfer.defaults import RAG

__all__ = ["RAG_ADJACENCIES", "AskConfig"]

RAG_ADJACENCIES = (Adjacency.REPLACE_BY_NULL, Adjacency.REPLACE_ONE)
"""The relations a RAG answer's guarantee can be stated under (PAD: sensitivity C or 2C)."""
RAG_DEFAULT_ADJACENCY = Adjacency(RAG.adjacency)
ADJACENCY_NAMES = tuple(a.value for a in RAG_ADJACENCIES)


@dataclass(frozen=True)
class AskConfig(Config):
    """One answer's settings (the keyword arguments of :meth:`dpinfer.PrivateRAG.ask`).

    Attributes:
        mechanism: the answering method (:data:`dpinfer.methods.rag.TABLE`).
        epsilon: target ε per answer for ``pad`` (None: :data:`RAG.epsilon <dpinfer.defaults.RAG>`); for
            ``pad-as-published`` a deprecated alias of ``noise_scale``.
        delta: δ of the guarantee. max_new_tokens: T_max, for which the guarantee is computed.
        seed: tests and benchmarks only (never written next to a release).
        temperature: 0: argmax; τ > 0 samples. sigma: PAD's noise σ (C is solved from ε).
        support_top_k: k of PAD's public Top-k⁺ support (None: the full vocabulary).
        support_min_p: min-p of PAD's public support, relative to the PUBLIC row's maximum (None: none).
        adjacency: :class:`~dpinfer.accounting.Adjacency` of the guarantee (replace-by-null or replace-one).
        theta: ``distance-threshold``'s largest distance. static_sigma: ``static``'s noise.
        min_new_tokens: benchmarks only: EOS masked (for every row alike) before this many tokens.
        noise_scale: ``pad-as-published``'s noise knob (the authors call it ε): not a guarantee.
        spelling: ``"cli"`` names a bad value by its command-line option (``--max-new-tokens``), not its keyword.
    """

    mechanism: str = option(RAG.method, help="the answering method (see the list above)", cli=False, request=True)
    epsilon: float | None = option(None, type=float, request=True, help=(
        f"target ε per answer for pad (default {RAG.epsilon:g}); with pad-as-published a deprecated alias of "
        "--noise-scale"))
    delta: float = option(RAG.delta, request=True, help=f"δ (default {RAG.delta:g})")
    max_new_tokens: int = option(RAG.max_new_tokens, request=True,
                                 help=f"T_max of the answer (default {RAG.max_new_tokens})")
    seed: int | None = option(None, type=int, help=(
        "for tests and benchmarks only: the guarantee then holds only while the seed is secret"))
    temperature: float = option(RAG.temperature, request=True, help="0 = argmax / greedy (default); τ > 0 samples")
    sigma: float = option(RAG.sigma, help=f"PAD's noise σ (default {RAG.sigma:g}; C is solved from ε)")
    support_top_k: int | None = option(RAG.support_top_k, type=int, cli=False, help=(
        f"k of PAD's public Top-k+ support (default {RAG.support_top_k}; 0 = full vocabulary)"))
    support_min_p: float | None = option(RAG.support_min_p, type=float, cli=False, help=(
        "min-p of PAD's public support, relative to the public row's most likely token (None: Top-k+ alone)"))
    adjacency: Adjacency = option(RAG_DEFAULT_ADJACENCY, type=str, choices=ADJACENCY_NAMES, help=(  # noqa: RUF009
        "replace-by-null (default): the context replaced by nothing (covers its content); replace-one: by any other "
        "context (also covers a document's membership in the store, which changes the retrieval; twice the "
        "sensitivity)"))
    theta: float = option(RAG.theta, help=f"distance-threshold: the largest Euclidean distance kept (default "
                                          f"{RAG.theta:g})")
    static_sigma: float = option(RAG.static_sigma, help=f"static: the noise σ (default {RAG.static_sigma:g})")
    min_new_tokens: int = option(0, cli=False, help="benchmarks only: EOS masked before this many tokens")
    noise_scale: float | None = option(None, type=float, help=(
        "pad-as-published: the authors' noise knob, which they call ε (default 0.2); it scales the noise and is NOT "
        "a guarantee"))

    def __post_init__(self) -> None:
        super().__post_init__()
        n, put = self.name, lambda k, v: object.__setattr__(self, k, v)
        if self.epsilon is not None:
            put("epsilon", positive_number(self.epsilon, n("epsilon")))
        if self.noise_scale is not None:
            put("noise_scale", positive_number(self.noise_scale, n("noise_scale")))
        put("delta", check_delta(self.delta, n("delta")))
        put("max_new_tokens", positive_int(self.max_new_tokens, n("max_new_tokens")))
        put("seed", check_seed(self.seed, n("seed")))
        put("temperature", non_negative_number(self.temperature, n("temperature")))
        put("sigma", positive_number(self.sigma, n("sigma")))
        if self.support_top_k is not None:
            put("support_top_k", positive_int(self.support_top_k, n("support_top_k")))
        if self.support_min_p is not None:
            put("support_min_p", check_probability(self.support_min_p, n("support_min_p"), low_open=True))
        put("adjacency", Adjacency.of(self.adjacency, n("adjacency"), RAG_ADJACENCIES))
        put("theta", positive_number(self.theta, n("theta")))
        put("static_sigma", positive_number(self.static_sigma, n("static_sigma")))
        put("min_new_tokens", int_at_least(self.min_new_tokens, n("min_new_tokens"), 0))

    @property
    def target_epsilon(self) -> float:
        """PAD's target ε: ``epsilon``, else the default."""
        return RAG.epsilon if self.epsilon is None else self.epsilon
