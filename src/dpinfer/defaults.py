"""Every default of the API, the command line and the benchmarks, in one place (one frozen dataclass per task).

The Python functions take their keyword defaults from here, the command line its ``default=`` values and the numbers
its ``--help`` prints, and the validation its assumptions; nothing else spells a default out. Light on import (no
torch): the parser reads it on every call.

>>> GENERATE.max_new_tokens, GENERATE.temperature, GENERATE.top_p
(256, 0.7, 0.9)
>>> SANITIZE.epsilon, SANITIZE.delta, SANITIZE.temperature, SANITIZE.top_k, SANITIZE.no_repeat_ngram
(40.0, 1e-05, 0.7, 40, 3)
>>> SYNTH.delta, SYNTH.batch_size, SYNTH.max_new_tokens, SYNTH.temperature, SYNTH.top_k
(1e-06, 8, 200, 1.0, 50)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GenerateDefaults:
    """Plain generation (:func:`dpinfer.generate`, ``dpinfer generate``): no privacy.

    Nucleus sampling at τ = 0.7, top-p = 0.9 reads well with the small embedded model (pure τ = 1 sampling of a 135M
    model wanders); 256 new tokens is a paragraph, the same fixed T_max as sanitisation's whole-document mechanisms.
    """

    max_new_tokens: int = 256
    temperature: float = 0.7
    top_k: int | None = None
    top_p: float | None = 0.9


@dataclass(frozen=True)
class SanitizeDefaults:
    """Document sanitisation (:func:`dpinfer.sanitize`, ``dpinfer sanitize``); the decoding defaults were chosen for
    the embedded 135M model by the sweep in docs/sanitize.md. The top-k support is computed from the PUBLIC context
    only and applied to every context, which keeps the guarantee."""

    method: str = "dp-fusion"
    epsilon: float = 40.0
    """Target ε per privacy group (see ``dpinfer sanitize --help`` and docs/threat-model.md for what 40 means)."""
    delta: float = 1e-5
    alpha: float = 2.0
    """Rényi order at which DP-Fusion's bound is enforced and charged."""
    temperature: float = 0.7
    top_k: int | None = 40
    no_repeat_ngram: int | None = 3
    min_p: float | None = 0.1
    """Support rule computed from the PUBLIC context only: keep the tokens at least 10% as likely as the public
    context's most likely one (after temperature), so that a flat first step cannot sample a token the public
    context finds unlikely (docs/quality.md). A public function: the guarantee is unchanged."""
    opening_tokens: int | None = 16
    """A public opening: the rewrite starts with the document's first tokens as the PUBLIC context shows them, up to
    the first placeholder and at most this many (untagged text is public under replace-by-null), so that the small
    model continues the document instead of commenting on it (docs/quality.md). Only for the methods that protect
    spans (and ``original``); never for dp-decoding and dp-prompt, whose adjacency makes every token private."""
    max_new_tokens_cap: int | None = 256
    """Cap on DP-Fusion's document-following default T_max (a constant: public). Longer documents get a rewrite of
    their first part; pass ``--max-new-tokens`` for more (every token is charged)."""
    tagger: str = "presidio"
    accounting: str = "dpinfer"
    adjacency: str = "replace-by-null"
    whole_document_max_new_tokens: int = 256
    """T_max of the mechanisms that protect the whole document (dp-decoding, dp-prompt): a fixed constant, since
    under their adjacency (any two documents) a T_max read from the document would reveal its length."""
    whole_document_max_input_tokens: int | None = None
    """The public cap on a document for dp-decoding and dp-prompt (their adjacency makes its length private): a longer
    document is cut to its first N tokens, silently. None: all that the model's context window leaves after the
    instruction template and T_max (public: from the model and the settings)."""


@dataclass(frozen=True)
class SynthDefaults:
    """Synthetic text (:func:`dpinfer.synthesize`, ``dpinfer synth``). ε has no default: it must be chosen."""

    method: str = "invisibleink"
    delta: float = 1e-6
    batch_size: int = 8
    max_new_tokens: int = 200
    temperature: float = 1.0
    top_k: int | None = 50
    max_reference_tokens: int | None = 512
    template: str = "generic"


@dataclass(frozen=True)
class RagDefaults:
    """Private RAG (:class:`dpinfer.PrivateRAG`, ``dpinfer rag``); see docs/rag.md for ε and the reranker."""

    method: str = "pad"
    epsilon: float = 64.0
    """Target ε per answer of ``pad`` (δ = 1e-5, T_max = 64, σ = 1.5 give C ≈ 1.43; docs/rag.md, "Choosing ε")."""
    delta: float = 1e-5
    max_new_tokens: int = 64
    temperature: float = 0.0
    """0: argmax of the noisy logits (the PAD authors decode greedily)."""
    sigma: float = 1.5
    """PAD's fixed noise σ; C is solved from (ε, δ, T_max)."""
    support_top_k: int | None = 1
    """k of PAD's public Top-k⁺ support ``{v : ℓ_pub[v] ≥ kth_largest(ℓ_pub) − 2C}``. 1 for argmax decoding (the
    default τ = 0): Top-1⁺ holds every token that the noise-free release ``ℓ_pub + clip(s)`` can make the argmax for
    ANY context (a shift of L2 norm ≤ C moves two logits apart by at most √2·C < 2C), so a wider support only adds
    tokens that can win through the noise alone (with k = 20, the earlier default, one held-out GenMedGPT question
    had a median support of 215 tokens per step, whose largest N(0, 1.5²) draw, ≈ 4.9, lifts tokens from far down
    the public ranking; docs/rag.md). When sampling (τ > 0), pass a wider k (e.g. 20)."""
    support_min_p: float | None = 0.5
    """min-p of PAD's public support: Top-k⁺ also drops the tokens whose PUBLIC probability is below ``min_p`` times
    the public row's most likely token's (``ℓ_pub[v] < max ℓ_pub + ln min_p``; 0.5: within ln 2 ≈ 0.69 of the
    public maximum); None: Top-k⁺ alone. The noise (σ = 1.5) then chooses among the tokens the question alone
    already ranks near the top, rather than among every token within 2C ≈ 2.9 of it, where it sends the 135M model
    into role-play and refusals; the private shift still reorders them. A function of the public row only: ε and C
    are unchanged (docs/rag.md; docs/quality.md, "RAG")."""
    adjacency: str = "replace-by-null"
    top_k: int = 6
    top_n: int = 3
    max_doc_tokens: int = 256
    theta: float = 0.9
    """distance-threshold: the largest Euclidean distance (unit vectors) kept."""
    static_sigma: float = 1.0
    store_epsilon: float = 3300.0
    """ε of the budget of a store's own ledger (``PrivateRAG(path)``, ``dpinfer rag ask``): about 100 answers at the
    default ε = 64 each (their zCDP losses compose to ε ≈ 3,274 at δ = 1e-5; docs/budget.md). Set another with
    ``dpinfer budget set store --epsilon E --ledger STORE/budget.db``."""


@dataclass(frozen=True)
class ProtectDefaults:
    """Prompt protection (:func:`dpinfer.protect_prompt`, ``dpinfer protect-prompt``; docs/prompt-protection.md).

    T_max = 48 covers a question of a few sentences and is fixed in advance (never the prompt's length); τ = 0.75 is
    the warmest temperature of the CSQA benchmark; ε₂ = 40 is where JEM over the 73k-word universe starts to release
    the consensus words rather than random ones (it protects one rewrite and is not added to the headline ε).
    """

    method: str = "dp-gtr"
    delta: float = 1e-5
    temperature: float = 0.75
    n_rewrites: int = 10
    n_keywords: int = 10
    keywords: str = "ndp"
    max_new_tokens: int = 48
    jem_epsilon: float = 40.0
    suppress: str = "ban"
    """Stage 3 keeps the released keywords out of the final prompt by banning them while decoding (``"ban"``), not
    only by asking (``"instruct"``): the 135M model ignores the template's avoid-list (docs/prompt-protection.md)."""
    max_input_tokens: int = 256
    """A public cap on the prompt: a longer prompt is cut to its first 256 tokens before stage 1, silently (its length
    is private under any-two-prompts adjacency, so no message may depend on it). A rewrite has at most T_max = 48
    tokens, so a prompt far longer than that is not kept whole by any rewrite anyway."""
    n_exemplars: int = 5
    """Stage 3 writes one final prompt from each of the 5 lowest-perplexity rewrites and releases the one closest to
    the rewrites' consensus (MiniLM embeddings): one greedy final from the 135M model often drifts off the question."""
    stage3_quorum: int | None = 3
    """Stage 3 stops a prompt's finals as soon as 3 of its 5 are complete (the others keep their text so far, as at
    T_max): the batch then decodes for as long as the third-shortest final, not the longest (most often a run-on line
    that never ends). None: every final decoded to its end."""
    stage3_int8: bool = True
    """Stage 3 (greedy, public post-processing) decodes on an int8 twin of a float32 CPU model's linear layers
    (:func:`dpinfer.quantize.int8_decode_twin`: its decode steps cost about half the float32 ones; prompt processing
    stays float32). Stage 1, the DP rewrites, always runs on the float32 weights its clip bounds were measured with."""


@dataclass(frozen=True)
class ServeDefaults:
    """The HTTP service (``dpinfer serve``; docs/serve.md)."""

    host: str = "127.0.0.1"
    """Loopback: binding another address needs a keys file (a service without keys serves only this machine)."""
    port: int = 8000
    max_body_bytes: int = 4 * 1024 * 1024
    """Request bodies over 4 MiB are refused (413) before they are read whole."""
    default_epsilon: float = 200.0
    """Budget (ε) of a unit that no admin has set: five DP-Fusion rewrites at the default ε = 40 per group."""
    default_delta: float = 1e-4
    """Budget (δ) of a unit that no admin has set (ten releases at δ = 1e-5)."""
    batch_window_s: float = 0.02
    """How long the batcher waits after the first queued job for others to join the same engine run (public)."""
    engine_min_capacity: int = 512
    """Cache positions per row of the server's shared batch, at least (public; its row count is the device's default
    slot count, whatever the jobs running): a request whose prompt width plus ``T_max`` fits joins the running batch
    at once; a longer one waits for the batch to drain, which is then planned again for it."""
    stage3_rows: int = 16
    """Row slots of the server's second shared batch, DP-GTR's stage 3 on the int8 twin (three default prompt
    protections at once, 5 rows each; a job with more rows gets a pool of its size). Its cache holds rows x capacity
    positions of keys and values (46 KB each on the embedded model): the main batch's 64 x 512 would be 1.5 GB more."""
    stage3_min_capacity: int = 256
    """Cache positions per row of the stage-3 batch, at least: a default stage-3 request (template, exemplar,
    keywords: under 200 tokens) plus its T_max fits; a longer one waits for the batch to drain."""
    tagger: str = "presidio"
    replica_max_ongoing_requests: int = 64
    """``serve --replicas``: requests Ray Serve lets one replica hold at once (its batcher decodes them together)."""
    chat_max_new_tokens: int = 128
    """T_max of an OpenAI-compatible chat completion when the request gives no ``max_tokens``."""
    stores_connect_timeout_s: float = 5.0
    """``--stores chroma://HOST:PORT``: how long the check that the Chroma server answers may take at start."""
    job_lease_s: float = 60.0
    """A synthesis job's lease in a PostgreSQL ledger: a replica on another machine that has not renewed it for this
    long is presumed dead, and a poll reports its unfinished job failed (its process on this machine is looked up)."""
    job_heartbeat_s: float = 15.0
    """How often a replica renews the leases of the synthesis jobs it runs."""


@dataclass(frozen=True)
class LedgerDefaults:
    """The privacy-budget ledger (:class:`dpinfer.Ledger`, ``dpinfer budget``; docs/budget.md).

    A unit's budget has no default ε: it is chosen at ``dpinfer budget init --epsilon E`` (the default for new units)
    or per unit with ``dpinfer budget set UNIT --epsilon E``. δ is the unit's total δ: every charge's Rényi loss is
    composed per unit and converted to ε once at this δ.
    """

    delta: float = 1e-5
    env: str = "DPINFER_LEDGER"
    """The environment variable the command line reads for ``--ledger``."""
    busy_timeout_s: float = 120.0
    """How long a spend waits for another process's transaction on the same ledger before giving up."""
    lease_s: float = 3600.0
    """A pending reservation's lease: a holder on another machine (whose process cannot be looked up) that has not
    touched its reservation for this long is presumed dead by ``dpinfer budget settle-dead`` (a live holder presumed
    dead fails closed: its later cancel is refused, its reservation stays counted)."""
    connect_timeout_s: float = 10.0
    """How long opening a connection to a PostgreSQL ledger may take."""


GENERATE = GenerateDefaults()
SANITIZE = SanitizeDefaults()
SYNTH = SynthDefaults()
SERVE = ServeDefaults()
RAG = RagDefaults()
PROTECT = ProtectDefaults()
LEDGER = LedgerDefaults()

MODEL_BACKEND = "auto"
"""``load_model(backend=...)`` / ``--backend``: dpinfer's own model code for the architectures it runs
(:mod:`dpinfer.modeling`), transformers for the others."""

__all__ = [
    "GENERATE",
    "LEDGER",
    "MODEL_BACKEND",
    "PROTECT",
    "RAG",
    "SANITIZE",
    "SERVE",
    "SYNTH",
    "GenerateDefaults",
    "LedgerDefaults",
    "ProtectDefaults",
    "RagDefaults",
    "SanitizeDefaults",
    "ServeDefaults",
    "SynthDefaults",
]
