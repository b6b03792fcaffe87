"""Garbage in, one line out: every command with empty, binary, invalid UTF-8, huge and folder inputs, and the corpus
parser fuzzed with hypothesis (issue 10; the API's type errors are in tests/unit/test_validation.py)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpinfer.cli import main
from dpinfer.errors import DataNotFoundError, InvalidInputError
from dpinfer.references import Reference, load_references

NAME = "Zacharias Oberholzer"
HUGE = 50 * 1024 * 1024


@pytest.fixture(scope="module")
def garbage(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("garbage")
    files = {"empty": d / "empty.jsonl", "binary": d / "binary.jsonl", "invalid-utf8": d / "bad.jsonl",
             "huge-sparse": d / "sparse.jsonl", "huge-text": d / "huge.jsonl", "folder": d / "folder.jsonl"}
    files["empty"].write_bytes(b"")
    files["binary"].write_bytes(b"\x00\x01\x02" + NAME.encode() + b"\x00")
    files["invalid-utf8"].write_bytes(NAME.encode() + b" \xff\xfe\xc3\x28")
    with files["huge-sparse"].open("wb") as f:
        f.truncate(HUGE)
    line = (NAME + " lives in Vienna.\n").encode()
    files["huge-text"].write_bytes(line * (HUGE // len(line) + 1))
    files["folder"].mkdir()
    return files


COMMANDS = {
    "generate": ["generate", "{f}", "--file"],
    "sanitize": ["sanitize", "{f}"],
    "sanitize --spans": ["sanitize", "{doc}", "--spans", "{f}"],
    "synth": ["synth", "{f}", "--text-field", "text", "--epsilon", "10", "--out", "{out}"],
    "synth --template-file": ["synth", "{corpus}", "--text-field", "text", "--epsilon", "10", "--batch-size", "1",
                              "--template-file", "{f}", "--out", "{out}"],
    "models": ["models", "--prepare", "--model", "{f}"],
    "bench engine": ["bench", "engine", "--model", "{f}"],
    "bench sanitize": ["bench", "sanitize", "--data", "{f}", "--out", "{tmp}"],
    "bench synth": ["bench", "synth", "--data", "{f}", "--out-dir", "{tmp}"],
    "bench tagger": ["bench", "tagger", "--taggers", "regex", "--json", "{f}"],
}
KINDS = ["empty", "binary", "invalid-utf8", "huge-sparse", "huge-text", "folder"]
# a well-formed but unusable file may legitimately get as far as the model (then refused there, in one line)
MODEL_COMMANDS = {"models", "bench engine"}
MAY_REACH_MODEL = {("bench sanitize", "huge-text"), ("bench synth", "huge-text")}


# bench tagger reads no input file: its --json PATH is an output, refused when it is a folder
CASES = [(c, k) for c in COMMANDS for k in KINDS if c != "bench tagger" or k == "folder"]


@pytest.mark.parametrize(("command", "kind"), CASES)
def test_every_command_refuses_garbage_files_in_one_line(command, kind, garbage, tmp_path, request, capsys):
    # the model commands get the garbage as --model: the real loader is what refuses it (quickly, no weights read)
    no_model = [] if command in MODEL_COMMANDS else request.getfixturevalue("no_model").catchable()
    doc = tmp_path / "doc.txt"
    doc.write_text("The applicant lives in Vienna.\n", encoding="utf-8")
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "a"}\n{"text": "b"}\n', encoding="utf-8")
    subst = {"{f}": str(garbage[kind]), "{doc}": str(doc), "{corpus}": str(corpus), "{out}": str(tmp_path / "o.jsonl"),
             "{tmp}": str(tmp_path / "bench")}
    argv = [subst.get(a, a) for a in COMMANDS[command]]
    rc = main(argv)
    cap = capsys.readouterr()
    assert rc == 2, (cap.out, cap.err)
    assert cap.err.startswith("dpinfer: error: ") and cap.err.count("\n") == 1, cap.err
    assert "Traceback" not in cap.err and NAME not in cap.err + cap.out
    if (command, kind) not in MAY_REACH_MODEL:
        assert no_model == [], cap.err
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize("argv", [
    ["bench", "tagger", "--taggers", "\x00garbage"],
    ["bench", "tagger", "--datasets", "nope"],
    ["bench", "tagger", "--n", "-1"],
    ["bench", "engine", "--k", "0"],
    ["bench", "engine", "--new-tokens", "-5"],
    ["bench", "sanitize", "--n", "0"],
    ["bench", "sanitize", "--temperature", "-1"],
    ["bench", "synth", "--epsilon", "-1"],
    ["bench", "synth", "--delta", "7"],
    ["generate", "x", "--top-p", "nan"],
])
def test_garbage_arguments_are_one_line(argv, no_model, capsys):
    rc = main(argv)
    cap = capsys.readouterr()
    assert rc == 2 and cap.err.startswith("dpinfer: error: ") and cap.err.count("\n") == 1, cap.err
    assert "Traceback" not in cap.err and no_model == []


def test_a_missing_model_is_one_line(capsys):
    rc = main(["models", "--prepare", "--model", "/no/such/model"])
    cap = capsys.readouterr()
    assert rc == 2 and cap.err.startswith("dpinfer: error: ") and cap.err.count("\n") == 1, cap.err


# ------------------------------------------------------------------------------------------------------ fuzzing
SECRET = "SECRETQX"


def _load(content: bytes, suffix: str, label_fields: tuple[str, ...] = ()) -> None:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / f"corpus{suffix}"
        p.write_bytes(content)
        try:
            refs = load_references(p, text_field="text", label_fields=label_fields)
        except (InvalidInputError, DataNotFoundError) as exc:
            assert SECRET not in str(exc), str(exc)
            assert "\n" not in str(exc)
            return
        assert all(isinstance(r, Reference) and isinstance(r.text, str) for r in refs)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400), st.sampled_from([".csv", ".jsonl"]))
def test_fuzz_load_references_bytes(content: bytes, suffix: str) -> None:
    _load(content, suffix)


_secret_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12).map(lambda s: SECRET + s)
_json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _secret_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_secret_text, inner, max_size=3),
    max_leaves=6,
)
_record = st.dictionaries(st.sampled_from(["text", "lab", SECRET, SECRET + "k"]) | _secret_text, _json_value,
                          max_size=4)
_jsonl_line = (_record.map(json.dumps) | _secret_text | _json_value.map(json.dumps)
               | st.just("[" * 3000) | st.just("1" * 5000))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_jsonl_line, max_size=5), st.booleans())
def test_fuzz_load_references_jsonl_never_echoes(lines: list[str], with_label: bool) -> None:
    _load("\n".join(lines).encode(), ".jsonl", ("lab",) if with_label else ())


_cell = _secret_text | st.sampled_from(["", '"', '""', ",", "\n", "\r", SECRET + '"x'])
_header = st.lists(st.sampled_from(["text", "lab", SECRET]) | _secret_text, min_size=0, max_size=4)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_header, st.lists(st.lists(_cell, max_size=5), max_size=5), st.booleans(), st.booleans())
def test_fuzz_load_references_csv_never_echoes(header, rows, quote, with_label) -> None:
    def fmt(cells: list[str]) -> str:
        return ",".join('"' + c.replace('"', '""') + '"' if quote else c for c in cells)

    content = "\n".join([fmt(header), *(fmt(r) for r in rows)])
    _load(content.encode("utf-8", "surrogatepass"), ".csv", ("lab",) if with_label else ())
