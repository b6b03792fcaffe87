"""Run a scenario many times on D and D′, fit a likelihood-ratio test on one half, measure it on fresh trials.

The test: per position t of the released sequence, the token frequencies on D and on D′ of one half of the selection
trials (add-½ smoothing; a stop or a missing token is one more symbol) give a log-ratio table; a sequence's score is
the sum of its entries, and the test says "D" when the score reaches a threshold. The threshold is the one whose
Clopper–Pearson ε lower bound is largest on the other half of the selection trials; where the scenario offers
several candidate input pairs, each gets its own selection trials and the pair with the largest selection bound is
kept. Then FPR and FNR are counted on fresh trials of that pair only, and their 95% Clopper–Pearson upper ends give
ε_lb (:mod:`dpinfer.audit.stats`). Neither the pair nor the threshold sees the evaluation trials, so ε_lb is a
valid lower bound whatever the mechanism does.
"""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import asdict, dataclass

import torch

from dpinfer.audit.scenarios import DELTA, Scenario
from dpinfer.audit.stats import clopper_pearson, epsilon_from_rates, epsilon_lower_bound
from dpinfer.errors import ConfigurationError
from dpinfer.mechanisms.base import Mechanism, StepInfo

MAX_THRESHOLDS = 400


@dataclass(frozen=True)
class AuditResult:
    """One audit's figures. ``epsilon_lb`` is the 95% lower bound; ``exceeds`` says it is above the claim."""

    mechanism: str
    variant: str | None
    claimed_epsilon: float
    delta: float
    epsilon_lb: float
    epsilon_point: float
    trials: int
    selection_trials: int
    evaluation_trials: int
    fpr: float
    fnr: float
    fpr_interval: tuple[float, float]
    fnr_interval: tuple[float, float]
    max_new_tokens: int
    vocab_size: int
    num_contexts: int
    adjacency: str
    inputs: str
    input_pair: str
    seconds: float

    @property
    def exceeds(self) -> bool:
        """Whether the audited lower bound is above the claimed ε (the claim is then refuted)."""
        return self.epsilon_lb > self.claimed_epsilon

    def to_dict(self) -> dict[str, object]:
        out = asdict(self)
        out["exceeds"] = self.exceeds
        return out


def run_trials(mech: Mechanism, logits: torch.Tensor, max_new_tokens: int, n: int,
               generator: torch.Generator) -> torch.Tensor:
    """``(n, T)`` released tokens of ``n`` generations from the fixed ``(K, V)`` logits; the symbol ``V`` marks a
    stop (and every position after it). ``mech.start`` is called before each generation (stateful mechanisms)."""
    k, v = logits.shape
    infos = [StepInfo(step=t, max_new_tokens=max_new_tokens, num_contexts=k) for t in range(max_new_tokens)]
    rows: list[list[int]] = []
    for _ in range(n):
        mech.start(k, v)
        seq = [v] * max_new_tokens
        for t, info in enumerate(infos):
            res = mech.step(logits, info, generator)
            if res.stop:
                break
            tok = res.tokens
            seq[t] = int(tok if tok.ndim == 0 else tok[0])
        rows.append(seq)
    return torch.tensor(rows, dtype=torch.long).reshape(n, max_new_tokens)


def _frequencies(seqs: torch.Tensor, symbols: int) -> torch.Tensor:
    n, t = seqs.shape
    counts = torch.zeros(t, symbols, dtype=torch.float64)
    counts.scatter_add_(1, seqs.T, torch.ones(t, n, dtype=torch.float64))
    return (counts + 0.5) / (n + 0.5 * symbols)


def log_ratio_table(seqs_d: torch.Tensor, seqs_dp: torch.Tensor, symbols: int) -> torch.Tensor:
    """``(T, symbols)`` per-position log(P̂_D/P̂_D′) from two sets of selection trials."""
    return _frequencies(seqs_d, symbols).log() - _frequencies(seqs_dp, symbols).log()


def scores(table: torch.Tensor, seqs: torch.Tensor) -> torch.Tensor:
    """The sum over positions of each sequence's log-ratio entries."""
    return table.gather(1, seqs.T).sum(dim=0)


def _errors(s_d: torch.Tensor, s_dp: torch.Tensor, threshold: float) -> tuple[int, int]:
    """(false positives among D′ runs, false negatives among D runs) of the test "score ≥ threshold ⇒ D"."""
    return int((s_dp >= threshold).sum()), int((s_d < threshold).sum())


def choose_threshold(s_d: torch.Tensor, s_dp: torch.Tensor, delta: float) -> tuple[float, tuple[float, float]]:
    """The threshold with the largest ε lower bound on these (selection) scores, and its key (that bound, then the
    ε of the add-½ error rates: ties, e.g. every bound 0 when the inputs are hard to tell apart, go to the better
    smoothed estimate, so the test is not degenerate)."""
    cands = torch.unique(torch.cat([s_d, s_dp]))
    if cands.numel() > MAX_THRESHOLDS:
        q = torch.linspace(0.0, 1.0, MAX_THRESHOLDS, dtype=torch.float64)
        cands = torch.unique(torch.quantile(cands, q))
    best, best_key = float(cands.max()), (-1.0, -1.0)
    n_d, n_dp = s_d.numel(), s_dp.numel()
    for c in cands.tolist():
        fp, fn = _errors(s_d, s_dp, c)
        key = (epsilon_lower_bound(fp, n_dp, fn, n_d, delta=delta),
               epsilon_from_rates((fp + 0.5) / (n_dp + 1), (fn + 0.5) / (n_d + 1), delta))
        if key > best_key:
            best, best_key = c, key
    return best, best_key


def make_generator(seed: int | None) -> torch.Generator:
    """A CPU generator seeded with ``seed``, or from :mod:`secrets` when ``seed`` is None."""
    g = torch.Generator()
    g.manual_seed(secrets.randbits(63) if seed is None else seed)
    return g


def run_audit(sc: Scenario, *, trials: int, seed: int | None = None) -> AuditResult:
    """Audit ``sc`` with ``trials`` generations on each input: a quarter select the test (on every candidate pair of
    inputs), the rest measure it (on the chosen pair)."""
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 8:
        raise ConfigurationError(f"trials must be an integer ≥ 8 (runs on each of the two inputs), got {trials!r}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # (K, V) rows of 16 entries: threads only add contention
    try:
        return _run(sc, trials, seed)
    finally:
        torch.set_num_threads(threads)


def _run(sc: Scenario, trials: int, seed: int | None) -> AuditResult:
    start = time.perf_counter()
    gen = make_generator(seed)
    mech = sc.build()
    guarantee = mech.guarantee(sc.max_new_tokens)
    claimed = float(guarantee.epsilon)
    delta = float(guarantee.delta) if math.isfinite(claimed) and guarantee.delta > 0 else DELTA
    n_sel = max(4, trials // 4)
    n_eval = trials - n_sel
    t = sc.max_new_tokens
    chosen = None
    for pair in sc.pairs:
        symbols = pair.d.shape[1] + 1
        sel_d = run_trials(mech, pair.d, t, n_sel, gen)
        sel_dp = run_trials(mech, pair.d_prime, t, n_sel, gen)
        half = n_sel // 2  # the table on one half, the threshold on the other: neither sees its own noise
        table = log_ratio_table(sel_d[:half], sel_dp[:half], symbols)
        threshold, key = choose_threshold(scores(table, sel_d[half:]), scores(table, sel_dp[half:]), delta)
        if chosen is None or key > chosen[0]:
            chosen = (key, pair, table, threshold)
    assert chosen is not None  # a scenario has at least one pair
    _, pair, table, threshold = chosen
    k, v = pair.d.shape
    ev_d = scores(table, run_trials(mech, pair.d, t, n_eval, gen))
    ev_dp = scores(table, run_trials(mech, pair.d_prime, t, n_eval, gen))
    fp, fn = _errors(ev_d, ev_dp, threshold)
    return AuditResult(
        mechanism=sc.mechanism,
        variant=sc.variant,
        claimed_epsilon=claimed,
        delta=delta,
        epsilon_lb=epsilon_lower_bound(fp, n_eval, fn, n_eval, delta=delta),
        epsilon_point=epsilon_from_rates(fp / n_eval, fn / n_eval, delta),
        trials=trials,
        selection_trials=n_sel,
        evaluation_trials=n_eval,
        fpr=fp / n_eval,
        fnr=fn / n_eval,
        fpr_interval=clopper_pearson(fp, n_eval),
        fnr_interval=clopper_pearson(fn, n_eval),
        max_new_tokens=t,
        vocab_size=v,
        num_contexts=k,
        adjacency=sc.adjacency,
        inputs=sc.inputs,
        input_pair=pair.label,
        seconds=time.perf_counter() - start,
    )
