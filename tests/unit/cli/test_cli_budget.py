"""``dpinfer budget`` and ``--ledger``/``--unit`` on the releasing commands: JSON on every action, one-line refusals
with exit status 2 before the model loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpinfer.accounting.ledger import Ledger
from dpinfer.cli import main
from dpinfer.taggers import Span

DOC = "Mr Smith, a lawyer practising in London, lodged application no. 36244/06 on 20 May 1998."
SPANS = [Span(3, 8, "PERSON"), Span(33, 39, "LOC"), Span(64, 72, "CODE"), Span(76, 87, "DATETIME")]


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_budget_init_set_show_history_void_with_json(tmp_path: Path, capsys) -> None:
    path = str(tmp_path / "b.db")
    out = _json(capsys, ["budget", "init", "--ledger", path, "--epsilon", "50", "--json"])
    assert out["default"] == {"epsilon": 50.0, "delta": 1e-5}
    out = _json(capsys, ["budget", "set", "case-42", "--epsilon", "12", "--ledger", path, "--json"])
    assert out["budget"] == {"epsilon": 12.0, "delta": 1e-5} and out["spent"] == 0.0
    from dpinfer.accounting import Zcdp

    ledger = Ledger(path)
    ledger.reserve("case-42", Zcdp(0.1), mechanism="pad").commit()
    stuck = ledger.reserve("case-42", Zcdp(0.1), mechanism="pad")
    out = _json(capsys, ["--json", "budget", "show", "case-42", "--ledger", path])
    assert (out["releases"], out["pending"]) == (1, 1)
    assert out["spent"] == Zcdp(0.2).to_epsilon(1e-5) and out["left"] == pytest.approx(12.0 - out["spent"])
    assert "1 of them pending" in out["guarantee"]
    out = _json(capsys, ["budget", "history", "case-42", "--ledger", path, "--json"])
    assert [c["state"] for c in out["charges"]] == ["committed", "pending"]
    out = _json(capsys, ["budget", "void", str(stuck.id), "--ledger", path, "--json"])
    assert out["state"] == "void"
    out = _json(capsys, ["budget", "show", "--ledger", path, "--json"])
    assert [u["unit"] for u in out["units"]] == ["case-42"] and out["units"][0]["pending"] == 0
    assert main(["budget", "show", "case-42", "--ledger", path]) == 0
    text = capsys.readouterr().out
    assert "case-42: budget ε = 12 (δ = 1e-05), spent ε = 1.92, left ε = 10" in text and "1 release\n" in text
    assert "its one release is (ε = 1.92, δ = 1e-05)-differentially private" in text
    assert main(["budget", "history", "case-42", "--ledger", path]) == 0
    assert "void" in capsys.readouterr().out


def test_budget_errors_are_one_line_with_exit_2(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("DPINFER_LEDGER", raising=False)
    assert main(["budget", "show"]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
    foreign = tmp_path / "x.db"
    foreign.write_bytes(b"not a ledger at all" * 100)
    assert main(["budget", "show", "--ledger", str(foreign)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dpinfer: error: ") and err.count("\n") == 1 and "not a dpinfer ledger" in err
    Ledger.init(tmp_path / "b.db")
    assert main(["budget", "void", "7", "--ledger", str(tmp_path / "b.db")]) == 2
    assert "has no charge 7" in capsys.readouterr().err


def test_sanitize_with_a_ledger_is_refused_before_the_model_loads(model_gate, tiny_model_dir, tmp_path: Path, capsys,
                                                                  monkeypatch) -> None:
    doc, spans = tmp_path / "doc.txt", tmp_path / "spans.json"
    doc.write_text(DOC)
    spans.write_text(json.dumps([s.to_dict() for s in SPANS]))
    path = str(tmp_path / "b.db")
    assert main(["budget", "init", "--ledger", path, "--epsilon", "25"]) == 0
    assert "default budget of a new unit: ε = 25, δ = 1e-05" in capsys.readouterr().out
    monkeypatch.setenv("DPINFER_LEDGER", path)  # the environment names the ledger
    argv = ["sanitize", str(doc), "--spans", str(spans), "--model", str(tiny_model_dir), "--max-new-tokens", "4",
            "--epsilon", "20", "--seed", "0", "--unit", "case-7", "--spans-only"]
    assert main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["method"] == "dp-fusion"
    assert "charged to unit case-7 of ledger" in captured.err

    model_gate.forbid()
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    err = captured.err
    assert err.startswith("dpinfer: error: budget exceeded for unit 'case-7': budget ε = 25 (δ = 1e-05), spent ε = ")
    assert "this release costs ε = 20 " in err and "nothing was generated" in err
    status = Ledger(path).status("case-7")
    assert (status.releases, status.pending) == (1, 0)
    assert main(["sanitize", str(doc), "--spans", str(spans), "--model", str(tiny_model_dir), "--ledger",
                 str(tmp_path / "missing.db")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_synth_charges_the_corpus_once_per_run_and_a_resumed_run_not_again(tiny_model_dir, tmp_path: Path, capsys,
                                                                           model_gate, monkeypatch) -> None:
    from dpinfer.accounting import Zcdp, zcdp_rho_for_target

    corpus = tmp_path / "c.csv"
    corpus.write_text("text,cat\n" + "".join(f'"review number {i} was fine",A\n' for i in range(6)))
    path = str(tmp_path / "b.db")
    Ledger.init(path)
    rho = zcdp_rho_for_target(6.0, 1e-5)  # one run at ε = 6 costs at most this ρ (InvisibleInk is zCDP)
    Ledger(path).set_budget("reviews", epsilon=(Zcdp(rho).to_epsilon(1e-5) + Zcdp(2 * rho).to_epsilon(1e-5)) / 2)
    job = ["synth", str(corpus), "--text-field", "text", "--epsilon", "6", "--batch-size", "2", "--max-new-tokens",
           "4", "--seed", "0", "--model", str(tiny_model_dir), "--ledger", path, "--unit", "reviews"]
    import errno

    from dpinfer.jobs.synth import SynthesisOutput

    out = tmp_path / "o.jsonl"
    with monkeypatch.context() as patch:  # the disk fills after one text: the run stops, its text released
        real = SynthesisOutput.append
        written = [0]

        def append(self: SynthesisOutput, record: dict) -> None:
            if written[0] == 1:
                raise OSError(errno.ENOSPC, "No space left on device")
            real(self, record)
            written[0] += 1

        patch.setattr(SynthesisOutput, "append", append)
        assert main([*job, "--out", str(out)]) == 2
    assert "charged to unit reviews" in capsys.readouterr().err
    history = Ledger(path).history("reviews")
    assert [(c.state, c.mechanism) for c in history] == [("committed", "invisibleink")]
    assert main([*job, "--out", str(out)]) == 0  # the rerun resumes
    assert len(Ledger(path).history("reviews")) == 1  # and is not charged again
    assert len(out.read_bytes().splitlines()) == 1 + 3
    model_gate.forbid()
    assert main([*job, "--out", str(tmp_path / "another.jsonl")]) == 2  # a second run: over the budget
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "budget exceeded for unit 'reviews'" in err


def test_protect_prompt_needs_a_unit_and_is_refused_before_the_model_loads(model_gate, tmp_path: Path, capsys,
                                                                           monkeypatch) -> None:
    path = str(tmp_path / "b.db")
    Ledger.init(path).set_budget("alice", epsilon=5.0)
    model_gate.forbid()
    assert main(["protect-prompt", "What is a kettle for?", "--epsilon", "8", "--ledger", path]) == 2
    assert "needs unit= (CLI: --unit NAME)" in capsys.readouterr().err
    assert main(["protect-prompt", "What is a kettle for?", "--epsilon", "8", "--ledger", path,
                 "--unit", "alice"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dpinfer: error: budget exceeded for unit 'alice': budget ε = 5 ") and err.count("\n") == 1
    assert "this release costs ε = 8 " in err


CORPUS = [
    ("Mr Smith, a lawyer practising in London, lodged an application on 20 May 1998.", ["Smith", "London"]),
    ("The applicant was born in 1970 and lives in Izmir.", ["Izmir"]),
    ("On 20 May 1998 the Court decided to communicate the application to the Government.", ["20 May 1998"]),
    ("Mr Jones represented the applicants before the Court.", ["Jones"]),
]


@pytest.mark.slow  # a subprocess that loads the model and is killed, then a resumed run
def test_a_resumed_sanitize_corpus_charges_each_record_once_after_a_kill(tiny_model_dir, tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    corpus = tmp_path / "in.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"doc-{i}", "text": text, "spans": [
        {"start": text.index(v), "end": text.index(v) + len(v), "label": "PERSON" if v[0] in "SJ" else "LOC"}
        for v in values]}) + "\n" for i, (text, values) in enumerate(CORPUS)), encoding="utf-8")
    path = tmp_path / "b.db"
    Ledger.init(path, epsilon=1000.0)
    args = ["sanitize", "--corpus", str(corpus), "--out", str(tmp_path / "out.jsonl"), "--model", str(tiny_model_dir),
            "--max-new-tokens", "4", "--seed", "5", "--spans-only", "--ledger", str(path)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[3] / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    # killed right after its second record's line is written, before that record's charge is committed
    code = ("import os, signal, sys\nimport dpinfer.jobs.corpus as c\nappend = c.CorpusOutput.append\n"
            "count = [0]\ndef killing_append(self, record):\n    append(self, record)\n    count[0] += 1\n"
            "    if count[0] == 2:\n        os.kill(os.getpid(), signal.SIGKILL)\n"
            "c.CorpusOutput.append = killing_append\nfrom dpinfer.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-500:]
    ledger = Ledger(path)
    killed = sorted(c.state for u in ledger.units() for c in ledger.history(u.unit))
    assert killed == ["committed", "pending", "pending", "pending"]  # one committed; the other three counted
    assert main(args) == 0  # resumed: the two missing records
    units = ledger.units()
    assert len(units) == len(CORPUS)  # one unit per document (a keyed hash of its text)
    charges = [c for u in units for c in ledger.history(u.unit)]
    assert len(charges) == len(CORPUS) and {c.state for c in charges} == {"committed"}  # each record once
    released = {r["id"]: r for r in map(json.loads, (tmp_path / "out.jsonl").read_text().splitlines())}
    assert len(released) == len(CORPUS)
    for text, _ in CORPUS:
        assert ledger.status(ledger.unit_for_text(text)).releases == 1
    assert main(args) == 0  # a rerun of the finished job charges nothing
    assert len([c for u in ledger.units() for c in ledger.history(u.unit)]) == len(CORPUS)


def test_protect_prompt_prompts_charge_the_source_once_per_prompt(tiny_model_dir, tmp_path: Path, capsys) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": 1, "prompt": "What is a kettle for?"}\n{"id": 2, "prompt": "Where is Izmir?"}\n')
    path = str(tmp_path / "b.db")
    Ledger.init(path, epsilon=5000.0)
    job = ["protect-prompt", "--prompts", str(prompts), "--out", str(tmp_path / "o.jsonl"), "--method", "dp-prompt",
           "--max-new-tokens", "4", "--seed", "0", "--model", str(tiny_model_dir), "--ledger", path]
    assert main([*job, "--temperature", "1.0", "--unit", "alice"]) == 2
    assert "needs --unit (the prompt source) and --epsilon" in capsys.readouterr().err
    assert main([*job, "--epsilon", "500", "--unit", "alice"]) == 0
    released = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    charges = Ledger(path).history("alice")
    assert [c.state for c in charges] == ["committed", "committed"] and len(released) == 2
    assert Ledger(path).status("alice").scope == "prompt-source"
    assert main([*job, "--epsilon", "500", "--unit", "alice"]) == 0  # nothing left to do: nothing charged
    assert len(Ledger(path).history("alice")) == 2


def test_a_failed_model_load_cancels_the_reserved_charge(tmp_path: Path, capsys) -> None:
    doc, spans = tmp_path / "doc.txt", tmp_path / "spans.json"
    doc.write_text(DOC)
    spans.write_text(json.dumps([s.to_dict() for s in SPANS]))
    path = str(tmp_path / "b.db")
    Ledger.init(path, epsilon=100)
    rc = main(["sanitize", str(doc), "--spans", str(spans), "--spans-only", "--ledger", path, "--unit", "case-9",
               "--model", str(tmp_path / "no-model-here")])
    assert rc != 0 and capsys.readouterr().err.startswith("dpinfer: error: ")
    charges = Ledger(path).history("case-9")
    assert [c.state for c in charges] == ["cancelled"]  # reserved before the model loaded, cancelled when it failed
