"""``dpinfer synth`` (dpinfer.cli.synth) on the tiny model: the output file, one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpinfer.cli import main as cli_main
from dpinfer.pipelines.synthesize import PromptTemplate

REVIEWS = [
    ("The pasta was fresh and the staff were kind.", "Restaurants", "5.0"),
    ("Slow service, cold fries, never again.", "Restaurants", "1.0"),
    ("Great haircut, friendly barber.", "Beauty", "5.0"),
    ("Lovely pizza and a quiet room.", "Restaurants", "5.0"),
    ("They lost my booking twice.", "Hotels", "2.0"),
    ("Best tacos in town.", "Restaurants", "5.0"),
    ("Clean rooms and a good breakfast.", "Hotels", "4.0"),
    ("The soup was salty but the bread was great.", "Restaurants", "5.0"),
    ("", "Restaurants", "5.0"),
]
TEMPLATE = PromptTemplate(private='Review ({cat}, {stars}): "{reference}". Write another.',
                          public="Write a review ({cat}, {stars}).")


def _write_corpus(tmp_path: Path) -> Path:
    p = tmp_path / "corpus.csv"
    rows = ["text,cat,stars"] + [f'"{t}",{c},{s}' for t, c, s in REVIEWS]
    p.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return p


def test_cli_synth_writes_the_guarantee_and_texts(tiny_model_dir: Path, tmp_path: Path, capsys) -> None:
    corpus = _write_corpus(tmp_path)
    tpl = tmp_path / "tpl.json"
    tpl.write_text(json.dumps({"private": TEMPLATE.private, "public": TEMPLATE.public}), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    rc = cli_main(["synth", str(corpus), "--text-field", "text", "--label-fields", "cat,stars", "--epsilon", "6",
                   "--batch-size", "2", "--max-new-tokens", "5", "--template-file", str(tpl), "--out", str(out),
                   "--model", str(tiny_model_dir), "--seed", "0", "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["guarantee"]["epsilon"] <= 6.0 and summary["texts"] == 2
    header = json.loads(out.read_text(encoding="utf-8").splitlines()[0])
    assert header["dpinfer"]["settings"]["epsilon"] == 6.0


@pytest.mark.parametrize(
    "extra,match",
    [
        (["--epsilon", "0"], "--epsilon must be"),
        (["--epsilon", "-2"], "--epsilon must be"),
        (["--epsilon", "5", "--batch-size", "50"], "fewer than one batch"),
        (["--epsilon", "5", "--text-field", "body"], "no field 'body'"),
        ([], "--epsilon is required"),
    ],
)
def test_cli_synth_bad_input_is_one_line(tiny_model_dir: Path, tmp_path: Path, capsys, extra: list[str],
                                         match: str) -> None:
    corpus = _write_corpus(tmp_path)
    args = ["synth", str(corpus), "--text-field", "text", "--out", str(tmp_path / "o.jsonl"),
            "--model", str(tiny_model_dir), *extra]
    if "--text-field" in extra:
        args.remove("--text-field")
        args.remove("text")
    assert cli_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert match in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "o.jsonl").exists()


def test_cli_synth_empty_corpus(tiny_model_dir: Path, tmp_path: Path, capsys) -> None:
    p = tmp_path / "e.jsonl"
    p.write_text("", encoding="utf-8")
    assert cli_main(["synth", str(p), "--text-field", "text", "--epsilon", "3", "--out", str(tmp_path / "o.jsonl"),
                     "--model", str(tiny_model_dir)]) == 2
    assert "no records" in capsys.readouterr().err


@pytest.mark.parametrize(("method", "epsilon", "spent", "needle"), [
    ("public", 0.0, False, "public prompt only"),
    ("adapmixed", float("inf"), True, "none ex ante. The privacy loss of adapmixed depends on the references"),
    ("toy", float("inf"), False, "Guarantee: none. toy states no differential-privacy guarantee."),
    ("invisibleink", 4.0, False, "It holds for every reference at once"),
])
def test_summary_says_what_the_guarantee_is(method, epsilon, spent, needle, capsys) -> None:
    import argparse
    from types import SimpleNamespace

    from dpinfer.cli.synth import print_summary

    texts = [SimpleNamespace(data_dependent={"spent": {"epsilon": 1.0}} if spent else {})]
    res = SimpleNamespace(texts=texts, generated_tokens=5, tokens_per_second=1.0, lm_calls_per_token=3,
                          references_left_out=0, guarantee=SimpleNamespace(epsilon=epsilon))
    print_summary(argparse.Namespace(method=method, out="o.jsonl", batch_size=2), res)
    assert needle in " ".join(capsys.readouterr().out.split())
