"""Private retrieval-augmented generation: answers about private documents with a guarantee for their context.

:class:`PrivateRAG` keeps the documents in a persistent Chroma store (:mod:`dpinfer.rag.store`, offline embeddings),
retrieves the ``top_k`` nearest (default 6), reranks them offline to ``top_n`` (default 3, :mod:`dpinfer.rag.rerank`)
and answers with one of the methods of :data:`dpinfer.methods.rag.TABLE` (their runners:
:mod:`dpinfer.rag.answering`). Prompts are one user turn in the model's chat template (:class:`RagTemplate`, with the
rows built in :mod:`dpinfer.rag.prompts`).

What is protected (``pad``): the retrieved context of ONE answer, i.e. the documents shown to the model for it, under
replace-by-null (the context replaced by nothing; default) or replace-one (replaced by any other context: this also
covers a document that changes which documents are retrieved). What is not: the question (it is the public row), which
documents exist and which were retrieved (``doc_ids``, for the store's owner: not part of the release), the store
itself, and timing. A session of k answers composes: every answer is composed into the session's
:class:`~dpinfer.accounting.PrivacyAccountant` (:attr:`PrivateRAG.accountant`), whose guarantee is
:meth:`PrivateRAG.session_guarantee`.

Methods (``mechanism=``): ``pad`` (default; rigorous PAD, K = 2: the question alone is the public row 0, with the
documents row 1; C calibrated from (ε, δ, T_max) with σ fixed), ``pad-as-published`` (the authors' step; no
guarantee), ``static`` (fixed noise; no guarantee), and the baselines ``none`` (the documents, no defence), ``public``
(the question alone: ε = 0), ``summarize`` (documents condensed first, Zeng et al. 2024) and ``distance-threshold``
(documents farther than ``theta`` dropped, Zeng et al. 2024).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpinfer.accounting import Adjacency, Guarantee, PrivacyAccountant, Zcdp
from dpinfer.accounting.calibration import zcdp_rho
from dpinfer.accounting.charge import Charges, Reservation, charge, close, hold, open_reservation, run_charged
from dpinfer.accounting.ledger import Ledger
from dpinfer.checks import positive_int
from dpinfer.configs.ask import AskConfig
from dpinfer.defaults import RAG
from dpinfer.engine import Engine, Job
from dpinfer.errors import ConfigurationError, InvalidInputError
from dpinfer.methods.rag import TABLE
from dpinfer.pipelines.sanitize_many import record_error, record_seed
from dpinfer.rag.answer import AskPlan, RagAnswer
from dpinfer.rag.answering import AnswerMethod
from dpinfer.rag.documents import read_documents, read_records
from dpinfer.rag.prompts import DOC_SLACK, RagRows, RagTemplate
from dpinfer.rag.rerank import rerank
from dpinfer.rag.store import AddReport, DocumentStore, Hit
from dpinfer.runtime import Runtime, resolve_runtime
from dpinfer.validation import check_text

if TYPE_CHECKING:
    from dpinfer.engine import EngineOutput
    from dpinfer.models import LM

__all__ = ["DEFAULT_EPSILON", "DEFAULT_THETA", "METHODS", "STORE_LEDGER", "PrivateRAG",
           "answer_method", "ask_guarantee", "compose_answer",
           "released_answer_method", "store_reservation"]

METHODS = tuple(TABLE.names())
"""The answering methods' names (read from :data:`dpinfer.methods.rag.TABLE`)."""
DEFAULT_EPSILON = RAG.epsilon
"""ε per answer of the default ``pad`` (at δ = 1e-5, T_max = 64, σ = 1.5: C ≈ 1.43); see docs/rag.md, "choosing ε"."""
DEFAULT_THETA = RAG.theta
"""Distance threshold of ``distance-threshold`` (Euclidean, unit vectors: cos ≥ 1 − θ²/2 ≈ 0.6)."""
STORE_LEDGER = "store"
"""``PrivateRAG(ledger=STORE_LEDGER)`` (the default): the store's own ledger, ``budget.db`` in its folder."""
SESSION_ADJACENCY = "the retrieved context of each of the {n} answers, all at once"


def answer_method(config: AskConfig, runtime: Any = None) -> AnswerMethod:
    """The runner of ``config.mechanism``, built through the method table (every method check made: the name, the
    knobs that apply to it, and PAD's calibration, which refuses an unreachable ε), from public parameters only."""
    method: AnswerMethod = TABLE.build(config.mechanism, config, runtime)
    method.mechanism  # noqa: B018  # calibrated now: an unreachable ε is refused here, before anything is read
    return method


def ask_guarantee(mechanism: str, **params: Any) -> Guarantee:
    """The guarantee of one answer by ``mechanism`` from its parameters alone, as :meth:`PrivateRAG.plan_ask` computes
    it: what a ledger charges before the model loads."""
    return answer_method(AskConfig.merged(None, mechanism=mechanism, **params)).guarantee()


def compose_answer(accountant: PrivacyAccountant, method: AnswerMethod) -> None:
    """Compose one answer of ``method`` into ``accountant``: the method's frozen loss event, ``T_max`` times (the one
    place an answer's loss is composed: a session's answers, an answer file's)."""
    event, count = method.loss_event()
    accountant.compose(event, count, adjacency=method.adjacency, label=method.name, delta=method.config.delta)


def released_answer_method(release: Mapping[str, Any]) -> AnswerMethod | None:
    """The method of a released answer (:meth:`RagAnswer.release`), rebuilt through the method table from its
    public settings; None when they do not give back the guarantee it was released with (or it has none)."""
    settings = release.get("settings")
    guarantee = release.get("guarantee")
    if not isinstance(settings, Mapping) or not isinstance(guarantee, Mapping):
        return None
    fields = {k: v for k, v in settings.items() if k in AskConfig.field_names() and v is not None}
    fields["mechanism"] = release.get("mechanism", settings.get("mechanism"))
    try:
        method = answer_method(AskConfig.merged(None, **fields))
        rebuilt, released = method.guarantee().to_dict(), Guarantee.from_dict(guarantee).to_dict()
        # what the loss is made of (a seeded test run says more in its statement: the same guarantee)
        same = all(rebuilt.get(k) == released.get(k) for k in ("epsilon", "delta", "mechanism", "parameters",
                                                                 "max_new_tokens", "order", "groups", "accounting"))
    except Exception:  # a release this version cannot rebuild: no guarantee to compose
        return None
    return method if same and math.isfinite(method.guarantee().epsilon) else None


def store_reservation(store: str | Path, ledger: Any = STORE_LEDGER, unit: str | None = None) -> Reservation | None:
    """A reservation (nothing reserved yet) for one answer from ``store`` on ``ledger`` (:class:`PrivateRAG`'s
    ``ledger``/``unit``), or None without a ledger: charged through :func:`~dpinfer.accounting.charge.charge`. The
    store's own ledger is created at the first answer, with its default budget."""
    folder = Path(store)
    if isinstance(ledger, str) and ledger == STORE_LEDGER:
        if not folder.is_dir():
            return None  # no store, nothing stored to protect (plan_ask refuses a private answer)
        path = folder / "budget.db"
        if not path.exists():
            Ledger.init(path, epsilon=RAG.store_epsilon, delta=RAG.delta)
        ledger, unit = Ledger(path), STORE_LEDGER if unit is None else unit
    where = str(folder.resolve())
    return open_reservation(ledger, unit, scope="store", default_unit=lambda book: book.unit_for_text(where))


class PrivateRAG:
    """Question answering over a private document store with PAD (see the module docstring).

    >>> # rag = dpinfer.PrivateRAG("my-store")
    >>> # rag.add(["Patient: ... Doctor: ...", ...])
    >>> # answer = rag.ask("What helps against migraines?", epsilon=64)
    >>> # answer.text, answer.guarantee.epsilon, rag.session_guarantee().epsilon

    Args:
        path: the store's folder (created on the first :meth:`add`), or a :class:`~dpinfer.rag.store.DocumentStore`
            (e.g. one on a Chroma server, :mod:`dpinfer.rag.server`).
        lm: model (default: the embedded SmolLM2-135M-Instruct), loaded on the first :meth:`ask`.
        embedder: sentence encoder with ``encode(texts)`` (default: offline all-MiniLM-L6-v2).
        top_k: documents retrieved by embedding distance (default 6).
        top_n: documents kept after reranking and shown to the model (default 3).
        reranker: ``"maxp"`` (default, :class:`dpinfer.rag.rerank.PassageReranker`), ``"none"`` or a callable.
        max_doc_tokens: each retrieved document is cut to this many tokens (a public bound on the private row's
            length, so the public row's padding never depends on it).
        template: the prompts (:class:`RagTemplate`).
        ledger: the privacy-budget ledger every answer is charged to (:func:`dpinfer.accounting.charge.charge`; the
            unit is the store: the answers compose). ``"store"`` (default): the store's own, ``budget.db`` in its
            folder, created at the first answer with a budget of ε = ``RAG.store_epsilon`` (δ = ``RAG.delta``) for the
            unit ``"store"``, so the store's budget holds across processes (``dpinfer budget show --ledger
            STORE/budget.db``); a :class:`~dpinfer.Ledger` or its path (unit: a keyed hash of the store's path); None:
            no ledger (only :meth:`session_guarantee` adds the answers up). A mechanism without a guarantee
            (``none``, ``static``, ...) costs ε = ∞ and is refused by every ledger.
        unit: the store's unit on the ledger (default: see ``ledger``).
        runtime: the :class:`~dpinfer.runtime.Runtime` whose model, engine and embedder answer (default: one on
            ``lm``, or the process's default runtime; give ``runtime`` or ``lm``, not both).
    """

    doc_slack = DOC_SLACK

    def __init__(self, path: str | Path | DocumentStore, *, lm: LM | str | None = None, embedder: Any = None,
                 top_k: int = RAG.top_k, top_n: int = RAG.top_n, reranker: str | Callable[..., Any] = "maxp",
                 max_doc_tokens: int = RAG.max_doc_tokens, template: RagTemplate | None = None,
                 ledger: Any = STORE_LEDGER, unit: str | None = None, runtime: Any = None) -> None:
        self.top_k = positive_int(top_k, "top_k")
        self.top_n = positive_int(top_n, "top_n")
        if self.top_n > self.top_k:
            raise ConfigurationError(f"top_n ({top_n}) cannot exceed top_k ({top_k}): reranking keeps a subset")
        if not (reranker in ("maxp", "none") or callable(reranker)):
            raise ConfigurationError(f"unknown reranker {reranker!r}; use 'maxp', 'none' or a callable")
        self.reranker = reranker
        self.max_doc_tokens = positive_int(max_doc_tokens, "max_doc_tokens")
        self.template = template or RagTemplate()
        self.runtime: Runtime = resolve_runtime(runtime, lm=lm)
        if embedder is None and runtime is not None:
            embedder = runtime.embedder
        self.store: DocumentStore = path if isinstance(path, DocumentStore) else \
            DocumentStore(path, embedder=embedder, create=True)  # a store on a Chroma server comes made
        self.accountant = PrivacyAccountant()
        """Every answer of this session (this object), composed: :meth:`session_guarantee`."""
        self._ledger_arg = ledger
        self._unit = unit

    # ------------------------------------------------------------------ budget
    def _spend(self, ledger: Any = STORE_LEDGER, unit: str | None = None) -> Reservation | None:
        """A reservation for one answer on the store's unit (None without a ledger)."""
        if isinstance(ledger, str) and ledger == STORE_LEDGER:  # the object's own setting
            ledger, unit = self._ledger_arg, self._unit if unit is None else unit
        return store_reservation(self.store.path, ledger, unit)

    # ------------------------------------------------------------------ store
    def add(self, texts_or_records: Sequence[str] | Sequence[Mapping[str, Any]], *, ids: Sequence[str] | None = None,
            text_field: str = "text", id_field: str | None = None) -> AddReport:
        """Add documents: strings, or records (mappings) whose ``text_field`` holds the text and, optionally,
        ``id_field`` the id. Ids default to a hash of the text (re-adding changes nothing)."""
        texts, ids = read_records(texts_or_records, ids=ids, text_field=text_field, id_field=id_field)
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

    def retrieve(self, question: str) -> list[Hit]:
        """The ``top_n`` documents for ``question``: ``top_k`` by embedding distance, reranked (PRIVATE)."""
        check_text(question, "the question")
        hits = self.store.query(question, self.top_k)
        return rerank(question, hits, self.top_n, self.store.embed_query, self.reranker)

    # ------------------------------------------------------------------ model and rows
    @property
    def lm(self) -> LM:
        """The runtime's model (loaded on first use)."""
        return self.runtime.lm

    @property
    def engine(self) -> Engine:
        """The runtime's engine (built on first use)."""
        return self.runtime.engine

    @property
    def rows(self) -> RagRows:
        """The rows of a question for this model and these settings (:class:`~dpinfer.rag.prompts.RagRows`)."""
        return RagRows(self.lm, self.template, self.top_n, self.max_doc_tokens)

    def cut(self, text: str, doc_tokens: int | None = None) -> str:
        return self.rows.cut(text, doc_tokens)

    def public_ids(self, question: str) -> list[int]:
        """Token ids of the public row: the question alone (the null context)."""
        return self.rows.public_ids(question)

    def private_ids(self, question: str, documents: Sequence[str], doc_tokens: int | None = None) -> list[int]:
        """Token ids of the private row (:meth:`RagRows.private_ids <dpinfer.rag.prompts.RagRows.private_ids>`)."""
        return self.rows.private_ids(question, documents, doc_tokens)

    def pad_width(self, question: str, doc_tokens: int | None = None) -> int:
        """The engine's padding width, from PUBLIC quantities only (:meth:`RagRows.pad_width
        <dpinfer.rag.prompts.RagRows.pad_width>`)."""
        return self.rows.pad_width(question, doc_tokens)

    def doc_budget(self, question: str, max_new_tokens: int) -> int:
        """Tokens per retrieved document, from PUBLIC quantities only (:meth:`RagRows.doc_budget
        <dpinfer.rag.prompts.RagRows.doc_budget>`); refused in one line when too few fit the window."""
        return self.rows.doc_budget(question, max_new_tokens)

    # ------------------------------------------------------------------ answers
    def ask(self, question: str, *, ledger: Any = STORE_LEDGER, unit: str | None = None,
            config: AskConfig | None = None, **settings: Any) -> RagAnswer:
        """Answer ``question`` from the store (see the module docstring).

        ``settings`` are :class:`~dpinfer.configs.ask.AskConfig`'s fields (``mechanism``, ``epsilon``, ``delta``,
        ``max_new_tokens``, ``seed``, ``temperature``, ``sigma``, ``support_top_k``, ``adjacency``, ``theta``,
        ``static_sigma``, ``min_new_tokens``, ``noise_scale``), or give a ``config``. ``ledger``, ``unit``: the ledger
        and unit this answer is charged to (default: the object's, see the class); the charge is reserved before the
        model loads and refused (:class:`~dpinfer.errors.BudgetExceededError`) when the store's budget cannot
        afford it.
        """
        with charge(self._spend(ledger, unit), None, scope="store") as spend:
            # the exact cost (the guarantee, from the parameters alone): settled before the store is read
            plan = self.plan_ask(question, config=config, on_guarantee=lambda g: hold(spend, g, exact=True),
                                 **settings)

            def run() -> RagAnswer:
                g0 = time.perf_counter()
                out = self.engine.run(plan.job)
                return self.finish_ask(plan, out, generation_seconds=time.perf_counter() - g0)

            return run_charged(spend, plan.charges, run)

    def plan_ask(self, question: str, *, config: AskConfig | None = None,
                 prepared: tuple[list[Hit], list[str]] | None = None,
                 on_guarantee: Callable[[Guarantee], None] | None = None, checked: bool = False,
                 **settings: Any) -> AskPlan:
        """Everything :meth:`ask` does before the engine runs: the checks, the calibrated mechanism and its guarantee
        (the method table's runner), retrieval and the rows, as an engine job with what :meth:`finish_ask` needs.
        ``prepared``: the (hits, documents) :meth:`ask_many` already retrieved (and condensed) for this question.
        ``on_guarantee(guarantee)`` is called with the answer's guarantee before the store is read or the model loads
        (a ledger's charge; :meth:`ask` and :meth:`ask_many` charge, a caller of plan_ask charges itself).

        Every job gets a PUBLIC padding width (the method's rows; the question's own length for ``public``), so
        that jobs of every method batch in one :meth:`Engine.run_jobs <dpinfer.engine.Engine.run_jobs>` call."""
        del checked  # the config is checked when it is built
        t0 = time.perf_counter()
        check_text(question, "the question")
        config = AskConfig.merged(config, **settings)
        method = answer_method(config, self.runtime)  # calibrated before anything private is read or the model loads
        guarantee = method.guarantee()
        if config.seed is not None:
            guarantee = dataclasses.replace(guarantee, seeded=True)
        if on_guarantee is not None:
            on_guarantee(guarantee)
        if method.retrieves and self.store.count() == 0:
            raise InvalidInputError(f"the store {self.store.path} holds no documents; add some with: "
                                    f"dpinfer rag add {self.store.path} FILES...")
        # tokens per document so that the padded rows and T_max fit the window: public, before anything is retrieved
        rows = self.rows
        doc_tokens = rows.doc_budget(question, config.max_new_tokens) if method.retrieves else self.max_doc_tokens
        if prepared is not None:
            hits, documents = prepared
        else:
            hits = method.select(self.retrieve(question)) if method.retrieves else []
            documents = method.documents_many(self, [(question, hits, config.seed)])[0]
        private = rows.private_ids(question, documents, doc_tokens) if documents else None
        contexts, width = method.rows(rows.public_ids(question), private, rows.pad_width(question, doc_tokens))
        settings_out = {"mechanism": method.name, "epsilon": None, "delta": config.delta,
                        "max_new_tokens": config.max_new_tokens, "temperature": config.temperature,
                        "top_k": self.top_k, "top_n": self.top_n, "max_doc_tokens": doc_tokens,
                        "model": self.lm.name, **method.settings()}  # never the seed
        job = Job(contexts=contexts, mechanism=method.mechanism, max_new_tokens=config.max_new_tokens,
                        seed=config.seed, pad_width=width,
                        min_new_tokens=min(config.min_new_tokens, config.max_new_tokens))
        return AskPlan(jobs=(job,), guarantee=guarantee, charges=Charges(guarantee, scope="store"), method=method,
                       hits=hits, settings=settings_out, t0=t0)

    def finish_ask(self, plan: AskPlan, out: EngineOutput, *, generation_seconds: float = 0.0) -> RagAnswer:
        """The :class:`RagAnswer` of a planned question (:meth:`plan_ask`) from its engine output; the answer is
        composed into this session's accountant (:meth:`session_guarantee`)."""
        method = plan.method
        ids = out.sequences[0]
        compose_answer(self.accountant, method)
        return RagAnswer(text=self.lm.decode(ids).strip(), doc_ids=[h.id for h in plan.hits],
                         guarantee=plan.guarantee, mechanism=method.name, settings=plan.settings,
                         seconds=time.perf_counter() - plan.t0, generation_seconds=generation_seconds,
                         tokens=len(ids), finish_reason=out.finish_reasons[0], token_ids=list(ids),
                         retrieved=list(plan.hits), data_dependent=method.data_dependent())

    def ask_many(self, questions: Sequence[str], *, ids: Sequence[str | int] | None = None,
                 **options: Any) -> Iterator[tuple[int, RagAnswer | None, str | None]]:
        """Answer many questions: plan each (:meth:`plan_ask`; ``options`` are :meth:`ask`'s keyword arguments,
        checked once), run every planned job through ONE :meth:`Engine.run_jobs <dpinfer.engine.Engine.run_jobs>`
        call, and yield ``(index, answer, None)`` as each finishes, or ``(index, None, error)`` for a question that
        could not be planned (``error``: one line, no private text). Every answer is composed into this session's
        accountant. With a ``seed`` (tests and benchmarks only), question ``i`` uses ``record_seed(seed, ids[i])``
        (``ids`` default: the indices), so its answer does not depend on the other questions. With a ledger
        (``ledger``/``unit`` options, default: the object's), each answer is reserved on the store's unit when it is
        planned (a question the budget cannot afford is reported as refused, nothing generated for it) and committed
        when it is yielded."""
        book = self._spend(options.pop("ledger", STORE_LEDGER), options.pop("unit", None))
        spends: dict[int, Reservation] = {}
        base = options.pop("config", None)
        config = AskConfig.merged(base, **options)
        method = answer_method(config, self.runtime)  # every check, once
        if ids is not None and len(ids) != len(questions):
            raise InvalidInputError(f"ask_many: {len(ids)} ids for {len(questions)} questions")
        seeds = [record_seed(config.seed, i if ids is None else ids[i]) for i in range(len(questions))]
        prepared: dict[int, tuple[list[Hit], list[str]]] = {}
        failed: set[int] = set()
        if method.retrieves and method.prepares:  # every question's documents in one engine run (summarize)
            retrieved = []
            for i, question in enumerate(questions):
                try:
                    retrieved.append((i, method.select(self.retrieve(question))))
                except Exception as exc:  # a per-question refusal: reported, the others go on
                    failed.add(i)
                    yield i, None, record_error(exc)
            docs = method.documents_many(self, [(questions[i], hits, seeds[i]) for i, hits in retrieved])
            prepared = {i: (hits, d) for (i, hits), d in zip(retrieved, docs, strict=True)}
        plans: list[tuple[int, AskPlan]] = []
        try:
            for i, question in enumerate(questions):
                if i in failed:
                    continue
                spend = None if book is None else Reservation(book.ledger, book.units, book.scope)
                try:
                    plans.append((i, self.plan_ask(question, config=config.replace(seed=seeds[i]),
                                                   prepared=prepared.get(i),
                                                   on_guarantee=lambda g, s=spend: hold(s, g, exact=True))))
                except Exception as exc:  # a per-question refusal: reported, the others go on
                    close(spend, released=False)
                    yield i, None, record_error(exc)
                    continue
                if spend is not None:
                    spends[i] = spend
            if not plans:
                return
            for j, out in self.engine.run_jobs([p.job for _, p in plans]):
                i, plan = plans[j]
                answer = self.finish_ask(plan, out)
                close(spends.pop(i, None), released=True)
                yield i, answer, None
        finally:  # what was reserved and never answered released nothing
            for spend in spends.values():
                close(spend, released=False)

    # ------------------------------------------------------------------ session
    @property
    def answers(self) -> int:
        """Answers given in this session (this object)."""
        return len(self.accountant)

    def session_guarantee(self) -> Guarantee:
        """The guarantee of every answer of this session together: the accountant's composition of the answers'
        losses (sequential, adaptive; zCDP ρ adds), converted once at the largest δ. Any answer without a guarantee
        voids it (ε = ∞); ``public`` answers cost nothing. It holds under the adjacency every answer covers, applied
        to every answer at once: a document retrieved for several answers is covered by the total."""
        acc, n = self.accountant, len(self.accountant)
        if not n:
            return Guarantee(0.0, acc.delta(), "rag-session", "no answer given yet", parameters={"answers": 0})
        if not acc.bounded:
            return Guarantee.no_privacy("rag-session")
        relation = acc.relation()
        where = "any change to the store" if relation is Adjacency.ANY_TWO_INPUTS else str(relation)
        adjacency = f"{where} of {SESSION_ADJACENCY.format(n=n)}"
        loss = acc.loss()
        parameters: dict[str, Any] = {"answers": n}
        if isinstance(loss, Zcdp):  # the answers of PAD (and public ones) compose in zCDP
            parameters["rho"] = zcdp_rho(loss)
        return acc.guarantee(mechanism="rag-session", adjacency=adjacency, parameters=parameters)

