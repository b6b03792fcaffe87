"""Every benchmark figure (matplotlib, the ``[eval]`` extra), in one place.

Each function takes a benchmark's results and a PNG path, draws with the Agg backend (no display), writes the file and
returns its path, or None when matplotlib is not installed (the benchmark's tables and JSON do not need it). No
function here imports a benchmark module: what a figure needs (labels, methods) is passed in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def figure(path: Path, size: tuple[float, float]) -> Iterator[Any]:
    """The axes of a new figure of ``size`` inches, saved to ``path`` (120 dpi, tight layout) on leaving; yields
    None (and writes nothing) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        yield None
        return
    fig, ax = plt.subplots(figsize=size)
    try:
        yield ax
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)


def _error_bars(ys: Sequence[float], lows: Sequence[float], highs: Sequence[float]) -> list[list[float]]:
    return [[y - lo for y, lo in zip(ys, lows, strict=True)], [hi - y for y, hi in zip(ys, highs, strict=True)]]


def sanitize_privacy_utility(res: Mapping[str, Any], path: Path) -> Path | None:
    """``dpinfer bench sanitize``: PPL vs LOSS-attack success, one series per method, ε annotated."""
    with figure(path, (7, 5)) as ax:
        if ax is None:
            return None
        by_method: dict[str, list[dict[str, Any]]] = {}
        for r in res["rows"]:
            if r["ppl_mean"] is not None and r["asr"] is not None:
                by_method.setdefault(r["method"], []).append(r)
        for method, rs in by_method.items():
            ax.plot([r["ppl_mean"] for r in rs], [r["asr"] for r in rs], marker="o",
                    linestyle="-" if len(rs) > 1 else "none", label=method)
            for r in rs:
                if r["target_epsilon"] is not None:
                    ax.annotate(f"ε={r['target_epsilon']:g}", (r["ppl_mean"], r["asr"]), fontsize=7,
                                xytext=(3, 3), textcoords="offset points")
        ax.axhline(0.2, color="grey", linestyle=":", linewidth=1, label="chance (1/5)")
        ax.set_xscale("log")
        ax.set_xlabel("perplexity of the release (log scale, lower is better)")
        ax.set_ylabel("LOSS-attack success rate (lower is more private)")
        ax.set_title("Privacy–utility on TAB-ECHR")
        ax.legend(fontsize=8)
    return path


def synth_mauve(res: Mapping[str, Any], path: Path) -> Path | None:
    """``dpinfer bench synth``: MAUVE (95% interval bars) vs LM calls per token, ``public`` as a band."""
    with figure(path, (6, 4)) as ax:
        if ax is None:
            return None
        for method in dict.fromkeys(r["method"] for r in res["rows"]):
            rows = [r for r in res["rows"] if r["method"] == method]
            if method == "public":
                r = rows[0]
                ax.axhspan(r["mauve_low"], r["mauve_high"], color="grey", alpha=0.2)
                ax.axhline(r["mauve"], color="grey", linestyle="--", label="public (no references)")
                continue
            ys = [r["mauve"] for r in rows]
            ax.errorbar([r["lm_calls_per_token"] for r in rows], ys, marker="o", capsize=3, label=method,
                        yerr=_error_bars(ys, [r["mauve_low"] for r in rows], [r["mauve_high"] for r in rows]))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("LM calls per token (B + 1)")
        ax.set_ylabel("MAUVE vs held-out texts")
        ax.set_title(f"ε = {res['settings']['epsilon']:g}, T_max = {res['settings']['max_new_tokens']}")
        ax.legend()
    return path


def rag_leakage(rows: Sequence[Mapping[str, Any]], path: Path, title: str) -> Path | None:
    """``dpinfer bench rag``: leakage (Repeat and ROUGE ≥ 0.5 prompt shares, Wilson bars) vs ε for pad; the other
    methods as reference lines."""
    with figure(path, (7, 4.2)) as ax:
        if ax is None:
            return None
        pad = sorted((r for r in rows if r["method"] == "pad"), key=lambda r: r["epsilon"])
        styles = ("--", ":", "-.", (0, (5, 1)), (0, (1, 3)), (0, (3, 1, 1, 1)))
        for key, colour, name in (("repeat_prompts", "tab:red", "Repeat Prompts"),
                                  ("rouge_prompts_0.5", "tab:blue", "ROUGE Prompts ≥ 0.5")):
            if pad:
                ys = [r[key]["share"] for r in pad]
                ax.errorbar([r["epsilon"] for r in pad], ys, marker="o", color=colour, capsize=3,
                            label=f"pad: {name}", yerr=_error_bars(ys, [r[key]["wilson95"][0] for r in pad],
                                                                   [r[key]["wilson95"][1] for r in pad]))
            if key == "repeat_prompts":
                for r, style in zip((r for r in rows if r["method"] != "pad"), styles, strict=False):
                    ax.axhline(r[key]["share"], color="grey", linestyle=style, linewidth=1,
                               label=f"{r['label']}: Repeat Prompts")
        ax.set_xscale("log")
        ax.set_xlabel("ε per answer (pad, δ = 1e-5)")
        ax.set_ylabel("share of attack prompts")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7, loc="upper left")
    return path


def gtr_leakage_accuracy(res: Mapping[str, Any], path: Path, labels: Mapping[str, str]) -> Path | None:
    """``dpinfer bench gtr``: accuracy vs ROUGE-1 leakage, one series per method of ``labels`` (method → label),
    τ annotated, with the original questions' accuracy and chance as lines."""
    with figure(path, (6.4, 4.4)) as ax:
        if ax is None:
            return None
        ans = res["answerers"][0]
        for method, marker in zip(labels, "osD^v<>", strict=False):
            pts = [r for r in res["rows"] if r["method"] == method]
            ax.plot([r["rouge1"] for r in pts], [r["accuracy"][ans]["accuracy"] for r in pts], marker=marker,
                    label=labels[method])
            for r in pts:
                ax.annotate(f"τ={r['tau']:g}", (r["rouge1"], r["accuracy"][ans]["accuracy"]), fontsize=7)
        ax.axhline(res["original"][ans]["accuracy"], color="grey", linestyle="--", label="original question")
        ax.axhline(0.2, color="black", linestyle=":", label="chance")
        ax.set_xlabel("ROUGE-1 with the original question (leakage, lower is more private)")
        ax.set_ylabel(f"accuracy ({ans})")
        ax.set_title("CSQA: DP-GTR vs DP-Prompt")
        ax.legend(fontsize=8)
    return path


def utility_rag(res: Mapping[str, Any], path: Path) -> Path | None:
    """``dpinfer bench utility`` (rag): the share of answers naming one of the reply's facts (Wilson bars) vs ε for
    pad, the ceiling and the floor as lines with their intervals as bands."""
    with figure(path, (6.4, 4.2)) as ax:
        if ax is None:
            return None
        rows = res["rows"]
        for method, colour, name in (("none", "tab:green", "none (ceiling)"), ("public", "grey", "public (floor)")):
            r = next((r for r in rows if r["method"] == method), None)
            if r is not None:
                ax.axhspan(*r["hit"]["wilson95"], color=colour, alpha=0.15)
                ax.axhline(r["hit"]["share"], color=colour, linestyle="--", label=name)
        _epsilon_curve(ax, rows, "pad", "hit", "share", "wilson95", base=2)
        _share_axes(ax, "ε per answer (pad, δ = 1e-5)", "answers naming a drug/test of the reply",
                    f"RAG on GenMedGPT: {res['questions']} held-in questions, 95% intervals")
    return path


def _floor_ceiling(ax: Any, rows: Sequence[Mapping[str, Any]], key: str, lines: Mapping[str, tuple[str, str]],
                   share: bool = True) -> None:
    """The rows named in ``lines`` (method → colour, label) as horizontal lines with their 95% bands."""
    for method, (colour, name) in lines.items():
        r = next((r for r in rows if r["method"] == method), None)
        if r is None:
            continue
        v = r[key]
        y, (lo, hi) = (v["share"], v["wilson95"]) if share else (v["mean"], v["ci95"])
        ax.axhspan(lo, hi, color=colour, alpha=0.15)
        ax.axhline(y, color=colour, linestyle="--", label=name)


def utility_synth(res: Mapping[str, Any], path: Path) -> Path | None:
    """``dpinfer bench utility`` (synth): sentiment accuracy on held-out real reviews of a classifier trained on
    InvisibleInk texts vs ε (Wilson bars), trained on ``public`` texts and on real references as bands."""
    with figure(path, (6.4, 4.2)) as ax:
        if ax is None:
            return None
        rows = res["rows"]
        _floor_ceiling(ax, rows, "accuracy", {"real (ceiling)": ("tab:green", "real references (ceiling)"),
                                              "public": ("grey", "public (floor)")})
        _epsilon_curve(ax, rows, "invisibleink", "accuracy", "share", "wilson95")
        ax.axhline(0.5, color="black", linestyle=":", linewidth=1, label="chance")
        _share_axes(ax, "ε per reference (invisibleink)", "accuracy on held-out real reviews",
                    f"Yelp sentiment: trained on {res['per_class']} texts per star rating, {res['test']} test "
                     "reviews")
    return path


def _share_axes(ax: Any, xlabel: str, ylabel: str, title: str) -> None:
    """A share on [0, 1] against ε: the labels, the title and the legend."""
    ax.set_ylim(0, 1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)


def _epsilon_curve(ax: Any, rows: Sequence[Mapping[str, Any]], method: str, metric: str, stat: str,
                   interval: str, base: float = 10) -> None:
    """``method``'s ``metric`` (its ``stat``, bars from its ``interval``) against ε, on a log axis of ``base``
    (nothing without rows of that method)."""
    mine = sorted((r for r in rows if r["method"] == method), key=lambda r: r["epsilon"])
    if not mine:
        return
    ys = [r[metric][stat] for r in mine]
    ax.errorbar([r["epsilon"] for r in mine], ys, marker="o", capsize=3, color="tab:blue", label=method,
                yerr=_error_bars(ys, [r[metric][interval][0] for r in mine], [r[metric][interval][1] for r in mine]))
    ax.set_xscale("log", base=base)


def utility_sanitize(res: Mapping[str, Any], path: Path) -> Path | None:
    """``dpinfer bench utility`` (sanitize): the share of fact questions the MiniLM answerer gets right from the
    release vs ε for dp-fusion (Wilson bars), ``original`` and ``ner-scrub`` as bands (a result without fact
    questions: the mean share of the document's values kept, t bars)."""
    from dpinfer.defaults import SANITIZE

    with figure(path, (6.4, 4.2)) as ax:
        if ax is None:
            return None
        rows = res["rows"]
        facts = all(r.get("facts") for r in rows)
        default = SANITIZE.min_p
        key = "facts" if facts else "recall"

        def point(r: Mapping[str, Any]) -> tuple[float, float, float]:
            v = r[key]
            return (v["share"], *v["wilson95"]) if facts else (v["mean"], *v["ci95"])

        _floor_ceiling(ax, rows, key, {"original": ("tab:green", "original (ceiling)"),
                                       "ner-scrub": ("grey", "ner-scrub (floor)")}, share=facts)
        dp = sorted((r for r in rows if r["method"] == "dp-fusion" and r.get("min_p", default) == default),
                    key=lambda r: r["epsilon"])  # the default support (a row with another min-p is in the table)
        if dp:
            ys, los, his = zip(*map(point, dp), strict=True)
            ax.errorbar([r["epsilon"] for r in dp], ys, marker="o", capsize=3, color="tab:blue", label="dp-fusion",
                        yerr=_error_bars(list(ys), list(los), list(his)))
            ax.set_xscale("log")
        if facts:
            ax.axhline(1 / res.get("choices", 4), color="black", linestyle=":", linewidth=1, label="chance")
        _share_axes(ax, "ε per group (dp-fusion)",
                    "fact questions answered from the release" if facts else "share of the document's values kept",
                    f"TAB-ECHR: {res['docs']} documents, T_max {res['T_max']}")
    return path
