"""The service: one :class:`~dpinfer.runtime.Runtime` (model, engine, tagger, embedder) for the process's lifetime,
the batcher that decodes the jobs of every request together, the budgets, the RAG stores, the synthesis jobs and the
metrics.

Every route runs in a worker thread of the web server and drives the task's steps over this service
(:mod:`dpinfer.serve.routes`): the body parsed and checked, the release planned by the library's task (tags,
tokenises, calibrates: the ex-ante guarantee and the plan's charges are known here: :meth:`Service.plan_sanitize`,
:meth:`Service.plan_ask`, :meth:`Service.plan_protect`, :meth:`Service.plan_generate`), **its cost reserved** on its
units (:meth:`Service.hold`: the unit of the entity it reads, always, and a unit the request names, in addition; any
refusal: all cancelled, nothing generated), its job decoded in the shared batch (:meth:`Service.run`), the release
finished by the task and the reservation committed; a failure in between cancels it. A stream commits once a
piece of the release has left, and cancels when it ends with none (a client gone before the first byte included).
Units, stores and jobs are keyed by (tenant, name): a tenant's unit ``NAME`` is the ledger's ``TENANT/NAME``, its
store ``STORES/tenants/TENANT/NAME``; what was made outside the service is reached once the operator adopts it for a
tenant (``dpinfer serve adopt``; no route adopts: a tenant's admin never reaches the ledger's other units).

Decoding: the runtime's engine is a :class:`~dpinfer.serve.batcher.SharedEngine`, so every pipeline run on it
(sanitisation, the three stages of prompt protection, a synthesis job's batches, a RAG answer, a chat completion)
submits its jobs to the one :class:`~dpinfer.serve.batcher.Batcher` thread and is decoded in the same forward passes
as every other request's (continuous batching across HTTP requests; :mod:`dpinfer.serve.batcher`). Streams read
their job's step events as the batcher produces them. No operation holds the model for its whole run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpinfer import generation
from dpinfer.accounting.charge import Charges, Reservation, charge, reserve
from dpinfer.accounting.ledger_store import is_database_url
from dpinfer.clip_bounds import clip_bounds
from dpinfer.configs.protect import ProtectConfig
from dpinfer.defaults import PROTECT, SERVE
from dpinfer.engine import Engine, EngineOutput, Job
from dpinfer.errors import ConfigurationError
from dpinfer.generation import GenerateInputs, GeneratePlan, GenerateSettings, TextStreamer
from dpinfer.models import int8_twin
from dpinfer.pipelines.protect_prompt import ProtectPlan, plan_protect
from dpinfer.pipelines.rag import PrivateRAG
from dpinfer.pipelines.sanitize_plan import SanitizePlan, finish_sanitize, plan_sanitize
from dpinfer.pipelines.synthesize import plan_synthesis
from dpinfer.runtime import Runtime
from dpinfer.serve.batcher import Batcher, SharedEngine, Ticket
from dpinfer.serve.bodies import synth
from dpinfer.serve.budget import BudgetRefused, LedgerBudgets, ledger_unit
from dpinfer.serve.job_table import JobTable
from dpinfer.serve.keys import Principal, check_name, check_unit_name
from dpinfer.serve.metrics import Metrics
from dpinfer.serve.stores import FolderStores, ServerStores, open_stores
from dpinfer.serve.synth_jobs import SynthJobs

log = logging.getLogger("dpinfer.serve")


class Service:
    """One runtime, one batcher, the budgets, the stores and the synthesis jobs of one ``dpinfer serve`` process.

    ``state``: the folder of the service's own files (the synthesis jobs); default: the ledger's folder."""

    def __init__(self, lm: Any, budgets: LedgerBudgets, *, tagger: str = SERVE.tagger, stores: str | Path | None = None,
                 embedder: Any = None, window: float = SERVE.batch_window_s, batching: bool = True,
                 min_new_tokens: int = 0, state: str | Path | None = None) -> None:
        self.budgets = budgets
        self.metrics = Metrics()
        self.model_lock = threading.Lock()
        """Held by the batcher for each engine step, and by anything that runs the model outside the engine."""
        self.plan_lock = threading.Lock()
        # a server's engine: the batch keeps its shapes (slot count, capacity) whatever is running, so that a request
        # arriving later joins the running batch instead of waiting for it to drain
        engine = Engine(lm, fixed_rows=True, min_capacity=SERVE.engine_min_capacity)
        self.batcher = Batcher(engine, self.model_lock, self.metrics, window=window, batching=batching)
        self.engine = SharedEngine(self.batcher)
        # DP-GTR's stage 3 (public greedy post-processing) in a second shared batch, on the int8 decode twin of a
        # float32 CPU model: its steps alternate with the first batch's under the same model lock
        twin = int8_twin(lm) if PROTECT.stage3_int8 else None
        self.int8_batcher = None if twin is None or twin is lm else Batcher(
            Engine(twin, max_rows=SERVE.stage3_rows, fixed_rows=True, min_capacity=SERVE.stage3_min_capacity),
            self.model_lock, self.metrics, window=window, batching=batching)
        self.core = Runtime(lm, self.engine, tagger, embedder,
                            int8_engine=None if self.int8_batcher is None else SharedEngine(self.int8_batcher))
        self.lm = lm
        self.tagger_name = tagger
        self.stores_at = None if stores is None else open_stores(stores, budgets.tenancy)
        """The tenants' stores: a folder, or a Chroma server shared by replicas (:mod:`dpinfer.serve.stores`)."""
        self.stores_dir = getattr(self.stores_at, "root", None)
        self._rags: dict[str, tuple[PrivateRAG, threading.Lock]] = {}
        self.min_new_tokens = int(min_new_tokens)
        """Benchmarks only: EOS masked for every rewrite until this many tokens (a public transform)."""
        shared = JobTable(budgets.ledger) if is_database_url(budgets.path) else None  # replicas: any one answers a poll
        self.jobs = SynthJobs(Path(state) if state is not None else budgets.path.parent / "jobs", self, shared)
        self.jobs.resume()

    def close(self) -> None:
        self.jobs.close()
        self.batcher.close()
        if self.int8_batcher is not None:
            self.int8_batcher.close()

    # ---------------------------------------------------------------- tenants and budgets
    def unit_ref(self, principal: Principal, name: object) -> tuple[str, str]:
        """(the tenant's name of the unit, the ledger's name): the unit the operator adopted under that name for the
        tenant, else ``TENANT/NAME`` (:func:`~dpinfer.serve.budget.ledger_unit`). Never another tenant's."""
        name = check_unit_name(name)
        adopted = self.budgets.tenancy.adopted("unit", principal.tenant, name)
        return name, adopted if adopted is not None else ledger_unit(principal.tenant, name)

    def units_for(self, principal: Principal, entity: str, named: object) -> list[tuple[str, str]]:
        """The units a release is charged to: the unit of the entity it reads (always), then the unit the request
        names (in addition, never instead)."""
        units = [self.unit_ref(principal, entity)]
        if named is not None:
            extra = self.unit_ref(principal, named)
            if extra[1] != units[0][1]:
                units.append(extra)
        return units

    def document_unit(self, text: str) -> str:
        """A document's unit: a keyed hash of its text, as the command line names it (``Ledger.unit_for_text``)."""
        return self.budgets.ledger.unit_for_text(text)

    def prompts_unit(self, principal: Principal) -> str:
        """The prompt source of a key (every prompt sent with it): ``prompts.KEYID``."""
        return f"prompts.{principal.key_id}"

    def charged(self, units: list[tuple[str, str]]) -> dict[str, Any]:
        """The reply's budget fields: ``unit`` and ``budget`` (the named unit, else the entity's) and ``units`` (every
        unit charged, the entity's first)."""
        states = [self.budgets.state(key, name) for name, key in units]
        return {"unit": units[-1][0], "budget": states[-1], "units": states}

    def budget(self, principal: Principal, unit: str) -> dict[str, Any]:
        name, key = self.unit_ref(principal, unit)
        return {"unit": name, **self.budgets.state(key, name)}

    def set_budget(self, principal: Principal, unit: str, epsilon: float, delta: float | None) -> dict[str, Any]:
        name, key = self.unit_ref(principal, unit)
        self.budgets.set_budget(key, epsilon, delta)
        return {"unit": name, **self.budgets.state(key, name)}

    def hold(self, units: list[tuple[str, str]], charges: Charges, **kw: Any) -> Reservation:
        """Reserve a planned release's ex-ante cost (``plan.charges``) on every unit or none (a refusal is raised as
        :class:`BudgetRefused`, counted in the metrics; ``kw``: :meth:`LedgerBudgets.open`'s resume key). The release
        runs in ``with charge(res, None, scope=...)``: committed when it ends, cancelled if it fails (nothing
        released)."""
        res = self.budgets.open(units, charges.scope or "document", **kw)
        with self.refusals(res, units):
            reserve(res, None, charges.cost, scope=charges.scope, mechanism=charges.mechanism)  # every unit or none
        return res

    @contextmanager
    def refusals(self, res: Reservation, units: list[tuple[str, str]]) -> Iterator[None]:
        """A refusal of ``res`` raised as :class:`BudgetRefused` (:meth:`LedgerBudgets.refusals`), counted."""
        try:
            with self.budgets.refusals(res, units):
                yield
        except BudgetRefused:
            self.metrics.refused()
            raise

    def _streamed(self, ticket: Ticket, res: Reservation | None, on_text: Callable[[str], None] | None = None,
                  opening: Sequence[int] = ()) -> Iterator[str]:
        """The text of ``ticket``'s job piece by piece as its tokens are released (row 0; EOS left out), after the
        public ``opening`` the release starts with (forced, not decoded); the charge is committed once a decoded
        piece has left (a client that disconnects has received part of a release) and cancelled otherwise. Closing
        the iterator early cancels the job."""
        eos = set(self.lm.eos_token_ids)
        streamer = TextStreamer(self.lm)
        with charge(res, None, scope=None):  # committed at the end; cancelled on failure unless a piece has left
            try:
                for tok in opening:
                    piece = streamer.push(tok)
                    if piece:
                        yield piece
                for event in ticket.events():
                    tok = event.tokens[0]
                    if tok >= 0 and tok not in eos:
                        piece = streamer.push(tok)
                        if piece:
                            if res is not None:
                                res.releasing()
                            yield piece
                tail = streamer.flush()
                if tail:
                    if res is not None:
                        res.releasing()
                    yield tail
            except BaseException:
                self.batcher.cancel(ticket)
                raise

    def run(self, job: Job) -> EngineOutput:
        """A planned job decoded in the shared batch (with every other request's jobs)."""
        return self.batcher.run(job)

    # ---------------------------------------------------------------- tag and sanitise
    def tag(self, text: str) -> dict[str, Any]:
        with self.plan_lock:
            spans = self.core.tagger.tag(text)
        return {"spans": [s.to_dict() for s in spans], "tagger": self.tagger_name}

    def plan_sanitize(self, principal: Principal, parsed: Mapping[str, Any]
                      ) -> tuple[SanitizePlan, list[tuple[str, str]]]:
        """(the plan, the units it is charged to) of a parsed request (:func:`dpinfer.serve.bodies.sanitize`): the
        spans (the server's tagger when none are given), the contexts, the calibrated mechanism, the guarantee."""
        units = self.units_for(principal, self.document_unit(parsed["text"]), parsed["unit"])
        config, spans = parsed["config"], parsed["spans"]
        cap = config.max_new_tokens or self.min_new_tokens
        with self.plan_lock:
            plan = plan_sanitize(parsed["text"], config, lm=self.lm, spans=spans,
                                 tagger=self.core.tagger if spans is None else None, checked=True,
                                 min_new_tokens=min(self.min_new_tokens, cap))
        return plan, units

    def sanitize_stream(self, plan: SanitizePlan, units: list[tuple[str, str]], held: Reservation
                        ) -> Iterator[dict[str, Any]]:
        """The released tokens as they are chosen, decoded in the shared batch (DP-Fusion releases token by token:
        each is covered by the guarantee), then the release; ``held`` committed once a piece has left."""
        t0 = time.perf_counter()
        ticket = self.batcher.submit(plan.job, listen=True)
        with closing(self._streamed(ticket, held, opening=plan.opening)) as pieces:
            for piece in pieces:
                yield {"delta": piece}
        res = finish_sanitize(plan, ticket.result(), seconds=time.perf_counter() - t0)
        yield {"done": True, **res.release(), **self.charged(units)}

    # ---------------------------------------------------------------- rag
    def _stores(self) -> FolderStores | ServerStores:
        if self.stores_at is None:
            raise ConfigurationError("this server has no stores (start it with --stores DIR or chroma://HOST:PORT)")
        return self.stores_at

    def store_path(self, principal: Principal, store: str) -> Path:
        """The folder of the tenant's store ``store`` in a stores folder (:meth:`FolderStores.path`)."""
        stores = self._stores()
        if not isinstance(stores, FolderStores):
            raise ConfigurationError("this server's stores are on a Chroma server, not in a folder")
        return stores.path(principal, check_name(store, "the store name"))

    def rag(self, principal: Principal, store: str, *, create: bool = False) -> tuple[PrivateRAG, threading.Lock]:
        """The tenant's store ``store`` (created on the first documents) and its lock. Another tenant's store is a
        missing one: the same 404, the same message."""
        stores = self._stores()
        check_name(store, "the store name")
        key = stores.locate(principal, store, create=create)
        with self.plan_lock:
            if key not in self._rags:
                # the one runtime of this process: summaries and answers are decoded in the shared batch
                where = stores.document_store(principal, store, key, self.core.embedder if isinstance(
                    stores, ServerStores) else None)
                self._rags[key] = (PrivateRAG(where, runtime=self.core), threading.Lock())
        return self._rags[key]

    def stores(self, principal: Principal) -> list[str]:
        return [] if self.stores_at is None else self.stores_at.names(principal)

    def store_unit(self, store: str) -> str:
        """A store's unit (every answer from it is charged there): ``store.STORE``."""
        return f"store.{store}"

    def store_info(self, principal: Principal, store: str) -> dict[str, Any]:
        """``GET /v1/rag/{store}``: the store's unit (its name and budget)."""
        self.rag(principal, store)
        name, key = self.unit_ref(principal, self.store_unit(store))
        return {"store": store, "unit": name, "budget": self.budgets.state(key, name)}

    def rag_add(self, principal: Principal, store: str, docs: list[Any]) -> dict[str, Any]:
        rag, lock = self.rag(principal, store, create=True)
        with lock:
            report = rag.add(docs, text_field="text", id_field="id" if all(isinstance(d, dict) and "id" in d
                                                                          for d in docs) else None)
        return {"store": store, **report.to_dict()}

    def plan_ask(self, principal: Principal, store: str, parsed: Mapping[str, Any]) -> Asked:
        """A parsed question (:func:`dpinfer.serve.bodies.ask`) planned on the tenant's store: retrieval, the
        calibrated mechanism, the guarantee; with the units it is charged to."""
        rag, lock = self.rag(principal, store)
        units = self.units_for(principal, self.store_unit(store), parsed["unit"])
        with lock:  # a summary runs on the shared engine: other requests go on meanwhile
            plan = rag.plan_ask(parsed["question"], config=parsed["config"], checked=True)
        return Asked(rag, plan, store, units)

    def answer(self, asked: Asked, out: EngineOutput) -> dict[str, Any]:
        """The release of a planned question from its engine output, with the budget of its units."""
        answer = asked.rag.finish_ask(asked.plan, out)
        return {**answer.release(), "store": asked.store, **self.charged(asked.units)}

    def ask_stream(self, asked: Asked, held: Reservation) -> Iterator[dict[str, Any]]:
        """PAD's released tokens as they are released (each is covered by the answer's guarantee), then the
        answer; ``held`` committed once a piece has left."""
        ticket = self.batcher.submit(asked.plan.job, listen=True)
        with closing(self._streamed(ticket, held)) as pieces:
            for piece in pieces:
                yield {"delta": piece}
        yield {"done": True, **self.answer(asked, ticket.result())}

    # ---------------------------------------------------------------- protect-prompt
    def plan_protect(self, principal: Principal, prompt: str, config: ProtectConfig, unit: object = None
                     ) -> tuple[ProtectPlan, list[tuple[str, str]]]:
        """(the plan, the units it is charged to) of a parsed prompt (:func:`dpinfer.serve.bodies.protect`): stage 1's
        job, the calibrated mechanism and the guarantee (:func:`~dpinfer.pipelines.protect_prompt.plan_protect`),
        charged to the key's prompts and the unit named."""
        units = self.units_for(principal, self.prompts_unit(principal), unit)
        with self.model_lock:  # a first calibration of the clip bounds runs the model outside the engine
            clip_bounds(self.lm)
        return plan_protect([prompt], config, self.core, pooled=False), units

    # ---------------------------------------------------------------- synth
    def check_synth(self, body: Mapping[str, Any]) -> Any:
        """Every check of a synthesis job and its plan (no model): bad parameters are refused before the job."""
        return plan_synthesis(*synth(body))

    # ---------------------------------------------------------------- plain generation
    def plan_generate(self, messages: Sequence[Mapping[str, str]], *, max_new_tokens: int, temperature: float,
                      top_p: float | None) -> GeneratePlan:
        """A chat completion without privacy, planned by plain generation's task (:data:`dpinfer.generation.TASK`:
        every check first; no guarantee, nothing charged)."""
        settings = GenerateSettings(max_new_tokens=max_new_tokens, temperature=temperature, top_k=None, top_p=top_p)
        with self.plan_lock:
            return generation.TASK.plan(settings, GenerateInputs(messages=[dict(m) for m in messages]), self.core)

    def generate_stream(self, job: Job) -> Iterator[str]:
        """The text of a planned chat completion (:meth:`plan_generate`) piece by piece, decoded in the shared
        batch."""
        yield from self._streamed(self.batcher.submit(job, listen=True), None)


@dataclass(frozen=True)
class Asked:
    """A question planned on a store (:meth:`Service.plan_ask`): what its answer is finished with."""

    rag: PrivateRAG
    plan: Any
    store: str
    units: list[tuple[str, str]]


__all__ = ["Asked", "Service"]
