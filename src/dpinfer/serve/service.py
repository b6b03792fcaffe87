"""The service: one :class:`~dpinfer.runtime.Runtime` (model, engine, tagger, embedder) for the process's lifetime,
the batcher that decodes the jobs of every request together, the budgets, the RAG stores, the synthesis jobs and the
metrics.

Every operation runs in a worker thread of the web server; each one checks its parameters, plans its release (tags,
tokenises, calibrates: the ex-ante guarantee is known here), **reserves its cost** on its units (the unit of the
entity it reads, always, and a unit the request names, in addition; any refusal: all cancelled, nothing generated),
decodes, builds the release and commits the reservation; a failure in between cancels it. A stream commits once a
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
from pathlib import Path
from typing import Any

from dpinfer.accounting.charge import Reservation, charge, reserve
from dpinfer.checks import check_delta, non_negative_number
from dpinfer.clip_bounds import clip_bounds
from dpinfer.configs.ask import AskConfig
from dpinfer.configs.protect import ProtectConfig
from dpinfer.configs.sanitize import SanitizeConfig
from dpinfer.configs.synth import SynthConfig
from dpinfer.defaults import GENERATE, PROTECT, SERVE
from dpinfer.engine import Engine, EngineOutput, Job
from dpinfer.errors import ConfigurationError, InvalidInputError
from dpinfer.generation import TextStreamer, plan_generate
from dpinfer.models import int8_twin
from dpinfer.pipelines.protect_prompt import method_for, protect_prompt
from dpinfer.pipelines.rag import PrivateRAG, answer_method
from dpinfer.pipelines.sanitize import finish_sanitize, plan_sanitize
from dpinfer.pipelines.synthesize import plan_synthesis
from dpinfer.runtime import Runtime
from dpinfer.serve.batcher import Batcher, SharedEngine, Ticket
from dpinfer.serve.budget import (
    TENANTS,
    BudgetRefused,
    LedgerBudgets,
    ledger_unit,
)
from dpinfer.serve.keys import Forbidden, NotFound, Principal, check_name, check_unit_name
from dpinfer.serve.metrics import Metrics
from dpinfer.serve.params import parse, text_field, unknown
from dpinfer.serve.synth_jobs import SynthJobs
from dpinfer.validation import check_sanitize_budget, check_sanitize_config, check_text

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
        self.stores_dir = Path(stores) if stores is not None else None
        if self.stores_dir is not None:
            self.stores_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._rags: dict[str, tuple[PrivateRAG, threading.Lock]] = {}
        self.min_new_tokens = int(min_new_tokens)
        """Benchmarks only: EOS masked for every rewrite until this many tokens (a public transform)."""
        self.jobs = SynthJobs(Path(state) if state is not None else budgets.path.parent / "jobs", self)
        self.jobs.resume()

    def close(self) -> None:
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

    def set_budget(self, principal: Principal, unit: str, body: Mapping[str, Any]) -> dict[str, Any]:
        unknown(body, ("epsilon", "delta"))
        name, key = self.unit_ref(principal, unit)
        eps = non_negative_number(body.get("epsilon"), "epsilon", " (the unit's total ε budget)")
        delta = None if body.get("delta") is None else check_delta(body.get("delta"), "delta")
        self.budgets.set_budget(key, eps, delta)
        return {"unit": name, **self.budgets.state(key, name)}

    def hold(self, units: list[tuple[str, str]], guarantee: Any, scope: str, **kw: Any) -> Reservation:
        """Reserve a release's ex-ante cost on every unit (:meth:`LedgerBudgets.hold`; a refusal is counted in the
        metrics). The release runs in ``with charge(res, None, scope=scope)``: committed when it ends, cancelled
        if it fails (nothing released)."""
        res = self.budgets.open(units, scope, **kw)
        with self.refusals(res, units):
            reserve(res, None, guarantee, scope=scope)  # every unit or none
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

    # ---------------------------------------------------------------- tag and sanitise
    def tag(self, body: Mapping[str, Any]) -> dict[str, Any]:
        unknown(body, ("text",))
        text = check_text(body.get("text"), "the document")
        with self.plan_lock:
            spans = self.core.tagger.tag(text)
        return {"spans": [s.to_dict() for s in spans], "tagger": self.tagger_name}

    def _plan_sanitize(self, principal: Principal, body: Mapping[str, Any]) -> tuple[Any, str, str]:
        """(the plan, the unit's name, its key): every check, the spans, the contexts, the calibrated mechanism."""
        config = parse(body, SanitizeConfig, "text", "spans", "unit", "stream")
        text = text_field(body, "text", "the document")
        spans = body.get("spans")
        if spans is not None and not isinstance(spans, (list, dict)):
            raise InvalidInputError("spans must be a list of {start, end, label} objects (or TAB entity mentions)")
        check_sanitize_budget(check_sanitize_config(config, check_tagger=False))
        units = self.units_for(principal, self.document_unit(text), body.get("unit"))
        with self.plan_lock:
            plan = plan_sanitize(text, config, lm=self.lm, spans=spans,
                                 tagger=self.core.tagger if spans is None else None, checked=True,
                                 min_new_tokens=min(self.min_new_tokens, config.max_new_tokens or self.min_new_tokens))
        return plan, units

    def sanitize(self, principal: Principal, body: Mapping[str, Any]) -> dict[str, Any]:
        plan, units = self._plan_sanitize(principal, body)

        def work() -> Any:
            out = self.batcher.run(plan.job)
            return finish_sanitize(plan, out, seconds=out.prefill_seconds + out.decode_seconds)

        with charge(self.hold(units, plan.guarantee, "document"), None, scope="document"):
            res = work()
        return {**res.release(), **self.charged(units)}

    def prepare_sanitize_stream(self, principal: Principal, body: Mapping[str, Any]
                                ) -> tuple[Any, list[tuple[str, str]], Reservation]:
        """Plan and reserve a streamed sanitisation (a refusal is raised here, before the stream starts)."""
        plan, units = self._plan_sanitize(principal, body)
        return plan, units, self.hold(units, plan.guarantee, "document")

    def sanitize_stream(self, prepared: tuple[Any, list[tuple[str, str]], Reservation]) -> Iterator[dict[str, Any]]:
        """The released tokens as they are chosen, decoded in the shared batch (DP-Fusion releases token by token:
        each is covered by the guarantee), then the release."""
        plan, units, held = prepared
        t0 = time.perf_counter()
        ticket = self.batcher.submit(plan.job, listen=True)
        with closing(self._streamed(ticket, held, opening=plan.opening)) as pieces:
            for piece in pieces:
                yield {"delta": piece}
        res = finish_sanitize(plan, ticket.result(), seconds=time.perf_counter() - t0)
        yield {"done": True, **res.release(), **self.charged(units)}

    # ---------------------------------------------------------------- rag
    def _stores_root(self) -> Path:
        if self.stores_dir is None:
            raise ConfigurationError("this server has no stores folder (start it with --stores DIR)")
        return self.stores_dir

    def store_path(self, principal: Principal, store: str) -> Path:
        """The folder of the tenant's store ``store``: one the operator adopted under that name, else
        ``STORES/tenants/TENANT/STORE`` (a tenant's stores live in its own folder; folders made outside the service
        are reached only once adopted)."""
        check_name(store, "the store name")
        root = self._stores_root()
        adopted = self.budgets.tenancy.adopted("store", principal.tenant, store)
        return root / adopted if adopted is not None else root / TENANTS / principal.tenant / store

    def rag(self, principal: Principal, store: str, *, create: bool = False) -> tuple[PrivateRAG, threading.Lock]:
        """The tenant's store ``store`` (created on the first documents) and its lock. Another tenant's store is a
        missing one: the same 404, the same message."""
        folder = self.store_path(principal, store)
        if not create and not folder.is_dir():
            raise NotFound("no store of that name for this key; add documents first with POST "
                           "/v1/rag/STORE/documents")
        if create and not folder.parent.is_dir():
            folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            for made in (folder.parent, folder.parent.parent):  # STORES/tenants/TENANT: the tenant names too
                made.chmod(0o700)
        with self.plan_lock:
            if str(folder) not in self._rags:
                # the one runtime of this process: summaries and answers are decoded in the shared batch
                rag = PrivateRAG(folder, runtime=self.core)
                self._rags[str(folder)] = (rag, threading.Lock())
        return self._rags[str(folder)]

    def stores(self, principal: Principal) -> list[str]:
        if self.stores_dir is None:
            return []
        own = self.stores_dir / TENANTS / principal.tenant
        names = {p.name for p in own.iterdir() if p.is_dir()} if own.is_dir() else set()
        names |= {n for n, target in self.budgets.tenancy.names("store", principal.tenant).items()
                  if (self.stores_dir / target).is_dir()}
        return sorted(names)

    def store_unit(self, store: str) -> str:
        """A store's unit (every answer from it is charged there): ``store.STORE``."""
        return f"store.{store}"

    def store_info(self, principal: Principal, store: str) -> dict[str, Any]:
        """``GET /v1/rag/{store}``: the store's unit (its name and budget)."""
        self.rag(principal, store)
        name, key = self.unit_ref(principal, self.store_unit(store))
        return {"store": store, "unit": name, "budget": self.budgets.state(key, name)}

    def rag_add(self, principal: Principal, store: str, body: Mapping[str, Any]) -> dict[str, Any]:
        unknown(body, ("documents",))
        docs = body.get("documents")
        if not isinstance(docs, list) or not docs:
            raise InvalidInputError("documents must be a non-empty list of strings or {text, id} objects")
        rag, lock = self.rag(principal, store, create=True)
        with lock:
            report = rag.add(docs, text_field="text", id_field="id" if all(isinstance(d, dict) and "id" in d
                                                                          for d in docs) else None)
        return {"store": store, **report.to_dict()}

    def _plan_ask(self, principal: Principal, store: str, body: Mapping[str, Any]) -> tuple[Any, ...]:
        """(the store, the plan, the unit's name, its key): checks, retrieval, the calibrated mechanism."""
        config = parse(body, AskConfig, "question", "unit", "stream")
        question = text_field(body, "question", "the question")
        answer_method(config)  # the method's checks and PAD's calibration, before the store is read
        rag, lock = self.rag(principal, store)
        units = self.units_for(principal, self.store_unit(store), body.get("unit"))
        with lock:  # a summary runs on the shared engine: other requests go on meanwhile
            plan = rag.plan_ask(question, config=config, checked=True)
        return rag, plan, units

    def _answer(self, rag: PrivateRAG, plan: Any, out: EngineOutput, store: str, units: list[tuple[str, str]]
                ) -> dict[str, Any]:
        answer = rag.finish_ask(plan, out)
        return {**answer.release(), "store": store, **self.charged(units)}

    def rag_ask(self, principal: Principal, store: str, body: Mapping[str, Any]) -> dict[str, Any]:
        rag, plan, units = self._plan_ask(principal, store, body)
        with charge(self.hold(units, plan.guarantee, "store"), None, scope="store"):
            out = self.batcher.run(plan.job)
        return self._answer(rag, plan, out, store, units)

    def prepare_rag_stream(self, principal: Principal, store: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Plan and reserve a streamed answer (refusals come here); the guarantee and the budget as reserved."""
        rag, plan, units = self._plan_ask(principal, store, body)
        held = self.hold(units, plan.guarantee, "store")
        return {"rag": rag, "plan": plan, "store": store, "unit_refs": units, "charge": held,
                "guarantee": plan.guarantee.to_dict(), "mechanism": plan.mechanism, **self.charged(units)}

    def rag_stream(self, prepared: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        """PAD's released tokens as they are released (each is covered by the answer's guarantee), then the
        answer."""
        ticket = self.batcher.submit(prepared["plan"].job, listen=True)
        with closing(self._streamed(ticket, prepared["charge"])) as pieces:
            for piece in pieces:
                yield {"delta": piece}
        p = prepared
        yield {"done": True, **self._answer(p["rag"], p["plan"], ticket.result(), p["store"], p["unit_refs"])}

    # ---------------------------------------------------------------- protect-prompt
    def protect(self, principal: Principal, body: Mapping[str, Any], *, prompt: str | None = None) -> dict[str, Any]:
        if prompt is None:
            config = parse(body, ProtectConfig, "prompt", "unit")
            prompt = body.get("prompt")
        else:  # a chat's dpinfer extension: its other fields are the chat's
            config = parse({k: v for k, v in body.items() if k in ProtectConfig.request_fields()}, ProtectConfig)
        if not isinstance(prompt, str) or not prompt.strip():
            raise InvalidInputError("prompt must be a non-empty string")
        method_for(config)  # the method's checks (its number of rewrites), before the model
        units = self.units_for(principal, self.prompts_unit(principal), body.get("unit"))
        held = self.budgets.open(units, "prompt-source")
        with self.model_lock:  # a first calibration of the clip bounds runs the model outside the engine
            clip_bounds(self.lm)
        # the pipeline charges ``held`` itself (its estimate before the model runs, its exact guarantee before any
        # token, committed once released); its three stages' jobs join the shared batch
        with self.refusals(held, units):
            res = protect_prompt(prompt, config, runtime=self.core, ledger=held)
        return {**res.release(), **self.charged(units)}

    # ---------------------------------------------------------------- synth
    def check_synth(self, body: Mapping[str, Any]) -> Any:
        """Every check of a synthesis job and its plan (no model): bad parameters are refused before the job."""
        config = parse(body, SynthConfig, "references", "unit")
        refs = body.get("references")
        if not isinstance(refs, list) or not refs or not all(isinstance(r, str) and r.strip() for r in refs):
            raise InvalidInputError("references must be a non-empty list of non-empty strings (the private records)")
        if body.get("unit") is not None:
            check_unit_name(body.get("unit"))
        return plan_synthesis(refs, config)

    # ---------------------------------------------------------------- plain generation
    def plan_generate(self, messages: Sequence[Mapping[str, str]], *, max_new_tokens: int, temperature: float,
                      top_p: float | None) -> Job:
        """A chat completion without privacy, planned by :func:`dpinfer.generation.plan_generate` (checks first)."""
        with self.plan_lock:
            return plan_generate(self.lm, messages=[dict(m) for m in messages], max_new_tokens=max_new_tokens,
                                 temperature=temperature, top_k=None, top_p=top_p)

    def generate(self, messages: Sequence[Mapping[str, str]], *, max_new_tokens: int = SERVE.chat_max_new_tokens,
                 temperature: float = GENERATE.temperature, top_p: float | None = GENERATE.top_p) -> dict[str, Any]:
        job = self.plan_generate(messages, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
        out = self.batcher.run(job)
        seq = out.sequences[0]
        return {"text": self.lm.decode(seq).strip(), "prompt_tokens": len(job.contexts[0]),
                "completion_tokens": len(seq),
                "finish_reason": "length" if out.finish_reasons[0] == "length" else "stop"}

    def generate_stream(self, job: Job) -> Iterator[str]:
        """The text of a planned chat completion (:meth:`plan_generate`) piece by piece, decoded in the shared
        batch."""
        yield from self._streamed(self.batcher.submit(job, listen=True), None)


def replace_last_user(messages: Sequence[Mapping[str, Any]], content: str) -> list[dict[str, Any]]:
    """The messages with the last user message's content replaced."""
    out = [dict(m) for m in messages]
    for m in reversed(out):
        if m.get("role") == "user":
            m["content"] = content
            return out
    raise InvalidInputError("the messages have no user message")


__all__ = ["Forbidden", "NotFound", "Service", "replace_last_user"]
