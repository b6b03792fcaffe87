"""``dpinfer sanitize`` (dpinfer.cli.sanitize) on the tiny model: JSON output, one-line refusals, help."""

from __future__ import annotations

import json

import pytest

from dpinfer.cli import main
from dpinfer.taggers import Span

DOC = "Mr Smith, a lawyer practising in London, lodged application no. 36244/06 on 20 May 1998."
SPANS = [Span(3, 8, "PERSON"), Span(33, 39, "LOC"), Span(64, 72, "CODE"), Span(76, 87, "DATETIME")]


def test_cli_sanitize_json_and_errors(tiny_model_dir, tmp_path, capsys):
    doc = tmp_path / "doc.txt"
    doc.write_text(DOC)
    spans = tmp_path / "spans.json"
    spans.write_text(json.dumps([s.to_dict() for s in SPANS]))
    rc = main(["sanitize", str(doc), "--spans", str(spans), "--model", str(tiny_model_dir), "--max-new-tokens", "6",
               "--seed", "1", "--json", "--group-epsilon", "PERSON=25"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert {"text", "guarantee"} <= set(out)
    assert {"epsilon", "delta", "groups"} <= set(out["guarantee"])
    bad = [
        (["--epsilon", "0"], "must be > 0"),
        (["--epsilon", "-3"], "must be > 0"),
        (["--group-epsilon", "PERSON"], "NAME=EPSILON"),
        (["--group-epsilon", "NAMES=3"], "neither a group nor a label"),
    ]
    for extra, needle in bad:
        rc = main(["sanitize", str(doc), "--spans", str(spans), "--model", str(tiny_model_dir), *extra])
        err = capsys.readouterr().err
        assert rc == 2 and needle in err and err.count("\n") == 1, (extra, err)
    spans.write_text(json.dumps([{"start": 0, "end": 999, "label": "PERSON"}]))
    assert main(["sanitize", str(doc), "--spans", str(spans), "--model", str(tiny_model_dir)]) == 2
    assert "ends beyond" in capsys.readouterr().err
    spans.write_text(json.dumps([{"start": 0, "end": 2, "label": "NAME"}]))
    assert main(["sanitize", str(doc), "--spans", str(spans), "--model", str(tiny_model_dir)]) == 2
    assert "unknown label" in capsys.readouterr().err


@pytest.mark.parametrize(("content", "needle"), [(b"", "is empty"), (b"  \n\t", "is empty"),
                                                 (b"\x00\x01binary", "binary"), (b"\xff\xfe\xfa", "UTF-8")])
def test_cli_sanitize_rejects_bad_files(content, needle, tiny_model_dir, tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(content)
    rc = main(["sanitize", str(bad), "--tagger", "regex", "--model", str(tiny_model_dir)])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_cli_zero_spans_file_is_refused(tiny_model_dir, tmp_path, capsys):
    doc = tmp_path / "doc.txt"
    doc.write_text(DOC, encoding="utf-8")
    spans = tmp_path / "spans.json"
    spans.write_text("[]")
    rc = main(["sanitize", str(doc), "--spans", str(spans), "--spans-only", "--model", str(tiny_model_dir)])
    captured = capsys.readouterr()
    assert rc == 2 and "--allow-untagged" in captured.err and captured.err.count("\n") == 1
    assert "Smith" not in captured.out + captured.err
    assert main(["sanitize", str(doc), "--spans", str(spans), "--spans-only", "--model", str(tiny_model_dir),
                 "--allow-untagged", "--max-new-tokens", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["guarantee"]["sentence"].startswith("Guarantee: none")


def test_sanitize_help_explains_the_default_epsilon_and_t_max(capsys):
    with pytest.raises(SystemExit):
        main(["sanitize", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "e^40" in text and "per group" in text and "docs/sanitize.md" in text
    assert "public under its adjacency" in text and "fixed 256" in text
    assert "--allow-untagged" in text and "--debug-stats" in text
