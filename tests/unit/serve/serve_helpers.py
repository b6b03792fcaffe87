"""Helpers of the service tests: live servers on loopback ports (uvicorn in a thread, or ``dpinfer serve`` in a
subprocess), on the tiny random model with the regex tagger, a bag-of-words embedder and budgets in a temp folder."""

from __future__ import annotations

import hashlib
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

SRC = Path(__file__).resolve().parents[3] / "src"
DOC = ("Mr John Smith, born on 12 March 1961, lives at 14 Baker Street in London. His phone number is "
       "+44 20 7946 0958 and his email is john.smith@example.com. He was treated at St Mary's Hospital.")
SECRET = "zebracorn-7749"
"""A private marker: tests send it in bodies and grep the server's log for it."""


class HashEmbedder:
    """Unit vectors from hashed lower-cased words (no model)."""

    dim = 64

    def encode(self, texts, batch_size: int = 32):
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in re.findall(r"\w+", t.lower()):
                out[i, int(hashlib.md5(w.encode()).hexdigest(), 16) % self.dim] += 1.0
            norm = np.linalg.norm(out[i])
            out[i] = out[i] / norm if norm else out[i]
            if not norm:
                out[i, 0] = 1.0
        return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, timeout: float = 120.0, proc: subprocess.Popen | None = None) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode}")
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the server did not start in time")


class ThreadServer:
    """uvicorn serving ``app`` in a daemon thread on a free loopback port."""

    def __init__(self, app) -> None:
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, access_log=False,
                                                    log_config=None, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        wait_ready(self.url, timeout=30)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def make_runtime(lm, tmp: Path, *, default_epsilon: float = 1000.0, window: float = 0.02, stores=None, ledger=None):
    """A service on ``ledger`` (default: TMP/ledger.db) and ``stores`` (default: the folder TMP/stores; or a Chroma
    server's ``chroma://HOST:PORT``)."""
    from dpinfer.serve.budget import LedgerBudgets
    from dpinfer.serve.service import Service

    budgets = LedgerBudgets(ledger or tmp / "ledger.db", create_epsilon=default_epsilon, create_delta=1e-3)
    return Service(lm, budgets, tagger="regex", stores=stores or tmp / "stores", embedder=HashEmbedder(),
                   window=window, state=tmp / "jobs" if ledger else None)


def cli_server(args: list[str], log: Path, *, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """``python -m dpinfer serve ARGS --port P`` in a subprocess, its stdout and stderr to ``log``."""
    port = free_port()
    full_env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **(env or {})}
    fh = open(log, "ab")
    proc = subprocess.Popen([sys.executable, "-m", "dpinfer", "serve", *args, "--port", str(port)],
                            stdout=fh, stderr=subprocess.STDOUT, env=full_env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc=proc)
    except BaseException:
        proc.kill()
        raise
    return proc, url


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
