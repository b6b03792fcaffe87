"""The service's runtime: one model, one engine, one tagger for the process's lifetime, a batcher that decodes the
jobs of concurrent requests together, the budgets, the RAG stores and the metrics.

Every operation is synchronous and runs in a worker thread of the web server; each one checks its parameters, plans
its release (tags, tokenises, calibrates: the ex-ante guarantee is known here), **reserves its cost** on its unit
(refused: nothing is generated), decodes, builds the release and commits the reservation; a failure in between
cancels it. Model use is serialised by one lock: the batcher holds it for each engine step, and the operations the
batcher cannot take (prompt protection's three stages, token-by-token streaming) hold it for their run.

Batching across requests (:class:`Batcher`): continuous batching on the one engine. Requests queue their planned
jobs; the batcher thread submits them to the engine between steps (:meth:`Engine.submit
<dpinfer.engine.Engine.submit>`) and calls :meth:`Engine.step <dpinfer.engine.Engine.step>` while any job runs: one
forward pass per decode step for every admitted job, a job joining when the scheduler has room for it and leaving
when it finishes. When the engine is idle, the first job waits ``window`` seconds for others so that requests sent
together are planned together. Batches are made of jobs and public settings only; what the engine guarantees about
public rows and shapes across jobs (rule 2) is stated in :mod:`dpinfer.engine.scheduler` and
:mod:`dpinfer.engine.runner`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dpinfer.defaults import GENERATE, PROTECT, RAG, SANITIZE, SERVE, SYNTH
from dpinfer.errors import ConfigurationError, DPInferError, InvalidInputError
from dpinfer.serve.budget import LedgerBudgets
from dpinfer.serve.keys import Principal, check_name

log = logging.getLogger("dpinfer.serve")


class NotFound(DPInferError):
    """A resource (store, job) that does not exist for this tenant (HTTP 404)."""


class Forbidden(DPInferError):
    """Another tenant's resource, or an admin-only action (HTTP 403)."""


class Metrics:
    """Counters for ``GET /metrics`` (Prometheus text format); labels are route templates and status codes only."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: dict[tuple[str, str, int], int] = {}
        self.refusals = 0
        self.tokens = 0
        self.decode_seconds = 0.0
        self.batches = 0
        self.batched_jobs = 0
        self.queue_length = 0
        self.started = time.time()

    def request(self, method: str, route: str, status: int) -> None:
        with self.lock:
            key = (method, route, status)
            self.requests[key] = self.requests.get(key, 0) + 1

    def refused(self) -> None:
        with self.lock:
            self.refusals += 1

    def generated(self, tokens: int, seconds: float) -> None:
        with self.lock:
            self.tokens += tokens
            self.decode_seconds += seconds

    def text(self) -> str:
        with self.lock:
            lines = ["# HELP dpinfer_requests_total HTTP requests by method, route template and status.",
                     "# TYPE dpinfer_requests_total counter"]
            for (m, r, s), n in sorted(self.requests.items()):
                lines.append(f'dpinfer_requests_total{{method="{m}",route="{r}",status="{s}"}} {n}')
            rate = self.tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0
            lines += [
                "# HELP dpinfer_budget_refusals_total Requests refused because they would overspend a unit.",
                "# TYPE dpinfer_budget_refusals_total counter", f"dpinfer_budget_refusals_total {self.refusals}",
                "# HELP dpinfer_generated_tokens_total Tokens released by the engine.",
                "# TYPE dpinfer_generated_tokens_total counter", f"dpinfer_generated_tokens_total {self.tokens}",
                "# HELP dpinfer_decode_seconds_total Wall time the engine spent on batches and exclusive runs.",
                "# TYPE dpinfer_decode_seconds_total counter",
                f"dpinfer_decode_seconds_total {self.decode_seconds:.3f}",
                "# HELP dpinfer_tokens_per_second Tokens released per second of engine time (since start).",
                "# TYPE dpinfer_tokens_per_second gauge", f"dpinfer_tokens_per_second {rate:.3f}",
                "# HELP dpinfer_queue_length Jobs waiting for the engine.",
                "# TYPE dpinfer_queue_length gauge", f"dpinfer_queue_length {self.queue_length}",
                "# HELP dpinfer_engine_steps_total Engine steps of the batcher (one token for every running job).",
                "# TYPE dpinfer_engine_steps_total counter", f"dpinfer_engine_steps_total {self.batches}",
                "# HELP dpinfer_batched_jobs_total Jobs the batcher submitted to the engine.",
                "# TYPE dpinfer_batched_jobs_total counter", f"dpinfer_batched_jobs_total {self.batched_jobs}",
            ]
        return "\n".join(lines) + "\n"


class Batcher:
    """Continuous batching across requests on the one engine (see the module docstring). ``run(job)`` blocks until the
    job has finished and returns its output (or raises its error). The loop submits queued jobs between steps and
    calls :meth:`Engine.step` while any job is running; a job that finished during another thread's steps (a stream
    holding the model lock steps the same engine) is noticed by its status."""

    def __init__(self, engine: Any, lock: threading.Lock, metrics: Metrics, *, window: float = SERVE.batch_window_s,
                 batching: bool = True) -> None:
        self.engine = engine
        self.lock = lock
        self.metrics = metrics
        self.window = float(window)
        self.batching = batching
        self.queue: queue.Queue[tuple[Any, Future[Any]] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._loop, name="dpinfer-batcher", daemon=True)
        self.thread.start()

    def run(self, job: Any) -> Any:
        fut: Future[Any] = Future()
        self.queue.put((job, fut))
        self.metrics.queue_length = self.queue.qsize()
        return fut.result()

    def close(self) -> None:
        self.queue.put(None)

    def _first(self) -> list[tuple[Any, Future[Any]]] | None:
        """Idle: wait for a job, then ``window`` seconds for others to start with it (one planned pool)."""
        first = self.queue.get()
        if first is None:
            return None
        items = [first]
        deadline = time.monotonic() + self.window
        while self.batching:
            timeout = deadline - time.monotonic()
            try:
                item = self.queue.get(timeout=timeout) if timeout > 0 else self.queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self.queue.put(None)
                break
            items.append(item)
        return items

    def _drain(self) -> list[tuple[Any, Future[Any]]]:
        items = []
        while True:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                return items
            if item is None:
                self.queue.put(None)
                return items
            items.append(item)

    def _loop(self) -> None:
        from dpinfer.engine import JobStatus

        active: list[tuple[Any, Future[Any]]] = []
        while True:
            if not active:
                items = self._first()
                if items is None:
                    return
            else:
                items = self._drain()
            for job, fut in items:
                try:
                    with self.lock:
                        self.engine.submit(job)
                except Exception as exc:  # refused before the model ran (its request gets the one-line error)
                    fut.set_exception(exc)
                    continue
                active.append((job, fut))
            self.metrics.queue_length = self.queue.qsize()
            if items:
                with self.metrics.lock:
                    self.metrics.batched_jobs += len(items)
            t0 = time.perf_counter()
            try:
                with self.lock:
                    if self.engine.busy:
                        self.engine.step()
            except BaseException as exc:
                if not any(job.error is not None for job, _ in active):  # not one job's failure: all of them
                    for job, fut in active:
                        if job.status is not JobStatus.FINISHED:
                            with self.lock:
                                self.engine.cancel(job)
                        fut.set_exception(exc)
                    active = []
            tokens, still = 0, []
            for job, fut in active:
                if job.status is not JobStatus.FINISHED:
                    still.append((job, fut))
                elif job.error is not None:
                    fut.set_exception(job.error)
                elif job.output is None:
                    fut.set_exception(DPInferError("the job was cancelled before it finished"))
                else:
                    tokens += len(job.output.sequences[0]) if job.output.sequences else 0
                    fut.set_result(job.output)
            active = still
            with self.metrics.lock:
                self.metrics.batches += 1
            self.metrics.generated(tokens, time.perf_counter() - t0)


# --------------------------------------------------------------------------------------------------- parameters
def _get(body: Mapping[str, Any], name: str, types: tuple[type, ...], default: Any = None, *,
         what: str | None = None) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in types:
        raise InvalidInputError(f"{what or name} must be {'/'.join(t.__name__ for t in types)}, got a boolean")
    if not isinstance(value, types):
        names = " or ".join("a number" if t in (int, float) else f"a {t.__name__}" for t in types)
        raise InvalidInputError(f"{what or name} must be {names}, got {type(value).__name__}")
    return value


NUM = (int, float)


def _unknown(body: Mapping[str, Any], allowed: Sequence[str]) -> None:
    extra = [k for k in body if k not in allowed]
    if extra:  # never echoed: a field name may be private text sent by mistake
        raise InvalidInputError(f"{len(extra)} unknown field(s); allowed: {', '.join(allowed)}")


SANITIZE_FIELDS = ("text", "spans", "epsilon", "group_epsilon", "groups", "method", "max_new_tokens", "unit",
                   "delta", "alpha", "temperature", "top_k", "allow_untagged", "adjacency", "stream")
ASK_FIELDS = ("question", "mechanism", "epsilon", "delta", "max_new_tokens", "temperature", "unit")
SYNTH_FIELDS = ("references", "method", "epsilon", "delta", "batch_size", "max_new_tokens", "max_texts", "unit")
PROTECT_FIELDS = ("prompt", "method", "epsilon", "delta", "n_rewrites", "n_keywords", "keywords", "max_new_tokens",
                  "n_exemplars", "unit")


class Runtime:
    """One model, one engine, one tagger, the budgets and the stores of one ``dpinfer serve`` process."""

    def __init__(self, lm: Any, budgets: LedgerBudgets, *, tagger: str = SERVE.tagger, stores: str | Path | None = None,
                 embedder: Any = None, window: float = SERVE.batch_window_s, batching: bool = True,
                 min_new_tokens: int = 0) -> None:
        from dpinfer.engine import Engine

        self.lm = lm
        self.engine = Engine(lm)
        self.budgets = budgets
        self.tagger_name = tagger
        self._tagger: Any = None
        self.stores_dir = Path(stores) if stores is not None else None
        if self.stores_dir is not None:
            self.stores_dir.mkdir(parents=True, exist_ok=True)
        self._embedder = embedder
        self._rags: dict[tuple[str, str], Any] = {}
        self.min_new_tokens = int(min_new_tokens)
        """Benchmarks only: EOS masked for every rewrite until this many tokens (a public transform)."""
        self.metrics = Metrics()
        self.model_lock = threading.Lock()
        self.plan_lock = threading.Lock()
        self.batcher = Batcher(self.engine, self.model_lock, self.metrics, window=window, batching=batching)

    def close(self) -> None:
        self.batcher.close()

    # ---------------------------------------------------------------- shared parts
    @property
    def tagger(self) -> Any:
        if self._tagger is None:
            from dpinfer.taggers import get_tagger

            self._tagger = get_tagger(self.tagger_name)
        return self._tagger

    @property
    def embedder(self) -> Any:
        if self._embedder is None:
            from dpinfer.eval.embeddings import load_embedder

            self._embedder = load_embedder()
        return self._embedder

    def claim(self, principal: Principal, kind: str, name: str, *, create: bool = True) -> None:
        """Check that ``principal``'s tenant owns the ``kind`` (unit or store) ``name``, claiming it if no one does."""
        owner = self.budgets.owner(f"{kind}:{name}", principal.tenant if create else None)
        if owner is not None and owner != principal.tenant:
            raise Forbidden(f"the {kind} {name} belongs to another tenant; use a {kind} of your own")

    def unit_key(self, principal: Principal, unit: object, default: str = "default", *, create: bool = True
                 ) -> tuple[str, str]:
        """(the unit's name, its key in the budgets), after checking the tenant owns it. Units without a name get
        the tenant's own default (``TENANT.default``, ``TENANT.prompts``, ``TENANT.corpus``)."""
        name = check_name(f"{principal.tenant}.{default}" if unit is None else unit, "the unit")
        self.claim(principal, "unit", name, create=create)
        return name, name

    def budget(self, principal: Principal, unit: str) -> dict[str, Any]:
        name, key = self.unit_key(principal, unit, create=False)
        return {"unit": name, **self.budgets.state(key)}

    def set_budget(self, principal: Principal, unit: str, body: Mapping[str, Any]) -> dict[str, Any]:
        from dpinfer.checks import check_delta, non_negative_number

        _unknown(body, ("epsilon", "delta"))
        name, key = self.unit_key(principal, unit)
        eps = non_negative_number(body.get("epsilon"), "epsilon", " (the unit's total ε budget)")
        delta = None if body.get("delta") is None else check_delta(body.get("delta"), "delta")
        return {"unit": name, **self.budgets.set_budget(key, eps, delta)}

    def _charged(self, key: str, guarantee: Any, scope: str, work: Callable[[], Any]) -> Any:
        """Reserve the release's ex-ante cost (its ``guarantee``) on ``key``, run ``work``, commit; cancel the
        reservation if ``work`` fails (nothing was released)."""
        from dpinfer.serve.budget import BudgetRefused

        try:
            rid = self.budgets.reserve(key, guarantee, scope=scope)
        except BudgetRefused:
            self.metrics.refused()
            raise
        try:
            result = work()
        except BaseException:
            self.budgets.cancel(rid)
            raise
        self.budgets.commit(rid)
        return result

    # ---------------------------------------------------------------- tag
    def tag(self, body: Mapping[str, Any]) -> dict[str, Any]:
        from dpinfer.validation import check_text

        _unknown(body, ("text",))
        text = check_text(body.get("text"), "the document")
        with self.plan_lock:
            spans = self.tagger.tag(text)
        return {"spans": [s.to_dict() for s in spans], "tagger": self.tagger_name}

    # ---------------------------------------------------------------- sanitize
    def _plan_sanitize(self, principal: Principal, body: Mapping[str, Any]) -> tuple[Any, str, str]:
        """(the plan, the unit's name, its key): every check, the spans, the contexts, the calibrated mechanism."""
        from dpinfer.pipelines.sanitize import plan_sanitize
        from dpinfer.validation import check_sanitize_budget, check_sanitize_params

        _unknown(body, SANITIZE_FIELDS)
        text = body.get("text")
        if not isinstance(text, str) or not text.strip():
            raise InvalidInputError("text must be the document, a non-empty string")
        spans = body.get("spans")
        if spans is not None and not isinstance(spans, (list, dict)):
            raise InvalidInputError("spans must be a list of {start, end, label} objects (or TAB entity mentions)")
        method = _get(body, "method", (str,), SANITIZE.method)
        epsilon = _get(body, "epsilon", NUM)
        group_eps = _get(body, "group_epsilon", (dict,))
        groups = _get(body, "groups", (dict,))
        opts = {"delta": _get(body, "delta", NUM, SANITIZE.delta), "alpha": _get(body, "alpha", NUM, SANITIZE.alpha),
                "temperature": _get(body, "temperature", NUM), "max_new_tokens": _get(body, "max_new_tokens", (int,)),
                "adjacency": _get(body, "adjacency", (str,), SANITIZE.adjacency)}
        top_k = _get(body, "top_k", (int,), SANITIZE.top_k)
        allow_untagged = bool(_get(body, "allow_untagged", (bool,), False))
        check_sanitize_params(method=method, epsilon=epsilon, group_epsilon=group_eps, top_k=top_k, groups=groups,
                              tagger=None, **opts)
        check_sanitize_budget(method=method, epsilon=epsilon, group_epsilon=group_eps, delta=opts["delta"],
                              alpha=opts["alpha"])
        name, key = self.unit_key(principal, body.get("unit"))
        with self.plan_lock:
            plan = plan_sanitize(text, lm=self.lm, method=method, epsilon=epsilon, group_epsilon=group_eps,
                                 spans=spans, tagger=self.tagger if spans is None else None, groups=groups,
                                 top_k=top_k, allow_untagged=allow_untagged, checked=True,
                                 min_new_tokens=self.min_new_tokens, **opts)
        return plan, name, key

    def sanitize(self, principal: Principal, body: Mapping[str, Any]) -> dict[str, Any]:
        from dpinfer.pipelines.sanitize import finish_sanitize

        plan, name, key = self._plan_sanitize(principal, body)

        def work() -> Any:
            out = self.batcher.run(plan.job)
            return finish_sanitize(plan, out, seconds=out.prefill_seconds + out.decode_seconds)

        res = self._charged(key, plan.guarantee, "document", work)
        return {**res.to_dict(), "unit": name, "budget": self.budgets.state(key)}

    def prepare_sanitize_stream(self, principal: Principal, body: Mapping[str, Any]) -> tuple[Any, str, str, Any]:
        """Plan and reserve a streamed sanitisation (a refusal is raised here, before the stream starts)."""
        from dpinfer.serve.budget import BudgetRefused

        plan, name, key = self._plan_sanitize(principal, body)
        try:
            charge = self.budgets.reserve(key, plan.guarantee, scope="document")
        except BudgetRefused:
            self.metrics.refused()
            raise
        return plan, name, key, charge

    def sanitize_stream(self, prepared: tuple[Any, str, str, Any]) -> Iterator[dict[str, Any]]:
        """The released tokens as they are chosen (DP-Fusion releases token by token: each is covered by the
        guarantee), then the release. Decoded alone under the model lock. Once a token has left, the charge is
        committed whatever happens next (a client that disconnects has still received part of a release)."""
        from dpinfer.generation import TextStreamer
        from dpinfer.pipelines.sanitize import finish_sanitize

        plan, name, key, charge = prepared
        job = plan.job
        released = False
        try:
            t0 = time.perf_counter()
            with self.exclusive():
                run = self.engine.stream(job.contexts, job.mechanism, max_new_tokens=job.max_new_tokens,
                                         min_new_tokens=job.min_new_tokens, seed=job.seed, processors=job.processors)
                streamer = TextStreamer(self.lm)
                for event in run:
                    tok = event.tokens[0]
                    if tok >= 0 and tok not in self.lm.eos_token_ids:
                        piece = streamer.push(tok)
                        if piece:
                            released = True
                            yield {"delta": piece}
                tail = streamer.flush()
                if tail:
                    released = True
                    yield {"delta": tail}
                out = run.output
            res = finish_sanitize(plan, out, seconds=time.perf_counter() - t0)
            self.metrics.generated(len(out.sequences[0]), 0.0)
        except BaseException:
            (self.budgets.commit if released else self.budgets.cancel)(charge)
            raise
        self.budgets.commit(charge)
        yield {"done": True, **res.to_dict(), "unit": name, "budget": self.budgets.state(key)}

    # ---------------------------------------------------------------- rag
    def rag(self, principal: Principal, store: str, *, create: bool = False) -> Any:
        """The store ``store`` (owned by the principal's tenant; created on the first documents)."""
        from dpinfer.pipelines.rag import PrivateRAG

        check_name(store, "the store name")
        if self.stores_dir is None:
            raise ConfigurationError("this server has no stores folder (start it with --stores DIR)")
        owner = self.budgets.owner(f"store:{store}", principal.tenant if create else None)
        if owner is None:
            raise NotFound(f"no store named {store}; add documents first with POST /v1/rag/{store}/documents")
        if owner != principal.tenant:
            raise Forbidden(f"the store {store} belongs to another tenant")
        with self.plan_lock:
            if store not in self._rags:
                self._rags[store] = PrivateRAG(self.stores_dir / store, lm=self.lm, embedder=self.embedder)
                self._rags[store]._engine = self.engine  # the one engine of this process
        return self._rags[store]

    def stores(self, principal: Principal) -> list[str]:
        if self.stores_dir is None or not self.stores_dir.exists():
            return []
        return sorted(p.name for p in self.stores_dir.iterdir()
                      if p.is_dir() and self.budgets.owner(f"store:{p.name}") == principal.tenant)

    def rag_add(self, principal: Principal, store: str, body: Mapping[str, Any]) -> dict[str, Any]:
        _unknown(body, ("documents",))
        docs = body.get("documents")
        if not isinstance(docs, list) or not docs:
            raise InvalidInputError("documents must be a non-empty list of strings or {text, id} objects")
        rag = self.rag(principal, store, create=True)
        with self.plan_lock:
            report = rag.add(docs, text_field="text", id_field="id" if all(isinstance(d, dict) and "id" in d
                                                                          for d in docs) else None)
        return {"store": store, **report.to_dict()}

    def rag_ask(self, principal: Principal, store: str, body: Mapping[str, Any]) -> dict[str, Any]:
        from dpinfer.pipelines.rag import check_ask_params

        _unknown(body, ASK_FIELDS)
        question = body.get("question")
        if not isinstance(question, str) or not question.strip():
            raise InvalidInputError("question must be a non-empty string")
        opts = {"mechanism": _get(body, "mechanism", (str,), RAG.method), "epsilon": _get(body, "epsilon", NUM),
                "delta": _get(body, "delta", NUM, RAG.delta),
                "max_new_tokens": _get(body, "max_new_tokens", (int,), RAG.max_new_tokens),
                "temperature": _get(body, "temperature", NUM, RAG.temperature)}
        check_ask_params(**opts)
        rag = self.rag(principal, store)
        name, key = self.unit_key(principal, body.get("unit"), default=f"store.{store}")
        with self.model_lock if opts["mechanism"] == "summarize" else self.plan_lock:  # summaries run the engine
            plan = rag.plan_ask(question, checked=True, **opts)
        del question
        def work() -> Any:
            t0 = time.perf_counter()
            out = self.batcher.run(plan.job)
            return rag.finish_ask(plan, out, generation_seconds=time.perf_counter() - t0)

        answer = self._charged(key, plan.guarantee, "store", work)
        release = answer.to_dict()
        release.pop("seconds", None)  # timing is not part of a release
        return {**release, "store": store, "unit": name, "budget": self.budgets.state(key)}

    # ---------------------------------------------------------------- protect-prompt
    def _protect_options(self, body: Mapping[str, Any]) -> dict[str, Any]:
        from dpinfer.pipelines.protect_prompt import check_protect_params

        opts = {"method": _get(body, "method", (str,), PROTECT.method), "epsilon": _get(body, "epsilon", NUM),
                "delta": _get(body, "delta", NUM, PROTECT.delta), "n_rewrites": _get(body, "n_rewrites", (int,)),
                "n_keywords": _get(body, "n_keywords", (int,), PROTECT.n_keywords),
                "keywords": _get(body, "keywords", (str,), PROTECT.keywords),
                "max_new_tokens": _get(body, "max_new_tokens", (int,), PROTECT.max_new_tokens),
                "n_exemplars": _get(body, "n_exemplars", (int,), PROTECT.n_exemplars)}
        check_protect_params(**opts)
        return opts

    def protect_guarantee(self, opts: Mapping[str, Any]) -> Any:
        """Prompt protection's ex-ante guarantee (its cost): stage 1's, from its parameters and the public clip
        bounds; the release's own guarantee is the same loss."""
        from dpinfer.accounting import Guarantee
        from dpinfer.pipelines.clip_bounds import clip_bounds
        from dpinfer.pipelines.protect_prompt import ADJACENCY, check_protect_params, stage1_mechanism

        n = check_protect_params(**opts)
        mech = stage1_mechanism(clip=clip_bounds(self.lm).bounds, n_rewrites=n, max_new_tokens=opts["max_new_tokens"],
                                delta=opts["delta"], epsilon=opts["epsilon"])
        return Guarantee.from_loss(mech.loss(opts["max_new_tokens"]), delta=opts["delta"], mechanism=opts["method"],
                                   adjacency=ADJACENCY, parameters={}, max_new_tokens=opts["max_new_tokens"])

    def protect(self, principal: Principal, body: Mapping[str, Any], *, prompt: str | None = None) -> dict[str, Any]:
        from dpinfer.pipelines.protect_prompt import protect_prompt

        if prompt is None:
            _unknown(body, PROTECT_FIELDS)
            prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise InvalidInputError("prompt must be a non-empty string")
        opts = self._protect_options(body)
        name, key = self.unit_key(principal, body.get("unit"), default="prompts")
        cost = self.protect_guarantee(opts)
        text = prompt
        del prompt

        def work() -> Any:
            with self.exclusive():
                return protect_prompt(text, lm=self.lm, embedder=self.embedder if opts["method"] == "dp-gtr" and
                                      opts["n_exemplars"] > 1 else None, **opts)

        res = self._charged(key, cost, "prompt-source", work)
        if abs(res.guarantee.epsilon - cost.epsilon) > 1e-9 * max(1.0, cost.epsilon):
            log.warning("prompt protection's guarantee differs from the reserved cost")
        release = res.to_dict()
        for k in ("seconds", "stage_seconds"):
            release.pop(k, None)  # timing is not part of a release
        return {**release, "unit": name, "budget": self.budgets.state(key)}

    # ---------------------------------------------------------------- synth
    def check_synth(self, body: Mapping[str, Any]) -> Any:
        """Every check of a synthesis job and its plan (no model): bad parameters are refused before the job."""
        from dpinfer.pipelines.synthesize import plan_synthesis

        _unknown(body, SYNTH_FIELDS)
        refs = body.get("references")
        if not isinstance(refs, list) or not refs or not all(isinstance(r, str) and r.strip() for r in refs):
            raise InvalidInputError("references must be a non-empty list of non-empty strings (the private records)")
        if body.get("unit") is not None:
            check_name(body.get("unit"), "the unit")
        return plan_synthesis(refs, method=_get(body, "method", (str,), SYNTH.method),
                              epsilon=_get(body, "epsilon", NUM), delta=_get(body, "delta", NUM, SYNTH.delta),
                              batch_size=_get(body, "batch_size", (int,), SYNTH.batch_size),
                              max_new_tokens=_get(body, "max_new_tokens", (int,), SYNTH.max_new_tokens),
                              max_texts=_get(body, "max_texts", (int,)))

    def synth(self, principal: Principal, body: Mapping[str, Any]) -> dict[str, Any]:
        """A synthesis job (run by ``POST /v1/synth`` in the background): plan, reserve, generate, commit."""
        from dpinfer.pipelines.synthesize import synthesize_iter

        plan = self.check_synth(body)
        name, key = self.unit_key(principal, body.get("unit"), default="corpus")
        def work() -> list[Any]:
            with self.exclusive():
                return sorted(synthesize_iter(plan, lm=self.lm), key=lambda t: t.batch)

        texts = self._charged(key, plan.guarantee, "corpus", work)
        release = plan.header(self.lm.name)["dpinfer"]
        release["texts"] = [{k: v for k, v in t.to_dict().items() if k != "data_dependent"} for t in texts]
        return {**release, "unit": name, "budget": self.budgets.state(key)}

    # ---------------------------------------------------------------- plain generation
    @contextmanager
    def exclusive(self) -> Iterator[None]:
        t0 = time.perf_counter()
        with self.model_lock:
            yield
        self.metrics.generated(0, time.perf_counter() - t0)

    def plain_job(self, messages: Sequence[Mapping[str, str]], *, max_new_tokens: int, temperature: float,
                  top_p: float | None) -> tuple[list[int], Any]:
        from dpinfer.engine import EngineJob
        from dpinfer.mechanisms.sampler import Sampler
        from dpinfer.validation import check_generate_params

        check_generate_params(max_new_tokens=max_new_tokens, temperature=temperature, top_k=None, top_p=top_p)
        ids = self.lm.encode(self.lm.chat_prompt([dict(m) for m in messages]))
        if len(ids) + max_new_tokens > self.lm.context_window:
            raise InvalidInputError(f"the messages ({len(ids)} tokens) plus max_tokens={max_new_tokens} exceed the "
                                    f"model's context window ({self.lm.context_window}); shorten them")
        mech = Sampler(temperature=temperature, top_k=None, top_p=top_p, mode="independent")
        # no privacy here, so the row's own length may set the public width the slot engine batches on
        return ids, EngineJob(contexts=[ids], mechanism=mech, max_new_tokens=max_new_tokens, pad_width=len(ids))

    def generate(self, messages: Sequence[Mapping[str, str]], *, max_new_tokens: int = SERVE.chat_max_new_tokens,
                 temperature: float = GENERATE.temperature, top_p: float | None = GENERATE.top_p) -> dict[str, Any]:
        ids, job = self.plain_job(messages, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
        out = self.batcher.run(job)
        seq = out.sequences[0]
        return {"text": self.lm.decode(seq).strip(), "prompt_tokens": len(ids), "completion_tokens": len(seq),
                "finish_reason": "length" if out.finish_reasons[0] == "length" else "stop"}

    def generate_stream(self, messages: Sequence[Mapping[str, str]], *, max_new_tokens: int = SERVE.chat_max_new_tokens,
                        temperature: float = GENERATE.temperature, top_p: float | None = GENERATE.top_p
                        ) -> Iterator[str]:
        """Yield the text piece by piece (decoded alone under the model lock: token events need the one-job engine)."""
        from dpinfer.generation import TextStreamer

        _, job = self.plain_job(messages, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
        streamer = TextStreamer(self.lm)
        with self.exclusive():
            n = 0
            for event in self.engine.stream(job.contexts, job.mechanism, max_new_tokens=max_new_tokens):
                tok = event.tokens[0]
                if tok >= 0 and tok not in self.lm.eos_token_ids:
                    n += 1
                    piece = streamer.push(tok)
                    if piece:
                        yield piece
        self.metrics.generated(n, 0.0)


def replace_last_user(messages: Sequence[Mapping[str, Any]], content: str) -> list[dict[str, Any]]:
    """The messages with the last user message's content replaced."""
    out = [dict(m) for m in messages]
    for m in reversed(out):
        if m.get("role") == "user":
            m["content"] = content
            return out
    raise InvalidInputError("the messages have no user message")


__all__ = ["Batcher", "Forbidden", "Metrics", "NotFound", "Runtime", "replace_last_user"]
