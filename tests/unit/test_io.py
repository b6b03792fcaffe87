"""File parsing and atomic IO (dpinfer.io): no partial file, one durable line per append, refusals without content."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dpinfer.errors import InvalidInputError
from dpinfer.io import (
    append_jsonl,
    atomic_open,
    atomic_write_json,
    atomic_write_text,
    decode_text,
    read_jsonl,
    read_output_lines,
)


def test_atomic_write_replaces_in_one_step_and_leaves_nothing_on_failure(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    atomic_write_json(out, {"a": 1, "é": [1.5]})
    assert json.loads(out.read_text(encoding="utf-8")) == {"a": 1, "é": [1.5]}
    assert oct(out.stat().st_mode & 0o777) == "0o600"
    with pytest.raises(RuntimeError), atomic_open(out) as f:
        f.write("partial")
        raise RuntimeError("stop")
    assert json.loads(out.read_text(encoding="utf-8")) == {"a": 1, "é": [1.5]}  # untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]  # no temporary left
    atomic_write_text(out, "plain\n")
    assert out.read_text(encoding="utf-8") == "plain\n"


def test_append_jsonl_and_read_back_with_a_torn_tail(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    append_jsonl(out, {"id": 1, "text": "a"})
    append_jsonl(out, {"id": 2, "text": "b"})
    with open(out, "ab") as f:
        f.write(b'{"id": 3, "te')
    lines = read_output_lines(out)
    assert [json.loads(raw) for _, raw in lines.lines] == [{"id": 1, "text": "a"}, {"id": 2, "text": "b"}]
    assert lines.torn == b'{"id": 3, "te'


def test_read_jsonl_names_the_bad_line_not_its_content(tmp_path: Path) -> None:
    p = tmp_path / "in.jsonl"
    p.write_text('{"id": 1}\n\n["private words"]\n', encoding="utf-8")
    it = read_jsonl(p)
    assert next(it) == (1, {"id": 1})
    with pytest.raises(InvalidInputError, match=r"in.jsonl:3: expected a JSON object") as err:
        next(it)
    assert "private" not in str(err.value)
    p.write_text('{"id": 1\n', encoding="utf-8")
    with pytest.raises(InvalidInputError, match=r":1: not valid JSON"):
        list(read_jsonl(p))
    with pytest.raises(InvalidInputError, match="no such file"):
        list(read_jsonl(tmp_path / "missing.jsonl"))


def test_decode_text_refuses_without_the_content() -> None:
    assert decode_text("é".encode(), "doc") == "é"
    for data, msg in ((b"a\x00b", "binary"), (b"\xff\xfe", "not valid UTF-8"), (b"  \n", "empty")):
        with pytest.raises(InvalidInputError, match=msg):
            decode_text(data, "doc")


def test_file_helpers_have_one_home() -> None:
    from dpinfer import io, validation

    assert not hasattr(validation, "atomic_write_text")  # no second import path (issue 33: no re-export)
    assert os.path.basename(io.__file__) == "io.py"
