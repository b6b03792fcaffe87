"""Imports flow one way: no module under the lower layers imports a higher one (parsed with ast, lazy imports and
``TYPE_CHECKING`` imports included, since a lazy upward import is still a dependency running back up the layers).

Layers, bottom up: ``errors`` → ``defaults`` / ``checks`` / ``io`` / ``release`` → ``configs`` → ``accounting`` →
``mechanisms`` → ``methods`` (the light method tables) → ``engine`` (with ``models`` and ``model_files``; ``modeling``,
the model code, imports nothing of dpinfer's but itself) → taggers, eval, ``clip_bounds`` → ``runtime`` → ``jobs`` (the
resumable-job loop), ``rag`` (the store and the answering parts), ``protect`` (prompt protection's stages), ``task``
(the task protocol) → pipelines → serve → bench, audit → interfaces (``cli``, the Python API). ``rag`` imports no
interface (its file readers come from :mod:`dpinfer.references`, not through pipelines); ``bench`` imports no command
line (it measures the server through its own modules); ``serve`` imports no bench, no command line and no audit.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "dpinfer"

UPPER = ("pipelines", "cli", "bench", "taggers", "eval", "audit", "generation", "validation", "api", "runtime",
         "serve")
"""Packages and modules above the engine: nothing in the core may import them."""

INTERFACES = ("pipelines", "cli", "bench", "serve", "audit", "api", "generation")
"""What runs a request (pipelines) and what serves one (command line, server, benchmarks, audit, Python API)."""

BOTTOM = (*UPPER, "configs", "accounting", "mechanisms", "methods", "engine", "models", "model_files", "modeling",
          "quantize", "packed")
"""Everything above the bottom layer (errors, defaults, checks, io, release)."""

FORBIDDEN: dict[str, tuple[str, ...]] = {
    "checks.py": BOTTOM,
    "io.py": BOTTOM,
    "release.py": BOTTOM,
    "configs": (*UPPER, "engine", "models", "model_files", "modeling", "quantize", "packed"),
    "accounting": (*UPPER, "methods", "mechanisms", "engine", "models", "model_files", "modeling", "quantize",
                   "packed"),
    "mechanisms": (*UPPER, "methods", "engine", "models", "model_files", "modeling", "quantize", "packed"),
    "modeling": (*UPPER, "configs", "accounting", "mechanisms", "methods", "engine", "models", "model_files",
                 "quantize", "packed"),
    "methods": INTERFACES,
    "engine": UPPER,
    "taggers": (*INTERFACES, "runtime"),
    "eval": (*INTERFACES, "runtime"),
    "runtime.py": INTERFACES,
    "clip_bounds.py": (*INTERFACES, "runtime"),
    "jobs": (*INTERFACES, "runtime", "engine", "models", "model_files", "modeling", "quantize", "packed", "taggers",
             "eval", "validation"),
    "rag": INTERFACES,
    "protect": INTERFACES,
    "task.py": INTERFACES,
    "bench": ("cli", "api"),
    "serve": ("cli", "bench", "api", "audit"),
}
"""For each core module or package (relative to src/dpinfer): the dpinfer sub-packages/modules it must not import."""

KNOWN_EXCEPTIONS: set[tuple[str, str]] = set()
"""(file, module) pairs allowed to break the rule. None: DP-Prompt's public clip calibration, the last one, moved to
:mod:`dpinfer.clip_bounds` (issue 13)."""


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


def test_listing_methods_imports_no_torch() -> None:
    """The method tables are light: every task's names and --help are listed without torch or a mechanism."""
    import subprocess

    code = ("import sys\nfrom dpinfer.methods import TABLE_MODULES, method_names, methods_help\n"
            "for task in TABLE_MODULES:\n    method_names(task); methods_help(task)\n"
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith('dpinfer.mechanisms.')\n"
            "       and m != 'dpinfer.mechanisms.registry']\nprint('IMPORTED', bad)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "IMPORTED []" in res.stdout, res.stdout + res.stderr


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
