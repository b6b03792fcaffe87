"""The synthesis jobs' state in the ledger's own database (its ``synth_jobs`` table, schema version 5), so that every
replica sharing a PostgreSQL ledger answers ``GET /v1/jobs/{id}`` whichever replica took the job.

A row holds what the poll answers, never the request: the job's id, tenant and units (their names), its status, its
progress (texts released of the total), a one-line error and a refusal's budget state, and, once done, its result
(the release's header fields and texts: public differentially private outputs). The references (private input) stay
in the job's own folder on the replica that runs it, as with a SQLite ledger. Every statement binds its
values (psycopg 3 or sqlite3 through the ledger's connection), as the keys table does
(:class:`~dpinfer.serve.keys.LedgerKeys`).

The job runs on the replica that took it, its **holder** (``host:pid:start``, the ledger's holders), which renews
the row's **lease** while it runs. A poll that finds an unfinished job whose holder is dead (its process gone, or on
another machine its lease run out: the ledger's ``holder_alive`` rule) reports it failed, once (a conditional
update), after settling the charges it left pending under its resume keys by the ledger's rule
(:meth:`Ledger.settle_job <dpinfer.accounting.ledger.Ledger.settle_job>`: anything that may have been released is
counted for good).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from dpinfer.accounting.ledger import holder_alive, holder_id
from dpinfer.defaults import SERVE

ENDED = ("done", "refused", "failed")
DEAD = "the server (replica) running the job stopped before it finished; submit the job again"
"""The error of a job whose holder died (its charges settled by the ledger's rule)."""
_LIVE = "status IN ('queued', 'running')"
_COLUMNS = frozenset({"status", "done", "total", "error", "budget", "result"})
"""The columns :meth:`JobTable.update` may set (their names are written into the statement; values are bound)."""


class JobTable:
    """The ``synth_jobs`` rows of one ledger (module docstring); ``holder``: this process."""

    def __init__(self, ledger: Any) -> None:
        self.ledger = ledger
        self.holder = holder_id()

    def add(self, job_id: str, tenant: str, units: list[tuple[str, str]], total: int) -> None:
        now = time.time()
        with self.ledger._transaction("add a synthesis job") as db:
            db.execute("INSERT INTO synth_jobs (id, tenant, units, status, done, total, holder, lease, created, "
                       "updated) VALUES (?, ?, ?, 'queued', 0, ?, ?, ?, ?, ?)",
                       (job_id, tenant, json.dumps(units), total, self.holder, now + SERVE.job_lease_s, now, now))

    def get(self, job_id: str) -> dict[str, Any] | None:
        """The job's row as a mapping (``units``, ``budget``, ``result`` decoded), or None."""
        rows = self.ledger._query("SELECT id, tenant, units, status, done, total, error, budget, result, holder, "
                                  "lease FROM synth_jobs WHERE id = ?", (job_id,))
        if not rows:
            return None
        keys = ("id", "tenant", "units", "status", "done", "total", "error", "budget", "result", "holder", "lease")
        row = dict(zip(keys, rows[0], strict=True))
        for key in ("units", "budget", "result"):
            row[key] = None if row[key] is None else json.loads(row[key])
        return row

    def dead(self, row: Mapping[str, Any]) -> bool:
        """Whether an unfinished job's holder died (the ledger's rule for a reservation's holder)."""
        return row["status"] not in ENDED and not holder_alive(str(row["holder"]), row["lease"], time.time())

    def update(self, job_id: str, **fields: Any) -> bool:
        """Set ``fields`` (and renew the lease) on this holder's unfinished job; False when it is not (any more)."""
        cols = sorted(fields)
        if not _COLUMNS.issuperset(cols):
            raise ValueError("not a column of synth_jobs")
        values = [json.dumps(fields[c]) if c in ("budget", "result") else fields[c] for c in cols]
        now = time.time()
        sets = "".join(f"{c} = ?, " for c in cols)  # column names from this module's own keywords, never a value
        with self.ledger._transaction("update a synthesis job") as db:
            cur = db.execute(f"UPDATE synth_jobs SET {sets}lease = ?, updated = ? WHERE id = ? AND holder = ? AND "
                             f"{_LIVE}", (*values, now + SERVE.job_lease_s, now, job_id, self.holder))
            return bool(cur.rowcount)

    def renew(self, job_ids: list[str]) -> None:
        """Renew the lease of this holder's running jobs (the heartbeat)."""
        for job_id in job_ids:
            self.update(job_id)

    def take_over(self, job_id: str, old_holder: str) -> bool:
        """This process takes over an unfinished job of a dead holder (a restarted server resuming its folder's job)."""
        now = time.time()
        with self.ledger._transaction("take over a synthesis job") as db:
            cur = db.execute(f"UPDATE synth_jobs SET holder = ?, lease = ?, updated = ? WHERE id = ? AND holder = ? "
                             f"AND {_LIVE}", (self.holder, now + SERVE.job_lease_s, now, job_id, old_holder))
            return bool(cur.rowcount)

    def fail_dead(self, row: Mapping[str, Any], resume_keys: list[str]) -> None:
        """A dead holder's job: its pending charges settled by the ledger's rule, then the job marked failed (once)."""
        self.ledger.settle_job(resume_keys, str(row["holder"]))
        now = time.time()
        with self.ledger._transaction("fail a synthesis job") as db:
            db.execute(f"UPDATE synth_jobs SET status = 'failed', error = ?, updated = ? WHERE id = ? AND holder = ? "
                       f"AND {_LIVE}", (DEAD, now, row["id"], row["holder"]))
