"""``sanitize --corpus --backend ray --ledger …``: each record's unit charged exactly once, also when Ray retries a
task whose actor died after pricing a record (the reservation is keyed by the record's resume key). On a local Ray
(one CPU, no dashboard; skipped without Ray) and a PostgreSQL ledger (tests/conftest.py: skipped without a server,
failed with CI set)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from test_corpus import DOCS, _corpus_args, _spans

from dpinfer.accounting.ledger import Ledger
from dpinfer.cli import main

N = 16


@pytest.fixture(scope="module")
def local_ray() -> Any:
    ray = pytest.importorskip("ray", reason="Ray is an optional extra (pip install 'dpinfer[ray]')")
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


def _corpus(path: Path) -> list[str]:
    rows, texts = [], []
    for i in range(N):
        base, spans = DOCS[i % len(DOCS)]
        text = f"{base} Case {i}."  # a different document each: its own unit
        texts.append(text)
        marks = _spans(text, *((base[s.start:s.end], s.label) for s in spans))
        rows.append({"id": f"doc-{i}", "text": text, "entity_mentions": [
            {"start_offset": s.start, "end_offset": s.end, "entity_type": s.label,
             "span_text": text[s.start:s.end]} for s in marks]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return texts


@pytest.mark.slow
def test_a_ray_corpus_job_with_a_retried_task_charges_each_record_once(local_ray, tiny_model_dir, postgres_url,
                                                                      tmp_path, monkeypatch, capsys):
    import dpinfer.pipelines.corpus_ray as corpus_ray

    marker = tmp_path / "failed-once"

    class FailsOnce(corpus_ray.SanitizeActor):  # defined here: Ray ships it by value to the actor
        crash_marker = str(marker)

        def _planned(self, record_id: str | int, guarantee: Any) -> None:
            super()._planned(record_id, guarantee)  # priced on the ledger, then the actor dies: Ray restarts it
            if not os.path.exists(self.crash_marker):  # and retries the task, which prices the record again
                open(self.crash_marker, "w").close()
                os._exit(1)

    monkeypatch.setattr(corpus_ray, "SanitizeActor", FailsOnce)
    texts = _corpus(tmp_path / "in.jsonl")
    ledger = Ledger.init(postgres_url, epsilon=100.0)
    out = tmp_path / "out.jsonl"
    args = _corpus_args(tmp_path / "in.jsonl", out, tiny_model_dir, "--backend", "ray", "--ray-batch-size", "4",
                        "--ledger", postgres_url)
    assert main(args) == 0, capsys.readouterr().err
    assert marker.exists()  # a task failed once and was retried
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == N and not [r for r in lines if "error" in r]  # 16 releases in OUT
    history = {text: ledger.history(ledger.unit_for_text(text)) for text in texts}
    assert all([c.state for c in charges] == ["committed"] for charges in history.values())  # 16 charges, once each
    for line, text in zip(sorted(lines, key=lambda r: int(r["id"][4:])), texts, strict=True):
        (charge,) = history[text]
        assert charge.mechanism == "dp-fusion" and charge.phase == "releasing"
        assert charge.epsilon == pytest.approx(line["guarantee"]["epsilon"], rel=1e-6)  # priced at its guarantee
    assert ledger.settle_dead() == []
    # a rerun of the finished job charges nothing
    assert main(args) == 0
    assert sum(len(ledger.history(ledger.unit_for_text(t))) for t in texts) == N
