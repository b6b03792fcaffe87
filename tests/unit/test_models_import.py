"""transformers' model code is imported without ``scipy.optimize`` (a stand-in while it imports), and afterwards
``scipy.optimize`` is the real module and transformers' use of it still works."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
from dpinfer.models import import_model_code
import_model_code()
assert "transformers.modeling_utils" in sys.modules
assert "scipy.optimize" not in sys.modules, "scipy.optimize was imported"
import numpy as np
import scipy.optimize
assert hasattr(scipy.optimize, "minimize")
from transformers.loss import loss_for_object_detection as od
rows, cols = od.linear_sum_assignment(np.array([[4.0, 1.0], [2.0, 3.0]]))
assert rows.tolist() == [0, 1] and cols.tolist() == [1, 0]
print("ok")
"""


@pytest.mark.full
def test_model_code_imports_without_scipy_optimize_and_scipy_works_after() -> None:
    pytest.importorskip("scipy")
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
