"""Issue 10's hostile-input run, as end-to-end tests on the embedded model (marked ``e2e``).

Each case runs the real ``dpinfer`` command in a subprocess, as a user would, and checks: a refusal is one line on
stderr with a non-zero exit and no traceback; no private string of the input reaches any output; parameter errors come
before the model loads; the input file is left intact; released JSON holds no seed and no per-step series; the
local-DP baselines' T_max does not follow the document.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "examples" / "echr_case_001-66929.txt"
GOLD = ROOT / "examples" / "echr_case_001-66929.spans.json"
TAB = ROOT.parent / "shared" / "data" / "tab" / "tab_echr_docs.jsonl"
NAMES = ("Mehmet Bülent Yılmaz", "Şahin Yılmaz", "Akbulut", "42552/98", "Mehmet", "Yılmaz")


def dpinfer(*args: str, stdin: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "dpinfer.cli", *args], capture_output=True, text=True,
                          input=stdin, timeout=timeout, env=env, cwd=ROOT)


def assert_refused(res: subprocess.CompletedProcess[str], *secrets: str) -> None:
    assert res.returncode != 0, res.stdout[-500:]
    assert "Traceback" not in res.stderr and "Traceback" not in res.stdout
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("dpinfer: error:"), res.stderr
    for s in (*NAMES, *secrets):
        assert s not in res.stderr and s not in res.stdout, f"private string {s!r} echoed"


@pytest.fixture
def doc(tmp_path: Path) -> Path:
    p = tmp_path / "case.txt"
    p.write_bytes(DOC.read_bytes())
    return p


def test_zero_spans_refused(doc: Path, tmp_path: Path) -> None:
    empty = tmp_path / "none.json"
    empty.write_text("[]")
    assert_refused(dpinfer("sanitize", str(doc), "--spans", str(empty), "--spans-only"))


def test_spans_of_another_document_refused(doc: Path, tmp_path: Path) -> None:
    if not TAB.is_file():
        pytest.skip(f"TAB data absent ({TAB})")
    text = DOC.read_text(encoding="utf-8")
    with TAB.open(encoding="utf-8") as f:
        other = next(d for d in map(json.loads, f) if d["text"] != text
                     and all(m["end_offset"] <= len(text) for m in d["entity_mentions"]))
    spans = tmp_path / "other.json"
    spans.write_text(json.dumps({"text": other["text"], "entity_mentions": other["entity_mentions"]}))
    secrets = tuple(m["span_text"] for m in other["entity_mentions"] if len(m["span_text"]) > 4)
    assert_refused(dpinfer("sanitize", str(doc), "--spans", str(spans)), *secrets)


@pytest.mark.parametrize("spans", [
    [{"start": 0, "end": 9, "label": "Mehmet Bülent Yılmaz"}],
    [{"start": "Şahin Yılmaz", "end": 9, "label": "PERSON"}],
    [{"start": 0, "end": 9}],
    "Mehmet Bülent Yılmaz",
])
def test_malformed_spans_holding_a_name_refused(doc: Path, tmp_path: Path, spans: object) -> None:
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(spans, ensure_ascii=False), encoding="utf-8")
    assert_refused(dpinfer("sanitize", str(doc), "--spans", str(p)))


def test_headerless_csv_holding_a_name_refused(tmp_path: Path) -> None:
    csv = tmp_path / "refs.csv"
    csv.write_text("Mehmet Bülent Yılmaz was admitted on 20 May 1998,Akbulut\n" * 20, encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert_refused(dpinfer("synth", str(csv), "--text-field", "text", "--epsilon", "8", "--out", str(out)))
    assert not out.exists()


@pytest.mark.parametrize("command", ["sanitize", "synth"])
def test_out_into_missing_folder_refused_before_the_model(doc: Path, tmp_path: Path, command: str) -> None:
    out = tmp_path / "missing" / "out.txt"
    extra = ["--text-field", "text", "--epsilon", "8"] if command == "synth" else ["--spans", str(GOLD)]
    src = doc
    if command == "synth":
        src = tmp_path / "refs.jsonl"
        src.write_text("".join(json.dumps({"text": f"review {i}"}) + "\n" for i in range(16)))
    t0 = time.perf_counter()
    res = dpinfer(command, str(src), *extra, "--out", str(out))
    assert time.perf_counter() - t0 < 6
    assert_refused(res)
    assert not out.parent.exists()


def test_out_onto_the_input_refused_and_input_intact(doc: Path, tmp_path: Path) -> None:
    before = doc.read_bytes()
    link = tmp_path / "link.txt"
    os.link(doc, link)
    for target in (doc, link):
        assert_refused(dpinfer("sanitize", str(doc), "--spans", str(GOLD), "--out", str(target)))
    assert doc.read_bytes() == before


BAD_SANITIZE = [
    ["--epsilon", "-1"], ["--epsilon", "nan"], ["--delta", "2"], ["--alpha", "0.5"], ["--temperature", "-1"],
    ["--top-k", "-3"], ["--max-new-tokens", "0"], ["--group-epsilon", "PERSON=abc"], ["--method", "nope"],
]


@pytest.mark.parametrize("bad", BAD_SANITIZE, ids=lambda b: " ".join(b))
def test_bad_parameters_refused_fast(doc: Path, bad: list[str]) -> None:
    t0 = time.perf_counter()
    res = dpinfer("sanitize", str(doc), "--spans", str(GOLD), *bad)
    assert time.perf_counter() - t0 < 6
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert all(s not in res.stderr for s in NAMES)


@pytest.fixture(scope="module")
def released_json(tmp_path_factory: pytest.TempPathFactory) -> dict:
    res = dpinfer("--json", "sanitize", str(DOC), "--spans", str(GOLD), "--max-new-tokens", "24", "--seed", "7")
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout)


def test_json_with_a_seed_holds_no_seed_and_no_step_series(released_json: dict) -> None:
    flat = json.dumps(released_json)
    assert '"seed"' not in flat
    assert "lambda_per_step" not in flat and "divergence_per_step" not in flat
    assert released_json["guarantee"].get("seeded") is True


def test_piped_stdout_holds_only_the_release(doc: Path, tmp_path: Path) -> None:
    out = tmp_path / "release.txt"
    res = dpinfer("sanitize", str(doc), "--spans", str(GOLD), "--max-new-tokens", "24", "--out", str(out))
    assert res.returncode == 0, res.stderr[-2000:]
    # stdout is the release (which may quote the document's untagged, public text) and then the guarantee: never
    # the document shown as input
    release = out.read_text(encoding="utf-8").strip()
    assert res.stdout.lstrip().startswith(release)
    rest = res.stdout.lstrip()[len(release):]
    text = DOC.read_text(encoding="utf-8")
    assert text[:200] not in rest and "PROCEDURE\n\nThe case originated" not in rest
    assert rest.lstrip().startswith("Guarantee")


@pytest.mark.full
def test_local_dp_baseline_t_max_does_not_follow_the_document(tmp_path: Path) -> None:
    text = DOC.read_text(encoding="utf-8")
    short, long = tmp_path / "short.txt", tmp_path / "long.txt"
    short.write_text(text[:300], encoding="utf-8")
    long.write_text(text[:3000], encoding="utf-8")
    t_max = []
    for p in (short, long):
        res = dpinfer("--json", "sanitize", str(p), "--method", "dp-decoding", "--tagger", "regex")
        assert res.returncode == 0, res.stderr[-2000:]
        t_max.append(json.loads(res.stdout)["guarantee"]["max_new_tokens"])
    assert t_max[0] == t_max[1]
