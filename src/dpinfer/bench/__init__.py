"""Benchmarks behind ``dpinfer bench ...``: each prints what it measured, with its baseline, from one run."""

from typing import Any


def machine_load() -> dict[str, Any]:
    """What a timing depends on besides the code: torch's intra-op threads, the CPU count and the 1-minute load
    average. On a shared CPU with more busy processes than cores, every multi-threaded kernel stalls at its barrier
    until its descheduled threads run again: a 10-row matrix product then costs far more than a 1-row product (which
    runs on one thread), so batched-vs-single ratios measured there say more about the load than about the code.
    ``OMP_NUM_THREADS=1`` avoids the stalls."""
    import os

    import torch

    return {"torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
            "load_average_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None}
