"""Private retrieval-augmented generation: answers about private documents with a guarantee for their context.

:class:`PrivateRAG` keeps the documents in a persistent Chroma store (:mod:`dpinfer.rag.store`, offline embeddings),
retrieves the ``top_k`` nearest (default 6), reranks them offline to ``top_n`` (default 3, :mod:`dpinfer.rag.rerank`)
and answers with one of the methods below. Prompts are one user turn in the model's chat template (an instruction,
the context and the question; :class:`RagTemplate`): the PAD paper's plain completion prompt
(``Context:\\n…\\n\\nQuestion: …\\nAnswer:\\n``, ``RagTemplate.completion()``) makes an instruct model continue a
quiz (multiple-choice lists) even without privacy.

What is protected (``pad``): the retrieved context of ONE answer, i.e. the documents shown to the model for it, under
replace-by-null (the context replaced by nothing; default) or replace-one (replaced by any other context: this also
covers a document that changes which documents are retrieved). What is not: the question (it is the public row), which
documents exist and which were retrieved (``doc_ids``, for the store's owner: not part of the release), the store
itself, and timing. A session of k answers composes: :meth:`PrivateRAG.session_guarantee` adds the answers' zCDP ρ.

Methods (``mechanism=``):

* ``pad`` (default): rigorous PAD, K = 2 (the question alone is the public row 0; with the documents, row 1),
  calibrated from (ε, δ, T_max) with σ fixed (:class:`dpinfer.mechanisms.pad.Pad`).
* ``pad-as-published``: the authors' decoding step; no guarantee, its figure reported as data-dependent.
* ``static``: fixed Gaussian noise on every logit (baseline, no guarantee).
* ``none``: greedy decoding with the documents (no defence). ``public``: greedy from the question alone (nothing is
  retrieved: ε = 0). ``summarize``: each retrieved document is first condensed by the LM to what the question needs,
  then ``none`` on the condensations (Zeng et al. 2024). ``distance-threshold``: documents farther than ``theta``
  (Euclidean distance between unit embeddings) are dropped, then ``none`` (Zeng et al. 2024). These have no guarantee.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpinfer.accounting.calibration import Budget, Spec
from dpinfer.defaults import RAG
from dpinfer.errors import ConfigurationError, InvalidInputError
from dpinfer.validation import decode_text

if TYPE_CHECKING:
    from dpinfer.accounting import Guarantee, PrivacyLoss
    from dpinfer.engine import EngineJob, EngineOutput
    from dpinfer.models import LM
    from dpinfer.pipelines.budget import Spend
    from dpinfer.rag.store import AddReport, DocumentStore, Hit

METHODS = ("pad", "pad-as-published", "static", "none", "public", "summarize", "distance-threshold")
"""Answering methods: the registered ``rag`` mechanisms and the pipeline baselines."""
DEFAULT_EPSILON = RAG.epsilon
"""ε per answer of the default ``pad`` (at δ = 1e-5, T_max = 64, σ = 1.5: C ≈ 1.43); see docs/rag.md, "choosing ε"."""
DEFAULT_THETA = RAG.theta
"""Distance threshold of ``distance-threshold`` (Euclidean, unit vectors: cos ≥ 1 − θ²/2 ≈ 0.6)."""
DOC_SLACK = 8
"""Tokens per document added to ``max_doc_tokens`` in the public padding width (merges at the boundaries)."""
MIN_DOC_TOKENS = 16
"""The fewest tokens per retrieved document :meth:`PrivateRAG.doc_budget` shrinks to before it refuses the question."""
SUMMARY_TOKENS = 32
"""Length cap of each condensation of the summarize baseline."""


@dataclass(frozen=True)
class RagTemplate:
    """The prompts: ``private`` with ``{context}`` and ``{question}``, ``public`` with ``{question}`` only (the
    null context). ``chat``: wrap both in the model's chat template (one user turn; the default, for instruct
    models). :meth:`completion` gives the PAD paper's plain completion prompts.

    >>> t = RagTemplate()
    >>> t.render_public("Why?")
    'Answer the question in two or three sentences.\\n\\nQuestion: Why?'
    >>> RagTemplate.completion().render_private("Doc A", "Why?")
    'Context:\\nDoc A\\n\\nQuestion: Why?\\nAnswer:\\n'
    """

    private: str = ("Answer the question in two or three sentences, using the context where it helps.\n\n"
                    "Context:\n{context}\n\nQuestion: {question}")
    public: str = "Answer the question in two or three sentences.\n\nQuestion: {question}"
    summary: str = ("Text:\n{document}\n\nQuestion: {question}\nIn one or two sentences, state only the facts of the "
                    "text that help answer the question.")
    separator: str = "\n\n"
    chat: bool = True

    @classmethod
    def completion(cls) -> RagTemplate:
        """The PAD paper's plain completion prompts (no chat template), for base models."""
        return cls(private="Context:\n{context}\n\nQuestion: {question}\nAnswer:\n",
                   public="Question: {question}\nAnswer:\n", chat=False)

    def __post_init__(self) -> None:
        if "{context}" not in self.private or "{question}" not in self.private:
            raise ConfigurationError("the private template must contain {context} and {question}")
        if "{context}" in self.public or "{question}" not in self.public:
            raise ConfigurationError("the public template must contain {question} and not {context}")

    def render_private(self, context: str, question: str) -> str:
        return self.private.replace("{context}", context).replace("{question}", question)

    def render_public(self, question: str) -> str:
        return self.public.replace("{question}", question)

    def wrap(self, lm: LM, text: str) -> str:
        return lm.instruction_prompt(text) if self.chat else text


@dataclass
class RagAnswer:
    """One answer. ``text`` is the release; ``guarantee`` its ex-ante (ε, δ) for the retrieved context.

    ``doc_ids`` (the documents shown to the model) and ``retrieved`` (their text and distance) are for the store's
    owner: they are NOT covered by the guarantee and must not be released with the answer. ``data_dependent`` holds
    figures computed from private data (e.g. pad-as-published's own figure): diagnostics, never a guarantee.
    """

    text: str
    doc_ids: list[str]
    guarantee: Guarantee
    mechanism: str
    settings: dict[str, Any]
    seconds: float
    generation_seconds: float
    tokens: int
    finish_reason: str
    token_ids: list[int] = field(default_factory=list, repr=False)
    retrieved: list[Hit] = field(default_factory=list, repr=False)
    data_dependent: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.generation_seconds if self.generation_seconds > 0 else 0.0

    def __str__(self) -> str:
        return self.text

    def to_dict(self, *, doc_ids: bool = False, debug: bool = False) -> dict[str, Any]:
        """The release: the text, what is read off it (``tokens``, ``finish_reason``), the guarantee and the public
        settings; nothing else depends on the question or the documents. ``doc_ids`` and the DATA-DEPENDENT figures
        (``debug``: the timing, which depends on the retrieved documents, and e.g. pad-as-published's own figure)
        only when asked: debug output, never part of a release."""
        out: dict[str, Any] = {"text": self.text, "mechanism": self.mechanism, "guarantee": self.guarantee.to_dict(),
                               "settings": dict(self.settings), "tokens": self.tokens,
                               "finish_reason": self.finish_reason}
        if doc_ids:
            out["doc_ids"] = list(self.doc_ids)
        if debug:
            out["data_dependent"] = {"warning": "computed from the private documents: not a guarantee, never release",
                                     **self.data_dependent, "seconds": round(self.seconds, 3),
                                     "generation_seconds": round(self.generation_seconds, 3)}
        return out


def _number(value: object, name: str, *, minimum: float = 0.0, strict: bool = True) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value <= minimum if strict else value < minimum):  # type: ignore[operator]
        raise ConfigurationError(f"{name} must be a finite number {'>' if strict else '≥'} {minimum:g}, got {value!r}")
    return float(value)  # type: ignore[arg-type]


def _int(value: object, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"{name} must be an integer ≥ {minimum}, got {value!r}")
    return value


def check_ask_params(*, mechanism: object = RAG.method, epsilon: object = None, delta: object = RAG.delta,
                     max_new_tokens: object = RAG.max_new_tokens, seed: object = None,
                     temperature: object = RAG.temperature, sigma: object = RAG.sigma,
                     support_top_k: object = RAG.support_top_k, adjacency: object = RAG.adjacency,
                     theta: object = RAG.theta, static_sigma: object = RAG.static_sigma, noise_scale: object = None,
                     cli: bool = False) -> None:
    """Every parameter of :meth:`PrivateRAG.ask` that can be checked before the store or the model is touched.

    >>> check_ask_params(epsilon=8)
    >>> check_ask_params(mechanism="pda")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    dpinfer.errors.ConfigurationError: unknown method 'pda'; choose one of pad, pad-as-published, static, ...
    """
    def n(name: str) -> str:
        return "--" + name.replace("_", "-") if cli else name

    if mechanism not in METHODS:
        raise ConfigurationError(f"unknown method {mechanism!r}; choose one of {', '.join(METHODS)}")
    if epsilon is not None:
        _number(epsilon, n("epsilon"))
        if mechanism not in ("pad", "pad-as-published"):
            raise ConfigurationError(f"{n('epsilon')} applies to pad, not to {mechanism}, which has no guarantee")
    if noise_scale is not None:
        _number(noise_scale, n("noise_scale"))
        if mechanism != "pad-as-published":
            raise ConfigurationError(f"{n('noise_scale')} is pad-as-published's noise knob; it does not apply to "
                                     f"{mechanism}")
    from dpinfer.checks import check_delta

    check_delta(delta)
    _int(max_new_tokens, n("max_new_tokens"))
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ConfigurationError(f"{n('seed')} must be an integer, got {seed!r}")
    _number(temperature, n("temperature"), strict=False)
    _number(sigma, n("sigma"))
    if support_top_k is not None:
        _int(support_top_k, n("support_top_k"))
    if adjacency not in ("replace-by-null", "replace-one"):
        raise ConfigurationError(f"{n('adjacency')} must be replace-by-null or replace-one, got {adjacency!r}")
    _number(theta, n("theta"))
    _number(static_sigma, n("static_sigma"))


def build_mechanism(method: str, *, epsilon: float | None, delta: float, max_new_tokens: int, temperature: float,
                    sigma: float, support_top_k: int | None, adjacency: str, static_sigma: float,
                    noise_scale: float | None = None) -> Any:
    """The mechanism that decodes ``method``'s answer (calibrated from public parameters only). For
    ``pad-as-published``, ``epsilon`` is a deprecated alias of ``noise_scale`` (the authors' knob, not a guarantee)."""
    from dpinfer.mechanisms import get_mechanism
    from dpinfer.mechanisms.pad import Pad

    if method == "pad":
        return Pad.calibrated(Budget(DEFAULT_EPSILON if epsilon is None else epsilon, delta),
                              Spec(max_new_tokens, sigma=sigma, top_k=support_top_k, temperature=temperature,
                                   adjacency=adjacency))
    if method == "pad-as-published":
        kw: dict[str, Any] = {"delta": delta, "temperature": temperature}
        knob = published_noise_scale(epsilon, noise_scale)
        if knob is not None:
            kw["noise_scale"] = knob
        return get_mechanism("pad-as-published", **kw)
    if method == "static":
        return get_mechanism("static", sigma=static_sigma, temperature=temperature)
    return get_mechanism("sampler", temperature=temperature, mode="joint")


def published_noise_scale(epsilon: float | None, noise_scale: float | None) -> float | None:
    """pad-as-published's noise knob: ``noise_scale``, else the deprecated ``epsilon`` alias, else None (default)."""
    return noise_scale if noise_scale is not None else epsilon


def _public_guarantee(delta: float, t_max: int) -> Guarantee:
    from dpinfer.accounting import Guarantee, PureDp

    return Guarantee(epsilon=0.0, delta=delta, mechanism="public",
                     adjacency="any change to the store (the question alone is decoded; nothing is retrieved)",
                     parameters={"T_max": t_max}, max_new_tokens=t_max, loss=PureDp(0.0))


def ask_guarantee(mechanism: str, **params: Any) -> Guarantee:
    """The guarantee of one answer by ``mechanism`` from its parameters alone (``params``: :func:`build_mechanism`'s
    keyword arguments), as :meth:`PrivateRAG.plan_ask` computes it: what a ledger charges before the model loads."""
    mech = build_mechanism(mechanism, **params)
    t_max = params["max_new_tokens"]
    return _public_guarantee(params["delta"], t_max) if mechanism == "public" else mech.guarantee(t_max)


STORE_LEDGER = "store"
"""``PrivateRAG(ledger=STORE_LEDGER)`` (the default): the store's own ledger, ``budget.db`` in its folder."""


def store_spend(store: str | Path, ledger: Any = STORE_LEDGER, unit: str | None = None) -> Spend | None:
    """A reservation for one answer from ``store`` on ``ledger`` (:class:`PrivateRAG`'s ``ledger``/``unit``), or None
    without a ledger. The store's own ledger is created at the first answer, with its default budget."""
    from dpinfer.accounting.ledger import Ledger
    from dpinfer.pipelines.budget import start_spend

    folder = Path(store)
    if isinstance(ledger, str) and ledger == STORE_LEDGER:
        if not folder.is_dir():
            return None  # no store, nothing stored to protect (plan_ask refuses a private answer)
        path = folder / "budget.db"
        if not path.exists():
            Ledger.init(path, epsilon=RAG.store_epsilon, delta=RAG.delta)
        ledger, unit = Ledger(path), STORE_LEDGER if unit is None else unit
    where = str(folder.resolve())
    return start_spend(ledger, unit, scope="store", default_unit=lambda book: book.unit_for_text(where))


@dataclass
class AskPlan:
    """One question planned for the engine (:meth:`PrivateRAG.plan_ask`): the job and what
    :meth:`PrivateRAG.finish_ask` needs. Its rows hold the retrieved private documents: never log or serialise it."""

    job: EngineJob
    mechanism: str
    guarantee: Guarantee
    hits: list[Hit]
    settings: dict[str, Any]
    delta: float
    adjacency: str
    t0: float


class PrivateRAG:
    """Question answering over a private document store with PAD (see the module docstring).

    >>> # rag = dpinfer.PrivateRAG("my-store")
    >>> # rag.add(["Patient: ... Doctor: ...", ...])
    >>> # answer = rag.ask("What helps against migraines?", epsilon=64)
    >>> # answer.text, answer.guarantee.epsilon, rag.session_guarantee().epsilon

    Args:
        path: the store's folder (created on the first :meth:`add`).
        lm: model (default: the embedded SmolLM2-135M-Instruct), loaded on the first :meth:`ask`.
        embedder: sentence encoder with ``encode(texts)`` (default: offline all-MiniLM-L6-v2).
        top_k: documents retrieved by embedding distance (default 6).
        top_n: documents kept after reranking and shown to the model (default 3).
        reranker: ``"maxp"`` (default, :class:`dpinfer.rag.rerank.PassageReranker`), ``"none"`` or a callable.
        max_doc_tokens: each retrieved document is cut to this many tokens (a public bound on the private row's
            length, so the public row's padding never depends on it).
        template: the prompts (:class:`RagTemplate`).
        ledger: the privacy-budget ledger every answer is charged to (:mod:`dpinfer.pipelines.budget`; the unit is
            the store: the answers compose). ``"store"`` (default): the store's own, ``budget.db`` in its folder,
            created at the first answer with a budget of ε = ``RAG.store_epsilon`` (δ = ``RAG.delta``) for the unit
            ``"store"``, so the store's budget holds across processes (``dpinfer budget show --ledger
            STORE/budget.db``); a :class:`~dpinfer.Ledger` or its path (unit: a keyed hash of the store's path); None:
            no ledger (only :meth:`session_guarantee` adds the answers up). A mechanism without a guarantee
            (``none``, ``static``, ...) costs ε = ∞ and is refused by every ledger.
        unit: the store's unit on the ledger (default: see ``ledger``).
    """

    def __init__(self, path: str | Path, *, lm: LM | str | None = None, embedder: Any = None,
                 top_k: int = RAG.top_k, top_n: int = RAG.top_n, reranker: str | Callable[..., Any] = "maxp",
                 max_doc_tokens: int = RAG.max_doc_tokens, template: RagTemplate | None = None,
                 ledger: Any = STORE_LEDGER, unit: str | None = None) -> None:
        from dpinfer.rag.store import DocumentStore

        self.top_k = _int(top_k, "top_k")
        self.top_n = _int(top_n, "top_n")
        if self.top_n > self.top_k:
            raise ConfigurationError(f"top_n ({top_n}) cannot exceed top_k ({top_k}): reranking keeps a subset")
        if not (reranker in ("maxp", "none") or callable(reranker)):
            raise ConfigurationError(f"unknown reranker {reranker!r}; use 'maxp', 'none' or a callable")
        self.reranker = reranker
        self.max_doc_tokens = _int(max_doc_tokens, "max_doc_tokens")
        self.template = template or RagTemplate()
        self.store: DocumentStore = DocumentStore(path, embedder=embedder, create=True)
        self._lm_arg = lm
        self._lm: LM | None = None
        self._engine: Any = None
        self._session: list[tuple[str, PrivacyLoss | None, float, str]] = []
        self._deltas: list[float] = []
        self._ledger_arg = ledger
        self._unit = unit

    # ------------------------------------------------------------------ budget
    def _spend(self, ledger: Any = STORE_LEDGER, unit: str | None = None) -> Spend | None:
        """A reservation for one answer on the store's unit (None without a ledger)."""
        if isinstance(ledger, str) and ledger == STORE_LEDGER:  # the object's own setting
            ledger, unit = self._ledger_arg, self._unit if unit is None else unit
        return store_spend(self.store.path, ledger, unit)

    # ------------------------------------------------------------------ store
    def add(self, texts_or_records: Sequence[str] | Sequence[Mapping[str, Any]], *, ids: Sequence[str] | None = None,
            text_field: str = "text", id_field: str | None = None) -> AddReport:
        """Add documents: strings, or records (mappings) whose ``text_field`` holds the text and, optionally,
        ``id_field`` the id. Ids default to a hash of the text (re-adding changes nothing)."""
        if isinstance(texts_or_records, (str, bytes)) or not isinstance(texts_or_records, Sequence):
            raise InvalidInputError("add() takes a list of texts or of records (mappings)")
        texts: list[str] = []
        rec_ids: list[str] = []
        for i, item in enumerate(texts_or_records):
            if isinstance(item, str):
                texts.append(item)
                continue
            if not isinstance(item, Mapping):
                raise InvalidInputError(f"document {i} is a {type(item).__name__}, not a string or a mapping")
            if text_field not in item or not isinstance(item[text_field], str):
                raise InvalidInputError(f"record {i}: no text field {text_field!r} holding a string")
            texts.append(item[text_field])
            if id_field is not None:
                if id_field not in item or item[id_field] in (None, ""):
                    raise InvalidInputError(f"record {i}: no id field {id_field!r}")
                rec_ids.append(str(item[id_field]))
        if ids is None and id_field is not None:
            ids = rec_ids
        return self.store.add(texts, ids=ids)

    def add_files(self, paths: Sequence[str | Path], *, text_field: str = "text",
                  id_field: str | None = None) -> AddReport:
        """Add the documents of ``.jsonl`` / ``.csv`` files (one record per line / row) and ``.txt`` files (one
        document each). Every file is read and checked before anything is stored."""
        texts, ids = read_documents(paths, text_field=text_field, id_field=id_field)
        return self.store.add(texts, ids=ids)

    def info(self) -> dict[str, Any]:
        return {**self.store.info(), "top_k": self.top_k, "top_n": self.top_n,
                "reranker": self.reranker if isinstance(self.reranker, str) else "custom"}

    # ------------------------------------------------------------------ retrieval
    def retrieve(self, question: str) -> list[Hit]:
        """The ``top_n`` documents for ``question``: ``top_k`` by embedding distance, reranked (PRIVATE)."""
        from dpinfer.rag.rerank import rerank
        from dpinfer.validation import check_text

        check_text(question, "the question")
        hits = self.store.query(question, self.top_k)
        return rerank(question, hits, self.top_n, self.store.embed_query, self.reranker)

    # ------------------------------------------------------------------ generation
    @property
    def lm(self) -> LM:
        if self._lm is None:
            from dpinfer.generation import resolve_lm

            self._lm = resolve_lm(self._lm_arg)
        return self._lm

    @property
    def engine(self) -> Any:
        if self._engine is None:
            from dpinfer.engine import Engine

            self._engine = Engine(self.lm)
        return self._engine

    def _cut(self, text: str, doc_tokens: int | None = None) -> str:
        limit = self.max_doc_tokens if doc_tokens is None else doc_tokens
        ids = self.lm.encode(text)
        return text if len(ids) <= limit else self.lm.decode(ids[:limit])

    def public_ids(self, question: str) -> list[int]:
        """Token ids of the public row: the question alone (the null context)."""
        return self.lm.encode(self.template.wrap(self.lm, self.template.render_public(question)))

    def private_ids(self, question: str, documents: Sequence[str], doc_tokens: int | None = None) -> list[int]:
        """Token ids of the private row: the question with ``documents`` (each cut to ``doc_tokens``, default
        ``max_doc_tokens``). The row never exceeds :meth:`pad_width` at that budget: should the joined documents
        re-tokenise longer, each is cut further (a function of the private row alone, which the clip covers)."""
        limit = self.max_doc_tokens if doc_tokens is None else doc_tokens
        width = self.pad_width(question, limit)
        while True:
            context = self.template.separator.join(self._cut(d, limit) for d in documents)
            ids = self.lm.encode(self.template.wrap(self.lm, self.template.render_private(context, question)))
            if len(ids) <= width or limit <= 1:
                return ids[:width]
            limit = max(1, limit - max(1, (len(ids) - width) // max(1, len(documents))))

    def pad_width(self, question: str, doc_tokens: int | None = None) -> int:
        """The engine's padding width, from PUBLIC quantities only: the private template with an empty context for
        this question, plus ``top_n · (doc_tokens + slack)`` (``doc_tokens`` default ``max_doc_tokens``)."""
        empty = self.lm.encode(self.template.wrap(self.lm, self.template.render_private("", question)))
        limit = self.max_doc_tokens if doc_tokens is None else doc_tokens
        return len(empty) + self.top_n * (limit + DOC_SLACK)

    def doc_budget(self, question: str, max_new_tokens: int) -> int:
        """Tokens per retrieved document, from PUBLIC quantities only (the question, ``top_n``, ``max_doc_tokens``,
        ``T_max`` and the model's context window): ``max_doc_tokens``, or fewer when :meth:`pad_width` plus
        ``T_max`` would not fit the window. Refused (one line, before anything is retrieved) when fewer than
        :data:`MIN_DOC_TOKENS` per document would fit."""
        from dpinfer.errors import ContextTooLongError

        window = self.lm.context_window
        empty = self.pad_width(question, 0) - self.top_n * DOC_SLACK
        fits = (window - max_new_tokens - empty) // self.top_n - DOC_SLACK
        if fits >= self.max_doc_tokens:
            return self.max_doc_tokens
        if fits < MIN_DOC_TOKENS:
            raise ContextTooLongError(
                f"the question's prompt ({empty} tokens) with top_n={self.top_n} documents of at least "
                f"{MIN_DOC_TOKENS} tokens and max_new_tokens={max_new_tokens} does not fit the model's context window "
                f"of {window} tokens; lower --max-new-tokens or --top-n, or shorten the question")
        return fits

    def _summary_jobs(self, question: str, hits: Sequence[Hit], seed: int | None) -> list[Any]:
        """One greedy engine job per retrieved document: the ``summarize`` baseline's query-focused condensation.
        Each job's padding width is public (the summary prompt with an empty document plus ``max_doc_tokens``), so
        the jobs of many questions batch in one :meth:`Engine.run_jobs <dpinfer.engine.Engine.run_jobs>` call."""
        from dpinfer.engine import EngineJob
        from dpinfer.mechanisms.sampler import Sampler

        empty = self.template.summary.replace("{document}", "").replace("{question}", question)
        width = len(self.lm.encode(self.template.wrap(self.lm, empty))) + self.max_doc_tokens + DOC_SLACK
        jobs = []
        for hit in hits:
            prompt = self.template.summary.replace("{document}", self._cut(hit.text)).replace("{question}", question)
            ids = self.lm.encode(self.template.wrap(self.lm, prompt))
            jobs.append(EngineJob(contexts=[ids], mechanism=Sampler(temperature=0.0, mode="joint"),
                                  max_new_tokens=SUMMARY_TOKENS, seed=seed, pad_width=width))
        return jobs

    def _summaries_many(self, items: Sequence[tuple[str, Sequence[Hit], int | None]]) -> list[list[str]]:
        """The summaries of every (question, hits, seed) item, all documents in one engine run (empty ones dropped)."""
        jobs, owner = [], []
        for n, (question, hits, seed) in enumerate(items):
            for job in self._summary_jobs(question, hits, seed):
                jobs.append(job)
                owner.append(n)
        texts: list[str | None] = [None] * len(jobs)
        if jobs:
            for j, out in self.engine.run_jobs(jobs):
                texts[j] = self.lm.decode(out.sequences[0]).strip()
        summaries: list[list[str]] = [[] for _ in items]
        for n, text in zip(owner, texts, strict=True):
            if text:
                summaries[n].append(text)
        return summaries

    def ask(self, question: str, *, mechanism: str = RAG.method, epsilon: float | None = None,
            delta: float = RAG.delta, max_new_tokens: int = RAG.max_new_tokens, seed: int | None = None,
            temperature: float = RAG.temperature, sigma: float = RAG.sigma,
            support_top_k: int | None = RAG.support_top_k, adjacency: str = RAG.adjacency,
            theta: float = RAG.theta, static_sigma: float = RAG.static_sigma, min_new_tokens: int = 0,
            noise_scale: float | None = None, ledger: Any = STORE_LEDGER, unit: str | None = None) -> RagAnswer:
        """Answer ``question`` from the store with ``mechanism`` (see the module docstring).

        Args:
            epsilon: target ε per answer for ``pad`` (default :data:`DEFAULT_EPSILON`); for ``pad-as-published`` a
                deprecated alias of ``noise_scale``.
            delta: δ of the guarantee.
            max_new_tokens: ``T_max``: the guarantee is computed for it.
            seed: tests and benchmarks only (the guarantee then holds only while the seed is secret; never stored).
            temperature: 0 (default): argmax / greedy; τ > 0 samples.
            sigma: PAD's noise σ (C is solved from ε). support_top_k: k of PAD's public Top-k⁺ support.
            adjacency: ``replace-by-null`` (default) or ``replace-one`` (sensitivity 2C).
            theta: ``distance-threshold``'s maximum Euclidean distance. static_sigma: ``static``'s noise.
            min_new_tokens: benchmarks only: EOS is masked (for every row alike) before this many tokens.
            noise_scale: ``pad-as-published``'s noise knob (the authors call it ε; default 0.2): NOT a guarantee.
            ledger, unit: the ledger and unit this answer is charged to (default: the object's, see the class);
                the charge is reserved before the model loads and refused (:class:`~dpinfer.errors.
                BudgetExceededError`) when the store's budget cannot afford it.
        """
        spend = self._spend(ledger, unit)
        try:
            plan = self.plan_ask(question, mechanism=mechanism, epsilon=epsilon, delta=delta,
                                 max_new_tokens=max_new_tokens, seed=seed, temperature=temperature, sigma=sigma,
                                 support_top_k=support_top_k, adjacency=adjacency, theta=theta,
                                 static_sigma=static_sigma, min_new_tokens=min_new_tokens, noise_scale=noise_scale,
                                 on_guarantee=None if spend is None else spend.settle)
            job = plan.job
            g0 = time.perf_counter()
            out = self.engine.generate(job.contexts, job.mechanism, max_new_tokens=job.max_new_tokens, seed=job.seed,
                                       pad_width=job.pad_width, min_new_tokens=job.min_new_tokens)
            answer = self.finish_ask(plan, out, generation_seconds=time.perf_counter() - g0)
        except BaseException:
            if spend is not None:
                spend.cancel()
            raise
        if spend is not None:
            spend.commit()
        return answer

    def plan_ask(self, question: str, *, mechanism: str = RAG.method, epsilon: float | None = None,
                 delta: float = RAG.delta, max_new_tokens: int = RAG.max_new_tokens, seed: int | None = None,
                 temperature: float = RAG.temperature, sigma: float = RAG.sigma,
                 support_top_k: int | None = RAG.support_top_k, adjacency: str = RAG.adjacency,
                 theta: float = RAG.theta, static_sigma: float = RAG.static_sigma, min_new_tokens: int = 0,
                 noise_scale: float | None = None, checked: bool = False,
                 prepared: tuple[list[Hit], list[str]] | None = None,
                 on_guarantee: Callable[[Guarantee], None] | None = None) -> AskPlan:
        """Everything :meth:`ask` does before the engine runs (arguments: see there): the checks, the calibrated
        mechanism and its guarantee, retrieval and the rows, as an :class:`~dpinfer.engine.EngineJob` with what
        :meth:`finish_ask` needs. ``checked=True`` skips the parameter checks (made once for many questions);
        ``prepared``: the (hits, documents) :meth:`ask_many` already retrieved (and summarised) for this question.
        ``on_guarantee(guarantee)`` is called with the answer's guarantee before the store is read or the model loads
        (a ledger's charge; :meth:`ask` and :meth:`ask_many` charge, a caller of plan_ask charges itself).

        Every job gets a PUBLIC padding width (:meth:`pad_width`; the question's own length for ``public``), so
        that jobs of every mechanism batch in :meth:`Engine.run_jobs <dpinfer.engine.Engine.run_jobs>`; a one-row
        job run alone (:meth:`ask`) is not padded."""
        from dpinfer.engine import EngineJob
        from dpinfer.validation import check_text

        t0 = time.perf_counter()
        check_text(question, "the question")
        if not checked:
            check_ask_params(mechanism=mechanism, epsilon=epsilon, delta=delta, max_new_tokens=max_new_tokens,
                             seed=seed, temperature=temperature, sigma=sigma, support_top_k=support_top_k,
                             adjacency=adjacency, theta=theta, static_sigma=static_sigma, noise_scale=noise_scale)
        # calibrated before anything private is read or the model loads (an unreachable ε is refused at once)
        mech = build_mechanism(mechanism, epsilon=epsilon, delta=delta, max_new_tokens=max_new_tokens,
                               temperature=temperature, sigma=sigma, support_top_k=support_top_k,
                               adjacency=adjacency, static_sigma=static_sigma, noise_scale=noise_scale)
        if mechanism == "public":
            guarantee = _public_guarantee(delta, max_new_tokens)
        else:
            guarantee = mech.guarantee(max_new_tokens)
        if on_guarantee is not None:
            on_guarantee(guarantee)
        if mechanism != "public" and self.store.count() == 0:
            raise InvalidInputError(f"the store {self.store.path} holds no documents; add some with: "
                                    f"dpinfer rag add {self.store.path} FILES...")
        # tokens per document so that the padded rows and T_max fit the window: public, before anything is retrieved
        doc_tokens = self.max_doc_tokens if mechanism == "public" else self.doc_budget(question, max_new_tokens)
        if prepared is not None:
            hits, documents = prepared
        else:
            hits = [] if mechanism == "public" else self.retrieve(question)
            if mechanism == "distance-threshold":
                hits = [h for h in hits if h.distance <= theta]
            if mechanism == "summarize":
                documents = self._summaries_many([(question, hits, seed)])[0]
            else:
                documents = [h.text for h in hits]
        public = self.public_ids(question)
        if mechanism == "public" or (not documents and mechanism != "pad"):
            # nothing retrieved (or all dropped): the question alone, padded as if documents had been shown
            rows, width = [public], len(public) if mechanism == "public" else self.pad_width(question, doc_tokens)
        elif mechanism == "pad":
            rows = [public, self.private_ids(question, documents, doc_tokens) if documents else public]
            width = self.pad_width(question, doc_tokens)
        else:
            rows, width = [self.private_ids(question, documents, doc_tokens)], self.pad_width(question, doc_tokens)
        if seed is not None:
            guarantee = dataclasses.replace(guarantee, seeded=True)
        settings = {"mechanism": mechanism, "epsilon": (DEFAULT_EPSILON if epsilon is None else epsilon)
                    if mechanism == "pad" else None,  # a guarantee's target only: no other method's knob is an ε
                    "delta": delta, "max_new_tokens": max_new_tokens, "temperature": temperature,
                    "top_k": self.top_k, "top_n": self.top_n, "max_doc_tokens": doc_tokens,
                    "model": self.lm.name}  # never the seed
        if mechanism == "pad":
            settings.update(sigma=sigma, support_top_k=support_top_k, adjacency=adjacency,
                            clip_norm=mech.clip_norm)
        elif mechanism == "distance-threshold":
            settings["theta"] = theta
        elif mechanism == "static":
            settings["static_sigma"] = static_sigma
        elif mechanism == "pad-as-published":
            settings["noise_scale"] = mech.params["noise_scale"]
        job = EngineJob(contexts=rows, mechanism=mech, max_new_tokens=max_new_tokens, seed=seed, pad_width=width,
                        min_new_tokens=min(min_new_tokens, max_new_tokens))
        return AskPlan(job=job, mechanism=mechanism, guarantee=guarantee, hits=hits, settings=settings,
                       delta=float(delta), adjacency=adjacency, t0=t0)

    def finish_ask(self, plan: AskPlan, out: EngineOutput, *, generation_seconds: float = 0.0) -> RagAnswer:
        """The :class:`RagAnswer` of a planned question (:meth:`plan_ask`) from its engine output; the answer is
        charged to this session (:meth:`session_guarantee`)."""
        mech, mechanism, max_new_tokens = plan.job.mechanism, plan.mechanism, plan.job.max_new_tokens
        ids = out.sequences[0]
        dd: dict[str, Any] = {}
        if mechanism == "pad-as-published":
            dd["authors_figure"] = mech.spend().to_dict()  # type: ignore[attr-defined]
            dd["charged_share"] = mech.charged_share()  # type: ignore[attr-defined]
        loss = getattr(mech, "loss", None)
        self._deltas.append(plan.delta)
        self._session.append((mechanism, loss(max_new_tokens) if mechanism == "pad" and loss else None,
                              float(plan.guarantee.epsilon), plan.adjacency if mechanism == "pad" else ""))
        return RagAnswer(text=self.lm.decode(ids).strip(), doc_ids=[h.id for h in plan.hits],
                         guarantee=plan.guarantee, mechanism=mechanism, settings=plan.settings,
                         seconds=time.perf_counter() - plan.t0, generation_seconds=generation_seconds,
                         tokens=len(ids), finish_reason=out.finish_reasons[0], token_ids=list(ids),
                         retrieved=list(plan.hits), data_dependent=dd)

    def ask_many(self, questions: Sequence[str], *, ids: Sequence[str | int] | None = None,
                 **options: Any) -> Iterator[tuple[int, RagAnswer | None, str | None]]:
        """Answer many questions: plan each (:meth:`plan_ask`; ``options`` are :meth:`ask`'s keyword arguments,
        checked once), run every planned job through ONE :meth:`Engine.run_jobs <dpinfer.engine.Engine.run_jobs>`
        call, and yield ``(index, answer, None)`` as each finishes, or ``(index, None, error)`` for a question that
        could not be planned (``error``: one line, no private text). Every answer is charged to this session: the
        answers compose (:meth:`session_guarantee`), since they all read the same store. With a ``seed`` (tests and
        benchmarks only), question ``i`` uses ``record_seed(seed, ids[i])`` (``ids`` default: the indices), so its
        answer does not depend on the other questions. With a ledger (``ledger``/``unit`` options, default: the
        object's), each answer is reserved on the store's unit when it is planned (a question the budget cannot
        afford is reported as refused, nothing generated for it) and committed when it is yielded."""
        from dpinfer.pipelines.budget import Spend
        from dpinfer.pipelines.sanitize import record_error, record_seed

        book = self._spend(options.pop("ledger", STORE_LEDGER), options.pop("unit", None))
        spends: dict[int, Spend] = {}
        seed = options.pop("seed", None)
        check_ask_params(**{k: v for k, v in options.items() if k != "min_new_tokens"}, seed=seed)
        if ids is not None and len(ids) != len(questions):
            raise InvalidInputError(f"ask_many: {len(ids)} ids for {len(questions)} questions")
        seeds = [record_seed(seed, i if ids is None else ids[i]) for i in range(len(questions))]
        prepared: dict[int, tuple[list[Hit], list[str]]] = {}
        failed: set[int] = set()
        if options.get("mechanism") == "summarize":  # every question's summaries in one engine run
            retrieved = []
            for i, question in enumerate(questions):
                try:
                    retrieved.append((i, self.retrieve(question)))
                except Exception as exc:  # a per-question refusal: reported, the others go on
                    failed.add(i)
                    yield i, None, record_error(exc)
            summaries = self._summaries_many([(questions[i], hits, seeds[i]) for i, hits in retrieved])
            prepared = {i: (hits, docs) for (i, hits), docs in zip(retrieved, summaries, strict=True)}
        plans: list[tuple[int, AskPlan]] = []
        try:
            for i, question in enumerate(questions):
                if i in failed:
                    continue
                spend = None if book is None else Spend(book.ledger, book.unit, book.scope)
                try:
                    plans.append((i, self.plan_ask(question, seed=seeds[i], checked=True, prepared=prepared.get(i),
                                                   on_guarantee=None if spend is None else spend.settle, **options)))
                except Exception as exc:  # a per-question refusal: reported, the others go on
                    if spend is not None:
                        spend.cancel()
                    yield i, None, record_error(exc)
                    continue
                if spend is not None:
                    spends[i] = spend
            if not plans:
                return
            for j, out in self.engine.run_jobs([p.job for _, p in plans]):
                i, plan = plans[j]
                answer = self.finish_ask(plan, out)
                spend = spends.pop(i, None)
                if spend is not None:
                    spend.commit()
                yield i, answer, None
        finally:  # what was reserved and never answered released nothing
            for spend in spends.values():
                spend.cancel()

    # ------------------------------------------------------------------ session
    @property
    def answers(self) -> int:
        """Answers given in this session (this object)."""
        return len(self._session)

    def session_guarantee(self) -> Guarantee:
        """The guarantee of every answer of this session together: the answers' zCDP losses add (sequential,
        adaptive composition), converted once. Any answer without a guarantee voids it (ε = ∞); ``public`` answers
        cost nothing. The adjacency is each answer's own, applied to every answer at once: a document retrieved for
        several answers is covered by the total."""
        from dpinfer.accounting import Guarantee, Zcdp, compose

        delta = max(self._deltas, default=1e-5)
        if not self._session:
            return Guarantee(0.0, delta, "rag-session", "no answer given yet", parameters={"answers": 0})
        if any(loss is None and method != "public" for method, loss, _, _ in self._session):
            return Guarantee.no_privacy("rag-session")
        losses = [loss for _, loss, _, _ in self._session if loss is not None]
        total = compose(*losses) if losses else Zcdp(0.0)
        adjacencies = sorted({adj for _, _, _, adj in self._session if adj})
        adjacency = (" and ".join(adjacencies) or "any change to the store") + \
            f" of the retrieved context of each of the {len(self._session)} answers, all at once"
        rho = float(getattr(total, "rho", math.nan))
        return Guarantee.from_loss(total, delta=delta, mechanism="rag-session", adjacency=adjacency,
                                   parameters={"answers": len(self._session), "rho": rho}, max_new_tokens=None)


# ------------------------------------------------------------------------------------------------------ files
TEXT_SUFFIXES = (".jsonl", ".csv", ".txt", ".md")


def read_documents(paths: Sequence[str | Path], *, text_field: str = "text",
                   id_field: str | None = None) -> tuple[list[str], list[str] | None]:
    """Texts (and ids when ``id_field`` is given) of ``.jsonl`` / ``.csv`` records and ``.txt`` / ``.md`` files.

    Refused with a one-line message naming the file (never its content): a missing file, a folder, another suffix,
    a binary or non-UTF-8 file, an empty file, a record without the field.
    """
    from dpinfer.pipelines.synthesize import load_references
    from dpinfer.validation import input_file

    if isinstance(paths, (str, Path)) or not paths:
        raise InvalidInputError("give one or more files to add")
    texts: list[str] = []
    ids: list[str] = []
    for raw in paths:
        p = input_file(raw, "document")
        suffix = p.suffix.lower()
        if suffix not in TEXT_SUFFIXES:
            raise InvalidInputError(f"{p.name}: give .jsonl, .csv, .txt or .md files (got {suffix or 'no suffix'})")
        if suffix in (".jsonl", ".csv"):
            refs = load_references(p, text_field=text_field, label_fields=(id_field,) if id_field else ())
            for r in refs:
                texts.append(r.text)
                if id_field:
                    ids.append(r.labels[id_field])
            continue
        text = decode_text(p.read_bytes(), p.name)
        texts.append(text)
        if id_field:
            ids.append(p.stem)
    for i, t in enumerate(texts):
        if not t.strip():
            raise InvalidInputError(f"document {i} is empty (or only white space)")
    return texts, (ids if id_field else None)
