"""Every Python snippet and every ``dpinfer`` command of the README runs as printed, from a folder holding only the
repository's ``examples/`` (as in a fresh clone after ``bash scripts/setup.sh``), on the embedded model.

Short settings only: every generation is capped at a few tokens (and protect-prompt at two rewrites) by the
substitutions in :data:`SHORT`, so that the test checks that the snippets and commands RUN, not what they write.
The two set-up commands of the README (``bash scripts/setup.sh``, ``bash scripts/test.sh``) are what this test suite
itself runs under; they are not run again here. The service examples (``dpinfer serve`` and the snippets that talk to
it on 127.0.0.1) need a running server: tests/unit/serve covers them."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")

SHORT = [  # (pattern, replacement) applied to the Python snippets: the same calls with a few tokens each
    (r"max_new_tokens=\d+", "max_new_tokens=3"),
    (r"dpinfer\.sanitize\(doc, ", "dpinfer.sanitize(doc, max_new_tokens=3, "),
    (r"rag\.ask\(([^)]*)\)", r"rag.ask(\1, max_new_tokens=3)"),
    (r"dpinfer\.protect_prompt\(([^)]*)\)", r"dpinfer.protect_prompt(\1, max_new_tokens=3, n_rewrites=2)"),
    (r"lm=lm, seed=0\)", "lm=lm, seed=0, max_new_tokens=3)"),
]
COMMAND_SHORT = {  # extra options per command for the CLI lines
    "sanitize": ["--max-new-tokens", "3"],
    "synth": ["--max-new-tokens", "3"],
    "ask": ["--max-new-tokens", "3"],
    "protect-prompt": ["--max-new-tokens", "3", "--n-rewrites", "2"],
    "generate": ["--max-new-tokens", "3"],
}


def blocks(language: str) -> list[str]:
    """The README's fenced blocks in ``language``, without those that talk to a running ``dpinfer serve``."""
    found = re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)
    return [b for b in found if "127.0.0.1" not in b]


def commands() -> list[list[str]]:
    out = []
    for block in blocks("bash"):
        for line in block.splitlines():
            line = line.split(" && ")[-1].strip()  # "bash scripts/setup.sh && .venv/bin/dpinfer ..." → the dpinfer part
            if line.startswith(".venv/bin/dpinfer "):
                argv = shlex.split(line, comments=True)[1:]
                if argv[0] != "serve":  # a server runs until stopped
                    out.append(argv)
    return out


@pytest.fixture()
def clone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_readme_has_snippets_and_commands():
    assert len(blocks("python")) >= 1 and len(commands()) >= 5
    assert "../shared" not in "".join(blocks("python") + blocks("bash"))  # every file used ships in examples/
    assert "..." not in "".join(blocks("python"))  # no placeholder that cannot run


def test_readme_python_snippets_run(clone, embedded_lm):
    for i, block in enumerate(blocks("python")):
        code = block
        for pattern, repl in SHORT:
            code = re.sub(pattern, repl, code)
        try:
            exec(compile(code, f"README.md python block {i}", "exec"), {"__name__": "__readme__"})
        except Exception as exc:  # the failing block, named
            pytest.fail(f"README python block {i} failed: {type(exc).__name__}: {exc}")


@pytest.mark.parametrize("argv", commands(), ids=lambda a: " ".join(a[:2]))
def test_readme_commands_run(argv, clone, embedded_lm):
    extra = next((COMMAND_SHORT[w] for w in reversed(argv[:2]) if w in COMMAND_SHORT), [])
    if argv[:2] == ["rag", "ask"]:
        subprocess.run([sys.executable, "-m", "dpinfer", "rag", "add", "my-store", "examples/notes.jsonl"],
                       check=True, capture_output=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    proc = subprocess.run([sys.executable, "-m", "dpinfer", *argv, *extra], capture_output=True, text=True,
                          timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr[-2000:]}"
