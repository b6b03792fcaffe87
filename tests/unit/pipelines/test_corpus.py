"""Corpus jobs: sanitize_many against sanitize, per-record errors, the JSONL corpus and output (refusals, torn lines),
and ``dpinfer sanitize --corpus`` on the tiny model: resume after deleted records, a torn last line and a SIGKILL,
no private text in the output or on stderr, one-line refusals before the model loads; ``--backend ray`` on a local
Ray (one CPU, no dashboard; skipped without Ray) against the local backend, record for record."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpinfer.cli import main
from dpinfer.errors import InvalidInputError
from dpinfer.jobs.corpus import CorpusOutput, read_corpus
from dpinfer.pipelines.sanitize import sanitize
from dpinfer.pipelines.sanitize_many import Record, record_seed, sanitize_many
from dpinfer.taggers import Span

SECRET = "Qvxzqj"  # a private value: it must never reach the output file, stderr or an error message
def _spans(text: str, *marks: tuple[str, str]) -> list[Span]:
    return [Span(text.index(value), text.index(value) + len(value), label) for value, label in marks]


_TEXTS = [
    f"Mr {SECRET}, a lawyer practising in London, lodged an application on 20 May 1998.",
    "The applicant was born in 1970 and lives in Izmir.",
    "On 20 May 1998 the Court decided to communicate the application to the Government.",
    "Mr Smith represented the applicants before the Court.",
]
DOCS = [
    (_TEXTS[0], _spans(_TEXTS[0], (SECRET, "PERSON"), ("London", "LOC"), ("20 May 1998", "DATETIME"))),
    (_TEXTS[1], _spans(_TEXTS[1], ("1970", "DATETIME"), ("Izmir", "LOC"))),
    (_TEXTS[2], _spans(_TEXTS[2], ("20 May 1998", "DATETIME"))),
    (_TEXTS[3], _spans(_TEXTS[3], ("Smith", "PERSON"))),
]
T_MAX = 5


def _records() -> list[Record]:
    return [Record(f"doc-{i}", text, spans) for i, (text, spans) in enumerate(DOCS)]


def _write_corpus(path: Path, extra: list[dict] | None = None, n: int | None = None) -> Path:
    rows = [{"id": r.id, "text": r.text, "entity_mentions": [
        {"start_offset": s.start, "end_offset": s.end, "entity_type": s.label, "span_text": r.text[s.start:s.end]}
        for s in r.spans]} for r in _records()[:n]]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows + (extra or [])), encoding="utf-8")
    return path


def _corpus_args(corpus: Path, out: Path, model: Path, *extra: str) -> list[str]:
    return ["sanitize", "--corpus", str(corpus), "--out", str(out), "--model", str(model), "--spans-field",
            "entity_mentions", "--max-new-tokens", str(T_MAX), "--seed", "11", *extra]


# ------------------------------------------------------------------------------------------------ sanitize_many
def test_sanitize_many_equals_sanitize_per_record(tiny_lm):
    recs = _records()[:2]
    outcomes = list(sanitize_many(recs, lm=tiny_lm, seed=5, max_new_tokens=T_MAX, epsilon=30))
    assert sorted(o.id for o in outcomes) == [r.id for r in recs]
    for o in outcomes:
        rec = next(r for r in recs if r.id == o.id)
        one = sanitize(rec.text, lm=tiny_lm, spans=rec.spans, seed=record_seed(5, rec.id), max_new_tokens=T_MAX,
                       epsilon=30)
        assert o.ok and o.result is not None
        assert o.result.token_ids == one.token_ids
        assert o.result.text == one.text
        assert o.result.to_dict() == one.to_dict()  # the release: text, guarantee (ε per group, δ, T_max), settings


def test_sanitize_many_reports_per_record_errors_and_goes_on(tiny_lm):
    long_text = "The applicant lodged an application. " * 200  # beyond the tiny model's 512-token window
    recs = [
        Record("empty", "   "),
        Record("beyond", f"Mr {SECRET} left.", [{"start": 0, "end": 400, "label": "PERSON"}]),
        Record("string-spans", f"Mr {SECRET} left.", "spans.json"),
        Record("untagged", f"Mr {SECRET} left."),  # no spans and no tagger
        Record("too-long", long_text, [Span(4, 13, "PERSON")]),
        Record("bad-label", f"Mr {SECRET} left.", [{"start": 3, "end": 9, "label": SECRET}]),
        _records()[1],
    ]
    outcomes = {o.id: o for o in sanitize_many(recs, lm=tiny_lm, tagger=None, seed=1, max_new_tokens=T_MAX)}
    assert set(outcomes) == {r.id for r in recs}
    assert outcomes["doc-1"].ok and outcomes["doc-1"].result.generated_tokens >= 1
    expected = {"empty": "is empty", "beyond": "ends beyond", "string-spans": "not a string",
                "untagged": "give spans= or a tagger", "too-long": "context window", "bad-label": "unknown label"}
    for rid, needle in expected.items():
        err = outcomes[rid].error
        assert err is not None and needle in err, (rid, err)
        assert "\n" not in err and SECRET not in err


def test_sanitize_many_refuses_unknown_options_and_non_records(tiny_lm):
    from dpinfer.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="unknown setting"):
        list(sanitize_many(_records(), lm=tiny_lm, spans=[]))
    with pytest.raises(ConfigurationError):
        list(sanitize_many(_records(), lm=tiny_lm, epsilon=-1))
    with pytest.raises(InvalidInputError, match="must be a dpinfer"):
        list(sanitize_many(["text"], lm=tiny_lm, max_new_tokens=2))  # type: ignore[list-item]


# ------------------------------------------------------------------------------------------------ files
@pytest.mark.parametrize(("lines", "needle"), [
    (['{"id": "a", "text": "x"}', '{"id": "a", "text": "y"}'], "line 2 repeats the id of line 1"),
    (['{"text": "x"}'], "no id field 'id'"),
    (['{"id": "a"}'], "no text field 'text'"),
    (['{"id": "a", "text": 3}'], "must be a string"),
    (['{"id": true, "text": "x"}'], "non-empty string or an integer"),
    (['{"id": "a", "text": "x"}', f"not json {SECRET}"], "line 2 is not JSON"),
    (['["a", "x"]'], "not an object"),
    (["", "  "], "holds no record"),
])
def test_read_corpus_refusals_name_the_line_not_the_content(tmp_path, lines, needle):
    p = tmp_path / "in.jsonl"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(InvalidInputError) as info:
        read_corpus(p)
    assert needle in str(info.value) and SECRET not in str(info.value)


def test_read_corpus_fields_and_ids(tmp_path):
    p = tmp_path / "in.jsonl"
    p.write_text('{"doc": 5, "body": "x", "m": [{"start": 0, "end": 1, "label": "PERSON"}]}\n\n'
                 '{"doc": "5", "body": "y"}\n')
    recs = read_corpus(p, id_field="doc", text_field="body", spans_field="m")
    assert [(r.id, r.text, r.spans is None) for r in recs] == [(5, "x", False), ("5", "y", True)]


def test_corpus_output_cuts_a_torn_line_and_refuses_foreign_files(tmp_path):
    out = CorpusOutput(tmp_path / "out.jsonl")
    assert out.open() == 0
    out.append({"id": "a", "text": "t1"})
    out.append({"id": 2, "error": "e"})
    good = (tmp_path / "out.jsonl").read_bytes()
    with open(tmp_path / "out.jsonl", "ab") as fh:
        fh.write(b'{"id":"c","te')
    again = CorpusOutput(tmp_path / "out.jsonl")
    assert again.open() == 2 and again.truncated_bytes == len(b'{"id":"c","te')
    assert (tmp_path / "out.jsonl").read_bytes() == good
    foreign = tmp_path / "notes.txt"
    foreign.write_text("my notes\n")
    with pytest.raises(InvalidInputError, match="not a dpinfer corpus record"):
        CorpusOutput(foreign).open()
    assert foreign.read_text() == "my notes\n"


# ------------------------------------------------------------------------------------------------ CLI
def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def _ids(path: Path) -> list[str]:
    return [json.loads(line)["id"] for line in _lines(path)]


def test_cli_corpus_resume_after_deleted_records_and_a_torn_line(tiny_model_dir, tmp_path, capsys):
    corpus = _write_corpus(tmp_path / "in.jsonl", extra=[{"id": "bad", "text": f"Mr {SECRET}.", "entity_mentions": [
        {"start_offset": 0, "end_offset": 99, "entity_type": "PERSON"}]}])
    out = tmp_path / "out.jsonl"
    assert main(_corpus_args(corpus, out, tiny_model_dir)) == 0
    err = capsys.readouterr().err
    assert "done 4 / skipped 0 / errors 1" in err and "budget per document" in err
    first = _lines(out)
    assert sorted(_ids(out)) == sorted([f"doc-{i}" for i in range(4)] + ["bad"])
    records = {json.loads(line)["id"]: json.loads(line) for line in first}
    assert "ends beyond" in records["bad"]["error"]
    rec = records["doc-0"]
    assert {"text", "guarantee", "method", "finish_reason", "generated_tokens", "max_new_tokens"} <= set(rec)
    assert rec["guarantee"]["max_new_tokens"] == T_MAX and rec["guarantee"]["delta"] == 1e-5
    assert {g["name"] for g in rec["guarantee"]["groups"]} == {"PERSON", "LOC", "DATETIME"}
    assert not ({"spans", "seed", "debug", "input", "document"} & set(rec))
    blob = out.read_text(encoding="utf-8") + err
    assert SECRET not in blob and DOCS[1][0] not in blob and '"seed"' not in out.read_text()

    # a rerun with everything done writes nothing and loads no model
    assert main(_corpus_args(corpus, out, tmp_path / "no-such-model")) == 0
    err = capsys.readouterr().err
    assert "done 0 / skipped 5 / errors 0" in err and "holds 5 records (4 released, 1 error)" in err
    assert _lines(out) == first

    # delete the error record and two releases: a deleted release would be released twice, so the rerun is refused
    # before the model loads, unless --allow-rerelease; the error record alone is retried
    bad = next(n for n, line in enumerate(first) if b'"error"' in line)
    gone = [n for n in range(len(first)) if n != bad][:2]
    kept = [line for n, line in enumerate(first) if n not in gone and n != bad]
    out.write_bytes(b"".join(kept))
    assert main(_corpus_args(corpus, out, tmp_path / "no-such-model")) == 2
    err = capsys.readouterr().err
    assert "was released to --out" in err and "--allow-rerelease" in err and err.count("\n") == 1
    assert main(_corpus_args(corpus, out, tiny_model_dir, "--allow-rerelease")) == 0
    err = capsys.readouterr().err
    assert "skipped 2" in err and "warning: --allow-rerelease" in err and SECRET not in err
    now = _lines(out)
    assert now[:2] == kept and sorted(now) == sorted(first)  # same seed: the rewritten records are the same lines

    # a torn last line (a kill in the middle of a write) that got past its guarantee is kept as released: an error
    # record saying so, never generated again; one torn before its guarantee is complete is cut off and written
    full = out.read_bytes()
    last = json.loads(now[-1])
    cut = now[-1].index(b'"text":"') + 10  # inside the released text
    out.write_bytes(full[: len(full) - len(now[-1]) + cut])
    assert main(_corpus_args(corpus, out, tmp_path / "no-such-model")) == 0
    assert "kept as released" in capsys.readouterr().err
    torn = json.loads(_lines(out)[-1])
    assert torn["id"] == last["id"] and torn["torn"] is True and torn["guarantee"] == last["guarantee"]
    settled = _lines(out)
    assert settled[:-1] == now[:-1]
    bad_line = next(line for line in settled if json.loads(line)["id"] == "bad")
    out.write_bytes(b"".join(line for line in settled if line != bad_line) + bad_line[:12])  # '{"id":"bad",'
    assert main(_corpus_args(corpus, out, tiny_model_dir)) == 0
    assert "torn last line of 12 bytes" in capsys.readouterr().err
    assert sorted(_lines(out)) == sorted(settled)


@pytest.mark.slow  # a subprocess that loads the model and is killed, then a resumed run
def test_cli_corpus_resume_after_sigkill(tiny_model_dir, tmp_path):
    """A run killed with SIGKILL mid-way, then rerun: only the missing ids are written, the finished lines stay
    byte-identical, and the result equals an uninterrupted run's."""
    corpus = _write_corpus(tmp_path / "in.jsonl")
    ref = tmp_path / "ref.jsonl"
    assert main(_corpus_args(corpus, ref, tiny_model_dir)) == 0
    out = tmp_path / "out.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[3] / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    # the same arguments; the process SIGKILLs itself right after its second record is written: a deterministic
    # "kill mid-run" (the batching engine finishes the documents together, so a timed kill may land after the last)
    code = ("import os, signal, sys\nimport dpinfer.jobs.corpus as c\nappend = c.CorpusOutput.append\n"
            "count = [0]\ndef killing_append(self, record):\n    append(self, record)\n    count[0] += 1\n"
            "    if count[0] == 2:\n        os.kill(os.getpid(), signal.SIGKILL)\n"
            "c.CorpusOutput.append = killing_append\nfrom dpinfer.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.Popen([sys.executable, "-c", code, *_corpus_args(corpus, out, tiny_model_dir)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    proc.wait(timeout=240)
    assert proc.returncode == -signal.SIGKILL
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    assert SECRET not in stderr
    before = _lines(out)
    complete = [line for line in before if line.endswith(b"\n")]
    assert len(complete) == 2 < len(DOCS)
    assert main(_corpus_args(corpus, out, tiny_model_dir)) == 0
    after = _lines(out)
    assert after[: len(complete)] == complete
    assert sorted(after) == sorted(_lines(ref))
    assert len(_ids(out)) == len(set(_ids(out))) == len(DOCS)


def test_cli_corpus_refusals_come_before_the_model_loads(model_gate, tiny_model_dir, tmp_path, capsys, monkeypatch):
    model_gate.forbid()
    corpus = _write_corpus(tmp_path / "in.jsonl")
    doc = tmp_path / "doc.txt"
    doc.write_text("Mr Smith.")
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"id": 1, "text": "a"}\n{"id": 1, "text": "b"}\n')
    nojson = tmp_path / "no.jsonl"
    nojson.write_text(f"{SECRET} is not JSON\n")
    out = str(tmp_path / "out.jsonl")
    cases = [
        (["--corpus", str(corpus), "--out", str(corpus)], "is the --corpus file"),
        (["--corpus", str(corpus), "--out", str(tmp_path / "missing" / "o.jsonl")], "does not exist"),
        (["--corpus", str(corpus)], "--corpus needs --out"),
        ([str(doc), "--corpus", str(corpus), "--out", out], "not both"),
        (["--corpus", str(corpus), "--out", out, "--spans", str(doc)], "does not apply to --corpus"),
        (["--corpus", str(dup), "--out", out], "repeats the id of line 1"),
        (["--corpus", str(corpus), "--out", out, "--id-field", "doc"], "no id field 'doc'"),
        (["--corpus", str(corpus), "--out", out, "--text-field", "body"], "no text field 'body'"),
        (["--corpus", str(nojson), "--out", out], "line 1 is not JSON"),
        (["--corpus", str(tmp_path / "none.jsonl"), "--out", out], "no such file"),
        (["--corpus", str(corpus), "--out", out, "--epsilon", "-1"], "must be > 0"),
        (["--corpus", str(corpus), "--out", out, "--ray-address", "auto"], "needs --backend ray"),
        ([str(doc), "--backend", "ray"], "applies to --corpus only"),
        ([], "give the document FILE"),
    ]
    for extra, needle in cases:
        t0 = time.perf_counter()
        rc = main(["sanitize", *extra, "--model", str(tiny_model_dir)])
        err = capsys.readouterr().err
        assert rc == 2 and needle in err and err.count("\n") == 1, (extra, err)
        assert SECRET not in err
        assert time.perf_counter() - t0 < 5
    assert not Path(out).exists()


def test_cli_corpus_refuses_a_second_run_on_the_same_output(model_gate, tiny_model_dir, tmp_path, capsys, monkeypatch):
    """Two runs on one OUT would both release the records still missing: the second is refused while the first holds
    the lock, before its model loads, and runs once the lock is released."""
    from dpinfer.jobs.corpus import OutputLock

    corpus = _write_corpus(tmp_path / "in.jsonl", n=1)
    out = tmp_path / "out.jsonl"
    first = OutputLock(out, "dpinfer sanitize --corpus")
    first.acquire()
    model_gate.forbid()
    try:
        rc = main(_corpus_args(corpus, out, tiny_model_dir))
        err = capsys.readouterr().err
        assert rc == 2 and "being written by another dpinfer sanitize --corpus run" in err and err.count("\n") == 1
    finally:
        assert first.release()  # created by the held lock, never written: removed
    model_gate.allow()
    assert main(_corpus_args(corpus, out, tiny_model_dir)) == 0
    assert len(out.read_text(encoding="utf-8").splitlines()) == 1


def test_cli_corpus_backend_ray_without_ray_says_how_to_install(tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    corpus = _write_corpus(tmp_path / "in.jsonl", n=1)
    rc = main(["sanitize", "--corpus", str(corpus), "--out", str(tmp_path / "o.jsonl"), "--backend", "ray"])
    err = capsys.readouterr().err
    assert rc == 2 and '.venv/bin/pip install -e ".[ray]"' in err and err.count("\n") == 1


# ------------------------------------------------------------------------------------------------ Ray backend
@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray", reason="Ray is an optional extra (pip install 'dpinfer[ray]')")
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.mark.slow  # a local Ray cluster and the model in its actors
def test_ray_backend_matches_the_local_backend_record_for_record(local_ray, tiny_model_dir, tmp_path, capsys):
    corpus = _write_corpus(tmp_path / "in.jsonl", n=3, extra=[{"id": "bad", "text": "   "}])
    local, on_ray = tmp_path / "local.jsonl", tmp_path / "ray.jsonl"
    assert main(_corpus_args(corpus, local, tiny_model_dir)) == 0
    capsys.readouterr()
    assert main(_corpus_args(corpus, on_ray, tiny_model_dir, "--backend", "ray", "--ray-batch-size", "2")) == 0
    err = capsys.readouterr().err
    assert "done 3 / skipped 0 / errors 1" in err and SECRET not in err
    by_id = {json.loads(line)["id"]: line for line in _lines(local)}
    assert {json.loads(line)["id"]: line for line in _lines(on_ray)} == by_id  # byte-identical lines per id
    assert SECRET not in on_ray.read_text(encoding="utf-8") and DOCS[1][0] not in on_ray.read_text(encoding="utf-8")


def test_ray_backend_completes_partial_spans_like_the_local_backend(local_ray, tiny_model_dir, tmp_path, capsys):
    """#32 finding 15: records whose given spans leave entity types uncovered are completed by the tagger on Ray as
    locally (the actor gets the tagger): the same lines, guarantees and span sources, record for record."""
    texts = [_TEXTS[0], "Mr Smith wrote on 20 May 1998 from Izmir."]
    rows = [{"id": f"p-{i}", "text": t, "entity_mentions": [
        {"start_offset": t.index(v), "end_offset": t.index(v) + len(v), "entity_type": "PERSON", "span_text": v}]}
        for i, (t, v) in enumerate(zip(texts, [SECRET, "Smith"], strict=True))]  # PERSON only: the dates uncovered
    corpus = tmp_path / "partial.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    local, on_ray = tmp_path / "local.jsonl", tmp_path / "ray.jsonl"
    assert main(_corpus_args(corpus, local, tiny_model_dir, "--tagger", "regex")) == 0
    capsys.readouterr()
    assert main(_corpus_args(corpus, on_ray, tiny_model_dir, "--tagger", "regex", "--backend", "ray")) == 0
    capsys.readouterr()
    by_id = {json.loads(line)["id"]: json.loads(line) for line in _lines(local)}
    assert {json.loads(line)["id"]: json.loads(line) for line in _lines(on_ray)} == by_id
    for rec in by_id.values():
        assert rec["settings"]["span_source"]["from"] == "given+tagger"  # the tagger completed the given spans
        assert "DATETIME" in {g["name"] for g in rec["guarantee"]["groups"]}
