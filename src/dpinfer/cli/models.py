"""``dpinfer models``: the embedded model and the converted models in the cache."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dpinfer.cli.output import add_backend_argument, console, print_json

EMBEDDED_NOTE = (
    "The embedded smollm2-135m-instruct is a small demonstration of the mechanics (135M parameters; text quality "
    "limited). For usable text pass --model /path/to/a local instruct model folder (Qwen2.5, Llama 3, Mistral, "
    "Gemma 2, Phi-3: any transformers causal LM with a fast tokenizer and a chat template) or a .gguf file; see the "
    "README, 'Bring your own model'."
)


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    m = sub.add_parser("models", parents=[common], help="list installed and cached models",
                       description="List the embedded model and the converted models in the cache. " + EMBEDDED_NOTE)
    m.add_argument("--prepare", action="store_true", help="load (and on first use convert and cache) the model")
    m.add_argument("--model", default=None, help="model to prepare (default: the embedded one)")
    add_backend_argument(m)
    m.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dpinfer.model_files import installed_models
    from dpinfer.paths import cache_dir

    models = installed_models()
    prepared: dict[str, Any] = {}
    if args.prepare:
        import time

        from dpinfer.models import load_model

        t0 = time.perf_counter()
        lm = load_model(args.model)
        prepared = {"name": lm.name, "source": str(lm.source), "backend": lm.backend,
                    "seconds": round(time.perf_counter() - t0, 2)}
        models = installed_models()
    if args.json:
        out: dict[str, Any] = {"cache_dir": str(cache_dir()), "models": models, "note": EMBEDDED_NOTE}
        if args.prepare:
            out["prepared"] = prepared
        print_json(out)
        return 0
    from rich.table import Table

    con = console()
    columns = ("name", "kind", "cached", "size MB", "path")
    rows = [(m["name"], m["kind"], "yes" if m.get("cached") else "no", str(m.get("size_mb", "")),
             str(m.get("path") or m.get("error", ""))) for m in models]
    if not con.is_terminal:  # for scripts: tab-separated, a header row, full names and paths
        sys.stdout.write("".join("\t".join(row) + "\n" for row in [columns, *rows]))
        print(EMBEDDED_NOTE, file=sys.stderr)  # stdout stays a table for scripts
    else:
        table = Table(title=f"dpinfer models (cache: {cache_dir()})")
        for col in columns:
            table.add_column(col, overflow="fold")
        table.columns[0].no_wrap = True  # a name is never cut
        table.columns[0].min_width = max((len(row[0]) for row in rows), default=4)
        for row in rows:
            table.add_row(*row)
        con.print(table)
        con.print(EMBEDDED_NOTE)
    if args.prepare:
        con.print(f"loaded {prepared['name']} in {prepared['seconds']} s (model code: {prepared['backend']})")
    return 0
