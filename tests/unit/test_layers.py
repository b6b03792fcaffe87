"""Imports flow one way: no module under the lower layers imports a higher one (parsed with ast, lazy imports and
``TYPE_CHECKING`` imports included, since a lazy upward import is still a dependency running back up the layers).

Layers, bottom up: ``errors`` → ``checks`` → ``accounting`` → ``mechanisms`` → ``engine`` (with ``models``) →
taggers, pipelines, eval, audit, bench → interfaces (``cli``, the Python API).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "dpinfer"

UPPER = ("pipelines", "cli", "bench", "taggers", "eval", "audit", "generation", "validation", "api")
"""Packages and modules above the engine: nothing in the core may import them."""

FORBIDDEN: dict[str, tuple[str, ...]] = {
    "checks.py": (*UPPER, "accounting", "mechanisms", "engine", "models"),
    "accounting": (*UPPER, "mechanisms", "engine", "models"),
    "mechanisms": (*UPPER, "engine", "models"),
    "engine": UPPER,
}
"""For each core module or package (relative to src/dpinfer): the dpinfer sub-packages/modules it must not import."""

KNOWN_EXCEPTIONS: set[tuple[str, str]] = set()
"""(file, module) pairs allowed to break the rule. None: DP-Prompt's public clip calibration, the last one, moved to
:mod:`dpinfer.pipelines.clip_bounds` (issue 13)."""


def _imports(path: Path) -> list[tuple[str, int]]:
    """Every absolute ``dpinfer...`` module a file imports (``import x`` / ``from x import y``), with its line."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names if alias.name.startswith("dpinfer")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # a relative import: resolve against the file's package
                base = path.relative_to(SRC.parent).with_suffix("").parts[: -node.level]
                module = ".".join((*base, node.module)) if node.module else ".".join(base)
            else:
                module = node.module or ""
            if module.startswith("dpinfer"):
                found.append((module, node.lineno))
                # "from dpinfer import pipelines" imports a sub-package by name
                if module == "dpinfer":
                    found += [(f"dpinfer.{alias.name}", node.lineno) for alias in node.names]
    return found


def _files(target: str) -> list[Path]:
    path = SRC / target
    return sorted(path.rglob("*.py")) if path.is_dir() else [path] if path.exists() else []


def _violations() -> list[str]:
    out = []
    for target, banned in FORBIDDEN.items():
        for file in _files(target):
            rel = file.relative_to(SRC).as_posix()
            for module, line in _imports(file):
                parts = module.split(".")
                if len(parts) > 1 and parts[1].removesuffix(".py") in banned and (rel, ".".join(parts[:2])) not in \
                        KNOWN_EXCEPTIONS:
                    out.append(f"src/dpinfer/{rel}:{line} imports {module}")
    return out


def test_no_import_runs_back_up_the_layers() -> None:
    assert _violations() == []


def test_the_check_sees_an_upward_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The parser finds plain, lazy, relative and TYPE_CHECKING imports (so the test above can fail)."""
    pkg = tmp_path / "dpinfer" / "mechanisms"
    pkg.mkdir(parents=True)
    (pkg / "bad.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "import dpinfer.cli\n"
        "if TYPE_CHECKING:\n    from dpinfer.taggers import Tagger\n"
        "def f():\n    from ..pipelines import sanitize\n    from dpinfer import audit\n",
        encoding="utf-8",
    )
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path / "dpinfer")
    found = sorted(m for m, _ in _imports(pkg / "bad.py"))
    assert found == ["dpinfer", "dpinfer.audit", "dpinfer.cli", "dpinfer.pipelines", "dpinfer.taggers"]
    assert len(_violations()) == 4
