"""The counters of ``GET /metrics`` (Prometheus text format): requests by route template and status, released
tokens, engine time and steps, queue length, budget refusals. Labels are route templates and status codes only."""

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
                "# HELP dpinfer_queue_length Jobs waiting for an engine (every shared batch).",
                "# TYPE dpinfer_queue_length gauge", f"dpinfer_queue_length {self.queue_length}",
                "# HELP dpinfer_engine_steps_total Engine steps of the batcher (one token for every running job).",
                "# TYPE dpinfer_engine_steps_total counter", f"dpinfer_engine_steps_total {self.batches}",
                "# HELP dpinfer_batched_jobs_total Jobs the batcher submitted to the engine.",
                "# TYPE dpinfer_batched_jobs_total counter", f"dpinfer_batched_jobs_total {self.batched_jobs}",
            ]
        return "\n".join(lines) + "\n"
