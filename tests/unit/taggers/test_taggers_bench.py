"""The tagger benchmark on a few documents, its metrics, its CLI and its missing-data behaviour."""

from __future__ import annotations

import argparse
import json

import pytest

from dpinfer.bench import tagger as bench
from dpinfer.errors import DataNotFoundError


def _numbers(obj):
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in ("precision", "recall", "f1"):
                yield v
            else:
                yield from _numbers(v)


def test_score_documents_definitions():
    pred = [[(0, 4, "PERSON"), (10, 14, "LOC"), (20, 30, "DATETIME")]]
    gold = [[(0, 4, "PERSON"), (9, 14, "ORG"), (22, 25, "DATETIME"), (26, 28, "DATETIME")]]
    r = bench.score_documents(pred, gold)
    assert r["per_type"]["PERSON"]["exact"]["f1"] == 1.0
    dt = r["per_type"]["DATETIME"]
    assert dt["exact"]["precision"] == 0.0 and dt["relaxed"]["precision"] == 1.0 and dt["relaxed"]["recall"] == 1.0
    assert r["per_type"]["LOC"]["relaxed"]["precision"] == 0.0 and r["per_type"]["LOC"]["relaxed"]["recall"] is None
    assert r["micro"]["exact"]["n_gold"] == 4 and r["micro"]["exact"]["tp_gold"] == 1
    assert r["untyped"]["relaxed"]["recall"] == 1.0
    assert r["chars"]["gold_chars"] == 4 + 5 + 3 + 2 and r["chars"]["recall"] == pytest.approx(13 / 14)
    assert "MISC" not in r["per_type"]


def test_small_bench_run_gives_numbers_in_unit_interval(requires_data, pii_reason):
    names = ("regex", "presidio") if pii_reason is None else ("regex",)
    res = bench.run_tagger_bench(names, n_tab=3, n_synth=20)
    assert res["datasets"]["tab"]["docs"] == 3 and res["datasets"]["synth"]["docs"] == 20
    for name in names:
        r = res["taggers"][name]
        assert set(r) >= {"load_s", "tab", "synth"}
        assert r["tab"]["speed"]["chars_per_s"] > 0 and r["tab"]["speed"]["docs_per_s"] > 0
        values = [v for v in _numbers(r) if v is not None]
        assert values and all(0.0 <= v <= 1.0 for v in values)
        assert r["tab"]["micro"]["relaxed"]["recall"] > 0.3
    md = bench.format_markdown(res)
    assert "| regex | tab |" in md and "## regex on synth" in md


def test_cli_arguments_and_json(requires_data, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    out = tmp_path / "r.json"
    args = parser.parse_args(["--taggers", "regex", "--n", "2", "--datasets", "tab", "--json", str(out)])
    assert bench.main(args) == 0
    data = json.loads(out.read_text())
    assert data["datasets"]["tab"]["docs"] == 2 and "synth" not in data["datasets"]
    assert "# Tagger benchmark" in capsys.readouterr().out
    assert bench.main(parser.parse_args(["--taggers", "regex", "--n", "1", "--json"])) == 0
    assert json.loads(capsys.readouterr().out)["taggers"]["regex"]["tab"]["speed"]["docs"] == 1


def test_missing_data_raises_data_not_found(tmp_path, monkeypatch):
    monkeypatch.setenv("DPINFER_DATA", str(tmp_path))
    with pytest.raises(DataNotFoundError):
        bench.run_tagger_bench(("regex",), n_tab=1)


def test_skipped_tagger_is_reported(requires_data, monkeypatch):
    from dpinfer.errors import MissingDependencyError

    def missing(name, **kw):
        raise MissingDependencyError("not installed: pip install 'dpinfer[pii]'")

    monkeypatch.setattr(bench, "get_tagger", missing)
    res = bench.run_tagger_bench(("presidio",), n_tab=1, n_synth=1)
    assert "pip install" in res["taggers"]["presidio"]["skipped"]
    assert "skipped" in bench.format_markdown(res)
