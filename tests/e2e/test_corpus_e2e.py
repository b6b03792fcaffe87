"""``dpinfer sanitize --corpus`` on the embedded model: three TAB-ECHR documents (gold spans in TAB's
``entity_mentions``), a short T_max, then a resume after one record is deleted (marked ``e2e``)."""

from __future__ import annotations

import json

import pytest

from dpinfer.cli import main

pytestmark = pytest.mark.e2e


def test_sanitize_corpus_on_tab_documents(embedded_lm, tmp_path, capsys):
    from dpinfer.errors import DataNotFoundError
    from dpinfer.paths import data_file

    try:
        tab = data_file("tab", "tab_echr_docs.jsonl")
    except DataNotFoundError as exc:
        pytest.skip(f"TAB data not found: {exc}")
    rows = []
    with tab.open(encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            cut = rec["text"].rfind("\n\n", 0, 500)  # short documents: the first paragraphs
            rec["text"] = rec["text"][:cut]
            rec["entity_mentions"] = [m for m in rec["entity_mentions"] if m["end_offset"] <= cut]
            rows.append(rec)
            if len(rows) == 3:
                break
    corpus = tmp_path / "tab.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    args = ["sanitize", "--corpus", str(corpus), "--out", str(out), "--id-field", "doc_id", "--spans-field",
            "entity_mentions", "--max-new-tokens", "8", "--epsilon", "12", "--seed", "3"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "done 3 / skipped 0 / errors 0" in err and "ε ≤ 12 (worst group)" in err
    lines = out.read_bytes().splitlines(keepends=True)
    records = [json.loads(line) for line in lines]
    assert sorted(r["id"] for r in records) == sorted(r["doc_id"] for r in rows)
    for rec in records:
        g = rec["guarantee"]
        assert g["epsilon"] <= 12 and g["max_new_tokens"] == 8 and rec["generated_tokens"] <= 8
        assert all(gr["epsilon"] <= 12 for gr in g["groups"]) and g["groups"]
    text = out.read_text(encoding="utf-8")
    for row in rows:  # no input text and no span in the output (mentions of 6+ characters)
        for m in row["entity_mentions"]:
            if len(m["span_text"]) >= 6 and m["entity_type"] in ("PERSON", "CODE"):
                assert m["span_text"] not in text and m["span_text"] not in err
    out.write_bytes(lines[0] + lines[2])  # a deleted release: refused (it would be released twice) unless allowed
    assert main(args) == 2 and "--allow-rerelease" in capsys.readouterr().err
    assert main([*args, "--allow-rerelease"]) == 0
    assert "done 1 / skipped 2" in capsys.readouterr().err
    now = out.read_bytes().splitlines(keepends=True)
    assert now[:2] == [lines[0], lines[2]] and now[2] == lines[1]
