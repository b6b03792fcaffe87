"""The server is a thin caller of the library (issue 33): no module under ``src/dpinfer/serve`` imports a mechanism
or the accountant's internals (only the charge path's public names and the ledger's opening), and every route is
parse → plan → charge → run → finish in at most 15 lines. Parsed with ast (lazy and ``TYPE_CHECKING`` imports
included); each check is also run on a planted violation, so that it can fail."""

from __future__ import annotations

import ast
from pathlib import Path

SERVE = Path(__file__).resolve().parents[3] / "src" / "dpinfer" / "serve"

ACCOUNTING_ALLOWED: dict[str, frozenset[str]] = {
    "dpinfer.accounting.charge": frozenset(
        {"charge", "reserve", "Reservation", "commit_left", "Charges", "run_charged", "hold", "close"}
    ),
    "dpinfer.accounting.ledger": frozenset({"Ledger", "holder_id", "holder_alive"}),
    "dpinfer.accounting.ledger_store": frozenset({"is_database_url"}),
}
"""The accounting names the server may import: the one charge path's public steps (:mod:`dpinfer.accounting.charge`),
opening the ledger, and its holders' names and liveness (the synthesis jobs' leases). Nothing else of accounting: no
loss, event, calibration, guarantee arithmetic or spend estimate."""

BANNED = ("dpinfer.mechanisms",)
"""Packages the server may not import at all."""

ROUTE_METHODS = frozenset({"get", "post", "put", "patch", "delete", "api_route"})
MAX_ROUTE_LINES = 15
EXPECTED_ROUTES = 17
"""Every route of the service (a route added or removed changes this number, on purpose)."""


def _import_violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            pairs = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            pairs = [(node.module, alias.name) for alias in node.names]
            if node.module == "dpinfer":  # "from dpinfer import accounting" imports a sub-package by name
                pairs += [(f"dpinfer.{alias.name}", None) for alias in node.names]
        else:
            continue
        for module, name in pairs:
            where = f"{path.name}:{node.lineno} imports {module}{'' if name is None else '.' + name}"
            if any(module == b or module.startswith(b + ".") for b in BANNED):
                out.append(where)
            elif module == "dpinfer.accounting" or module.startswith("dpinfer.accounting."):
                if name not in ACCOUNTING_ALLOWED.get(module, frozenset()):
                    out.append(where)
    return out


def _routes(path: Path) -> list[tuple[str, int]]:
    """(the route function's name, the lines of its body without the docstring) of each route in ``path``: a
    function decorated with ``<router or app>.get/post/...(...)``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if not any(
            isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr in ROUTE_METHODS
            for d in node.decorator_list
        ):
            continue
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
            body = body[1:]  # the docstring
        lines = 0 if not body else body[-1].end_lineno - body[0].lineno + 1  # type: ignore[operator]
        found.append((node.name, lines))
    return found


def _files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.py"))


def test_serve_imports_no_mechanism_and_no_accounting_internals() -> None:
    assert [v for f in _files(SERVE) for v in _import_violations(f)] == []


def test_every_route_is_at_most_15_lines() -> None:
    routes = {f"{f.relative_to(SERVE).as_posix()}:{name}": lines for f in _files(SERVE) for name, lines in _routes(f)}
    assert len(routes) == EXPECTED_ROUTES, sorted(routes)
    assert {r: n for r, n in routes.items() if n > MAX_ROUTE_LINES} == {}
    assert all(r.startswith("routes/") for r in routes), sorted(routes)  # app.py only assembles them


def test_the_checks_see_a_planted_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from typing import TYPE_CHECKING\n"
        "from dpinfer.accounting.charge import charge, RecordCharges\n"
        "from dpinfer.accounting.ledger import Ledger\n"
        "from dpinfer import accounting\n"
        "if TYPE_CHECKING:\n    from dpinfer.accounting.losses import Zcdp\n"
        "def f():\n    import dpinfer.mechanisms.dp_fusion\n    from dpinfer.mechanisms import registry\n"
        "@router.post('/x')\n"
        "def long_route():\n    '''doc'''\n" + "    x = 1\n" * (MAX_ROUTE_LINES + 1) + "@router.get('/y')\n"
        "async def short_route():\n    return 1\n",
        encoding="utf-8",
    )
    found = sorted(v.split(" imports ")[1] for v in _import_violations(bad))
    assert found == [
        "dpinfer.accounting",
        "dpinfer.accounting.charge.RecordCharges",
        "dpinfer.accounting.losses.Zcdp",
        "dpinfer.mechanisms.dp_fusion",
        "dpinfer.mechanisms.registry",
    ]
    assert _routes(bad) == [("long_route", MAX_ROUTE_LINES + 1), ("short_route", 1)]
