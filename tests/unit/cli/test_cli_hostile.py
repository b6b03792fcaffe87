"""Hostile input at every entry point (issue 10): parameter errors before the model loads, --out checked before any
work and written atomically, no private text on an unrequested stdout or in any error, no traceback for garbage."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from dpinfer.cli import main

NAME = "Zacharias Oberholzer"
DOC = f"The applicant, {NAME}, was born in 1961 and lives in Vienna. He lodged application no. 12345/06 in 2006.\n"
SPANS = [{"start": 15, "end": 15 + len(NAME), "label": "PERSON"}]


@pytest.fixture
def doc(tmp_path: Path) -> tuple[Path, Path]:
    d = tmp_path / "doc.txt"
    d.write_text(DOC, encoding="utf-8")
    s = tmp_path / "spans.json"
    s.write_text(json.dumps(SPANS), encoding="utf-8")
    assert DOC[15:15 + len(NAME)] == NAME
    return d, s


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    p = tmp_path / "corpus.jsonl"
    p.write_text("".join(json.dumps({"text": f"{NAME} review {i}"}) + "\n" for i in range(6)), encoding="utf-8")
    return p


def _one_line_error(capsys: pytest.CaptureFixture[str], rc: int) -> str:
    cap = capsys.readouterr()
    assert rc == 2, cap
    assert cap.err.startswith("dpinfer: error: ") and cap.err.count("\n") == 1, cap.err
    assert "Traceback" not in cap.err + cap.out and "MODEL-WAS-LOADED" not in cap.err, cap.err
    assert NAME not in cap.err + cap.out
    return cap.err


# ------------------------------------------------------------------------------------------- parameters before load
SANITIZE_BAD = [
    (["--epsilon", "-1"], "--epsilon"),
    (["--epsilon", "nan"], "--epsilon"),
    (["--delta", "2"], "--delta"),
    (["--alpha", "0.5"], "--alpha"),
    (["--temperature", "-1"], "--temperature"),
    (["--temperature", "0"], "--temperature"),
    (["--top-k", "-3"], "--top-k"),
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--no-repeat-ngram", "-1"], "--no-repeat-ngram"),
    (["--seed", "-5"], "--seed"),
    (["--method", "nope"], "--method"),
    (["--tagger", "nope"], "--tagger"),
    (["--group-epsilon", "PERSON=0"], "PERSON"),
    (["--adjacency", "replace-one", "--accounting", "as_published"], "as_published"),
    (["--epsilon", "1"], "smallest reachable"),  # an unreachable target: calibrated from the parameters alone
]


@pytest.mark.parametrize(("extra", "needle"), SANITIZE_BAD)
def test_sanitize_parameter_errors_come_before_the_model(extra, needle, doc, no_model, capsys):
    rc = main(["sanitize", str(doc[0]), "--spans", str(doc[1]), *extra])
    assert needle in _one_line_error(capsys, rc)
    assert no_model == []


SYNTH_BAD = [
    (["--epsilon", "0"], "--epsilon"),
    (["--epsilon", "inf"], "--epsilon"),
    (["--delta", "0"], "--delta"),
    (["--batch-size", "0"], "--batch-size"),
    (["--max-new-tokens", "-2"], "--max-new-tokens"),
    (["--top-k", "-1"], "--top-k"),
    (["--temperature", "0"], "--temperature"),
    (["--max-texts", "0"], "--max-texts"),
    (["--max-reference-tokens", "-1"], "--max-reference-tokens"),
    (["--limit", "0"], "--limit"),
    (["--seed", "-1"], "--seed"),
    (["--epsilon", "1e-6"], "ε"),  # unreachable: calibration refuses it before the model loads
]


@pytest.mark.parametrize(("extra", "needle"), SYNTH_BAD)
def test_synth_parameter_errors_come_before_the_model(extra, needle, corpus, tmp_path, no_model, capsys):
    args = ["synth", str(corpus), "--text-field", "text", "--batch-size", "2", "--epsilon", "10",
            "--out", str(tmp_path / "o.jsonl"), *extra]
    assert needle in _one_line_error(capsys, main(args))
    assert no_model == [] and not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize(("extra", "needle"), [
    (["--temperature", "-1"], "--temperature"), (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--top-k", "0"], "--top-k"), (["--top-p", "1.5"], "--top-p"), (["--seed", "-1"], "--seed"),
])
def test_generate_parameter_errors_come_before_the_model(extra, needle, no_model, capsys):
    assert needle in _one_line_error(capsys, main(["generate", "hello", *extra]))
    assert no_model == []


def test_generate_refuses_a_whitespace_prompt(no_model, capsys):
    assert "empty" in _one_line_error(capsys, main(["generate", "  \n\t "]))
    assert no_model == []


# ------------------------------------------------------------------------------------------------------ --out
def _out_cases(tmp_path: Path, doc: Path) -> dict[str, tuple[str, str]]:
    folder = tmp_path / "folder"
    folder.mkdir()
    hard = tmp_path / "hard.txt"
    os.link(doc, hard)
    sym = tmp_path / "sym.txt"
    sym.symlink_to(doc)
    return {
        "missing folder": (str(tmp_path / "nope" / "out.txt"), "does not exist"),
        "a folder": (str(folder), "is a folder"),
        "the input": (str(doc), "is the input file"),
        "a hard link of the input": (str(hard), "is the input file"),
        "a symlink to the input": (str(sym), "is the input file"),
    }


@pytest.mark.parametrize("case", ["missing folder", "a folder", "the input", "a hard link of the input",
                                  "a symlink to the input"])
def test_sanitize_out_is_checked_before_the_model_and_the_input_is_intact(case, doc, tmp_path, no_model, capsys):
    out, needle = _out_cases(tmp_path, doc[0])[case]
    rc = main(["sanitize", str(doc[0]), "--spans", str(doc[1]), "--out", out])
    assert needle in _one_line_error(capsys, rc)
    assert no_model == [] and doc[0].read_text(encoding="utf-8") == DOC


@pytest.mark.parametrize("case", ["missing folder", "a folder", "the input", "a hard link of the input"])
def test_synth_out_is_checked_before_the_model(case, corpus, tmp_path, no_model, capsys):
    before = corpus.read_bytes()
    out, needle = _out_cases(tmp_path, corpus)[case]
    rc = main(["synth", str(corpus), "--text-field", "text", "--batch-size", "2", "--epsilon", "10", "--out", out])
    assert needle in _one_line_error(capsys, rc)
    assert no_model == [] and corpus.read_bytes() == before


@pytest.mark.skipif(sys.platform == "win32" or os.geteuid() == 0, reason="needs a non-root POSIX user")
def test_out_in_an_unwritable_folder_is_refused(doc, tmp_path, no_model, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        rc = main(["sanitize", str(doc[0]), "--spans", str(doc[1]), "--out", str(locked / "o.txt")])
        assert "cannot write" in _one_line_error(capsys, rc)
    finally:
        locked.chmod(0o700)
    assert no_model == []


def test_sanitize_out_is_written_atomically(doc, tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "release.txt"
    out.write_text("old release\n")
    rc = main(["sanitize", str(doc[0]), "--spans", str(doc[1]), "--model", str(tiny_model_dir), "--max-new-tokens",
               "4", "--epsilon", "30", "--out", str(out)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert out.read_text(encoding="utf-8") != "old release\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doc.txt", "release.txt", "spans.json"]


def test_a_failed_final_write_keeps_the_release(doc, tmp_path, tiny_model_dir, capsys, monkeypatch):
    """The final rename fails after the whole generation: the release is still printed, no temp file is left."""
    def broken(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    out = tmp_path / "release.txt"
    rc = main(["sanitize", str(doc[0]), "--spans", str(doc[1]), "--spans-only", "--model", str(tiny_model_dir),
               "--max-new-tokens", "4", "--epsilon", "30", "--out", str(out), "--json"])
    cap = capsys.readouterr()
    assert rc == 2 and "No space left on device" in cap.err and "standard output" in cap.err
    assert cap.err.count("\n") == 1 and "Traceback" not in cap.err
    assert isinstance(json.loads(cap.out)["text"], str)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doc.txt", "spans.json"]


def test_synth_a_failed_append_keeps_the_texts_already_written(corpus, tmp_path, tiny_model_dir, capsys,
                                                              monkeypatch):
    """Texts are on disk as they finish: a full disk stops the run, says how many texts are safe and that rerunning
    resumes; the torn line it may leave holds part of a text (after its batch index): the rerun keeps it as released
    (an error record saying it was torn) and does not generate that batch again."""
    import dpinfer.jobs.synth as files

    real_write = files.write_line
    calls = [0]

    def full_disk(fd: int, line: bytes) -> None:
        calls[0] += 1
        if calls[0] == 3:  # the header, the first text, then the disk is full halfway through the second text
            os.write(fd, line[: len(line) // 2])
            raise OSError(28, "No space left on device")
        real_write(fd, line)

    monkeypatch.setattr(files, "write_line", full_disk)
    out = tmp_path / "o.jsonl"
    args = ["synth", str(corpus), "--text-field", "text", "--batch-size", "2", "--epsilon", "10",
            "--max-new-tokens", "3", "--model", str(tiny_model_dir), "--out", str(out)]
    err = _one_line_error(capsys, main(args))
    assert "No space left on device" in err and "1 of 3 texts are safely in it" in err and "rerun" in err
    assert len(out.read_bytes().splitlines()) == 3 and not out.read_bytes().endswith(b"\n")  # header, text, torn
    monkeypatch.setattr(files, "write_line", real_write)
    assert main(args) == 0
    assert "torn last line" in " ".join(capsys.readouterr().out.split())
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert "dpinfer" in lines[0] and sorted(x["batch"] for x in lines[1:]) == [0, 1, 2]
    assert lines[2]["torn"] is True and "text" not in lines[2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl", "o.jsonl"]


def test_interrupted_write_leaves_no_temporary_file(tmp_path):
    from dpinfer.io import atomic_open

    target = tmp_path / "o.txt"
    with pytest.raises(KeyboardInterrupt), atomic_open(target) as f:
        f.write("partial")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------------------ stdout
def test_sanitize_prints_only_the_release_and_the_guarantee(doc, tiny_model_dir, capsys):
    rc = main(["sanitize", str(doc[0]), "--spans", str(doc[1]), "--model", str(tiny_model_dir), "--max-new-tokens",
               "4", "--epsilon", "30"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "Guarantee" in cap.out
    # the release starts with the public opening ("The applicant," up to the first tagged span): untagged text after
    # a span ("was born in") must not be echoed
    for secret in (NAME, "Vienna", "12345/06", "was born in"):
        assert secret not in cap.out and secret not in cap.err
    assert cap.out.startswith("The applicant,")


def test_show_input_never_goes_into_a_pipe(doc, tiny_model_dir, capsys):
    rc = main(["sanitize", str(doc[0]), "--spans", str(doc[1]), "--model", str(tiny_model_dir), "--max-new-tokens",
               "4", "--epsilon", "30", "--show-input"])
    cap = capsys.readouterr()
    assert rc == 0 and NAME not in cap.out + cap.err and "not a terminal" in cap.err


# ------------------------------------------------------------------------------------------------------ errors
def test_headerless_csv_error_does_not_echo_the_first_record(tmp_path, no_model, capsys):
    p = tmp_path / "c.csv"
    p.write_text(f"{NAME},5 stars,Vienna\nAnna Berg,1 star,Graz\n", encoding="utf-8")
    rc = main(["synth", str(p), "--text-field", "text", "--epsilon", "10", "--batch-size", "1",
               "--out", str(tmp_path / "o.jsonl")])
    err = _one_line_error(capsys, rc)
    assert "header row" in err and "Vienna" not in err and "Anna" not in err


def test_jsonl_missing_field_does_not_list_the_record_keys(tmp_path):
    from dpinfer.errors import InvalidInputError
    from dpinfer.references import load_references

    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps({NAME: "x"}) + "\n", encoding="utf-8")
    with pytest.raises(InvalidInputError) as exc:
        load_references(p, text_field="text")
    assert NAME not in str(exc.value) and "1 field" in str(exc.value)


@pytest.mark.parametrize("cmd", [["generate", "{p}", "--file"], ["sanitize", "{p}"],
                                 ["synth", "{p}", "--text-field", "t", "--epsilon", "10", "--out", "{o}"]])
def test_a_folder_as_input_says_it_is_a_folder(cmd, tmp_path, no_model, capsys):
    folder = tmp_path / "in.csv"
    folder.mkdir()
    argv = [a.replace("{p}", str(folder)).replace("{o}", str(tmp_path / "o.jsonl")) for a in cmd]
    assert "is a folder" in _one_line_error(capsys, main(argv))


# ------------------------------------------------------------------------------------------------------ bench tagger
def test_bench_tagger_help_is_user_help(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "tagger", "--help"])
    out = capsys.readouterr().out
    assert "add_parser" not in out and "Wire it" not in out
    assert "recall" in out and "--taggers" in out and "examples:" in out


def test_global_json_reaches_bench_tagger(monkeypatch, capsys):
    import dpinfer.bench.tagger as bt

    monkeypatch.setattr(bt, "run_tagger_bench", lambda *a, **k: {"fake": True})
    assert main(["--json", "bench", "tagger", "--taggers", "regex", "--n", "1"]) == 0
    assert json.loads(capsys.readouterr().out) == {"fake": True}
    assert main(["bench", "tagger", "--taggers", "regex", "--n", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"fake": True}


def test_out_where_no_file_can_be_created_is_refused(doc, tmp_path, no_model, capsys, monkeypatch):
    """The probe (a temporary file created and removed in the folder) catches what permission bits miss (ACLs, a
    read-only file system, running as root on a read-only mount)."""
    import tempfile

    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", denied)
    rc = main(["sanitize", str(doc[0]), "--spans", str(doc[1]), "--out", str(tmp_path / "o.txt")])
    assert "cannot write" in _one_line_error(capsys, rc)
    assert no_model == []


def test_synth_output_file_holds_no_timing_and_no_leftovers(corpus, tmp_path, tiny_model_dir, capsys):
    """Throughput depends on the references' lengths: it stays out of the released file (operator output only)."""
    out = tmp_path / "o.jsonl"
    rc = main(["synth", str(corpus), "--text-field", "text", "--batch-size", "2", "--epsilon", "10",
               "--max-new-tokens", "3", "--max-texts", "1", "--model", str(tiny_model_dir), "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    header = json.loads(out.read_text(encoding="utf-8").splitlines()[0])["dpinfer"]
    assert "tokens_per_second" not in header and "guarantee" in header
    assert NAME not in out.read_text(encoding="utf-8").splitlines()[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl", "o.jsonl"]


def test_a_missing_tagger_back_end_is_refused_before_the_model(doc, no_model, capsys, monkeypatch):
    import dpinfer.taggers
    from dpinfer.errors import MissingDependencyError

    def missing(name: str, **kwargs: object) -> None:
        raise MissingDependencyError(f'the {name} tagger needs: pip install "dpinfer[pii]"')

    monkeypatch.setattr(dpinfer.taggers, "get_tagger", missing)
    assert "pip install" in _one_line_error(capsys, main(["sanitize", str(doc[0]), "--tagger", "presidio"]))
    assert no_model == []
