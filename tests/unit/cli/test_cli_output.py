"""Machine-friendly output: nothing wrapped or cut when standard output or error is not a terminal, and a mistyped
option of a sub-command answered by that sub-command, with a suggestion."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dpinfer.cli import main
from dpinfer.cli.output import console

LONG = " ".join(f"word{i}" for i in range(60))  # ~430 characters: wrapped at 80 columns by a default console


def test_console_into_a_pipe_neither_wraps_nor_truncates(capsys):
    console().print(LONG)
    console(stderr=True).print(f"[dim]{LONG}[/dim]")
    cap = capsys.readouterr()
    assert cap.out == LONG + "\n"
    assert cap.err == LONG + "\n"  # one line, no colour codes


def test_sanitize_into_a_file_is_not_wrapped(tiny_model_dir, tmp_path, capsys):
    doc = tmp_path / "doc.txt"
    doc.write_text("On 12 March 2003 the applicant, John Smith, wrote to the court in London about case 123/45.\n")
    rc = main(["sanitize", str(doc), "--model", str(tiny_model_dir), "--tagger", "regex", "--max-new-tokens", "3",
               "--seed", "0"])
    cap = capsys.readouterr()
    assert rc == 0
    statement = cap.out.rstrip("\n").split("\n\n")[-1].splitlines()
    assert statement[0].startswith("Guarantee") and len(statement[0]) > 80
    assert all(line.startswith(("Guarantee", "Caveat", "A random seed")) for line in statement)  # nothing wrapped
    notes = [line for line in cap.err.splitlines() if "private spans" in line]
    assert len(notes) == 1 and "tokens/s" in notes[0]  # the whole note on one line


def test_models_piped_prints_full_names(tmp_path):
    out = tmp_path / "models.tsv"
    with out.open("w") as fh:
        rc = subprocess.run([sys.executable, "-m", "dpinfer", "models"], stdout=fh, stderr=subprocess.PIPE,
                            timeout=120).returncode
    assert rc == 0
    lines = out.read_text().splitlines()
    assert lines[0].split("\t")[:2] == ["name", "kind"]
    names = [line.split("\t")[0] for line in lines[1:]]
    assert "smollm2-135m-instruct" in names and not any("…" in line for line in lines)
    listed = json.loads(subprocess.run([sys.executable, "-m", "dpinfer", "models", "--json"], capture_output=True,
                                       timeout=120, check=True).stdout)
    assert names == [m["name"] for m in listed["models"]]


@pytest.mark.parametrize(
    ("argv", "command", "suggestion"),
    [
        (["sanitize", "doc.txt", "--epsilom", "3"], "dpinfer sanitize", "--epsilon"),
        (["rag", "ask", "STORE", "q", "--epsilonn=3"], "dpinfer rag ask", "--epsilon"),
        (["bench", "engine", "--jbos", "2"], "dpinfer bench engine", "--jobs"),
        (["synth", "refs.csv", "--text-field", "t", "--out", "o.jsonl", "--batch-szie", "8"], "dpinfer synth",
         "--batch-size"),
    ],
)
def test_mistyped_subcommand_flag_names_the_subcommand(argv, command, suggestion, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.startswith(f"usage: {command} ")  # the sub-command's usage, not the top-level one
    assert f"{command}: error: unrecognized arguments: " in err
    assert f"(did you mean {suggestion}?)" in err


def test_unknown_flag_without_a_close_match_has_no_suggestion(capsys):
    with pytest.raises(SystemExit):
        main(["models", "--zzzzzz"])
    err = capsys.readouterr().err
    assert "dpinfer models: error: unrecognized arguments: --zzzzzz" in err and "did you mean" not in err


def test_help_and_usage_into_a_pipe_are_not_wrapped(capsys):
    with pytest.raises(SystemExit):
        main(["sanitize", "--help"])
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("usage: dpinfer sanitize [-h]") and "[--spans-only]" in first and "[file]" in first
    with pytest.raises(SystemExit):
        main(["sanitize", "doc.txt", "--epsilom", "3"])
    usage, error = capsys.readouterr().err.splitlines()
    assert usage.startswith("usage: dpinfer sanitize ") and error.startswith("dpinfer sanitize: error: ")


def test_progress_bar_shows_the_known_total_and_an_eta(monkeypatch):
    """On a terminal the sanitize progress bar shows done/T_max (the public total, known before the first step)
    and an estimate of the time left; into a pipe it draws nothing."""
    import io
    import time

    from rich.console import Console

    from dpinfer.cli import output

    buf = io.StringIO()
    monkeypatch.setattr(output, "console", lambda stderr=False: Console(file=buf, force_terminal=True, width=120,
                                                                         color_system=None))
    with output.count_progress("sanitizing", "tokens") as update:
        update(0, 256)
        for done in (32, 64, 128):
            time.sleep(0.05)
            update(done, 256)
        time.sleep(0.2)  # let the live display refresh at least once with the last update
    drawn = buf.getvalue()
    assert "/256" in drawn and "tokens" in drawn and "ETA" in drawn
    assert "0/?" not in drawn

    pipe = io.StringIO()
    monkeypatch.setattr(output, "console", lambda stderr=False: Console(file=pipe))
    with output.count_progress("sanitizing", "tokens") as update:
        update(0, 256)
        update(256, 256)
    assert pipe.getvalue() == ""
