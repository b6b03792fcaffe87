"""One resumable-job loop (dpinfer.jobs.run_resumable) for every corpus job, through the CLI on the tiny
model: the same SIGKILL / resume / torn-line / deleted-line cases for ``sanitize --corpus``, ``rag ask
--questions``, ``protect-prompt --prompts`` and ``synth --out``; what a resumed job knows about OUT (ids from another
input, a text released under another id, the summary counting every record of OUT); ``rag ask --questions``
composing every answer in OUT; the charge hook (reserve → commit / cancel, never twice for a finished record)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from dpinfer.accounting.calibration import Budget, Spec
from dpinfer.cli import main
from dpinfer.jobs import TORN_ERROR, parse_prefix, settle_torn

RAG_DIR = Path(__file__).parents[1] / "rag"
SRC = Path(__file__).parents[3] / "src"
SECRET = "Qvxzqj"
TEXTS = [f"Mr {SECRET} lives in London.", "The applicant was born in 1970.", "Mr Smith met Ms Jones in Paris.",
         "Ms Brown moved to Izmir in 1998."]


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@dataclass
class Job:
    """One corpus job run through the CLI: ``argv(input, out, model)``, the input rows, the key field of OUT."""

    name: str
    argv: Callable[[Path, Path, Path], list[str]]
    write_input: Callable[[Path, list[int]], Path]
    key: str = "id"
    header: int = 0  # lines before the first record (synth: its header)


def _sanitize_input(path: Path, which: list[int]) -> Path:
    rows = []
    for i in which:
        text = TEXTS[i]
        name = text.split()[1]
        rows.append({"id": f"d{i}", "text": text, "spans": [{"start": text.index(name), "end": text.index(name)
                                                             + len(name), "label": "PERSON"}]})
    return _jsonl(path, rows)


def _questions(path: Path, which: list[int]) -> Path:
    qs = ["What helps a migraine?", "My knee hurts on stairs.", "I cough at night.", "Always thirsty, why?"]
    return _jsonl(path, [{"id": f"q{i}", "question": qs[i]} for i in which])


def _prompts(path: Path, which: list[int]) -> Path:
    return _jsonl(path, [{"id": f"p{i}", "prompt": TEXTS[i]} for i in which])


def _reviews(path: Path, which: list[int]) -> Path:
    reviews = ["The pasta was fresh.", "Slow service, cold fries.", "Lovely pizza, quiet room.", "Best tacos.",
               "Great soup.", "Rude waiter.", "Nice wine list.", "Too loud."]
    p = path.with_suffix(".csv")
    p.write_text("text,cat\n" + "".join(f'"{t}",R\n' for t in reviews), encoding="utf-8")
    return p


JOBS = {
    "sanitize": Job("sanitize", lambda i, o, m: ["sanitize", "--corpus", str(i), "--out", str(o), "--model", str(m),
                                                 "--max-new-tokens", "4", "--seed", "3"], _sanitize_input),
    "rag": Job("rag", lambda i, o, m: ["rag", "ask", str(o.parent / "store"), "--questions", str(i), "--out", str(o),
                                       "--model", str(m), "--max-new-tokens", "4", "--epsilon", "8", "--seed", "3"],
               _questions),
    "protect": Job("protect", lambda i, o, m: ["protect-prompt", "--prompts", str(i), "--out", str(o), "--model",
                                               str(m), "--method", "dp-prompt", "--temperature", "1.0",
                                               "--max-new-tokens", "4", "--seed", "3"], _prompts),
    "synth": Job("synth", lambda i, o, m: ["synth", str(i), "--text-field", "text", "--label-fields", "cat",
                                           "--epsilon", "8", "--batch-size", "2", "--max-new-tokens", "4", "--out",
                                           str(o), "--model", str(m), "--seed", "3"], _reviews, key="batch",
                 header=1),
}

KILLER = """
import importlib.util, os, signal, sys
import dpinfer.jobs.corpus as corpus, dpinfer.io as jobs, dpinfer.jobs.synth as synth_job
real, count = jobs.write_line, [0]
def killing(fd, line):
    real(fd, line)
    if not line.startswith(b'{{"dpinfer"'):
        count[0] += 1
        if count[0] == 2:
            os.kill(os.getpid(), signal.SIGKILL)
corpus.write_line = synth_job.write_line = killing
spec = importlib.util.spec_from_file_location("rag_conftest", {rag!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
import dpinfer.eval.embeddings as emb
emb.load_embedder = lambda *a, **k: module.HashEmbedder()
from dpinfer.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture
def hash_embedder(monkeypatch: pytest.MonkeyPatch):
    import importlib.util

    import dpinfer.eval.embeddings

    spec = importlib.util.spec_from_file_location("rag_conftest", RAG_DIR / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    HashEmbedder = module.HashEmbedder

    monkeypatch.setattr(dpinfer.eval.embeddings, "load_embedder", lambda *a, **k: HashEmbedder())
    return HashEmbedder


def _store(tmp_path: Path, tiny_lm, embedder_cls) -> None:
    from dpinfer.pipelines.rag import PrivateRAG

    docs = ["Patient: I have a migraine. Doctor: Rest in a dark room and take ibuprofen.",
            "Patient: My knee hurts. Doctor: It may be arthritis; see a physiotherapist.",
            "Patient: I cough at night. Doctor: This could be asthma; use an inhaler."]
    PrivateRAG(tmp_path / "store", lm=tiny_lm, embedder=embedder_cls(), top_k=2, top_n=1, max_doc_tokens=16).add(docs)


@pytest.mark.slow  # a subprocess that loads the model and is killed, then a resumed run
@pytest.mark.parametrize("name", list(JOBS))
def test_every_corpus_job_survives_a_kill_a_torn_line_and_a_deleted_line(name, tiny_model_dir, tiny_lm, tmp_path,
                                                                         model_gate, hash_embedder, capsys):
    job = JOBS[name]
    if name == "rag":
        _store(tmp_path, tiny_lm, hash_embedder)
    inp = job.write_input(tmp_path / "in.jsonl", [0, 1, 2, 3])
    ref, out = tmp_path / "ref.jsonl", tmp_path / "out.jsonl"
    if name == "protect":  # the first run measures DP-Prompt's public clip bounds and caches them ("clip_source")
        assert main(job.argv(job.write_input(tmp_path / "warm.jsonl", [0]), tmp_path / "warm-out.jsonl",
                             tiny_model_dir)) == 0
    assert main(job.argv(inp, ref, tiny_model_dir)) == 0
    capsys.readouterr()
    reference = _lines(ref)
    assert len(reference) == job.header + 4

    # SIGKILL right after the second record is written, then the same command: only the missing records are
    # generated, the finished lines stay byte-identical, and OUT equals the uninterrupted run's (seeded)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    killer = KILLER.format(rag=str(RAG_DIR / "conftest.py"))
    proc = subprocess.run([sys.executable, "-c", killer, *job.argv(inp, out, tiny_model_dir)], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300)
    assert proc.returncode == -signal.SIGKILL and SECRET.encode() not in proc.stderr
    killed = _lines(out)
    assert len(killed) == job.header + 2
    assert main(job.argv(inp, out, tiny_model_dir)) == 0
    err = capsys.readouterr().err
    assert SECRET not in err
    if job.key == "id":
        assert "skipped 2" in err and "holds 4 records" in err
    resumed = _lines(out)
    assert resumed[: len(killed)] == killed and sorted(resumed) == sorted(reference)

    # a torn last line that got past its guarantee (its batch index, for synth) holds part of a release: it is kept
    # as released (an error record saying so) and never generated again; no model loads
    last = resumed[-1]
    rec = json.loads(last)
    out.write_bytes(b"".join(resumed[:-1]) + last[:-10])  # the guarantee (batch index) comes first: it is complete
    with model_gate:
        assert main(job.argv(inp, out, tiny_model_dir)) == 0
    now = _lines(out)
    assert now[:-1] == resumed[:-1]
    torn = json.loads(now[-1])
    assert torn[job.key] == rec[job.key] and torn["error"] == TORN_ERROR and torn["torn"] is True
    if "guarantee" in rec:
        assert torn["guarantee"] == rec["guarantee"]
    capsys.readouterr()

    # a deleted release would be released a second time: refused before the model loads, unless --allow-rerelease
    # (synth: a finished OUT has no partition file left, so a deleted text cannot be resumed at all)
    gone = now[job.header]
    out.write_bytes(b"".join(line for line in now if line != gone))
    with model_gate:
        assert main(job.argv(inp, out, tiny_model_dir)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and SECRET not in err
    if name == "synth":
        assert "partition file" in err
        return
    assert "--allow-rerelease" in err
    assert main([*job.argv(inp, out, tiny_model_dir), "--allow-rerelease"]) == 0
    assert "--allow-rerelease" in capsys.readouterr().err
    assert sorted(_lines(out)) == sorted(now)  # seeded: the same line again


@pytest.mark.parametrize("name", ["sanitize", "protect"])
def test_a_resume_refuses_ids_from_another_input_and_a_text_under_a_new_id(name, tiny_model_dir, tmp_path, capsys,
                                                                          model_gate, monkeypatch):
    job = JOBS[name]
    out = tmp_path / "out.jsonl"
    assert main(job.argv(job.write_input(tmp_path / "a.jsonl", [0, 1]), out, tiny_model_dir)) == 0
    capsys.readouterr()
    side = Path(f"{out}.digests")
    assert side.stat().st_mode & 0o777 == 0o600
    blob = side.read_text(encoding="utf-8")
    import hashlib

    assert SECRET not in blob and hashlib.sha256(TEXTS[0].encode()).hexdigest() not in blob  # keyed, not a plain hash
    before = _lines(out)

    # the same texts under new ids (and OUT's ids not in the input): refused in one line, before the model loads
    moved = tmp_path / "b.jsonl"
    rows = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    _jsonl(moved, [{**r, "id": f"new-{r['id']}"} for r in rows] + [json.loads(line) for line in
                                                                    _lines(job.write_input(tmp_path / "c.jsonl",
                                                                                           [2]))])
    with model_gate:
        assert main(job.argv(moved, out, tiny_model_dir)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--allow-rerelease" in err and SECRET not in err and "new-" not in err
    assert _lines(out) == before

    # only OUT's ids missing from the input (a new record besides): refused too
    other = job.write_input(tmp_path / "d.jsonl", [2])
    with model_gate:
        assert main(job.argv(other, out, tiny_model_dir)) == 2
    assert "whose id is not in" in capsys.readouterr().err

    # with the flag the run goes on, warns, and the summary counts every record of OUT (not only this input's)
    assert main([*job.argv(other, out, tiny_model_dir), "--allow-rerelease"]) == 0
    err = capsys.readouterr().err
    assert "warning: --allow-rerelease" in err and "this run: done 1 / skipped 0" in err
    assert "holds 3 records (3 released, 0 errors)" in err and "3 releases in the output" in err


def test_rag_questions_summary_composes_every_answer_in_out(tiny_model_dir, tiny_lm, tmp_path, hash_embedder,
                                                            capsys):
    """A second questions file on the same OUT: the summary composes the answers of both files (the accountant's
    zCDP composition of every answer in OUT), not only the current file's."""
    from dpinfer.accounting import Zcdp
    from dpinfer.checks import format_up
    from dpinfer.mechanisms.pad import Pad

    job = JOBS["rag"]
    _store(tmp_path, tiny_lm, hash_embedder)
    out = tmp_path / "out.jsonl"
    assert main(job.argv(job.write_input(tmp_path / "a.jsonl", [0, 1]), out, tiny_model_dir)) == 0
    capsys.readouterr()
    assert main(job.argv(job.write_input(tmp_path / "b.jsonl", [2, 3]), out, tiny_model_dir)) == 0
    err = capsys.readouterr().err
    rho = Pad.calibrated(Budget(8.0, 1e-5), Spec(4)).rho(4)
    assert "4 answers in the output, composed" in err
    assert f"ρ = {format_up(4 * rho)} zCDP, ε ≤ {format_up(Zcdp(4 * rho).to_epsilon(1e-5))}" in err


class Ledger:
    """A charge hook that records its calls."""

    def __init__(self, refuse_after: int | None = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self.refuse_after = refuse_after

    def open(self, key: str) -> str:
        from dpinfer.errors import InfeasibleBudgetError

        if self.refuse_after is not None and sum(c == "reserve" for c, _ in self.calls) >= self.refuse_after:
            raise InfeasibleBudgetError("the budget is spent")
        self.calls.append(("reserve", key))
        return key

    def close(self, token: str, *, released: bool) -> None:
        self.calls.append(("commit" if released else "cancel", token))


def test_the_charge_hook_commits_releases_cancels_errors_and_never_charges_a_finished_record_twice(tmp_path):
    from dpinfer.errors import InfeasibleBudgetError
    from dpinfer.jobs.corpus import run_corpus_job
    from dpinfer.pipelines.sanitize_many import Record

    records = [Record(f"r{i}", f"text {i}") for i in range(4)]

    def generate(todo):
        for r in todo:
            yield {"id": r.id, "error": "bad"} if r.id == "r1" else {"id": r.id, "guarantee": {}, "text": "x"}

    out = tmp_path / "out.jsonl"
    ledger = Ledger(refuse_after=3)
    with pytest.raises(InfeasibleBudgetError):
        run_corpus_job(records, out, generate, job="test", source="in", charge=ledger)
    assert ledger.calls == [("reserve", '"r0"'), ("commit", '"r0"'), ("reserve", '"r1"'), ("cancel", '"r1"'),
                            ("reserve", '"r2"'), ("commit", '"r2"')]
    again = Ledger()
    run = run_corpus_job(records, out, generate, job="test", source="in", charge=again)
    assert again.calls == [("reserve", '"r3"'), ("commit", '"r3"')]  # r0, r1 (an error record), r2 are done
    assert (run.done, run.skipped, run.out_records, run.out_errors) == (1, 3, 4, 1)
    # a torn record is charged once, by the run that finds it (its writer was stopped before its commit)
    data = out.read_bytes()
    out.write_bytes(data[: data.rindex(b'"text"') + 9])
    third = Ledger()
    run = run_corpus_job(records, out, generate, job="test", source="in", charge=third)
    assert third.calls == [("reserve", '"r3"'), ("commit", '"r3"')] and run.torn == 1 and run.done == 0


def test_parse_prefix_and_settle_torn():
    assert parse_prefix(b'{"id":"a","guarantee":{"e":1},"te') == {"id": "a", "guarantee": {"e": 1}}
    assert parse_prefix(b'{"id":"a","guarantee":{"e":1') == {"id": "a"}
    assert parse_prefix(b"not json") == {}
    assert settle_torn(b'{"id":"a","guarantee":{"e":1', "id", "guarantee") is None
    assert settle_torn(b'{"id":7,"guarantee":{"e":1},"text":"x', "id", "guarantee") == {
        "id": 7, "error": TORN_ERROR, "torn": True, "guarantee": {"e": 1}}


def test_an_unwritable_digest_file_is_refused_before_the_model_loads(tiny_model_dir, tmp_path, capsys,
                                                                     model_gate, monkeypatch):
    model_gate.forbid()
    job = JOBS["sanitize"]
    out = tmp_path / "out.jsonl"
    Path(f"{out}.digests").mkdir()
    assert main(job.argv(job.write_input(tmp_path / "in.jsonl", [0]), out, tiny_model_dir)) == 2
    err = capsys.readouterr().err
    assert "--out's digest file" in err and "is a folder" in err and err.count("\n") == 1 and not out.exists()
