"""Corpus jobs on Ray Data: ``dpinfer sanitize --corpus IN --out OUT --backend ray [--ray-address ADDR]``.

The driver reads the corpus and the output (:mod:`dpinfer.jobs.corpus`: the same refusals and resume rules as
the local backend), and sends the records still to do through ``ray.data.from_items(...).map_batches`` over
:class:`SanitizeActor`, a stateful actor class: each actor loads the model ONCE and runs
:func:`~dpinfer.pipelines.sanitize_many.sanitize_many` (one :meth:`Engine.run_jobs <dpinfer.engine.Engine.run_jobs>`
call) per batch; ``num_gpus=1`` per actor when the model runs on CUDA, else ``num_cpus``; several batches in flight per
actor (``ActorPoolStrategy(max_tasks_in_flight_per_actor=...)``) so an actor never waits for its next batch. Each record
comes back to the driver as its output line as soon as its batch finishes, and the driver appends it (the same line the
local backend would write: with a test seed, the same text, since a record's seed depends on its id only).

With a ledger (``--ledger``: a PostgreSQL URL, or a SQLite file on a one-machine Ray), each record's unit is charged
exactly once: the driver reserves a placeholder per record under the record's resume key before the job starts
(``settle_first``: nothing can be released before it is priced), the actor that plans the record prices it by
reserving under the same key (:meth:`Ledger.reserve <dpinfer.accounting.ledger.Ledger.reserve>` takes over the
pending charge: idempotent, so a task Ray retries after a failed attempt re-prices the same charge instead of adding
one), and the driver commits it once the record's line is durably in ``OUT``.

Nothing leaves the machine: usage statistics are off (``RAY_USAGE_STATS_ENABLED=0``, set before ``ray`` is imported)
and a local Ray starts without its dashboard. With ``--ray-address`` the records travel to that cluster's nodes: its
object store holds (and may spill to its local disk) the private texts while they are processed; run it only on a
cluster you trust with the corpus. Ray is an optional extra: ``.venv/bin/pip install -e ".[ray]"``.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dpinfer.errors import ConfigurationError, install_hint

if TYPE_CHECKING:
    from dpinfer.pipelines.sanitize_many import Record

INSTALL_HINT = f"install it {install_hint('ray')}"


def check_ray() -> None:
    """Refuse in one line, saying how to install it, when Ray Data is not installed (checked without importing it)."""
    if importlib.util.find_spec("ray") is None:
        raise ConfigurationError(f"--backend ray needs Ray Data, which is not installed; {INSTALL_HINT}")


def _quiet_ray_env() -> None:
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # nothing leaves the machine (set before ray is imported)
    os.environ.setdefault("RAY_DISABLE_DOCKER_CPU_WARNING", "1")


def init_ray(address: str | None = None, *, num_cpus: int | None = None) -> Any:
    """Import Ray with usage statistics off and start (or join, with ``address``) a Ray cluster; a local one starts
    without its dashboard. Returns the ``ray`` module. An already initialised Ray is reused as it is."""
    check_ray()
    _quiet_ray_env()
    import ray

    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"log_to_driver": False, "configure_logging": False}
        if address:
            kwargs["address"] = address
        else:
            kwargs["include_dashboard"] = False
            if num_cpus is not None:
                kwargs["num_cpus"] = num_cpus
        try:
            ray.init(**kwargs)
        except ConnectionError as exc:
            raise ConfigurationError(f"could not join the Ray cluster at {address!r} ({type(exc).__name__}); check "
                                     "--ray-address (e.g. ray://HOST:10001 or auto)") from None
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # the driver draws its own (records written, rate, ETA)
    return ray


class SanitizeActor:
    """The stateful engine actor of :func:`sanitize_corpus_ray`: loads the model once (``__init__``), then sanitises
    one batch of records per call (``{"key", "text", "spans"}`` columns, spans as JSON text or ``""``) and returns
    ``{"key", "line"}``: each record's output line (:func:`~dpinfer.jobs.corpus.release_record`)."""

    def __init__(self, model: str | None, device: str | None, quantize: str | None, tagger: str | None,
                 seed: int | None, options: Mapping[str, Any], ledger: str | None = None) -> None:
        from dpinfer.engine import Engine
        from dpinfer.models import load_model
        from dpinfer.taggers import get_tagger

        self.lm = load_model(model, device=device, quantize=quantize)
        self.engine = Engine(self.lm)
        label_map = options.get("label_map")
        self.tagger = None if tagger is None else get_tagger(tagger, **({"label_map": label_map} if label_map
                                                                         else {}))
        self.seed = seed
        self.options = dict(options)
        self.ledger: Any = None
        if ledger:
            from dpinfer.accounting.ledger import Ledger

            self.ledger = Ledger(ledger)
        self.charges: dict[str, tuple[str, str]] = {}

    def _planned(self, record_id: str | int, guarantee: Any) -> None:
        """A record is planned (before any of its tokens): its exact cost, reserved under its resume key (taking
        over the driver's placeholder, or the charge an earlier attempt of this task priced)."""
        from dpinfer.accounting.charge import RecordCharges
        from dpinfer.jobs.corpus import id_key

        unit, resume_key = self.charges[id_key(record_id)]
        RecordCharges.price_elsewhere(self.ledger, unit, guarantee, scope="document", resume_key=resume_key)

    def __call__(self, batch: Mapping[str, Sequence[Any]]) -> dict[str, list[str]]:
        from dpinfer.io import encode_record
        from dpinfer.jobs.corpus import id_key, release_record
        from dpinfer.pipelines.sanitize_many import Record, sanitize_many

        records = [Record(json.loads(str(k)), str(t), None if not s else json.loads(str(s)))
                   for k, t, s in zip(batch["key"], batch["text"], batch["spans"], strict=True)]
        planned = None
        if self.ledger is not None:
            self.charges = {str(k): (str(u), str(r)) for k, u, r in zip(batch["key"], batch["unit"], batch["rkey"],
                                                                        strict=True)}
            planned = self._planned
        keys, lines = [], []
        for outcome in sanitize_many(records, engine=self.engine, tagger=self.tagger, seed=self.seed,
                                     on_planned=planned, **self.options):
            keys.append(id_key(outcome.id))
            lines.append(encode_record(release_record(outcome)).decode("utf-8"))
        return {"key": keys, "line": lines}


def sanitize_corpus_ray(records: Sequence[Record], *, model: str | None = None, device: str | None = None,
                        quantize: str | None = None, tagger: str | None = None, seed: int | None = None,
                        options: Mapping[str, Any] | None = None, address: str | None = None,
                        batch_size: int = 8, actors: int | None = None, in_flight: int = 2,
                        num_cpus: int | None = None, ledger: str | None = None,
                        charge_of: Callable[[Record], tuple[str, str]] | None = None) -> Iterator[dict[str, Any]]:
    """Sanitise ``records`` on Ray Data; yield each output record (a dict, as the local backend writes it) as soon as
    its batch finishes. ``actors``: engine actors (default: one per GPU when the model runs on CUDA, else 1);
    ``in_flight``: batches queued per actor; ``num_cpus``: CPUs of a local Ray (default: all). ``ledger`` (where
    the ledger is: a PostgreSQL URL or a file every actor can open) and ``charge_of(record)`` (its unit and resume
    key): each actor prices the records it plans there (see the module docstring)."""
    import torch

    from dpinfer.pipelines.sanitize_many import needs_tagger

    ray = init_ray(address, num_cpus=num_cpus)
    if not records:
        return
    use_gpu = (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    if actors is None:
        actors = max(1, int(ray.cluster_resources().get("GPU", 0))) if use_gpu else 1
    resources: dict[str, Any] = {"num_gpus": 1} if use_gpu else {"num_cpus": 1}
    rows = [{"key": json.dumps(r.id, ensure_ascii=False), "text": r.text,
             "spans": "" if r.spans is None else json.dumps(r.spans, ensure_ascii=False),
             **dict(zip(("unit", "rkey"), charge_of(r) if ledger and charge_of else ("", ""), strict=True))}
            for r in records]
    ds = ray.data.from_items(rows, override_num_blocks=max(1, -(-len(rows) // batch_size)))
    out = ds.map_batches(
        SanitizeActor, batch_size=batch_size, batch_format="numpy",
        fn_constructor_kwargs={"model": model, "device": device, "quantize": quantize,
                               "tagger": tagger if needs_tagger(records, options) else None,
                               "seed": seed, "options": dict(options or {}), "ledger": ledger or None},
        compute=ray.data.ActorPoolStrategy(size=actors, max_tasks_in_flight_per_actor=in_flight),
        **resources)
    for row in out.iter_rows():
        yield json.loads(str(row["line"]))
