"""``dpinfer bench serving``: the four serving figures of issue 14, each beside its baselines and target, in ONE run.

On one model (for the targets: ``--device cuda --dtype bf16 --shape qwen2.5-7b``, a random-weight model of that shape
built on the GPU, nothing downloaded), one ~``--prompt-tokens`` document prompt and ``--new-tokens`` tokens per
release (EOS masked, so every run makes exactly that many), it measures

1. **plain single stream** (target ≥ 165 tok/s): greedy generation of the document's rewriting prompt through the
   engine (``Engine.generate``: a job without a public width, in a cache of its own) and as one job with a public
   width through ``Engine.run_jobs`` (the slot runner's pooled batch), beside Hugging Face ``generate`` eager and
   with a static cache + ``torch.compile`` on the same prompt;
2. **DP-Fusion m = 4 on one document** (target ≥ 100 tok/s; 4 privacy groups, K = 5 rows): the run of
   ``dpinfer bench sanitize --perf`` through ``sanitize`` (the engine) and as one job through ``run_jobs``,
   each beside ``original`` (plain generation of the same length, same sampler) on the same path;
3. **DP-Fusion m = 4 over a corpus** (target ≥ 2,000 released tok/s): ``--corpus-docs`` documents through
   ``sanitize_many`` (one ``run_jobs`` call: the slot engine), the corpus path of ``dpinfer bench sanitize --corpus``,
   compared with the one-document m = 4 rate through ``sanitize``;
4. **InvisibleInk B = 8** (target ≥ 0.8× plain generation of the same length): the run of ``dpinfer bench synth
   --perf`` on 8 references, through ``Engine.generate`` and as one job through ``run_jobs``, each against plain
   generation on the same path.

Tokens/s are generated (released) tokens per second of wall-clock time, prefill included, median of ``--repeats``
interleaved rounds (default 3 on CUDA, 1 elsewhere); every ratio is computed from the medians of this run. The slot
engine compiles its decode step on CUDA (``compile="auto"``; eager on CPU): the first call of each slot-engine row,
which compiles, is timed apart, as is Hugging Face's first static+compile call, and both are printed below the table.

The document is the shipped ECHR example (``examples/echr_case_001-66929.txt``, gold spans from its ``.spans.json``)
cut at a paragraph boundary so that its rewriting prompt has at most ``--prompt-tokens`` tokens; its entity types are
split into 4 groups as in ``dpinfer bench sanitize --perf``. The corpus is ``--corpus-docs`` copies of that document,
each its own record, job, seed and release (the slot engine shares nothing across jobs, so a copy costs what another
document of the same length and groups costs). InvisibleInk's 8 references are windows of the same document starting
at successive paragraphs, each cut so that its prompt has about ``--prompt-tokens`` tokens.

The targets are for an H100, the 7B shape and bf16; on anything else the table still shows them, with the run marked
as not the target hardware.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpinfer.bench import speed
from dpinfer.bench.harness import Progress, Timings, md_table, quiet, rounds, write_json, write_text
from dpinfer.bench.speed import DEFAULT_DOC, add_speed_arguments, check_speed_arguments
from dpinfer.configs import Config, add_options, option

DESCRIPTION = __doc__


@dataclass(frozen=True)
class Target:
    """One target of issue 14: ``value ≥ threshold`` in ``unit``."""

    measure: str
    threshold: float
    unit: str

    def text(self) -> str:
        return f"≥ {self.threshold:,g} {self.unit}"

    def met(self, value: float) -> bool:
        return value >= self.threshold


TARGETS: dict[str, Target] = {
    "plain": Target("plain, single stream", 165.0, "tok/s"),
    "fusion": Target("DP-Fusion m = 4, one document", 100.0, "tok/s"),
    "corpus": Target("DP-Fusion m = 4, corpus", 2000.0, "released tok/s"),
    "invisibleink": Target("InvisibleInk B = 8", 0.8, "× plain"),
}
"""The targets of issue 14 ("serving speed and scale"), set for :data:`TARGET_HARDWARE`."""

MEASURES = {number: target.measure for number, target in enumerate(TARGETS.values(), start=1)}
"""The table's measure numbers (1-4, in the issue's order)."""

TARGET_HARDWARE = "an H100, 7B shape, bf16"
TARGET_SHAPE = "qwen2.5-7b"
GROUPS = 4
"""DP-Fusion's privacy groups m in measures 2 and 3 (K = m + 1 rows)."""
BATCH_SIZE = 8
"""InvisibleInk's B in measure 4 (B + 1 rows)."""


@dataclass(frozen=True)
class ServingBenchConfig(Config):
    """Settings of ``dpinfer bench serving`` (one field per option, its ``--help`` with it; the device-dependent
    defaults resolved by :func:`config_from_args`)."""

    model: str | None = option(None, type=str, help="model name or local folder (default: the embedded SmolLM2)")
    device: str | None = None
    dtype: str | None = None
    shape: str | None = None
    """A :data:`dpinfer.bench.speed.SHAPES` name: random weights of that shape instead of ``model``."""
    new_tokens: int = option(256, help="tokens generated per release (default 256)")
    prompt_tokens: int = option(600, help="the document is cut so its prompt has at most this many tokens (default "
                                          "600)")
    corpus_docs: int = option(8, help="documents of the corpus measure (default 64 on CUDA, 8 elsewhere)")
    repeats: int = option(1, help="interleaved rounds, the median is reported (default 3 on CUDA, 1 elsewhere)")
    hf_baselines: bool = option(True, flag="--hf", help="also time the Hugging Face generate baselines (--no-hf: "
                                                        "skip them)")
    out: str | None = option(None, type=str, help="also write serving.json and serving.md into this folder")
    seed: int = 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_options(p, ServingBenchConfig)
    add_speed_arguments(p, None)


def config_from_args(args: argparse.Namespace) -> ServingBenchConfig:
    """The config of parsed ``dpinfer bench serving`` options, checked here, before any model loads."""
    from dpinfer.models import _pick_device

    check_speed_arguments(args, speed_run=True, runs="bench serving")  # shape, model, device, dtype
    c = ServingBenchConfig.from_args(args)
    if _pick_device(c.device).type == "cuda":
        c = c.replace(**{k: v for k, v in (("corpus_docs", 64), ("repeats", 3)) if k not in args})
    return c


# ---------------------------------------------------------------------------------------------------- the inputs
def example_spans(name: str = DEFAULT_DOC) -> list[Any]:
    """The gold spans of a document shipped in ``examples/`` (its ``.spans.json``)."""
    from dpinfer.taggers.base import Span

    raw = json.loads(speed.example_document(name.removesuffix(".txt") + ".spans.json"))
    return [Span(int(s["start"]), int(s["end"]), str(s["label"])) for s in raw]


def _paragraphs(text: str) -> list[tuple[int, str]]:
    """(start offset, text) of each non-empty paragraph."""
    out, pos = [], 0
    for part in text.split("\n\n"):
        if part.strip():
            out.append((pos, part))
        pos += len(part) + 2
    return out


def _prompt_length(lm: Any, text: str) -> int:
    from dpinfer.pipelines.sanitize_contexts import DEFAULT_INSTRUCTION, build_prompt

    return len(lm.encode(build_prompt(lm, text, DEFAULT_INSTRUCTION)[0]))


def serving_document(lm: Any, prompt_tokens: int) -> Any:
    """The example document with its gold spans (a :class:`dpinfer.bench.sanitize.Doc`), cut after the last paragraph
    that keeps its rewriting prompt within ``prompt_tokens`` tokens (at least one paragraph); refused (one line) when
    the cut holds fewer than :data:`GROUPS` entity types, with the ``--prompt-tokens`` that would hold them."""
    from dpinfer.bench.sanitize import Doc
    from dpinfer.errors import ConfigurationError

    text, spans = speed.example_document(), example_spans()
    paragraphs = _paragraphs(text)
    ends = [start + len(part) for start, part in paragraphs]
    cut = ends[0]
    for end in ends[1:]:
        if _prompt_length(lm, text[:end]) > prompt_tokens:
            break
        cut = end
    kept = [s for s in spans if s.end <= cut]
    labels = {s.label for s in kept}
    if len(labels) < GROUPS:
        need = next((end for end in ends if len({s.label for s in spans if s.end <= end}) >= GROUPS), None)
        hint = (f"; it needs --prompt-tokens {_prompt_length(lm, text[:need])} or more with this tokenizer"
                if need is not None else "")
        raise ConfigurationError(f"the example document cut to --prompt-tokens {prompt_tokens} holds {len(labels)} "
                                 f"entity types; DP-Fusion m = {GROUPS} needs {GROUPS}{hint}")
    return Doc("echr_case_001-66929", text[:cut], kept)


def reference_texts(n: int) -> list[str]:
    """``n`` windows of the example document starting at successive paragraphs (wrapping around), whole; they are
    cut to a token budget where they are used."""

    paragraphs = [part for _, part in _paragraphs(speed.example_document())]
    return ["\n\n".join(paragraphs[(i + j) % len(paragraphs)] for j in range(len(paragraphs))) for i in range(n)]


# ---------------------------------------------------------------------------------------------------- the measures
def _measure_plain(lm: Any, ids: list[int], *, new_tokens: int, repeats: int, hf_baselines: bool,
                   progress: Progress) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Measure 1: per-round seconds of each path on the same prompt, and the first calls timed apart."""
    from dpinfer.engine import Engine, Job
    from dpinfer.mechanisms.sampler import Sampler

    slots = Engine(lm)

    def job() -> Job:  # the prompt is a public benchmark prompt: its length is the job's public width
        return Job([ids], Sampler(temperature=0.0, mode="joint"), max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, pad_width=len(ids))

    def through_slots() -> float:
        timer = Timings(sync=lambda: speed.sync(lm))
        ((_, out),) = timer.time("run_jobs", lambda: list(slots.run_jobs([job()])))
        assert len(out.sequences[0]) == new_tokens
        return timer.runs["run_jobs"][0]

    def one_job() -> float:
        return speed.time_engine(lm, ids, 1, new_tokens, True)[0]

    hf_lm = speed.hf_twin(lm) if hf_baselines else None  # the same model on transformers' forward: its generate

    def hf(compiled: bool) -> Callable[[], float]:
        return lambda: speed.time_hf(hf_lm, ids, new_tokens, compiled=compiled)

    paths: dict[str, Callable[[], float]] = {}
    first: dict[str, float] = {}
    if hf_baselines:
        paths["hf generate eager"] = hf(False)
        paths["hf generate static+compile"] = hf(True)
    paths["engine (Engine.generate)"] = one_job
    paths["slot engine (run_jobs, 1 job)"] = through_slots
    progress("1. plain: first calls")
    first["1. slot engine (run_jobs, 1 job)"] = through_slots()
    if hf_baselines:
        first["1. hf generate static+compile"] = hf(True)()
    timings = Timings()
    for _, order in rounds(repeats, list(paths.items())):
        for label, fn in order:
            progress(f"1. plain: {label}")
            timings.add(label, fn())
    return ({label: timings.runs[label] for label in paths},
            {"first_calls": first, "slot_decode_step": speed.slot_decode_step(lm, job())})


def _row(number: int, key: str | None, path: str, decode: str, runs: list[float], tokens: int, *,
         baseline: str | None = None, base_seconds: float | None = None, base_rate: float | None = None,
         ratio_target: bool = False) -> dict[str, Any]:
    """One table row from its per-round seconds: tokens/s from the median, the ratio to its baseline (same tokens:
    base seconds / seconds; else rate / base rate) and, for a row with a target, whether it meets it."""
    seconds = statistics.median(runs)
    rate = tokens / seconds
    ratio = None
    if base_seconds is not None:
        ratio = base_seconds / seconds
    elif base_rate is not None:
        ratio = rate / base_rate
    target = TARGETS.get(key) if key else None
    value = (ratio if ratio_target else rate) if target else None
    return {"number": number, "measure": MEASURES[number], "path": path, "decode_step": decode,
            "seconds": seconds, "runs": runs, "tokens": tokens, "tokens_per_s": rate, "baseline": baseline,
            "ratio": ratio, "target": target.text() if target else None, "target_key": key if target else None,
            "value": value, "met": target.met(value) if target and value is not None else None}


def run(config: ServingBenchConfig, progress: Progress = quiet) -> dict[str, Any]:
    """Load the model and measure the four figures (module docstring) in one run; write ``serving.json`` and
    ``serving.md`` into ``config.out`` when given; return the measurements with their Markdown (``"markdown"``)."""
    import torch

    from dpinfer import bench
    from dpinfer.bench import corpus as bench_corpus
    from dpinfer.bench import sanitize as bench_sanitize
    from dpinfer.bench import synth as bench_synth
    from dpinfer.configs.synth import TEMPLATES
    from dpinfer.defaults import SANITIZE
    from dpinfer.engine import Engine
    from dpinfer.pipelines.sanitize import plan_sanitize
    from dpinfer.pipelines.sanitize_contexts import DEFAULT_INSTRUCTION, prepare_contexts
    from dpinfer.pipelines.sanitize_many import Record, sanitize_many
    from dpinfer.references import Reference
    from dpinfer.taggers.resolve import resolve_groups

    c = config
    load_before = bench.machine_load()
    progress("loading the model")
    lm = speed.speed_model(c.model, device=c.device, dtype=c.dtype, shape=c.shape)
    doc = serving_document(lm, c.prompt_tokens)
    ids = prepare_contexts(lm, doc.text, doc.spans, resolve_groups(doc.spans, None), DEFAULT_INSTRUCTION).original
    n = c.new_tokens
    progress("warm-up")
    speed.time_engine(lm, ids[:64], 1, 4, True)  # thread pools, allocator, CUDA context: not in the first timed run

    # 1. plain, single stream
    plain, plain_info = _measure_plain(lm, ids, new_tokens=n, repeats=c.repeats, hf_baselines=c.hf_baselines,
                                       progress=progress)
    first_calls: dict[str, float] = dict(plain_info["first_calls"])

    # 2. DP-Fusion m = 4, one document (dpinfer bench sanitize --perf's run, m = 4 only, plus the slot engine)
    one = bench_sanitize.run_perf(lm, doc, max_new_tokens=n, seed=c.seed, repeats=c.repeats,
                                  progress=lambda s: progress(f"2. one document: {s}"),
                                  hf_baselines=False, ms=(GROUPS,), slot_engine=True)
    first_calls.update({f"2. {k}": v for k, v in one["settings"]["slot_first_call_seconds"].items()})
    info = {r["config"]: r for r in one["rows"]}
    fusion = f"dp-fusion m={GROUPS}"
    labels = sorted({s.label for s in doc.spans})
    groups = {f"G{i + 1}": labels[i::GROUPS] for i in range(GROUPS)}  # as run_perf groups them

    # 3. DP-Fusion m = 4 over a corpus (copies of the document, one record each) through sanitize_many
    docs = [bench_sanitize.Doc(f"{doc.doc_id}#{i}", doc.text, doc.spans) for i in range(c.corpus_docs)]
    engine = Engine(lm)
    corpus_opts = {"epsilon": SANITIZE.epsilon, "max_new_tokens": n, "min_new_tokens": n, "groups": groups}
    progress("3. corpus: first call")
    t0 = time.perf_counter()
    refused = [o.error for o in sanitize_many([Record(d.doc_id, d.text, d.spans) for d in docs], lm=lm,
                                              seed=c.seed, engine=engine, **corpus_opts) if o.error]
    first_calls["3. corpus (sanitize_many)"] = time.perf_counter() - t0
    corpus = bench_corpus.run_corpus(lm, docs, epsilon=SANITIZE.epsilon, max_new_tokens=n, seed=c.seed,
                                     repeats=c.repeats, groups=groups, engine=engine, one_by_one=False,
                                     progress=lambda s: progress(f"3. corpus: {s}"))
    corpus_job = plan_sanitize(doc.text, lm=lm, spans=doc.spans, groups=groups, max_new_tokens=n, seed=c.seed).job

    # 4. InvisibleInk B = 8 vs plain (dpinfer bench synth --perf's run, plus the slot engine)
    template = TEMPLATES["tab"]
    overhead = len(lm.encode(lm.instruction_prompt(template.render_private("", {})) + template.render_prefix({})))
    synth_defaults = bench_synth.SynthBenchConfig()
    ink = bench_synth.run_perf(lm, [Reference(t) for t in reference_texts(BATCH_SIZE)], batch_size=BATCH_SIZE,
                               max_new_tokens=n, template="tab", seed=c.seed, repeats=c.repeats,
                               epsilon=synth_defaults.epsilon, top_k=synth_defaults.top_k,
                               max_reference_tokens=max(1, c.prompt_tokens - overhead), slot_engine=True,
                               progress=lambda s: progress(f"4. InvisibleInk: {s}"))
    first_calls.update({f"4. {k} (run_jobs)": v for k, v in ink["slot_engine"]["first_call_seconds"].items()})
    load_after = bench.machine_load()

    # the table
    rows: list[dict[str, Any]] = []
    hf_eager = statistics.median(plain["hf generate eager"]) if c.hf_baselines else None
    for label, runs in plain.items():
        if label.startswith("hf "):
            rows.append(_row(1, None, label, "compiled" if "compile" in label else "eager", runs, n,
                             baseline="HF eager" if label != "hf generate eager" else None,
                             base_seconds=hf_eager if label != "hf generate eager" else None))
        else:
            decode = plain_info["slot_decode_step"] if label.startswith("slot") else "eager"
            rows.append(_row(1, "plain", label, decode, runs, n, baseline="HF eager" if hf_eager else None,
                             base_seconds=hf_eager))
    for config_name, path in (("original", "sanitize (engine)"),
                              (fusion, "sanitize (engine)"),
                              ("original (run_jobs)", "slot engine (run_jobs, 1 job)"),
                              (f"{fusion} (run_jobs)", "slot engine (run_jobs, 1 job)")):
        is_fusion = config_name.startswith("dp-fusion")
        base = "original (run_jobs)" if "run_jobs" in config_name else "original"
        label = f"{'DP-Fusion m = ' + str(info[config_name]['groups']) if is_fusion else 'original (plain)'}, {path}"
        rows.append(_row(2, "fusion" if is_fusion else None, label, info[config_name]["decode_step"],
                         one["runs"][config_name], n, baseline="original, same path" if is_fusion else None,
                         base_seconds=statistics.median(one["runs"][base]) if is_fusion else None))
    fusion_one = statistics.median(one["runs"][fusion])
    corpus_runs = corpus["runs"]["corpus (sanitize_many)"]
    m_span = bench_corpus._span(corpus["settings"]["groups_per_doc"])
    documents = f"{c.corpus_docs} document{'s' if c.corpus_docs != 1 else ''}"
    rows.append(_row(3, "corpus", f"{documents} (m = {m_span}), sanitize_many (slot engine, one run_jobs call)",
                     speed.slot_decode_step(lm, corpus_job), corpus_runs,
                     corpus["settings"]["released_tokens"], baseline="one document through sanitize",
                     base_rate=n / fusion_one))
    for path, seconds, steps in (
            ("engine (Engine.generate)", ink["seconds"], {"public": "eager", "invisibleink": "eager"}),
            ("slot engine (run_jobs, 1 job)", ink["slot_engine"]["seconds"], ink["slot_engine"]["decode_step"])):
        rows.append(_row(4, None, f"plain (public prompt), {path}", steps["public"], seconds["public"], n))
        rows.append(_row(4, "invisibleink", f"InvisibleInk B = {BATCH_SIZE}, {path}", steps["invisibleink"],
                         seconds["invisibleink"], n, baseline="plain, same path",
                         base_seconds=statistics.median(seconds["public"]), ratio_target=True))
    device = torch.device(lm.device)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    dtype = str(lm.dtype).removeprefix("torch.")
    on_target = (device.type == "cuda" and "H100" in device_name and c.shape == TARGET_SHAPE
                 and lm.dtype == torch.bfloat16)
    import transformers

    weights = sum(p.numel() * p.element_size() for p in lm.model.parameters())
    res: dict[str, Any] = {
        "settings": {
            "model": lm.name, "shape": c.shape, "device": str(lm.device), "device_name": device_name, "dtype": dtype,
            "torch": torch.__version__, "transformers": transformers.__version__, "weight_bytes": weights,
            "prompt_tokens": len(ids), "new_tokens": n, "repeats": c.repeats, "corpus_docs": c.corpus_docs,
            "corpus_groups_per_doc": corpus["settings"]["groups_per_doc"], "doc_id": doc.doc_id,
            "invisibleink_prompt_tokens": ink["prompt_tokens"], "machine_load_before": load_before,
            "machine_load_after": load_after, "on_target_hardware": on_target, "target_hardware": TARGET_HARDWARE,
            "corpus_errors": refused + corpus["errors"],
        },
        "rows": rows,
        "first_calls": first_calls,
        "summary": _summary(rows),
    }
    if "plain" in res["summary"]:  # what the best plain rate reads: the weights once per token (KV cache aside)
        res["summary"]["plain"]["weight_bytes_per_s"] = weights * res["summary"]["plain"]["best_value"]
    res["markdown"] = format_markdown(res)
    if c.out:
        res["files"] = [str(write_json(Path(c.out) / "serving.json", res)),
                        str(write_text(Path(c.out) / "serving.md", res["markdown"] + "\n"))]
    return res


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per target: its best row (highest value) and whether any row meets it."""
    out: dict[str, Any] = {}
    for key, target in TARGETS.items():
        mine = [r for r in rows if r["target_key"] == key]
        if not mine:
            continue
        best = max(mine, key=lambda r: r["value"])
        out[key] = {"measure": target.measure, "target": target.text(), "met": any(r["met"] for r in mine),
                    "best_path": best["path"], "best_value": best["value"]}
    return out


def _bytes(n: float) -> str:
    """
    >>> _bytes(15.2e9), _bytes(493e3)
    ('15.20 GB', '0.49 MB')
    """
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.2f} MB"


def _value(v: float) -> str:
    return f"{v:,.2f}" if math.isfinite(v) else str(v)


def format_markdown(res: dict[str, Any]) -> str:
    s = res["settings"]
    load = s["machine_load_before"]
    model = f"random-weight {s['shape']}" if s["shape"] else s["model"]
    lines = [
        f"Serving speed, one run: {model} on {s['device_name']} ({s['device']}), {s['dtype']}, torch "
        f"{s['torch']}, transformers {s['transformers']}; weights {_bytes(s['weight_bytes'])}; "
        f"{s['prompt_tokens']}-token document prompt, {s['new_tokens']} new tokens per release (EOS masked), "
        f"prefill included, median of {s['repeats']} interleaved round(s); machine load: torch threads "
        f"{load['torch_threads']}, CPUs {load['cpu_count']}, 1-minute load average {load['load_average_1min']} "
        f"before and {s['machine_load_after']['load_average_1min']} after",
        "",
    ]
    if not s["on_target_hardware"]:
        lines += [f"**Not the target hardware** (targets are for {TARGET_HARDWARE}): the verdicts compare this "
                  "machine's figures with them.", ""]
    lines += md_table(["#", "measure", "path", "decode step", "seconds", "tokens/s", "vs baseline", "target",
                       "result"], "llllrrlll",
                      ([r["number"], r["measure"], r["path"], r["decode_step"], f"{r['seconds']:.2f}",
                        _value(r["tokens_per_s"]), _versus(r), r["target"] or "",
                        "" if r["met"] is None else ("**met**" if r["met"] else "not met")] for r in res["rows"]))
    calls = "; ".join(f"{k} {v:.2f} s" for k, v in res["first_calls"].items())
    lines += ["", f"First calls, timed apart (on CUDA they compile): {calls}."]
    verdicts = []
    for key, v in res["summary"].items():
        value = f"{v['best_value']:.2f}×" if key == "invisibleink" else f"{_value(v['best_value'])} tok/s"
        read = (f"; it reads the weights at {_bytes(v['weight_bytes_per_s'])}/s" if "weight_bytes_per_s" in v
                else "")
        verdicts.append(f"{v['measure']} {v['target']}: {'met' if v['met'] else 'not met'} (best: {value}, "
                        f"{v['best_path']}{read})")
    lines += ["", "Targets: " + "; ".join(verdicts) + "."]
    if s["corpus_errors"]:
        lines.append(f"Corpus records refused: {len(s['corpus_errors'])}: " + "; ".join(s["corpus_errors"]))
    return "\n".join(lines)


def _versus(row: dict[str, Any]) -> str:
    if row["ratio"] is not None:
        return f"{row['ratio']:.2f}× {row['baseline']}"
    return "baseline" if row["target_key"] is None else ""


def render(res: dict[str, Any]) -> str:
    """What ``dpinfer bench serving`` prints: the Markdown table (and where its files went, with ``--out``)."""
    files = res.get("files")
    return res["markdown"] + (f"\n\nwritten: {', '.join(files)}" if files else "")
