"""``dpinfer bench engine``: engine throughput against Hugging Face ``model.generate``, side by side in one run.

For a real ~500-token document prompt (the shipped ECHR example) and ``N`` new tokens (EOS masked so every run makes
exactly ``N``), it times

* ``hf``: ``lm.model.generate(do_sample=False, min_new_tokens=N, max_new_tokens=N)`` (prefill included);
* ``engine K=…``: the engine stepping K copies of the same prompt in joint mode (greedy on row 0), prefill included,
  with the shared prefix prefilled once (``shared``) and, for K > 1, without prefix sharing (``unshared``: every row
  prefilled, as for K different contexts).

Throughput is generated tokens per second of wall-clock time, prefill included; ratios are to ``hf`` in the same run.
Runs are interleaved over ``--repeats`` rounds and the median is reported (this machine is noisy).

``--jobs N`` (the slot runner, :mod:`dpinfer.engine.runner`): N jobs, each K copies of a different
~``--prompt-tokens`` window of the document (joint greedy, exactly ``--new-tokens`` each), timed one by one
(:meth:`Engine.generate`) and through ``Engine.run_jobs`` (one forward per step for every job) in the same run, with
the ratio; ``--compile`` adds the compiled decode step (its first call, which compiles, is timed apart) and Hugging
Face ``generate`` with a static cache and ``torch.compile``; Hugging Face eager ``generate`` on one prompt is always
the baseline row. Tokens/s count released tokens (one per job per step).

``--device cuda --dtype bf16 --shape qwen2.5-7b`` runs a random-weight model of a named shape (:data:`SHAPES`; built
from its config on the device, nothing downloaded) with the embedded model's tokenizer for the prompts.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dpinfer.bench.engine_decisions import MECHANISMS, format_mechanism_markdown, run_mechanism_bench
from dpinfer.bench.harness import Progress, Timings, md_table, quiet, rounds
from dpinfer.bench.speed import (  # noqa: F401 (re-exported: the engine bench's names before the split)
    DEFAULT_DOC,
    INSTRUCTION,
    SHAPES,
    add_speed_arguments,
    check_speed_arguments,
    document_prompt_ids,
    example_document,
    hf_twin,
    job_prompts,
    shape_model,
    slot_decode_step,
    speed_model,
    sync,
    time_engine,
    time_hf,
)
from dpinfer.configs import Config, add_options, option
from dpinfer.errors import ConfigurationError

DESCRIPTION = __doc__

HF_FORWARD = "[hf forward]"
"""Label suffix of the engine rows run on transformers' forward (``backend="hf"``) beside dpinfer's own."""

def run_engine_bench(lm: Any, *, ks: tuple[int, ...] = (1, 2, 5, 9), new_tokens: int = 256, prompt_tokens: int = 500,
                     repeats: int = 1, unshared: bool = True, progress: Progress = quiet, hf_lm: Any = None,
                     ab: bool = True) -> dict[str, Any]:
    """Measure and return ``{"settings": ..., "rows": [...]}`` (see module docstring). ``hf_lm``: the same model on
    transformers' forward (``backend="hf"``), for ``hf generate`` and, when ``lm`` runs dpinfer's own model code,
    every engine config again on it (``[hf forward]``, with ``ab``), interleaved in the same rounds."""
    ids = document_prompt_ids(lm, prompt_tokens)
    hf_lm = hf_lm if hf_lm is not None else hf_twin(lm)
    configs: list[tuple[str, int, bool]] = [("hf generate", 1, True)]
    for k in ks:
        configs.append((f"engine K={k}", k, True))
        if unshared and k > 1:
            configs.append((f"engine K={k} unshared", k, False))
    if hf_lm is not lm and ab:
        configs += [(f"{label} {HF_FORWARD}", k, shared) for label, k, shared in configs[1:]]
    # warm-up (thread pools, allocator) so the first timed run is not penalised
    time_engine(lm, ids[:64], 1, 4, True)
    if hf_lm is not lm and ab:
        time_engine(hf_lm, ids[:64], 1, 4, True)
    timings, prefill, cpu = Timings(), Timings(), Timings()  # cpu: the process's CPU seconds (less load-sensitive)
    for _, order in rounds(repeats, configs):
        for label, k, shared in order:
            progress(label)
            c0 = time.process_time()
            if label == "hf generate":
                timings.add(label, time_hf(hf_lm, ids, new_tokens))
            else:
                dt, pf = time_engine(hf_lm if label.endswith(HF_FORWARD) else lm, ids, k, new_tokens, shared)
                timings.add(label, dt)
                prefill.add(label, pf)
            cpu.add(label, time.process_time() - c0)
    rows = []
    for label, k, shared in configs:
        t = timings.median(label)
        rows.append({
            "config": label, "contexts": k, "prefix_sharing": shared if label != "hf generate" else None,
            "seconds": round(t, 3), "seconds_range": timings.spread(label),
            "prefill_seconds": round(prefill.median(label), 3) if label in prefill.runs else None,
            "tokens_per_s": round(new_tokens / t, 2), "ratio_vs_hf": round(timings.ratio("hf generate", label), 3),
            "backend": "hf" if label == "hf generate" or label.endswith(HF_FORWARD) else lm.backend,
            "cpu_seconds": round(cpu.median(label), 3), "cpu_ratio_vs_hf": round(cpu.ratio("hf generate", label), 3),
        })
        twin = f"{label} {HF_FORWARD}"
        if twin in timings.runs:
            rows[-1]["ratio_vs_hf_forward"] = round(timings.ratio(twin, label), 3)
            rows[-1]["cpu_ratio_vs_hf_forward"] = round(cpu.ratio(twin, label), 3)
    import torch

    return {
        "settings": {"model": lm.name, "device": str(lm.device), "dtype": str(lm.dtype).replace("torch.", ""),
                     "backend": lm.backend, "prompt_tokens": len(ids), "new_tokens": new_tokens, "repeats": repeats,
                     "torch_threads": torch.get_num_threads()},
        "rows": rows,
    }


def run_jobs_bench(lm: Any, *, n_jobs: int, ks: tuple[int, ...] = (1,), new_tokens: int = 64,
                   prompt_tokens: int = 300, repeats: int = 1, compile: bool = False, max_rows: int | None = None,
                   progress: Progress = quiet, hf_lm: Any = None, ab: bool = True) -> dict[str, Any]:
    """``--jobs N``: N jobs one by one vs through ``run_jobs`` (see the module docstring); rows per K. ``hf_lm``: the
    same model on transformers' forward, for ``hf generate`` and (when ``lm`` runs dpinfer's own model code) each
    ``run_jobs`` eager row again on it (``[hf forward]``, with ``ab``)."""
    hf_lm = hf_lm if hf_lm is not None else hf_twin(lm)
    import torch

    from dpinfer.engine import Engine, Job
    from dpinfer.mechanisms.sampler import Sampler

    prompts = job_prompts(lm, n_jobs, prompt_tokens)
    total = n_jobs * new_tokens

    def jobs(k: int) -> list[Any]:
        return [Job([p] * k, Sampler(temperature=0.0, mode="joint"), max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, pad_width=len(p)) for p in prompts]

    engine = Engine(lm)
    time_engine(lm, prompts[0][:64], 1, 4, True)  # warm-up
    hf_engine = Engine(hf_lm) if hf_lm is not lm and ab else None
    if hf_engine is not None:
        time_engine(hf_lm, prompts[0][:64], 1, 4, True)
    timings = Timings(sync=lambda: sync(lm))
    extra: dict[str, dict[str, Any]] = {}

    def timed(label: str, fn: Callable[[], Any]) -> Any:
        progress(label)
        return timings.time(label, fn)

    def through_slots(k: int, compiled: bool) -> dict[int, Any]:
        return dict(engine.run_jobs(jobs(k), compile=compiled, max_rows=max_rows))

    step_ab = None
    if compile:  # the decode step alone, eager vs compiled, interleaved (S = the jobs' slot count)
        from dpinfer.engine import DEFAULT_MAX_ROWS, bucket_capacity

        progress("decode step eager vs compiled")
        default_rows = DEFAULT_MAX_ROWS.get(torch.device(lm.device).type, DEFAULT_MAX_ROWS["cpu"])
        step_ab = decode_step_ab(lm, slots=min(n_jobs * max(ks), max_rows or default_rows),
                                 capacity=bucket_capacity(max(map(len, prompts)) + new_tokens))
    if compile:  # first calls compile: timed apart, once per K (then cached per slot-count bucket)
        for k in ks:
            label = f"run_jobs K={k} compiled, first call (compiles)"
            timed(label, lambda k=k: through_slots(k, True))
            extra[label] = {"contexts": k, "first_call": True}
        timed("hf generate static+compile, first call (compiles)", lambda: time_hf(hf_lm, prompts[0], new_tokens,
                                                                                    compiled=True))
    for _ in range(repeats):
        timed("hf generate (1 prompt)", lambda: time_hf(hf_lm, prompts[0], new_tokens))
        if compile:
            timed("hf generate static+compile (1 prompt)", lambda: time_hf(hf_lm, prompts[0], new_tokens,
                                                                            compiled=True))
        for k in ks:
            ref = timed(f"one by one K={k}", lambda k=k: [
                engine.generate(j.contexts, j.mechanism, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                pad_width=j.pad_width) for j in jobs(k)])
            got = timed(f"run_jobs K={k} eager", lambda k=k: through_slots(k, False))
            same = sum(got[i].sequences[0] == ref[i].sequences[0] for i in range(n_jobs))
            extra[f"run_jobs K={k} eager"] = {"contexts": k, "same_tokens_as_one_by_one": f"{same}/{n_jobs}"}
            if hf_engine is not None:
                label = f"run_jobs K={k} eager {HF_FORWARD}"
                got = timed(label, lambda k=k: dict(hf_engine.run_jobs(jobs(k), compile=False, max_rows=max_rows)))
                same = sum(got[i].sequences[0] == ref[i].sequences[0] for i in range(n_jobs))
                extra[label] = {"contexts": k, "same_tokens_as_one_by_one": f"{same}/{n_jobs}"}
            if compile:
                got = timed(f"run_jobs K={k} compiled", lambda k=k: through_slots(k, True))
                same = sum(got[i].sequences[0] == ref[i].sequences[0] for i in range(n_jobs))
                extra[f"run_jobs K={k} compiled"] = {"contexts": k, "same_tokens_as_one_by_one": f"{same}/{n_jobs}"}
    rows = []
    for label in timings.runs:
        t = timings.median(label)
        hf = label.startswith("hf ")
        k = extra.get(label, {}).get("contexts", 1 if hf else int(label.split("K=")[1].split()[0]))
        tokens = new_tokens if hf else total
        base = None if hf or "first call" in label else timings.ratio(f"one by one K={k}", label)
        rows.append({"config": label, "contexts": k, "seconds": round(t, 3), "seconds_range": timings.spread(label),
                     "tokens_per_s": round(tokens / t, 2),
                     "ratio_vs_one_by_one": None if base is None else round(base, 3),
                     **{x: y for x, y in extra.get(label, {}).items() if x not in ("contexts", "first_call")}})
    from dpinfer.engine import DEFAULT_MAX_ROWS

    return {
        "settings": {"model": lm.name, "device": str(lm.device), "dtype": str(lm.dtype).replace("torch.", ""),
                     "backend": lm.backend, "jobs": n_jobs, "prompt_tokens": [len(p) for p in prompts],
                     "new_tokens": new_tokens,
                     "repeats": repeats, "torch_threads": torch.get_num_threads(),
                     "max_rows": max_rows or DEFAULT_MAX_ROWS.get(torch.device(lm.device).type)},
        "rows": rows,
        "decode_step": step_ab,
    }


def decode_step_ab(lm: Any, *, slots: int, capacity: int, reps: int = 20) -> dict[str, float]:
    """One slot-engine decode step (``slots`` rows, half the ``capacity`` filled), eager and compiled, timed
    alternately ``reps`` times each (so that load drift on a shared machine hits both alike): median milliseconds
    per step, and the seconds of the first compiled call (the compilation)."""
    import torch

    from dpinfer.engine import DecodeStep, SlotCache
    from dpinfer.engine.cache import own_model

    config = lm.model.config
    heads = config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    with torch.inference_mode():
        cache = SlotCache(config.num_hidden_layers, slots, capacity, lm.device, hf=not own_model(lm.model))
        gen = torch.Generator(device="cpu").manual_seed(0)
        fill = capacity // 2
        kv = [(torch.randn((heads, fill, head_dim), generator=gen).to(lm.device, lm.dtype),
               torch.randn((heads, fill, head_dim), generator=gen).to(lm.device, lm.dtype))
              for _ in range(config.num_hidden_layers)]
        for slot in range(slots):
            cache.write(slot, kv, fill)
        ids = torch.randint(0, lm.vocab_size, (slots, 1), generator=gen).to(lm.device)
        eager, compiled = DecodeStep(lm, cache, False), DecodeStep(lm, cache, True)
        timings = Timings(sync=lambda: sync(lm))
        timings.time("first compiled call", lambda: compiled(ids))
        eager(ids)
        for _, order in rounds(reps, [("eager", eager), ("compiled", compiled)]):
            for name, fn in order:
                timings.time(name, lambda fn=fn: fn(ids))
    return {"eager_ms": 1000 * timings.median("eager"), "compiled_ms": 1000 * timings.median("compiled"),
            "compile_seconds": timings.median("first compiled call")}


def format_jobs_markdown(res: dict[str, Any]) -> str:
    s = res["settings"]
    lengths = s["prompt_tokens"]
    lines = [
        f"Slot engine: {s['jobs']} jobs on {s['model']} ({s['device']}, {s['dtype']}, {s['torch_threads']} threads, "
        f"backend {s.get('backend', 'hf')}), "
        f"prompts of {min(lengths)}-{max(lengths)} tokens, {s['new_tokens']} new tokens per job, max_rows "
        f"{s['max_rows']}, median of {s['repeats']} run(s); tokens/s = released tokens (HF rows: one prompt)",
        "",
        *md_table(["config", "K", "seconds", "tokens/s", "ratio vs one by one", "same tokens"], "lrrrrr",
                  ([r["config"], r["contexts"], f"{r['seconds']:.2f}", f"{r['tokens_per_s']:.2f}",
                    "" if r["ratio_vs_one_by_one"] is None else f"{r['ratio_vs_one_by_one']:.2f}",
                    r.get("same_tokens_as_one_by_one", "")] for r in res["rows"])),
    ]
    ab = res.get("decode_step")
    if ab:
        lines += ["", f"Decode step alone (interleaved): eager {ab['eager_ms']:.1f} ms, compiled "
                      f"{ab['compiled_ms']:.1f} ms (×{ab['eager_ms'] / ab['compiled_ms']:.2f}); compilation "
                      f"{ab['compile_seconds']:.1f} s"]
    return "\n".join(lines)


def _times(ratio: float | None) -> str:
    return "" if ratio is None else f"{ratio:.2f}×"


def format_markdown(res: dict[str, Any]) -> str:
    if "mechanism" in res["settings"]:
        return format_mechanism_markdown(res)
    if "jobs" in res["settings"]:
        return format_jobs_markdown(res)
    s = res["settings"]
    lines = [
        f"Engine throughput: {s['model']} on {s['device']} ({s['dtype']}, {s['torch_threads']} threads, backend "
        f"{s.get('backend', 'hf')}; '{HF_FORWARD}': the same engine on transformers' forward), "
        f"{s['prompt_tokens']}-token document prompt, {s['new_tokens']} new tokens, median of {s['repeats']} run(s); "
        "CPU s: the process's CPU seconds; 'vs hf forward': how many times faster than the same config on "
        "transformers' forward",
        "",
        *md_table(["config", "K", "seconds", "prefill s", "tokens/s", "ratio vs HF", "CPU s", "vs hf forward",
                   "vs hf forward (CPU)"], "lrrrrrrrr",
                  ([r["config"], r["contexts"], f"{r['seconds']:.2f}",
                    "" if r["prefill_seconds"] is None else f"{r['prefill_seconds']:.2f}", f"{r['tokens_per_s']:.2f}",
                    f"{r['ratio_vs_hf']:.2f}", f"{r['cpu_seconds']:.2f}" if "cpu_seconds" in r else "",
                    _times(r.get("ratio_vs_hf_forward")), _times(r.get("cpu_ratio_vs_hf_forward"))]
                   for r in res["rows"])),
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class EngineBenchConfig(Config):
    """Settings of ``dpinfer bench engine`` (one field per option; its ``--help`` with it)."""

    model: str | None = option(None, type=str, help="model name or local folder (default: the embedded SmolLM2)")
    ks: tuple[int, ...] = (1, 2, 5, 9)
    """Numbers of contexts K stepped together (``--k``; with ``jobs``: 1)."""
    new_tokens: int = option(256, help="tokens generated per run (default 256; --jobs: 64)")
    prompt_tokens: int = option(500, help="approximate prompt length (default 500; --jobs: 300)")
    repeats: int = option(1, help="interleaved rounds; the median is reported (default 1)")
    unshared: bool = option(True, help="also time K > 1 without prefix sharing (--no-unshared: skip those runs)")
    jobs: int | None = option(None, type=int, help="slot engine: N jobs one by one vs through Engine.run_jobs (one "
                                                   "forward per step), same run")
    compile: bool = option(False, help="with --jobs: also the compiled decode step and HF generate with static "
                                       "cache + torch.compile")
    max_rows: int | None = option(None, type=int, help="with --jobs: slot count (default per device)")
    device: str | None = option(None, type=str, help="cpu, cuda or cuda:N (default: CUDA when available)")
    dtype: str | None = option(None, type=str, help="float32, bf16, fp16 (default: float32 on CPU, bf16 on GPU)")
    mechanism: str | None = option(None, type=str, choices=MECHANISMS,
                                   help="with --jobs: N jobs of this mechanism (K = 5: m = 4 groups, B = 4 "
                                        "references), each decode step timed by phase beside plain sampling of the "
                                        "same rows, per-job and batched decisions")
    shape: str | None = option(None, type=str, choices=sorted(SHAPES),
                               help="random-weight model of this shape (no download) instead of --model")
    debug_stats: bool = option(False, help="with --mechanism: the jobs fetch and record their data-dependent "
                                           "per-step statistics (left on the device otherwise)")
    backend_ab: bool = option(True, help="when the model runs on dpinfer's own model code, also time every engine "
                                         "config on transformers' forward in the same rounds (--no-backend-ab: "
                                         "skip those runs)")

    def __post_init__(self) -> None:
        if not self.ks or any(not isinstance(k, int) or k < 1 for k in self.ks):
            raise ConfigurationError("--k takes whole numbers of contexts >= 1, e.g. --k 1 2 5")
        for name in ("new_tokens", "prompt_tokens", "repeats", "jobs", "max_rows"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigurationError(f"--{name.replace('_', '-')} must be a whole number >= 1")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--k", type=int, nargs="+", default=argparse.SUPPRESS, dest="ks",
                   help="numbers of contexts (default 1 2 5 9; with --jobs: 1)")
    add_options(p, EngineBenchConfig)


def config_from_args(args: argparse.Namespace) -> EngineBenchConfig:
    """The config of parsed ``dpinfer bench engine`` options (checked here, before any model loads)."""
    c = EngineBenchConfig.from_args(args, **({"ks": tuple(args.ks)} if "ks" in args else {}))
    check_speed_arguments(args, speed_run=True, runs="bench engine")  # shape, model, device, dtype
    if c.jobs is None:
        for name, flag in (("compile", "--compile"), ("max_rows", "--max-rows"), ("mechanism", "--mechanism"),
                           ("debug_stats", "--debug-stats")):
            if getattr(c, name):
                raise ConfigurationError(f"{flag} applies to the slot engine: add --jobs N")
        return c
    if c.mechanism is not None:
        for name, flag in (("compile", "--compile"), ("ks", "--k")):
            if name in args and getattr(args, name, None):
                raise ConfigurationError(f"{flag} does not apply with --mechanism (K = m + 1 = 5, eager)")
        return c.replace(**{k: v for k, v in {"new_tokens": 16, "prompt_tokens": 300}.items() if k not in args})
    jobs_defaults = {"ks": (1,), "new_tokens": 64, "prompt_tokens": 300}  # what --jobs changes when not given
    return c.replace(**{k: v for k, v in jobs_defaults.items() if k not in args})


def run(config: EngineBenchConfig, progress: Progress = quiet) -> dict[str, Any]:
    """Load the model and measure (:func:`run_engine_bench`, or :func:`run_jobs_bench` with ``jobs``);
    ``progress(stage)`` names each run as it starts."""
    lm = speed_model(config.model, device=config.device, dtype=config.dtype, shape=config.shape)
    if config.jobs is not None and config.mechanism is not None:
        return run_mechanism_bench(lm, n_jobs=config.jobs, mechanism=config.mechanism, new_tokens=config.new_tokens,
                                   prompt_tokens=config.prompt_tokens, repeats=config.repeats,
                                   max_rows=config.max_rows, debug_stats=config.debug_stats, progress=progress)
    hf_lm = hf_twin(lm)  # the same model on transformers' forward: its generate, and the A/B
    if config.jobs is not None:
        return run_jobs_bench(lm, n_jobs=config.jobs, ks=config.ks, new_tokens=config.new_tokens,
                              prompt_tokens=config.prompt_tokens, repeats=config.repeats, compile=config.compile,
                              max_rows=config.max_rows, progress=progress,
                              hf_lm=hf_lm, ab=config.backend_ab)
    return run_engine_bench(lm, ks=config.ks, new_tokens=config.new_tokens, prompt_tokens=config.prompt_tokens,
                            repeats=config.repeats, unshared=config.unshared, progress=progress,
                            hf_lm=hf_lm, ab=config.backend_ab)


def render(res: dict[str, Any]) -> str:
    """What ``dpinfer bench engine`` prints (the Markdown table)."""
    return format_markdown(res)
