"""Synthesis jobs of the service (``POST /v1/synth``, then ``GET /v1/jobs/{id}``), resumable like ``dpinfer synth
--out``: a restarted server resumes every job that had not ended, generates only the batches still missing, and never
releases a finished text a second time.

Each job lives in ``STATE/jobs/ID/`` (``STATE``: the folder of the server's ledger; folders and files mode 0700/0600):

- ``job.json``: the job's tenant, units and status (``queued``, ``running``, ``done``, ``refused``, ``failed``) with a
  one-line error; rewritten atomically at each change; never any text.
- ``request.json``: the request (the private references and the parameters), kept only while the job has not ended,
  so that a restarted server can plan it again; deleted when it ends.
- ``out.jsonl``: the output, written by the corpus jobs' loop (:func:`~dpinfer.jobs.run_resumable` with
  :class:`~dpinfer.jobs.synth.SynthesisOutput`, as ``dpinfer synth --out`` writes it): the header (guarantee,
  settings, counts), then each text as its batch finishes, one durable line each (a torn last line is settled by the
  same rule as the command's); its private partition sidecar exists while the job is unfinished.

With a PostgreSQL ledger (replicas, possibly on several machines) the job's state is also kept in the ledger's
database (:class:`~dpinfer.serve.job_table.JobTable`: status, progress, error and, once done, the released texts;
never the request), so that any replica answers the poll; the job still runs on the replica that took it (its
folder there), which renews the row's lease; a job whose replica died is reported failed by the next poll, its
pending charges settled by the ledger's rule. With a SQLite ledger (one process) ``job.json`` is the job's state.

Budget: a job is charged once, its plan's ex-ante guarantee on the corpus's unit (``c-`` + a keyed hash of the
references) and on the unit the request names, if any (scope ``corpus``), reserved before anything
is generated under the job's resume key (:meth:`Ledger.resume_key <dpinfer.accounting.ledger.Ledger.resume_key>`):
a server killed before the commit leaves the reservation pending (counted as spent); the resumed job takes it over
instead of reserving again. It is committed once a text is in ``out.jsonl`` and cancelled if the job released
nothing.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dpinfer.defaults import SERVE
from dpinfer.errors import DPInferError
from dpinfer.io import atomic_write_text
from dpinfer.jobs.synth import SynthesisOutput, run_synthesis_job
from dpinfer.pipelines.synthesize import synthesize_iter
from dpinfer.serve.budget import BudgetRefused
from dpinfer.serve.job_table import JobTable
from dpinfer.serve.keys import NotFound, Principal

log = logging.getLogger("dpinfer.serve")

JOB = "dpinfer serve synth"
ENDED = ("done", "refused", "failed")
TEXT_FIELDS = ("batch", "text", "labels", "tokens", "finish_reason")
"""What a text's line holds: the release (its diagnostics, e.g. data-dependent figures, stay out)."""
_ID = re.compile(r"[0-9a-f]{32}")


class SynthJobs:
    """The synthesis jobs of one server, kept under ``root`` (module docstring); ``service``: the
    :class:`~dpinfer.serve.service.Service` that checks, plans and decodes them; ``table``: their rows in a
    PostgreSQL ledger shared by replicas (module docstring), or None (the files are the state)."""

    def __init__(self, root: str | os.PathLike[str], service: Any, table: JobTable | None = None) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.service = service
        self.table = table
        self.threads: dict[str, threading.Thread] = {}
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        if table is not None:  # the heartbeat: this replica's running jobs keep their lease
            threading.Thread(target=self._heartbeat, name="dpinfer-synth-lease", daemon=True).start()

    # ---------------------------------------------------------------- routes
    def submit(self, principal: Principal, body: Mapping[str, Any]) -> dict[str, Any]:
        """Check the request (a bad one is refused now, 422), keep it, start the job; ``{id, status, poll}``."""
        plan = self.service.check_synth(body)
        corpus = "c-" + self.service.budgets.ledger.unit_for_text(json.dumps(body["references"]))[2:]
        units = self.service.units_for(principal, corpus, body.get("unit"))
        job_id = uuid.uuid4().hex
        folder = self.root / job_id
        folder.mkdir(mode=0o700)
        _write(folder / "request.json", {"body": dict(body)})
        _write(folder / "job.json", {"id": job_id, "tenant": principal.tenant, "units": units, "status": "queued"})
        if self.table is not None:
            self.table.add(job_id, principal.tenant, units, len(plan.batches))
        self._start(job_id)
        return {"id": job_id, "status": "queued", "poll": f"/v1/jobs/{job_id}"}

    def get(self, principal: Principal, job_id: str) -> dict[str, Any]:
        """The job's status; once done, its result (the header's release fields, the texts, the unit's budget)."""
        if self.table is not None:
            return self._shared(principal, job_id)
        state = self._state(job_id) if _ID.fullmatch(job_id) else None
        if state is None or state.get("tenant") != principal.tenant:  # another tenant's job is a missing one
            raise NotFound("no such job")
        out = {k: v for k, v in state.items() if k not in ("tenant", "units")}
        if state["status"] == "done":
            units = job_units(state)
            out["result"] = {**self.release(job_id), **self.service.charged(units)}
        return out

    def _shared(self, principal: Principal, job_id: str) -> dict[str, Any]:
        """:meth:`get` from the ledger's table (any replica): a dead holder's unfinished job is failed first."""
        table = self.table
        assert table is not None
        row = table.get(job_id) if _ID.fullmatch(job_id) else None
        if row is None or row["tenant"] != principal.tenant:  # another tenant's job is a missing one
            raise NotFound("no such job")
        if table.dead(row):
            table.fail_dead(row, self._resume_keys(job_id, row))
            row = table.get(job_id) or row
        out: dict[str, Any] = {"id": job_id, "status": row["status"],
                               "progress": {"done": row["done"], "total": row["total"]}}
        out.update({k: row[k] for k in ("error", "budget") if row[k] is not None})
        if row["status"] == "done":
            out["result"] = {**row["result"], **self.service.charged(job_units(row))}
        return out

    def _resume_keys(self, job_id: str, state: Mapping[str, Any]) -> list[str]:
        """The resume keys of a job's charges (one per unit)."""
        key = self.service.budgets.ledger.resume_key(JOB, job_id)
        return self.service.budgets.resume_keys(job_units(state), key)

    def release(self, job_id: str) -> dict[str, Any]:
        """What ``out.jsonl`` holds: the header's fields and the texts in batch order."""
        lines = [json.loads(line) for line in (self.root / job_id / "out.jsonl").read_text("utf-8").splitlines()
                 if line.strip()]
        header = dict(lines[0]["dpinfer"])
        header.pop("kind", None)
        header["texts"] = sorted(lines[1:], key=lambda t: t["batch"])
        return header

    def resume(self) -> list[str]:
        """Start again every job that had not ended (a server stopped or killed mid-job); their ids."""
        resumed = []
        for folder in sorted(self.root.iterdir()) if self.root.exists() else []:
            state = self._state(folder.name) if _ID.fullmatch(folder.name) else None
            if state is not None and state["status"] not in ENDED and self._take_over(folder.name):
                self._start(folder.name)
                resumed.append(folder.name)
        if resumed:
            log.info("resuming %d synthesis job(s)", len(resumed))
        return resumed

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the running jobs' threads (tests, shutdown)."""
        for thread in list(self.threads.values()):
            thread.join(timeout)

    def close(self) -> None:
        """Stop the heartbeat (the jobs' leases then run out unless the process is looked up)."""
        self.stopped.set()

    def _heartbeat(self) -> None:
        assert self.table is not None
        while not self.stopped.wait(SERVE.job_heartbeat_s):
            with self.lock:
                running = [job_id for job_id, t in self.threads.items() if t.is_alive()]
            try:
                self.table.renew(running)
            except DPInferError:  # the database is unreachable for now: the next beat tries again
                log.warning("could not renew the synthesis jobs' leases; retrying")

    def _take_over(self, job_id: str) -> bool:
        """Whether this server may resume its folder's unfinished job: always with a SQLite ledger; with a shared
        one, when its row is unfinished and its holder dead (taken over, once) or it has no row yet (added), else the
        folder's job is ended as the row says (failed by a poll meanwhile: its request is deleted, never resumed)."""
        if self.table is None:
            return True
        row = self.table.get(job_id)
        state = self._state(job_id) or {}
        if row is None and "tenant" in state:  # a job of a server before the table: its row now, then resumed
            self.table.add(job_id, str(state["tenant"]), job_units(state), 0)
            return True
        if row is not None and row["holder"] == self.table.holder and row["status"] not in ENDED:
            return True
        if row is not None and self.table.dead(row) and self.table.take_over(job_id, str(row["holder"])):
            return True
        row = self.table.get(job_id)
        if row is not None and row["status"] in ENDED:
            self._close(job_id, status=row["status"], **({"error": row["error"]} if row["error"] else {}))
        return False

    # ---------------------------------------------------------------- one job
    def _state(self, job_id: str) -> dict[str, Any] | None:
        try:
            return json.loads((self.root / job_id / "job.json").read_text("utf-8"))
        except (OSError, ValueError):
            return None

    def _set(self, job_id: str, **fields: Any) -> None:
        state = self._state(job_id) or {}
        state.update(fields)
        _write(self.root / job_id / "job.json", state)

    def _start(self, job_id: str) -> None:
        with self.lock:
            running = self.threads.get(job_id)
            if running is not None and running.is_alive():
                return
            thread = threading.Thread(target=self._run, args=(job_id,), name=f"dpinfer-synth-{job_id[:8]}",
                                      daemon=True)
            self.threads[job_id] = thread
            thread.start()

    def _run(self, job_id: str) -> None:
        folder = self.root / job_id
        try:
            self._set(job_id, status="running")
            self._row(job_id, status="running")
            self._synthesize(job_id)
        except BudgetRefused as exc:
            self._end(job_id, status="refused", error=_line(str(exc)), budget=exc.state)
        except DPInferError as exc:
            self._end(job_id, status="failed", error=_line(str(exc)))
        except Exception as exc:  # its message may quote the input: withheld
            log.error("synthesis job failed: unexpected %s (message withheld)", type(exc).__name__)
            self._end(job_id, status="failed", error=f"unexpected {type(exc).__name__} (message withheld)")
        else:
            SynthesisOutput(folder / "out.jsonl").finish()  # every batch is released: the partition file goes
            self._end(job_id, status="done")

    def _end(self, job_id: str, **fields: Any) -> None:
        self._row(job_id, **fields, **({"result": self.release(job_id)} if fields["status"] == "done" else {}))
        self._close(job_id, **fields)

    def _close(self, job_id: str, **fields: Any) -> None:
        self._set(job_id, **fields)
        (self.root / job_id / "request.json").unlink(missing_ok=True)  # the private input is no longer needed

    def _row(self, job_id: str, **fields: Any) -> None:
        """The job's row in the shared table (its status, progress, error; the release once done), if any."""
        if self.table is None:
            return
        try:
            if not self.table.update(job_id, **fields):
                log.warning("synthesis job %s: its row was ended by another replica (its lease ran out)", job_id[:8])
        except DPInferError:  # the database is unreachable: the job goes on (its files are its state here)
            log.warning("synthesis job %s: could not update its row in the ledger", job_id[:8])

    def _progress(self, job_id: str, done: int, total: int) -> None:
        self._set(job_id, progress={"done": done, "total": total})
        self._row(job_id, done=done, total=total)

    def _synthesize(self, job_id: str) -> None:
        """Plan the job again from its request, then the batches not yet in ``out.jsonl`` (module docstring)."""
        svc = self.service
        state = self._state(job_id) or {}
        body = json.loads((self.root / job_id / "request.json").read_text("utf-8"))["body"]
        plan = svc.check_synth(body)
        header = plan.header(svc.lm.name)
        digest = plan.partition_sha256()
        out = SynthesisOutput(self.root / job_id / "out.jsonl")
        units = job_units(state)
        legacy = "units" not in state  # a job of an earlier server: its one charge under the job's own resume key
        total = len(plan.batches)
        resume_key = svc.budgets.ledger.resume_key(JOB, job_id)

        def hold(resumed: bool) -> Any:
            if resumed:  # a resumed job that released texts: its charges (pending if the server died) are spent
                svc.budgets.commit_left(units, resume_key, per_unit=legacy is False)
                return None
            return svc.hold(units, plan.charges, resume_key=resume_key, per_unit=legacy is False)

        def check(todo: list[int]) -> None:
            out.check(header, digest)
            self._progress(job_id, len(out.done), total)

        run_synthesis_job(out, total, header, digest,
                          lambda skip: synthesize_iter(plan, runtime=svc.core, skip_batches=skip), job=JOB,
                          hold=hold, record=_text_line, check=check,
                          on_release=lambda key, record: self._progress(job_id, len(out.done), total))


def _text_line(text: Any) -> dict[str, Any]:
    """A text's line: the release only (:data:`TEXT_FIELDS`)."""
    record = text.to_dict()
    return {k: record[k] for k in TEXT_FIELDS}


def job_units(state: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The units a job is charged to ((the tenant's name, the ledger's) each); a job written by an earlier server
    (one ``unit``, the ledger's own name) keeps its unit."""
    if "units" in state:
        return [(str(u[0]), str(u[1])) for u in state["units"]]
    return [(str(state["unit"]), str(state["unit"]))]


def _line(message: str) -> str:
    return " ".join(message.split())


def _write(path: Path, obj: Mapping[str, Any]) -> None:
    atomic_write_text(path, json.dumps(obj, ensure_ascii=False) + "\n")  # a new file of mode 0600, then renamed
