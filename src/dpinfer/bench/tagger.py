"""Tagger benchmark: span-level precision / recall / F1 per TAB type, and tagging speed.

Gold data (from the shared evaluation data, :func:`dpinfer.paths.data_dir`):

* ``tab``: ``tab/tab_echr_docs.jsonl``, 77 ECHR cases of the TAB test split with every entity mention
  (already in the eight TAB types);
* ``synth``: ``pii/presidio_synth_v2.json``, 1,500 presidio-research synthetic sentences with 17 Presidio entity
  types, mapped to TAB types with the same label map the taggers use (types mapped to null are left out and counted).

Matching (a prediction and a gold span "agree" when their labels are equal):

* **exact**: same start, same end, same label. P = matched predictions / predictions, R = matched gold / gold;
* **relaxed**: the spans share at least one character and have the same label. P = predictions overlapping some gold
  span of their label / predictions; R = gold spans overlapped by some prediction of their label / gold spans
  (not one-to-one: one long prediction may cover several gold spans);
* **micro**: counts summed over the types; **untyped**: the same with labels ignored (does the tagger cover the
  private text at all, whatever the group?); **chars**: character-level coverage, recall = gold characters inside
  some prediction / gold characters, precision = predicted characters inside some gold span / predicted characters.

Speed is measured over the whole dataset, after the tagger is built (``load_s`` is reported separately).
Metrics with an empty denominator are ``None`` (shown as ``–``).

``dpinfer bench tagger`` shows :data:`DESCRIPTION` as its help.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dpinfer.bench.data import load_tab as tab_documents
from dpinfer.bench.harness import Progress, quiet, write_json
from dpinfer.configs import Config, add_options, option
from dpinfer.errors import InvalidInputError, MissingDependencyError
from dpinfer.paths import data_file
from dpinfer.taggers.base import TAB_LABELS, Tagger
from dpinfer.taggers.labels import LabelMap, resolve_label_map
from dpinfer.taggers.registry import get_tagger

DATASETS = ("tab", "synth")
TAB_FILE = ("tab", "tab_echr_docs.jsonl")
SYNTH_FILE = ("pii", "presidio_synth_v2.json")

Gold = tuple[int, int, str]


# ------------------------------------------------------------------------------------------------------ data


def load_tab(n: int | None = None) -> list[tuple[str, list[Gold]]]:
    """The first ``n`` (all if ``None``) TAB documents as (text, gold spans). Raises DataNotFoundError if absent."""
    docs = tab_documents(None, 10**9 if n is None else n, 10**12)
    return [(d.text, [(s.start, s.end, s.label) for s in d.spans]) for d in docs]


def load_synth(n: int | None = None, label_map: LabelMap | None = None) -> tuple[list[tuple[str, list[Gold]]], dict]:
    """The first ``n`` presidio-research sentences as (text, gold spans in TAB types), and the unmapped-type counts."""
    lmap = resolve_label_map(label_map)
    path = data_file(*SYNTH_FILE)
    records = json.loads(path.read_text(encoding="utf-8"))
    if n is not None:
        records = records[:n]
    docs: list[tuple[str, list[Gold]]] = []
    unmapped: dict[str, int] = {}
    for r in records:
        gold: list[Gold] = []
        for s in r["spans"]:
            label = lmap.get(s["entity_type"])
            if label is None:
                unmapped[s["entity_type"]] = unmapped.get(s["entity_type"], 0) + 1
                continue
            gold.append((int(s["start_position"]), int(s["end_position"]), label))
        docs.append((r["full_text"], gold))
    return docs, unmapped


# --------------------------------------------------------------------------------------------------- metrics


def _ratio(a: int, b: int) -> float | None:
    return a / b if b else None


def _prf(tp_pred: int, n_pred: int, tp_gold: int, n_gold: int) -> dict[str, Any]:
    p, r = _ratio(tp_pred, n_pred), _ratio(tp_gold, n_gold)
    f1 = None if p is None or r is None else (0.0 if p + r == 0 else 2 * p * r / (p + r))
    return {
        "precision": p,
        "recall": r,
        "f1": f1,
        "n_pred": n_pred,
        "n_gold": n_gold,
        "tp_pred": tp_pred,
        "tp_gold": tp_gold,
    }


class _Counts:
    __slots__ = ("ex_tp", "n_gold", "n_pred", "rel_tp_gold", "rel_tp_pred")

    def __init__(self) -> None:
        self.n_pred = self.n_gold = self.ex_tp = self.rel_tp_pred = self.rel_tp_gold = 0

    def add(self, pred: Sequence[tuple[int, int]], gold: Sequence[tuple[int, int]]) -> None:
        ps, gs = set(pred), set(gold)
        self.n_pred += len(ps)
        self.n_gold += len(gs)
        self.ex_tp += len(ps & gs)
        gl = sorted(gs)
        pl = sorted(ps)
        self.rel_tp_pred += sum(1 for p in pl if _overlaps_any(p, gl))
        self.rel_tp_gold += sum(1 for g in gl if _overlaps_any(g, pl))

    def result(self) -> dict[str, Any]:
        return {
            "exact": _prf(self.ex_tp, self.n_pred, self.ex_tp, self.n_gold),
            "relaxed": _prf(self.rel_tp_pred, self.n_pred, self.rel_tp_gold, self.n_gold),
        }


def _overlaps_any(span: tuple[int, int], others: Sequence[tuple[int, int]]) -> bool:
    s, e = span
    return any(os < e and s < oe for os, oe in others)


def _covered(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _intersection(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    i = j = total = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def score_documents(
    predictions: Sequence[Sequence[Gold]], golds: Sequence[Sequence[Gold]], labels: Sequence[str] = TAB_LABELS
) -> dict[str, Any]:
    """P/R/F1 per type (exact and relaxed), micro, untyped, and character coverage (definitions: module docstring).

    >>> r = score_documents([[(0, 4, "PERSON"), (10, 14, "LOC")]], [[(0, 4, "PERSON"), (9, 14, "ORG")]])
    >>> r["per_type"]["PERSON"]["exact"]["f1"], r["micro"]["relaxed"]["recall"], r["untyped"]["relaxed"]["recall"]
    (1.0, 0.5, 1.0)
    """
    if len(predictions) != len(golds):
        raise InvalidInputError("predictions and golds must have the same number of documents")
    per = {label: _Counts() for label in labels}
    micro, untyped = _Counts(), _Counts()
    chars_gold = chars_pred = chars_both = 0
    for pred, gold in zip(predictions, golds, strict=True):
        for label in labels:
            p = [(s, e) for s, e, lab in pred if lab == label]
            g = [(s, e) for s, e, lab in gold if lab == label]
            per[label].add(p, g)
        untyped.add([(s, e) for s, e, _ in pred], [(s, e) for s, e, _ in gold])
        cg, cp = _covered((s, e) for s, e, _ in gold), _covered((s, e) for s, e, _ in pred)
        chars_gold += sum(e - s for s, e in cg)
        chars_pred += sum(e - s for s, e in cp)
        chars_both += _intersection(cg, cp)
    for c in per.values():
        for attr in _Counts.__slots__:
            setattr(micro, attr, getattr(micro, attr) + getattr(c, attr))
    return {
        "per_type": {label: c.result() for label, c in per.items() if c.n_gold or c.n_pred},
        "micro": micro.result(),
        "untyped": untyped.result(),
        "chars": {
            "recall": _ratio(chars_both, chars_gold),
            "precision": _ratio(chars_both, chars_pred),
            "gold_chars": chars_gold,
            "pred_chars": chars_pred,
        },
    }


# ------------------------------------------------------------------------------------------------------- run


def _run_one(tagger: Tagger, docs: Sequence[tuple[str, list[Gold]]]) -> dict[str, Any]:
    preds: list[list[Gold]] = []
    t0 = time.perf_counter()
    for text, _ in docs:
        preds.append([(s.start, s.end, s.label) for s in tagger.tag(text)])
    seconds = time.perf_counter() - t0
    n_chars = sum(len(t) for t, _ in docs)
    out = score_documents(preds, [g for _, g in docs])
    out["speed"] = {
        "seconds": seconds,
        "docs": len(docs),
        "chars": n_chars,
        "chars_per_s": n_chars / seconds if seconds > 0 else None,
        "docs_per_s": len(docs) / seconds if seconds > 0 else None,
    }
    return out


def run_tagger_bench(
    taggers: Sequence[str | Tagger] = ("regex", "presidio"),
    n_tab: int | None = None,
    n_synth: int | None = None,
    datasets: Sequence[str] = DATASETS,
    label_map: LabelMap | None = None,
) -> dict[str, Any]:
    """Run each tagger (a registered name or a :class:`Tagger`) on the TAB and synthetic gold data.

    ``n_tab`` / ``n_synth`` limit the number of documents (the first ones; ``None``: all). A tagger whose optional
    dependency is missing is reported as skipped (with the reason), not run. Raises
    :class:`~dpinfer.errors.DataNotFoundError` if the evaluation data is absent.
    """
    unknown = [d for d in datasets if d not in DATASETS]
    if unknown:
        raise InvalidInputError(f"unknown dataset(s) {unknown}; choose from {list(DATASETS)}")
    data: dict[str, list[tuple[str, list[Gold]]]] = {}
    info: dict[str, Any] = {}
    if "tab" in datasets:
        data["tab"] = load_tab(n_tab)
        info["tab"] = {"file": "/".join(TAB_FILE), "docs": len(data["tab"])}
    if "synth" in datasets:
        data["synth"], unmapped = load_synth(n_synth, label_map)
        info["synth"] = {"file": "/".join(SYNTH_FILE), "docs": len(data["synth"]), "gold_unmapped": unmapped}
    for name, docs in data.items():
        info[name]["chars"] = sum(len(t) for t, _ in docs)
        info[name]["gold_spans"] = sum(len(g) for _, g in docs)

    results: dict[str, Any] = {}
    for spec in taggers:
        t0 = time.perf_counter()
        if isinstance(spec, Tagger):
            tagger, key = spec, spec.name
        else:
            key = spec
            try:
                kwargs = {"label_map": label_map} if label_map is not None else {}
                tagger = get_tagger(spec, **kwargs)
            except MissingDependencyError as e:
                results[key] = {"skipped": str(e)}
                continue
        load_s = time.perf_counter() - t0
        results[key] = {"load_s": load_s}
        for name, docs in data.items():
            results[key][name] = _run_one(tagger, docs)
    return {
        "datasets": info,
        "taggers": results,
        "matching": {
            "exact": "same start, end and label",
            "relaxed": "at least one shared character and the same label (not one-to-one)",
            "untyped": "labels ignored",
            "chars": "character coverage of gold by predictions (recall) and of predictions by gold (precision)",
        },
    }


# ---------------------------------------------------------------------------------------------------- output


def _f(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def format_markdown(results: Mapping[str, Any]) -> str:
    """Markdown report: a summary table, then one per-type table per dataset and tagger."""
    lines: list[str] = ["# Tagger benchmark", ""]
    info = results["datasets"]
    for name, d in info.items():
        extra = ""
        if d.get("gold_unmapped"):
            extra = "; gold types not mapped (left out): " + ", ".join(
                f"{k} ({v})" for k, v in sorted(d["gold_unmapped"].items())
            )
        lines.append(
            f"- **{name}**: {d['file']}, {d['docs']} docs, {d['chars']:,} chars, {d['gold_spans']:,} gold spans{extra}"
        )
    lines.append("")
    lines.append(
        "| tagger | dataset | micro exact P / R / F1 | micro relaxed P / R / F1 | untyped relaxed R | char R | char P "
        "| chars/s | docs/s | load s |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for tname, tres in results["taggers"].items():
        if "skipped" in tres:
            lines.append(f"| {tname} | – | skipped: {tres['skipped']} | | | | | | | |")
            continue
        for dname in info:
            r = tres[dname]
            ex, rel = r["micro"]["exact"], r["micro"]["relaxed"]
            sp = r["speed"]
            lines.append(
                f"| {tname} | {dname} | {_f(ex['precision'])} / {_f(ex['recall'])} / {_f(ex['f1'])} "
                f"| {_f(rel['precision'])} / {_f(rel['recall'])} / {_f(rel['f1'])} "
                f"| {_f(r['untyped']['relaxed']['recall'])} | {_f(r['chars']['recall'])} "
                f"| {_f(r['chars']['precision'])} "
                f"| {sp['chars_per_s'] or 0:,.0f} | {sp['docs_per_s'] or 0:,.1f} | {tres['load_s']:.1f} |"
            )
    for dname in info:
        for tname, tres in results["taggers"].items():
            if "skipped" in tres:
                continue
            r = tres[dname]
            lines += ["", f"## {tname} on {dname}", ""]
            lines.append("| type | gold | pred | exact P | exact R | exact F1 | relaxed P | relaxed R | relaxed F1 |")
            lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
            rows = [(label, r["per_type"][label]) for label in TAB_LABELS if label in r["per_type"]]
            rows.append(("**micro**", r["micro"]))
            for label, m in rows:
                ex, rel = m["exact"], m["relaxed"]
                lines.append(
                    f"| {label} | {ex['n_gold']} | {ex['n_pred']} | {_f(ex['precision'])} | {_f(ex['recall'])} "
                    f"| {_f(ex['f1'])} | {_f(rel['precision'])} | {_f(rel['recall'])} | {_f(rel['f1'])} |"
                )
    return "\n".join(lines) + "\n"


DESCRIPTION = """\
Measure how well the PII taggers find private spans, against gold annotations: span-level precision, recall and F1
per entity type (exact and relaxed matching), character coverage, and tagging speed.

Gold data comes from the shared evaluation data (../shared/data beside the repository, or $DPINFER_DATA):
  tab    77 ECHR court cases of the TAB test split (tab/tab_echr_docs.jsonl)
  synth  1,500 presidio-research synthetic sentences (pii/presidio_synth_v2.json), mapped to TAB types

Recall is what matters for privacy: a span the tagger misses is not protected by `dpinfer sanitize`.
Prints a Markdown table; with --json, one JSON object instead (--json PATH writes it to PATH and prints the table).

examples:
  dpinfer bench tagger --taggers regex --n 10
  dpinfer bench tagger --datasets synth --json results.json
"""


@dataclass(frozen=True)
class TaggerBenchConfig(Config):
    """Settings of ``dpinfer bench tagger`` (one field per option, its ``--help`` with it)."""

    taggers: tuple[str, ...] = option(("regex", "presidio"), type=str,
                                      help="comma-separated tagger names (default: regex,presidio)")
    datasets: tuple[str, ...] = option(DATASETS, type=str,
                                       help=f"comma-separated datasets (default: {','.join(DATASETS)})")
    n: int | None = option(None, type=int, help="use only the first N documents of each dataset")
    json: bool | str | None = None
    """True or ``"-"``: print JSON instead of Markdown; a path: write the JSON there and print the Markdown."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``dpinfer bench tagger``."""
    add_options(parser, TaggerBenchConfig)
    parser.add_argument(
        "--json",
        nargs="?",
        const=True,
        default=argparse.SUPPRESS,  # keeps a global `dpinfer --json bench tagger`
        metavar="PATH",
        help="print the results as one JSON object instead of Markdown; with PATH, write the JSON there and print "
        "the Markdown table",
    )


def config_from_args(args: argparse.Namespace) -> TaggerBenchConfig:
    """The config of parsed ``dpinfer bench tagger`` options, checked (tagger and dataset names, --n, a --json PATH
    that cannot be written) before any tagger loads."""
    from dpinfer.taggers.registry import available_taggers

    lists = {name: tuple(x.strip() for x in str(getattr(args, name)).split(",") if x.strip())
             for name in ("taggers", "datasets") if name in args}
    c = TaggerBenchConfig.from_args(args, **lists)
    if not c.taggers:
        raise InvalidInputError("--taggers is empty; give e.g. --taggers regex,presidio")
    unknown = [t for t in c.taggers if t not in available_taggers()]
    if unknown:
        raise InvalidInputError(f"unknown tagger {unknown[0]!r}; choose from {', '.join(available_taggers())}")
    if not c.datasets or any(d not in DATASETS for d in c.datasets):
        raise InvalidInputError(f"--datasets must be a comma-separated list of {', '.join(DATASETS)}")
    if c.n is not None and c.n < 1:
        raise InvalidInputError("--n must be >= 1")
    if isinstance(c.json, str) and c.json != "-":
        from dpinfer.io import check_output_path

        check_output_path(c.json, option="--json")
    return c


def run(config: TaggerBenchConfig, progress: Progress = quiet) -> dict[str, Any]:
    """Run every tagger of ``config`` on its datasets (:func:`run_tagger_bench`); with a ``--json PATH``, the results
    are written there (atomically)."""
    progress(", ".join(config.taggers))
    results = run_tagger_bench(config.taggers, n_tab=config.n, n_synth=config.n, datasets=config.datasets)
    if isinstance(config.json, str) and config.json != "-":
        write_json(config.json, results)
    return results


def render(results: dict[str, Any]) -> str:
    """The Markdown report ``dpinfer bench tagger`` prints."""
    return format_markdown(results)


def report(config: TaggerBenchConfig, results: dict[str, Any]) -> None:
    """Print the JSON (``config.json`` True or ``"-"``) or the Markdown report (otherwise; a ``--json PATH`` was
    written by :func:`run`)."""
    if config.json is True or config.json == "-":
        sys.stdout.write(json.dumps(results, indent=2) + "\n")
    else:
        sys.stdout.write(render(results))


def main(args: argparse.Namespace) -> int:
    """Run the benchmark from parsed ``args`` and print the report; returns the exit status (0)."""
    config = config_from_args(args)
    report(config, run(config))
    return 0


if __name__ == "__main__":  # pragma: no cover
    _p = argparse.ArgumentParser(prog="dpinfer bench tagger", description=DESCRIPTION,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(_p)
    raise SystemExit(main(_p.parse_args()))
