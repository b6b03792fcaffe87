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
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.full]

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


def command_blocks() -> list[list[tuple[list[str], int, int]]]:
    """The ``dpinfer`` commands of each bash block, in order, as (argv, times, expected exit status): a line whose
    comment says "twice" runs twice, and a command followed by a printed ``dpinfer: error: ...`` line must fail with
    status 2 (the README shows the refusal)."""
    out = []
    for block in blocks("bash"):
        lines = block.splitlines()
        cmds = []
        for i, raw in enumerate(lines):
            line = raw.split(" && ")[-1].strip()  # "bash scripts/setup.sh && .venv/bin/dpinfer ..." → the dpinfer part
            if not line.startswith(".venv/bin/dpinfer "):
                continue
            argv = shlex.split(line, comments=True)[1:]
            if argv[0] == "serve":  # a server runs until stopped
                continue
            refused = i + 1 < len(lines) and lines[i + 1].startswith("dpinfer: error:")
            cmds.append((argv, 2 if "# twice" in line else 1, 2 if refused else 0))
        if cmds:
            out.append(cmds)
    return out


@pytest.fixture()
def clone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_readme_has_snippets_and_commands():
    assert len(blocks("python")) >= 1 and sum(map(len, command_blocks())) >= 5
    assert "../shared" not in "".join(blocks("python") + blocks("bash"))  # every file used ships in examples/
    assert "..." not in "".join(blocks("python"))  # no placeholder that cannot run


def test_readme_python_snippets_run(clone, embedded_lm):
    namespace: dict = {"__name__": "__readme__"}
    for i, block in enumerate(blocks("python")):
        if any(not Path(m).exists() for m in re.findall(r'load_model\("(/[^"]+)"', block)):
            continue  # an example of bringing one's own model: it names a folder of the reader's
        code = block
        for pattern, repl in SHORT:
            code = re.sub(pattern, repl, code)
        try:  # the blocks share one namespace, as in one session that follows the README
            exec(compile(code, f"README.md python block {i}", "exec"), namespace)
        except Exception as exc:  # the failing block, named
            pytest.fail(f"README python block {i} failed: {type(exc).__name__}: {exc}")


@pytest.mark.parametrize("block", command_blocks(), ids=lambda b: " / ".join(" ".join(a[:2]) for a, _, _ in b))
def test_readme_commands_run(block, clone, embedded_lm):
    """One bash block's commands, in order, in one folder (a block may build on its earlier lines: a store, a
    ledger)."""
    models = [argv[i + 1] for argv, _, _ in block for i, a in enumerate(argv[:-1]) if a == "--model"]
    missing = [m for m in models if m.startswith("/") and not Path(m).exists()]
    if missing:  # an example of bringing one's own model: it names a folder of the reader's
        pytest.skip(f"needs a local model at {missing[0]}")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for argv, times, expected in block:
        extra = next((COMMAND_SHORT[w] for w in reversed(argv[:2]) if w in COMMAND_SHORT), [])
        for _ in range(times):
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "dpinfer", *argv, *extra], capture_output=True, text=True,
                                  timeout=900, env=env)
            print(f"{time.perf_counter() - t0:7.1f} s  dpinfer {' '.join(argv[:2])}")  # shown with pytest -s
            assert proc.returncode == expected, f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr[-2000:]}"
