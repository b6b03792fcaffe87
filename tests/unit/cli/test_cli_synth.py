"""``dpinfer synth`` (dpinfer.cli.synth) on the tiny model: the output file, one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpinfer.cli import main as cli_main
from dpinfer.configs.synth import PromptTemplate
from dpinfer.jobs import TORN_ERROR

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
    assert "diagnostics" not in summary and "tokens_per_second" not in json.dumps(summary)  # the release only
    header = json.loads(out.read_text(encoding="utf-8").splitlines()[0])
    assert header["dpinfer"]["settings"]["epsilon"] == 6.0


def test_cli_synth_debug_stats_prints_the_diagnostics_never_writes_them(tiny_model_dir: Path, tmp_path: Path,
                                                                       capsys) -> None:
    corpus = _write_corpus(tmp_path)
    out = tmp_path / "out.jsonl"
    rc = cli_main(["synth", str(corpus), "--text-field", "text", "--label-fields", "cat", "--method", "amin",
                   "--epsilon", "8", "--batch-size", "2", "--max-new-tokens", "4", "--out", str(out), "--model",
                   str(tiny_model_dir), "--seed", "0", "--json", "--debug-stats"])
    assert rc == 0
    diagnostics = json.loads(capsys.readouterr().out)["diagnostics"]
    assert "warning" in diagnostics and "tokens_per_second" in diagnostics
    assert all("private_tokens" in t for t in diagnostics["texts"])
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert all(set(rec) == {"batch", "text", "labels", "tokens", "finish_reason"} for rec in lines[1:])
    assert not {"tokens_per_second", "seconds", "diagnostics"} & set(lines[0]["dpinfer"])


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


@pytest.mark.parametrize(("method", "epsilon", "needle"), [
    ("public", 0.0, "public prompt only"),
    ("adapmixed", float("inf"), "none ex ante. The privacy loss of adapmixed depends on the references"),
    ("invisibleink", 4.0, "It holds for every reference at once"),
])
def test_summary_says_what_the_guarantee_is(method, epsilon, needle, capsys) -> None:
    """The words come from the method's table entry (its kind of guarantee); no timing without --debug-stats."""
    import argparse
    from types import SimpleNamespace

    from dpinfer.cli.synth import print_summary

    res = SimpleNamespace(texts=[object()], generated_tokens=5, lm_calls_per_token=3, references_left_out=0,
                          guarantee=SimpleNamespace(epsilon=epsilon))
    print_summary(argparse.Namespace(method=method, out="o.jsonl", batch_size=2), res)  # type: ignore[arg-type]
    out = " ".join(capsys.readouterr().out.split())
    assert needle in out and "tokens/s" not in out


# ------------------------------------------------------------------------------------------------ resumable --out
# four batches of B = 2 within --label-fields cat: Restaurants 3 (six records, one empty), Hotels 1; Beauty's single
# record is left out
JOB = ["--text-field", "text", "--label-fields", "cat", "--epsilon", "8", "--batch-size", "2", "--max-new-tokens",
       "6", "--seed", "3"]
BATCHES = 4


def _job(corpus: Path, out: Path, model: Path, *extra: str) -> list[str]:
    return ["synth", str(corpus), *JOB, "--out", str(out), "--model", str(model), *extra]


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def _batches(path: Path) -> list[int]:
    return [json.loads(line)["batch"] for line in _lines(path)[1:]]


def _stop_after(monkeypatch: pytest.MonkeyPatch, appended: int) -> None:
    """The next run's appends fail with 'disk full' once ``appended`` texts are written."""
    import errno

    from dpinfer.jobs.synth import SynthesisOutput

    real = SynthesisOutput.append
    count = [0]

    def append(self: SynthesisOutput, record: dict) -> None:
        if count[0] == appended:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, record)
        count[0] += 1

    monkeypatch.setattr(SynthesisOutput, "append", append)


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    """The lines of one uninterrupted seeded run."""
    d = tmp_path_factory.mktemp("synth-ref")
    out = d / "ref.jsonl"
    assert cli_main(_job(_write_corpus(d), out, tiny_model_dir)) == 0
    assert not Path(f"{out}.partition").exists()
    return _lines(out)


@pytest.fixture
def interrupted(tiny_model_dir: Path, tmp_path: Path, capsys) -> tuple[Path, Path]:
    """The corpus and an --out whose run stopped (disk full) after two of its four texts."""
    corpus, out = _write_corpus(tmp_path), tmp_path / "out.jsonl"
    with pytest.MonkeyPatch.context() as mp:
        _stop_after(mp, 2)
        assert cli_main(_job(corpus, out, tiny_model_dir)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left on device" in err
    assert "2 of 4 texts are safely in it" in err and "rerun the same command to resume" in err
    assert len(_batches(out)) == 2
    return corpus, out


def test_cli_synth_header_holds_no_reference_and_the_header_and_texts_are_appended(uninterrupted) -> None:
    head = json.loads(uninterrupted[0])["dpinfer"]
    assert head["kind"] == "synthesis" and head["texts"] == BATCHES and head["references"] == len(REVIEWS)
    assert head["settings"]["label_fields"] == ["cat"] and head["guarantee"]["seeded"] is True
    assert "tokens_per_second" not in head and "seconds" not in head
    assert sorted(json.loads(line)["batch"] for line in uninterrupted[1:]) == list(range(BATCHES))
    blob = b"".join(uninterrupted).decode("utf-8")
    assert not any(text and text in blob for text, _, _ in REVIEWS) and '"seed"' not in blob


def test_cli_synth_resume_writes_only_the_missing_batches(interrupted, uninterrupted, tiny_model_dir: Path,
                                                          capsys) -> None:
    corpus, out = interrupted
    side = Path(f"{out}.partition")
    assert side.stat().st_mode & 0o777 == 0o600  # private: derived from the corpus
    assert not any(text and text in side.read_text(encoding="utf-8") for text, _, _ in REVIEWS)
    kept = _lines(out)
    assert kept[0] == uninterrupted[0]  # the header line, before any text
    out.write_bytes(b"".join(kept[:2]))  # one more text deleted: two batches are missing now
    assert cli_main(_job(corpus, out, tiny_model_dir, "--json")) == 2  # a deleted text would be released again
    assert "--allow-rerelease" in capsys.readouterr().err
    assert cli_main(_job(corpus, out, tiny_model_dir, "--json", "--allow-rerelease")) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["generated"], summary["skipped"], summary["texts"]) == (3, 1, BATCHES)
    now = _lines(out)
    assert now[:2] == kept[:2]  # finished lines stay byte-identical
    assert sorted(_batches(out)) == list(range(BATCHES))
    # with a seed a batch draws the same randomness whichever batches run with it: the same texts, batch for batch
    assert sorted(now) == sorted(uninterrupted)
    assert not side.exists()  # every batch is out: the private partition file is gone


def test_cli_synth_resume_keeps_a_torn_last_line_as_released(interrupted, uninterrupted, tiny_model_dir: Path,
                                                              capsys) -> None:
    """A line torn after its batch index may hold part of the text: that batch is released, never generated again
    (an error record says it was torn); a line torn before its batch index is complete is cut off."""
    corpus, out = interrupted
    done = set(_batches(out))
    missing = next(line for line in uninterrupted[1:] if json.loads(line)["batch"] not in done)
    batch = json.loads(missing)["batch"]
    with open(out, "ab") as fh:
        fh.write(missing[: len(missing) // 2])  # a kill in the middle of a write
    kept = _lines(out)[:-1]
    assert cli_main(_job(corpus, out, tiny_model_dir)) == 0
    assert "torn last line" in " ".join(capsys.readouterr().out.split())
    now = _lines(out)
    assert now[: len(kept)] == kept
    assert json.loads(now[len(kept)]) == {"batch": batch, "error": TORN_ERROR, "torn": True}
    assert sorted(now[:len(kept)] + now[len(kept) + 1:]) == sorted(line for line in uninterrupted if line != missing)


def test_cli_synth_resume_cuts_a_line_torn_before_its_batch(interrupted, uninterrupted, tiny_model_dir: Path,
                                                            capsys) -> None:
    corpus, out = interrupted
    done = set(_batches(out))
    missing = next(line for line in uninterrupted[1:] if json.loads(line)["batch"] not in done)
    with open(out, "ab") as fh:
        fh.write(missing[:9])  # '{"batch":' and no index yet: nothing released
    kept = _lines(out)[:-1]
    assert cli_main(_job(corpus, out, tiny_model_dir)) == 0
    assert "torn last line of 9 bytes" in " ".join(capsys.readouterr().out.split())
    assert _lines(out)[: len(kept)] == kept and sorted(_lines(out)) == sorted(uninterrupted)


@pytest.mark.slow  # a subprocess that loads the model and is killed, then a resumed run
def test_cli_synth_resume_after_sigkill(uninterrupted, tiny_model_dir: Path, tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    corpus, out = _write_corpus(tmp_path), tmp_path / "out.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[3] / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    # the process SIGKILLs itself right after its second text is written: a deterministic "kill mid-run"
    code = ("import os, signal, sys\nimport dpinfer.jobs.synth as j\nappend = j.SynthesisOutput.append\n"
            "count = [0]\ndef killing_append(self, record):\n    append(self, record)\n    count[0] += 1\n"
            "    if count[0] == 2:\n        os.kill(os.getpid(), signal.SIGKILL)\n"
            "j.SynthesisOutput.append = killing_append\nfrom dpinfer.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.run([sys.executable, "-c", code, *_job(corpus, out, tiny_model_dir)], env=env,
                          capture_output=True, timeout=240)
    assert proc.returncode == -signal.SIGKILL
    before = _lines(out)
    assert len(before) == 3 and Path(f"{out}.partition").exists()
    assert cli_main(_job(corpus, out, tiny_model_dir)) == 0
    assert _lines(out)[:3] == before and sorted(_lines(out)) == sorted(uninterrupted)


def test_cli_synth_changed_corpus_is_refused_before_the_model_loads(interrupted, tiny_model_dir: Path, monkeypatch,
                                                                    model_gate, capsys) -> None:
    corpus, out = interrupted
    before, side = out.read_bytes(), Path(f"{out}.partition")
    edited = corpus.read_text(encoding="utf-8").replace("Best tacos in town.", "Best tacos in the city.")
    corpus.write_text(edited, encoding="utf-8")  # the same records, labels and order: one reference edited
    model_gate.forbid()
    assert cli_main(_job(corpus, out, tiny_model_dir)) == 2
    err = capsys.readouterr().err
    assert err.startswith("dpinfer: error: ") and err.count("\n") == 1 and "the corpus changed" in err
    assert not any(text and text in err for text, _, _ in REVIEWS) and "the city" not in err
    assert out.read_bytes() == before and side.exists()


def test_cli_synth_missing_partition_file_is_refused(model_gate, interrupted, tiny_model_dir: Path, monkeypatch,
                                                     capsys) -> None:
    corpus, out = interrupted
    Path(f"{out}.partition").unlink()
    model_gate.forbid()
    assert cli_main(_job(corpus, out, tiny_model_dir)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "partition file out.jsonl.partition is missing" in err


@pytest.mark.parametrize(("change", "needle"), [
    (["--epsilon", "7"], "--epsilon is 8.0 there, 7.0 here"),
    (["--max-new-tokens", "5"], "--max-new-tokens (T_max) is 6 there, 5 here"),
    (["--batch-size", "3"], "--batch-size (B) is 2 there, 3 here"),
    (["--limit", "8"], "--limit is null there, 8 here"),
    (["--seed", None], "whether the run is seeded (--seed) is true there, false here"),
    (["--template", "tab"], "--template / --template-file is \"generic\" there, \"tab\" here"),
    (["--method", "amin"], "--method is \"invisibleink\" there, \"amin\" here"),
])
def test_cli_synth_other_settings_are_refused_before_the_model_loads(interrupted, tiny_model_dir: Path, model_gate,
                                                                     capsys, change: list, needle: str) -> None:
    corpus, out = interrupted
    before = out.read_bytes()
    args = _job(corpus, out, tiny_model_dir)
    option, value = change
    if option in args:
        i = args.index(option)
        del args[i:i + 2]
    if value is not None:
        args += [option, value]
    model_gate.forbid()
    assert cli_main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and "use another --out, or delete" in err, err
    assert out.read_bytes() == before


def test_cli_synth_a_finished_out_is_a_no_op(uninterrupted, tiny_model_dir: Path, tmp_path: Path, monkeypatch,
                                            model_gate, capsys) -> None:
    out = tmp_path / "out.jsonl"
    out.write_bytes(b"".join(uninterrupted))
    model_gate.forbid()
    assert cli_main(_job(_write_corpus(tmp_path), out, tiny_model_dir)) == 0
    assert "All 4 batches are done" in capsys.readouterr().out
    assert _lines(out) == uninterrupted


def test_cli_synth_refuses_a_foreign_or_busy_out(tiny_model_dir: Path, tmp_path: Path, monkeypatch,
                                                 model_gate, capsys) -> None:
    fcntl = pytest.importorskip("fcntl", reason="flock is POSIX only")
    corpus = _write_corpus(tmp_path)
    model_gate.forbid()
    foreign = tmp_path / "notes.jsonl"
    foreign.write_bytes(b'{"id": "a", "text": "x"}\n{"id": "b"')
    assert cli_main(_job(corpus, foreign, tiny_model_dir)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not the output of dpinfer synth" in err
    assert foreign.read_bytes() == b'{"id": "a", "text": "x"}\n{"id": "b"'  # left as it was: no line cut
    busy = tmp_path / "busy.jsonl"
    with open(busy, "wb") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)  # another run holds it
        assert cli_main(_job(corpus, busy, tiny_model_dir)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "being written by another dpinfer synth run" in err
    assert busy.read_bytes() == b""
