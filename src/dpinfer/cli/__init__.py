"""The ``dpinfer`` command line.

Every error is printed as one line (``dpinfer: error: ...``) with exit status 2; no traceback (set
``DPINFER_DEBUG=1`` to see one for an unexpected error, whose message is withheld because it may quote the input).
Parameters and paths are checked before any model loads. ``--json`` (before or after the sub-command) prints one
JSON object on standard output instead of text.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from dpinfer import __version__
from dpinfer.errors import DPInferError, InvalidInputError

EXIT_ERROR = 2


def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def _print_json(obj: Any) -> None:
    from dpinfer._json import plain

    def default(o: Any) -> Any:
        return plain(o.to_dict()) if hasattr(o, "to_dict") else str(o)

    sys.stdout.write(json.dumps(plain(obj), indent=2, ensure_ascii=False, default=default) + "\n")


def read_text_arg(source: str, what: str = "input") -> str:
    """Text of a FILE argument, or standard input for ``-``; refuses a missing file, a folder, an empty, binary,
    non-UTF-8 or oversized (> 4 MiB) input with a one-line message (sizes and offsets only, never the content)."""
    from dpinfer.validation import MAX_TEXT_BYTES, input_file

    limit_mib = MAX_TEXT_BYTES // (1024 * 1024)
    if source == "-":
        data = sys.stdin.buffer.read(MAX_TEXT_BYTES + 1)
        where = "standard input"
    else:
        p = input_file(source, what)
        if p.stat().st_size > MAX_TEXT_BYTES:
            raise InvalidInputError(f"{source} is larger than {limit_mib} MiB; split it into parts")
        data = p.read_bytes()
        where = source
    if len(data) > MAX_TEXT_BYTES:
        raise InvalidInputError(f"{where} is larger than {limit_mib} MiB; split it into parts")
    if b"\x00" in data:
        raise InvalidInputError(f"{where} looks binary (it contains NUL bytes); give a UTF-8 text file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"{where} is not valid UTF-8 text (bad byte at offset {exc.start})") from None
    if not text.strip():
        raise InvalidInputError(f"{where} is empty")
    return text


def _cli_k(value: int | None, option: str) -> int | None:
    """A CLI count where 0 means "off / None": refuses negatives, maps 0 to None."""
    if value is not None and value < 0:
        raise InvalidInputError(f"{option} must be ≥ 0 (0 = off), got {value}")
    return None if value == 0 else value


# ---------------------------------------------------------------------------------------------------------- commands
def cmd_generate(args: argparse.Namespace) -> int:
    from dpinfer.generation import generate, stream
    from dpinfer.models import load_model
    from dpinfer.validation import check_generate_params, check_text

    check_generate_params(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                          top_p=args.top_p, seed=args.seed, cli=True)
    prompt = read_text_arg(args.prompt, "prompt") if (args.file or args.prompt == "-") else args.prompt
    check_text(prompt, "the prompt")
    lm = load_model(args.model, device=args.device, quantize=args.quantize)
    kw: dict[str, Any] = {"lm": lm, "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
                          "top_k": args.top_k, "top_p": args.top_p, "seed": args.seed}
    if args.chat:
        kw["messages"] = [{"role": "user", "content": prompt}]
    else:
        kw["prompt"] = prompt
    if args.json:
        res = generate(**kw)
        _print_json({"text": res.text, "finish_reason": res.finish_reason, "prompt_tokens": res.prompt_tokens,
                     "generated_tokens": len(res.token_ids), "seconds": round(res.seconds, 3),
                     "guarantee": res.guarantee.to_dict()})
        return 0
    for piece in stream(**kw):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    _console(stderr=True).print("[dim]plain generation: no privacy guarantee[/dim]")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from dpinfer.models import installed_models
    from dpinfer.paths import cache_dir

    models = installed_models()
    if args.prepare:
        import time

        from dpinfer.models import load_model

        t0 = time.perf_counter()
        lm = load_model(args.model)
        prepared = {"name": lm.name, "source": str(lm.source), "seconds": round(time.perf_counter() - t0, 2)}
        models = installed_models()
    if args.json:
        out: dict[str, Any] = {"cache_dir": str(cache_dir()), "models": models}
        if args.prepare:
            out["prepared"] = prepared
        _print_json(out)
        return 0
    from rich.table import Table

    table = Table(title=f"dpinfer models (cache: {cache_dir()})")
    for col in ("name", "kind", "cached", "size MB", "path"):
        table.add_column(col)
    for m in models:
        table.add_row(m["name"], m["kind"], "yes" if m.get("cached") else "no", str(m.get("size_mb", "")),
                      str(m.get("path") or m.get("error", "")))
    _console().print(table)
    if args.prepare:
        _console().print(f"loaded {prepared['name']} in {prepared['seconds']} s")
    return 0


LABEL_STYLES = {"PERSON": "bold red", "CODE": "bold magenta", "LOC": "bold green", "ORG": "bold blue",
                "DEM": "bold yellow", "DATETIME": "bold cyan", "QUANTITY": "bold white", "MISC": "bold bright_black"}


def _parse_group_epsilon(items: Sequence[str] | None) -> dict[str, float] | None:
    if not items:
        return None
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise InvalidInputError(f"--group-epsilon expects NAME=EPSILON (e.g. PERSON=2), got {item!r}")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise InvalidInputError(f"--group-epsilon {name}: {value!r} is not a number") from None
    return out


def _parse_groups(items: Sequence[str] | None) -> dict[str, list[str]] | None:
    if not items:
        return None
    out: dict[str, list[str]] = {}
    for item in items:
        name, sep, labels = item.partition("=")
        if not sep or not name or not labels:
            raise InvalidInputError(f"--group expects NAME=LABEL[,LABEL...] (e.g. ID=PERSON,CODE), got {item!r}")
        out[name.strip()] = [lab.strip() for lab in labels.split(",") if lab.strip()]
    return out


def _write_failure(option: str, path: str, exc: OSError, where: str) -> int:
    print(f"dpinfer: error: could not write {option} {path} ({exc.strerror or type(exc).__name__}); {where}",
          file=sys.stderr)
    return EXIT_ERROR


def cmd_sanitize(args: argparse.Namespace) -> int:
    from dpinfer.validation import (
        atomic_write_text,
        check_output_path,
        check_sanitize_budget,
        check_sanitize_params,
    )

    # every parameter and path is checked here, before the document is tagged and before the model loads
    top_k = _cli_k(args.top_k, "--top-k")
    no_repeat = _cli_k(args.no_repeat_ngram, "--no-repeat-ngram")
    group_eps = _parse_group_epsilon(args.group_epsilon)
    groups = _parse_groups(args.group)
    check_sanitize_params(method=args.method, epsilon=args.epsilon, group_epsilon=group_eps, delta=args.delta,
                          alpha=args.alpha, temperature=args.temperature, top_k=top_k,
                          max_new_tokens=args.max_new_tokens, no_repeat_ngram=no_repeat, seed=args.seed,
                          accounting=args.accounting, adjacency=args.adjacency,
                          tagger=args.tagger, groups=groups, cli=True)
    if args.out:
        check_output_path(args.out, inputs=(args.file, args.spans))
    text = read_text_arg(args.file, "document")
    if args.spans:
        read_text_arg(args.spans, "spans")  # a missing, empty, binary or oversized file is refused here
    check_sanitize_budget(method=args.method, epsilon=args.epsilon, group_epsilon=group_eps, delta=args.delta,
                          alpha=args.alpha, cli=True)
    from dpinfer.models import load_model
    from dpinfer.pipelines.sanitize import resolve_spans, sanitize

    # the spans, checked against THIS document (or tagged), and the refusal of zero spans: before the model loads
    spans = resolve_spans(text, spans=args.spans, tagger=None if args.spans else args.tagger, method=args.method,
                          allow_untagged=args.allow_untagged)
    lm = load_model(args.model, device=args.device, quantize=args.quantize)
    extra: dict[str, Any] = {}
    if args.top_k is not None:
        extra["top_k"] = top_k
    if args.no_repeat_ngram is not None:
        extra["no_repeat_ngram"] = no_repeat
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    err = _console(stderr=True)
    with Progress(TextColumn("sanitizing"), BarColumn(), MofNCompleteColumn(), TextColumn("tokens"),
                  TimeElapsedColumn(), console=err, transient=True, disable=not err.is_terminal) as prog:
        task = prog.add_task("sanitize", total=None)

        def progress(done: int, total: int) -> None:
            prog.update(task, completed=done, total=total)

        res = sanitize(
            text, lm=lm, method=args.method, epsilon=args.epsilon, group_epsilon=group_eps, delta=args.delta,
            spans=spans, tagger=None, groups=groups,
            max_new_tokens=args.max_new_tokens, alpha=args.alpha, temperature=args.temperature, seed=args.seed,
            accounting=args.accounting, adjacency=args.adjacency, progress=progress,
            allow_untagged=args.allow_untagged, debug=args.debug_stats, **extra,
        )
    write_error: OSError | None = None
    if args.out:
        try:
            atomic_write_text(args.out, res.text + "\n")
        except OSError as exc:  # the release is still printed below: never lose a finished result
            write_error = exc
    if args.json:
        _print_json(res.to_dict())
    else:
        _print_sanitize(args, text, res, err)
    if write_error is not None:
        return _write_failure("--out", args.out, write_error, "the rewrite is on standard output")
    if args.out:
        err.print(f"[dim]rewrite written to {args.out}[/dim]", markup=True, highlight=False)
    return 0


def _print_sanitize(args: argparse.Namespace, text: str, res: Any, err: Any) -> None:
    """Standard output: the release, then the guarantee. Notes go to standard error. The private document is shown
    only with --show-input and only on a terminal (never into a pipe or a file)."""
    from rich.panel import Panel
    from rich.text import Text

    con = _console()
    counts: dict[str, int] = {}
    for s in res.spans:
        counts[s.label] = counts.get(s.label, 0) + 1
    source = "spans file" if args.spans else f"{args.tagger} tagger"
    if args.show_input:
        if con.is_terminal:
            shown = Text(text)
            for s in res.spans:
                shown.stylize(LABEL_STYLES.get(s.label, "bold"), s.start, s.end)
            legend = ", ".join(f"[{LABEL_STYLES.get(k, 'bold')}]{k}[/] {v}" for k, v in counts.items()) or "none"
            con.print(Panel(shown, title=f"input: {len(res.spans)} private spans ({source})", subtitle=legend))
        else:
            err.print("[dim]--show-input ignored: standard output is not a terminal (the private document is never "
                      "written to a pipe or a file)[/dim]")
    per_label = ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"
    err.print(f"[dim]{len(res.spans)} private spans ({source}: {per_label}); {res.method}, {res.generated_tokens} "
              f"tokens, {res.tokens_per_second:.1f} tokens/s[/dim]", highlight=False)
    sentence = _guarantee_sentence(res)
    if con.is_terminal:
        con.print(Panel(Text(res.text), title=f"rewrite ({res.method})"))
        con.print(Text(sentence))
    else:
        sys.stdout.write(res.text + "\n\n" + sentence + "\n")


def _label_fields(items: Sequence[str] | None) -> list[str]:
    fields: list[str] = []
    for item in items or ():
        fields.extend(f.strip() for f in item.split(",") if f.strip())
    return fields


def _template_arg(args: argparse.Namespace) -> Any:

    from dpinfer.errors import ConfigurationError
    from dpinfer.pipelines.synthesize import PromptTemplate

    if not args.template_file:
        return args.template
    from dpinfer.validation import MAX_TEXT_BYTES, input_file

    p = input_file(args.template_file, "template")
    if p.stat().st_size > MAX_TEXT_BYTES:
        raise InvalidInputError(f"{p} is too large for a template file")
    try:
        data = json.loads(p.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InvalidInputError(f"{p} is not a JSON file") from None
    if not (isinstance(data, dict) and isinstance(data.get("private"), str) and isinstance(data.get("public"), str)):
        raise ConfigurationError(f'{p} must hold {{"private": "... {{reference}} ...", "public": "..."}}')
    prefix = data.get("response_prefix", "")
    if not isinstance(prefix, str):
        raise ConfigurationError(f"{p}: response_prefix must be a string")
    return PromptTemplate(private=data["private"], public=data["public"], response_prefix=prefix)


def cmd_synth(args: argparse.Namespace) -> int:
    from dpinfer.models import load_model
    from dpinfer.pipelines.synthesize import load_references, synthesize
    from dpinfer.validation import check_output_path, check_synth_budget, check_synth_params

    # every parameter and path is checked here, before the corpus is read and before the model loads
    if args.method != "public" and args.epsilon is None:
        raise InvalidInputError("--epsilon is required (the target ε per reference), except with --method public")
    top_k = _cli_k(args.top_k, "--top-k")
    max_ref = _cli_k(args.max_reference_tokens, "--max-reference-tokens")
    check_synth_params(method=args.method, epsilon=args.epsilon, delta=args.delta, batch_size=args.batch_size,
                       max_new_tokens=args.max_new_tokens, top_k=top_k, temperature=args.temperature, seed=args.seed,
                       max_texts=args.max_texts, max_reference_tokens=max_ref, limit=args.limit, cli=True)
    check_output_path(args.out, inputs=(args.file, args.template_file))
    template = _template_arg(args)
    refs = load_references(args.file, text_field=args.text_field, label_fields=_label_fields(args.label_fields),
                           limit=args.limit)
    if args.method != "public" and len(refs) < args.batch_size:
        raise InvalidInputError(f"{len(refs)} references are fewer than one batch of B = {args.batch_size}; lower "
                                "--batch-size or add references")
    check_synth_budget(method=args.method, epsilon=args.epsilon, delta=args.delta, batch_size=args.batch_size,
                       max_new_tokens=args.max_new_tokens, top_k=top_k, temperature=args.temperature)
    lm = load_model(args.model, device=args.device)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    err = _console(stderr=True)
    with Progress(TextColumn(f"synthesizing ({args.method})"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("batches"), TimeElapsedColumn(), console=err, transient=True,
                  disable=not err.is_terminal) as prog:
        task = prog.add_task("synth", total=None)

        def progress(done: int, total: int) -> None:
            prog.update(task, completed=done, total=total)

        res = synthesize(refs, lm=lm, method=args.method, epsilon=args.epsilon, delta=args.delta,
                         batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                         top_k=top_k, temperature=args.temperature,
                         prompt_template=template, seed=args.seed, max_texts=args.max_texts,
                         max_reference_tokens=max_ref, progress=progress)
    try:
        res.write_jsonl(args.out)
    except OSError as exc:  # never lose a finished result: save it elsewhere, or print it
        from dpinfer.validation import rescue_write_text

        body = "".join(res.jsonl_lines())
        rescue = rescue_write_text(body, ".jsonl")
        if rescue is None:
            sys.stdout.write(body)
            return _write_failure("--out", args.out, exc, "the texts are on standard output")
        return _write_failure("--out", args.out, exc, f"the texts were saved to {rescue}")
    if args.json:
        _print_json({**res.header()["dpinfer"], "out": args.out})
        return 0
    con = _console()
    g = res.guarantee
    con.print(f"{len(res.texts)} synthetic texts ({res.generated_tokens} tokens, {res.tokens_per_second:.1f} tokens/s, "
              f"{res.lm_calls_per_token} LM calls per token) written to {args.out}")
    if res.references_left_out and args.method != "public":
        con.print(f"[dim]{res.references_left_out} references were left out (label groups not filling a batch of "
                  f"{args.batch_size}, or --max-texts)[/dim]")
    if args.method == "adapmixed":
        con.print("Guarantee: none ex ante. AdaPMixED's privacy loss depends on the references; each text records its "
                  "realised (data-dependent) figure, which is not a differential-privacy guarantee.")
    elif args.method == "public":
        con.print("Guarantee: the texts were generated from the public prompt only; they reveal nothing about the "
                  "references (ε = 0).")
    else:
        con.print(f"Guarantee: {g}")
        con.print("It holds for every reference at once: the batches are disjoint and chosen without reading the "
                  "texts, so the file as a whole has the guarantee of one text.")
    return 0


def _guarantee_sentence(res: Any) -> str:
    from dpinfer.pipelines.sanitize import guarantee_sentence

    return guarantee_sentence(res)


def _progress_runner(label: str) -> tuple[Any, Callable[[str], None]]:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    err = _console(stderr=True)
    prog = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err,
                    transient=True, disable=not err.is_terminal)
    task = prog.add_task(label)

    def update(what: str) -> None:
        prog.update(task, description=f"{label}: {what}")

    return prog, update


_BENCH_COUNTS = ("n", "new_tokens", "prompt_tokens", "repeats", "max_chars", "max_new_tokens", "n_texts",
                 "n_private", "n_real", "mauve_repeats", "perf_batch_size")


def _check_bench_args(args: argparse.Namespace) -> None:
    """The numeric options and the data file of a benchmark, checked before any model loads."""
    from dpinfer.validation import (
        check_delta,
        check_seed,
        check_temperature,
        int_at_least,
        positive_number,
        sniff_text_file,
    )

    for name in _BENCH_COUNTS:
        value = getattr(args, name, None)
        if value is not None:
            int_at_least(value, "--" + name.replace("_", "-"), 1)
    for k in getattr(args, "k", None) or ():
        int_at_least(k, "--k", 1)
    if getattr(args, "skip", None) is not None:
        int_at_least(args.skip, "--skip", 0)
    check_seed(getattr(args, "seed", None), "--seed")
    if getattr(args, "temperature", None) is not None:
        check_temperature(args.temperature, "--temperature", allow_zero=False)
    _cli_k(getattr(args, "top_k", None), "--top-k")
    _cli_k(getattr(args, "no_repeat_ngram", None), "--no-repeat-ngram")
    if getattr(args, "epsilon", None) is not None:
        positive_number(args.epsilon, "--epsilon")
    if getattr(args, "delta", None) is not None:
        check_delta(args.delta, "--delta")
    if getattr(args, "data", None):
        sniff_text_file(args.data, "data")
    for name in ("out", "out_dir"):
        folder = getattr(args, name, None)
        if folder:
            from pathlib import Path

            if Path(folder).exists() and not Path(folder).is_dir():
                raise InvalidInputError(f"--{name.replace('_', '-')} {folder} is a file; give a folder")


def cmd_bench_engine(args: argparse.Namespace) -> int:
    from dpinfer.bench.engine import format_markdown, run_engine_bench
    from dpinfer.models import load_model

    _check_bench_args(args)
    lm = load_model(args.model)
    prog, update = _progress_runner("bench engine")
    with prog:
        res = run_engine_bench(lm, ks=tuple(args.k), new_tokens=args.new_tokens, prompt_tokens=args.prompt_tokens,
                               repeats=args.repeats, unshared=not args.no_unshared, progress=update)
    if args.json:
        _print_json(res)
    else:
        print(format_markdown(res))
    return 0


def _run_bench_module(name: str, args: argparse.Namespace) -> int:
    """Run ``dpinfer.bench.<name>.main`` with a progress spinner; print its markdown (and plot path) or its JSON."""
    import importlib

    _check_bench_args(args)
    bench = importlib.import_module(f"dpinfer.bench.{name}")
    prog, update = _progress_runner(f"bench {name}")
    with prog:
        res = bench.main(args, progress=update)
    if args.json:
        _print_json(res)
    else:
        print(res["markdown"])
        if res.get("plot"):
            print(f"\nplot: {res['plot']}")
    return 0


def cmd_bench_sanitize(args: argparse.Namespace) -> int:
    return _run_bench_module("sanitize", args)


def cmd_bench_synth(args: argparse.Namespace) -> int:
    return _run_bench_module("synth", args)


def _bench_tagger(args: argparse.Namespace) -> int:
    from dpinfer.bench import tagger

    _check_bench_args(args)
    return int(tagger.main(args) or 0)


# ---------------------------------------------------------------------------------------------------------- parser
QUANTIZE_HELP = ("int8: CPU only; decode steps use dynamic int8 Linear layers (prompt processing stays float32): "
                 "faster decoding, slightly different sampling distribution (default: off)")


def _add_quantize(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quantize", default=None, choices=["int8"], help=QUANTIZE_HELP)


COMMAND_MODULES: tuple[str, ...] = ("dpinfer.cli.protect_prompt", "dpinfer.cli.calibrate_clip")
"""Command modules, one per command (``dpinfer.cli.<name>``). Each defines ``add_parser(sub, common)``, which adds its
subcommand to ``sub`` (parents ``[common]`` for ``--json``) with ``set_defaults(func=run)``, where ``run(args) -> int``
returns the exit status, and optionally ``add_bench_parser(bench_sub, common)`` for its ``dpinfer bench`` entry. A
command module imports torch, models and pipelines lazily inside ``run`` (parameter errors come in under a second)."""


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print one JSON object instead of text")
    parser = argparse.ArgumentParser(
        prog="dpinfer", parents=[common],
        description="Differentially private inference with LLMs, offline. Every private output carries an "
                    "(ε, δ) guarantee computed before the private data is read.",
    )
    parser.add_argument("--version", action="version", version=f"dpinfer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    g = sub.add_parser("generate", parents=[common], help="plain generation (no privacy), streamed",
                       description="Generate a continuation of PROMPT with the engine (no privacy guarantee). "
                                   "The prompt is used exactly as given unless --chat.")
    g.add_argument("prompt", help="prompt text, or '-' for standard input, or a file with --file")
    g.add_argument("--file", action="store_true", help="PROMPT is a file path")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--model", default=None, help="model name or local folder (default: embedded SmolLM2-135M)")
    g.add_argument("--device", default=None, help="cpu / cuda (default: cuda when available)")
    _add_quantize(g)
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.7, help="0 = greedy (default 0.7)")
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--top-p", type=float, default=0.9)
    g.add_argument("--seed", type=int, default=None, help="reproduce the output (default: secure random)")
    g.set_defaults(func=cmd_generate)

    sz = sub.add_parser("sanitize", parents=[common], help="rewrite a document with a per-group (ε, δ) guarantee",
                        description="Rewrite a sensitive document with DP-Fusion (or a baseline). Private spans are "
                                    "found by a local tagger (or given with --spans); each entity type is a privacy "
                                    "group with its own ε. The guarantee is computed before the document is read. "
                                    "Not protected: the existence, position and token length of each span, and "
                                    "anything the tagger missed.",
                        epilog="Choosing ε: the default ε = 40 per group means the rewrite changes the odds of any "
                               "conclusion about one group's span contents by at most e^40 (≈ 2e17), except with "
                               "probability δ: a weak worst-case bound. It is still useful: it is per group, covers "
                               "the spans' contents only, about 10 of it is the fixed cost of converting the Rényi "
                               "bound at α = 2, and measured attacks stay near chance (LOSS attack 0.24 at ε = 40, "
                               "0.22 at ε = 12, chance 0.20; docs/sanitize.md). Lower ε (> 10.13 at α = 2; with "
                               "--alpha 8 down to ≈ 1.22) protects more and reads worse; --group-epsilon tightens "
                               "the groups that matter most.")
    sz.add_argument("file", help="the document (UTF-8 text), or '-' for standard input")
    sz.add_argument("--epsilon", type=float, default=None,
                    help="target ε per group (default 40: a per-group bound e^40 on the odds; see below and "
                         "docs/threat-model.md)")
    sz.add_argument("--group-epsilon", action="append", metavar="NAME=E",
                    help="ε for one group or label, e.g. --group-epsilon PERSON=10 (repeatable)")
    sz.add_argument("--group", action="append", metavar="NAME=L1,L2",
                    help="merge labels into one group, e.g. --group ID=PERSON,CODE (repeatable)")
    sz.add_argument("--delta", type=float, default=1e-5, help="δ (default 1e-5)")
    sz.add_argument("--spans", default=None, help="JSON spans file (list of {start, end, label} or TAB "
                                                  "entity_mentions) for THIS document (its text/span_text must "
                                                  "match); replaces the tagger; overlapping spans are merged")
    sz.add_argument("--tagger", default="presidio", help="presidio (default) | regex")
    sz.add_argument("--method", default="dp-fusion",
                    help="dp-fusion (default) | original | ner-scrub | dp-decoding | dp-prompt")
    sz.add_argument("--max-new-tokens", type=int, default=None,
                    help="T_max. Default for dp-fusion: about the document's length (public under its adjacency); "
                         "for dp-decoding and dp-prompt: a fixed 256 (the length is private under theirs)")
    sz.add_argument("--alpha", type=float, default=2.0, help="Rényi order of DP-Fusion's bound (default 2)")
    sz.add_argument("--temperature", type=float, default=None, help="sampling temperature (default 0.7)")
    sz.add_argument("--top-k", type=int, default=None,
                    help="public top-k support (default 40; 0 = full vocabulary)")
    sz.add_argument("--no-repeat-ngram", type=int, default=None,
                    help="ban repeating any n-gram of the rewrite (public transform; default 3; 0 = off)")
    sz.add_argument("--accounting", default="dpinfer", choices=["dpinfer", "as_published"],
                    help="as_published: the DP-Fusion authors' 4β-per-step accounting, for comparison")
    sz.add_argument("--adjacency", default="replace-by-null", choices=["replace-by-null", "replace-one"],
                    help="DP-Fusion's neighbouring documents: replace-by-null (default; a group's spans replaced by "
                         "placeholders) or replace-one (a group's values swapped for any others; bound enforced at "
                         "order 2α, more noise for the same ε)")
    sz.add_argument("--allow-untagged", action="store_true",
                    help="rewrite even if no span is given or found (refused by default: nothing would be protected)")
    sz.add_argument("--debug-stats", action="store_true",
                    help="add the DATA-DEPENDENT per-step λ/divergences, spans and timing to --json (they reveal the "
                         "private content: never release them)")
    sz.add_argument("--seed", type=int, default=None,
                    help="for tests and benchmarks only: the guarantee then holds only while the seed is secret "
                         "(default: noise from the OS's secure generator)")
    sz.add_argument("--model", default=None, help="model name or local folder (default: embedded SmolLM2-135M)")
    sz.add_argument("--device", default=None)
    _add_quantize(sz)
    sz.add_argument("--out", default=None, help="also write the rewrite to this file (checked before the model "
                                                "loads; written atomically; never the input file)")
    sz.add_argument("--show-input", action="store_true",
                    help="also show the document with its private spans highlighted (terminal only: never printed "
                         "into a pipe or a file)")
    sz.set_defaults(func=cmd_sanitize)

    sy = sub.add_parser("synth", parents=[common], help="synthetic texts from a private corpus, (ε, δ) per reference",
                        description="Generate synthetic texts that resemble a private corpus (InvisibleInk by "
                                    "default), one text per disjoint batch of B references. The (ε, δ) guarantee per "
                                    "reference is computed before the corpus is read and written into the output "
                                    "file's first line, with the settings.")
    sy.add_argument("file", help="the private corpus: a .jsonl or .csv file")
    sy.add_argument("--text-field", required=True, help="the field holding each reference's text")
    sy.add_argument("--label-fields", action="append", metavar="F1,F2",
                    help="public label fields shown in the prompts (e.g. label1,label2 for Yelp); references are "
                         "batched within equal labels")
    sy.add_argument("--epsilon", type=float, default=None, help="target ε per reference (required but for public)")
    sy.add_argument("--delta", type=float, default=1e-6, help="δ (default 1e-6)")
    sy.add_argument("--batch-size", type=int, default=8, help="B references per text (compute ≈ B + 1 LM calls per "
                                                              "token; default 8)")
    sy.add_argument("--max-new-tokens", type=int, default=200, help="T_max per text (default 200)")
    sy.add_argument("--method", default="invisibleink", choices=["invisibleink", "amin", "adapmixed", "public"],
                    help="invisibleink (default) | amin | adapmixed (data-dependent, no guarantee) | public")
    sy.add_argument("--top-k", type=int, default=50, help="k of Top-k+ (default 50; 0 = full vocabulary)")
    sy.add_argument("--temperature", type=float, default=1.0, help="τ (default 1.0)")
    sy.add_argument("--template", default="generic", choices=["generic", "yelp", "tab"],
                    help="built-in prompt pair (default generic; yelp uses {label1} and {label2})")
    sy.add_argument("--template-file", default=None,
                    help='JSON {"private": "... {reference} ...", "public": "...", "response_prefix": "..."} '
                         "(the prefix is optional); {field} names a label field")
    sy.add_argument("--max-texts", type=int, default=None, help="stop after this many texts")
    sy.add_argument("--max-reference-tokens", type=int, default=512,
                    help="cut each reference to this many tokens (default 512; 0 = no cut)")
    sy.add_argument("--limit", type=int, default=None, help="read only the first N records")
    sy.add_argument("--seed", type=int, default=None,
                    help="for tests and benchmarks only: the guarantee then holds only while the seed is secret "
                         "(default: noise from the OS's secure generator)")
    sy.add_argument("--model", default=None, help="model name or local folder (default: embedded SmolLM2-135M)")
    sy.add_argument("--device", default=None)
    sy.add_argument("--out", required=True, help="output .jsonl (first line: guarantee and settings)")
    sy.set_defaults(func=cmd_synth)

    m = sub.add_parser("models", parents=[common], help="list installed and cached models",
                       description="List the embedded model and the converted models in the cache.")
    m.add_argument("--prepare", action="store_true", help="load (and on first use convert and cache) the model")
    m.add_argument("--model", default=None, help="model to prepare (default: the embedded one)")
    m.set_defaults(func=cmd_models)

    from dpinfer.audit import command as audit_command  # light: torch loads only when the audit runs

    au = sub.add_parser("audit", parents=[common], help="empirical privacy audit: audited ε lower bound vs the claim",
                        description=audit_command.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    audit_command.add_arguments(au)
    au.set_defaults(func=audit_command.run)

    b = sub.add_parser("bench", help="benchmarks (print what they measured, with their baseline, in one run)")
    bsub = b.add_subparsers(dest="bench", metavar="BENCH", required=True)
    from dpinfer.bench import engine as bench_engine

    be = bsub.add_parser("engine", parents=[common], help="engine tokens/s vs HF generate for K = 1, 2, 5, 9",
                         description=bench_engine.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_engine.add_arguments(be)
    be.set_defaults(func=cmd_bench_engine)
    from dpinfer.bench import sanitize as bench_sanitize

    bs = bsub.add_parser("sanitize", parents=[common], help="sanitisation privacy-utility (PPL, ASR, leaks) or --perf",
                         description=bench_sanitize.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_sanitize.add_arguments(bs)
    bs.set_defaults(func=cmd_bench_sanitize)
    from dpinfer.bench import synth as bench_synth

    bsy = bsub.add_parser("synth", parents=[common], help="synthetic-text MAUVE vs compute (B) at fixed ε, or --perf",
                          description=bench_synth.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_synth.add_arguments(bsy)
    bsy.set_defaults(func=cmd_bench_synth)
    try:
        from dpinfer.bench import tagger as bench_tagger
    except ImportError:  # pragma: no cover - module always ships; its heavy imports are lazy
        bench_tagger = None
    if bench_tagger is not None:
        bt = bsub.add_parser("tagger", help="tagger precision / recall / F1 against gold spans",
                             description=bench_tagger.DESCRIPTION,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
        bench_tagger.add_arguments(bt)
        bt.set_defaults(func=_bench_tagger)
    for module_name in COMMAND_MODULES:
        module = importlib.import_module(module_name)
        module.add_parser(sub, common)
        if hasattr(module, "add_bench_parser"):
            module.add_bench_parser(bsub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "json"):
        args.json = False
    try:
        return int(args.func(args) or 0)
    except DPInferError as exc:
        print(f"dpinfer: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("dpinfer: interrupted", file=sys.stderr)
        return 130
    except MemoryError:
        print("dpinfer: error: out of memory; lower max-new-tokens or the number of contexts", file=sys.stderr)
        return EXIT_ERROR
    except OSError as exc:  # the file system said no: its reason and the path, never file content
        where = f" ({exc.filename})" if exc.filename else ""
        reason = exc.strerror or f"could not read or write a file ({type(exc).__name__}); check the paths given"
        print(f"dpinfer: error: {reason}{where}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:
        if os.environ.get("DPINFER_DEBUG"):
            raise
        print(f"dpinfer: error: unexpected {type(exc).__name__} (message withheld: it may quote the input); rerun "
              "with DPINFER_DEBUG=1 for the traceback", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
