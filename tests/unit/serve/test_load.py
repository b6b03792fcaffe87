"""The bounded loopback load test (``python -m dpinfer.bench.serve_load``) on the tiny model: 50 concurrent
clients, a unit admitting exactly 3 sanitisations; then a kill -9 of the server mid-load and a restart."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from serve_helpers import SRC


def test_fifty_clients_three_admitted_and_a_kill_mid_load(tiny_model_dir, tmp_path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1", "DPINFER_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "dpinfer.bench.serve_load", "--model", str(tiny_model_dir),
                           "--max-new-tokens", "24", "--kill-after", "0.2"],
                          capture_output=True, text=True, env=env, timeout=1500)
    out = json.loads(proc.stdout)
    print(json.dumps(out))  # the figures, shown with -s
    assert out["checks"] == dict.fromkeys(out["checks"], True), out
    assert proc.returncode == 0
    assert out["phase1"]["ok"] == 3 and out["phase1"]["refused"] == 47
