"""The counters of ``GET /metrics`` (Prometheus text format, an admin key): requests by route template and status,
jobs batched, queue length, budget refusals. Labels are route templates and status codes only. No figure that depends
on what a release holds (its realised token count, its decoding time, the engine steps it took) is published: two
scrapes around one request would read it off. Those counters are kept in the process for the benchmarks only."""

from __future__ import annotations

import threading
import time
from typing import Any


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
        self.queues: list[Any] = []
        """The batchers' job queues (a server has one per shared batch): the queue-length gauge is their sum."""
        self.started = time.time()

    @property
    def queue_length(self) -> int:
        """Jobs waiting for an engine, over every batcher."""
        return sum(q.qsize() for q in self.queues)

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
            lines += [
                "# HELP dpinfer_budget_refusals_total Requests refused because they would overspend a unit.",
                "# TYPE dpinfer_budget_refusals_total counter", f"dpinfer_budget_refusals_total {self.refusals}",
                "# HELP dpinfer_queue_length Jobs waiting for an engine (every shared batch).",
                "# TYPE dpinfer_queue_length gauge", f"dpinfer_queue_length {self.queue_length}",
                "# HELP dpinfer_batched_jobs_total Jobs the batcher submitted to the engine.",
                "# TYPE dpinfer_batched_jobs_total counter", f"dpinfer_batched_jobs_total {self.batched_jobs}",
            ]
        return "\n".join(lines) + "\n"
