"""One charge path: outside :mod:`dpinfer.accounting` nothing calls a ledger's or a reservation's ``reserve`` /
``settle`` / ``commit`` step (issue 33): pipelines, the command line, corpus jobs, the server and the benches go
through :func:`dpinfer.accounting.charge.run_charged`, :func:`~dpinfer.accounting.charge.hold`,
:func:`~dpinfer.accounting.charge.close` or :class:`~dpinfer.accounting.charge.RecordCharges`."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "dpinfer"
STEPS = {"reserve", "settle", "commit"}


def _calls(path: Path, root: Path = SRC.parent) -> list[str]:
    """``file:line .step`` for every attribute named like a charge step (a call, or a bound method passed on)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [f"{path.relative_to(root).as_posix()}:{node.lineno} .{node.attr}"
            for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr in STEPS]


def test_no_charge_step_is_called_outside_accounting() -> None:
    found = [hit for path in sorted(SRC.rglob("*.py")) if "accounting" not in path.relative_to(SRC).parts[:1]
             for hit in _calls(path)]
    assert found == [], "charge steps called outside dpinfer/accounting (use the charge path): " + ", ".join(found)


def test_the_check_finds_a_step_call(tmp_path: Path) -> None:
    """The check is not vacuous: a reservation's step, called or passed as a value, is found."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f(res):\n    res.settle(1)\n    g(res.commit)\n", encoding="utf-8")
    assert sorted(h.split(" ")[1] for h in _calls(probe, tmp_path)) == [".commit", ".settle"]
