"""The command line: outputs, --json, and one-line errors with a non-zero exit."""

from __future__ import annotations

import json

import pytest

from dpinfer.cli import main


def test_generate_json(tiny_model_dir, capsys):
    rc = main(["generate", "The applicant", "--model", str(tiny_model_dir), "--max-new-tokens", "5",
               "--temperature", "0", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["generated_tokens"] <= 5 and isinstance(out["text"], str)
    assert out["guarantee"]["epsilon"] == "inf"


def test_generate_streams_text(tiny_model_dir, capsys):
    assert main(["generate", "The applicant", "--model", str(tiny_model_dir), "--max-new-tokens", "5",
                 "--seed", "1"]) == 0
    cap = capsys.readouterr()
    assert cap.out.endswith("\n") and "no privacy guarantee" in cap.err


def test_json_flag_before_subcommand(tiny_model_dir, capsys):
    assert main(["--json", "generate", "x", "--model", str(tiny_model_dir), "--max-new-tokens", "2"]) == 0
    assert "text" in json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["generate", "x", "--model", "no/such-model"], "unknown model"),
        (["generate", "x", "--model", "{tiny}", "--temperature", "-1"], "temperature"),
        (["generate", "x", "--model", "{tiny}", "--max-new-tokens", "0"], "--max-new-tokens"),
        (["generate", "{empty}", "--file", "--model", "{tiny}"], "is empty"),
        (["generate", "{binary}", "--file", "--model", "{tiny}"], "binary"),
        (["generate", "/no/such/file", "--file", "--model", "{tiny}"], "no such file"),
    ],
)
def test_errors_are_one_line_with_exit_2(argv, needle, tiny_model_dir, tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("  \n")
    (tmp_path / "bin.dat").write_bytes(b"\x00\x01\x02")
    subst = {"{tiny}": str(tiny_model_dir), "{empty}": str(tmp_path / "empty.txt"),
             "{binary}": str(tmp_path / "bin.dat")}
    rc = main([subst.get(a, a) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("dpinfer: error: ") and needle in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_models_json(capsys):
    assert main(["models", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "cache_dir" in out and out["models"][0]["name"] == "smollm2-135m-instruct"


def test_help_lists_commands(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for cmd in ("generate", "models", "bench"):
        assert cmd in out
