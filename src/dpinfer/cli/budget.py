"""``dpinfer budget``: the privacy-budget ledger (init, set, show, history, void), and the ``--ledger``/``--unit``
options every releasing command shares (:func:`add_ledger_options`, :func:`cli_charge`)."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from typing import Any

from dpinfer.cli.output import print_json
from dpinfer.defaults import LEDGER
from dpinfer.errors import LedgerError

LEDGER_HELP = (f"charge this release to the privacy-budget ledger PATH, a SQLite file, or postgresql://USER@HOST/DB "
               f"(default: ${LEDGER.env}); refused before the model loads when the unit cannot afford it (dpinfer "
               "budget --help)")


def add_ledger_options(parser: argparse.ArgumentParser, unit_help: str) -> None:
    """``--ledger PATH`` and ``--unit NAME`` on a command that releases."""
    parser.add_argument("--ledger", default=None, metavar="PATH", help=LEDGER_HELP)
    parser.add_argument("--unit", default=None, metavar="NAME", help=unit_help)


def ledger_path(args: argparse.Namespace) -> str | None:
    """``--ledger``, else ``$DPINFER_LEDGER``, else None."""
    return getattr(args, "ledger", None) or os.environ.get(LEDGER.env) or None


def cli_charge(args: argparse.Namespace, *, scope: str, default_unit: Callable[[Any], str] | None = None,
               what: str = "this release") -> Any:
    """The release's charge (:func:`dpinfer.accounting.charge.charge`, a context manager yielding the reservation,
    or None without a ledger) on ``--ledger``/``--unit``: reserved in the block before the model loads, cancelled
    when the block raises (a model that failed to load released nothing), committed when it ends."""
    from dpinfer.accounting.charge import charge

    return charge(ledger_path(args), getattr(args, "unit", None), scope=scope, default_unit=default_unit, what=what)


def report_charge(spend: Any) -> None:
    """One line on standard error after a charged release: the unit, this release's ε, the unit's spend."""
    import sys

    if spend is None or spend.charge is None:
        return
    status = spend.ledger.status(spend.unit)
    print(f"-- charged to unit {spend.unit} of ledger {spend.ledger.path}: this release ε = "
          f"{_eps(spend.charge.epsilon)}; the unit has spent ε = {_eps(status.spent)} of its budget ε = "
          f"{status.epsilon:g} (δ = {status.delta:g})",
          file=sys.stderr)


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--ledger", default=None, metavar="PATH",
                       help=f"the ledger: a SQLite file, or postgresql://USER@HOST:PORT/DB (default: ${LEDGER.env})")
    b = sub.add_parser(
        "budget", parents=[common], help="the privacy-budget ledger: budgets per unit, what is spent",
        description="A persistent privacy-budget ledger (one SQLite file, or one PostgreSQL database shared by many "
                    "machines): every release charged with --ledger is "
                    "composed with the unit's earlier releases by the accountant and refused, before the model "
                    "loads, once the unit's budget would be exceeded. Units: a document (sanitize), a corpus "
                    "(synth), a RAG store (rag ask), a prompt source (protect-prompt); see docs/budget.md.")
    bsub = b.add_subparsers(dest="budget_command", metavar="ACTION", required=True)
    init = bsub.add_parser("init", parents=[common, where], help="create a ledger; set the default budget of new units",
                           description="Create the ledger (or open it) and set the budget a unit gets at its first "
                                       "spend. Without --epsilon, units have no default: each needs `budget set`.")
    init.add_argument("--epsilon", type=float, default=None, help="default ε of a new unit (default: none)")
    init.add_argument("--delta", type=float, default=LEDGER.delta,
                      help=f"default δ of a new unit (default {LEDGER.delta:g}): a unit's releases compose in Rényi "
                           "DP and convert to ε once, at this δ")
    init.set_defaults(func=run_init)
    st = bsub.add_parser("set", parents=[common, where], help="set one unit's budget")
    st.add_argument("unit", metavar="UNIT")
    st.add_argument("--epsilon", type=float, required=True, help="the unit's total ε")
    st.add_argument("--delta", type=float, default=None, help="the unit's δ (default: the ledger's default δ)")
    st.set_defaults(func=run_set)
    sh = bsub.add_parser("show", parents=[common, where], help="budget, spent, left, pending (one unit or all)")
    sh.add_argument("unit", metavar="UNIT", nargs="?", default=None)
    sh.set_defaults(func=run_show)
    hi = bsub.add_parser("history", parents=[common, where], help="every charge of a unit")
    hi.add_argument("unit", metavar="UNIT")
    hi.set_defaults(func=run_history)
    vo = bsub.add_parser("void", parents=[common, where],
                         help="void a pending charge (its process died before releasing anything)")
    vo.add_argument("charge", metavar="CHARGE", type=int)
    vo.set_defaults(func=run_void)
    sd = bsub.add_parser(
        "settle-dead", parents=[common, where], help="settle the pending charges whose holder died",
        description="Settle every pending charge whose holder is dead (a process of this machine that is gone, or "
                    "another holder whose lease ran out) by one rule: a charge still 'reserved' (its holder had not "
                    "started releasing) is cancelled; any other is committed, counted for good. Never an under-count; "
                    "a service runs it at its start. Charges without a holder (older ledgers) are left pending.")
    sd.set_defaults(func=run_settle_dead)


def _open(args: argparse.Namespace, create: bool = False) -> Any:
    from dpinfer.accounting.ledger import Ledger

    path = ledger_path(args)
    if path is None:
        raise LedgerError(f"give the ledger with --ledger PATH (or set {LEDGER.env})")
    return Ledger(path, create=create)


def _eps(value: float, down: bool = False) -> str:
    """ε for display: rounded up (spent), or down (``down``: what is left), so the figure shown stays a bound."""
    from dpinfer.checks import format_up

    if not math.isfinite(value):
        return "∞"
    return f"{-float(format_up(-value)):g}" if down and value > 0 else format_up(value)


def run_init(args: argparse.Namespace) -> int:
    from dpinfer.accounting.ledger import Ledger

    path = ledger_path(args)
    if path is None:
        raise LedgerError(f"give the ledger with --ledger PATH (or set {LEDGER.env})")
    ledger = Ledger.init(path, epsilon=args.epsilon, delta=args.delta)
    eps, delta = ledger.default_budget()
    if args.json:
        print_json({"ledger": str(ledger.path), "default": {"epsilon": eps, "delta": delta}})
    else:
        default = "none (set each unit's with `dpinfer budget set UNIT --epsilon E`)" if eps is None else \
            f"ε = {eps:g}, δ = {delta:g}"
        print(f"ledger {ledger.path}: default budget of a new unit: {default}")
    return 0


def _status_line(s: Any) -> str:
    pending = f", {s.pending} pending (counted)" if s.pending else ""
    return (f"{s.unit}: budget ε = {s.epsilon:g} (δ = {s.delta:g}), spent ε = {_eps(s.spent)}, left ε = "
            f"{_eps(s.left, down=True)}, {s.releases} release{'' if s.releases == 1 else 's'}{pending}"
            + (f", protects a {s.scope}" if s.scope else ""))


def run_set(args: argparse.Namespace) -> int:
    status = _open(args).set_budget(args.unit, args.epsilon, args.delta)
    if args.json:
        print_json(status.to_dict())
    else:
        print(_status_line(status))
    return 0


def run_show(args: argparse.Namespace) -> int:
    ledger = _open(args)
    if args.unit is not None:
        status = ledger.status(args.unit)
        if args.json:
            print_json(status.to_dict())
        else:
            print(_status_line(status))
            if set(status.groups) - {"*"}:
                print("per group: " + ", ".join(f"{name} ε = {_eps(eps)}" for name, eps in status.groups.items()))
            print(status.guarantee())
        return 0
    units = ledger.units()
    eps, delta = ledger.default_budget()
    if args.json:
        print_json({"ledger": str(ledger.path), "default": {"epsilon": eps, "delta": delta},
                    "units": [u.to_dict() for u in units]})
        return 0
    print(f"ledger {ledger.path}: default budget of a new unit: " + ("none" if eps is None else
                                                                      f"ε = {eps:g}, δ = {delta:g}"))
    for status in units:
        print(_status_line(status))
    return 0


def run_history(args: argparse.Namespace) -> int:
    records = _open(args).history(args.unit)
    if args.json:
        print_json({"unit": args.unit, "charges": [r.to_dict() for r in records]})
        return 0
    for r in records:
        d = r.to_dict()
        print(f"#{r.id}\t{d['created']}\t{r.state}\t{r.mechanism}\tε = {_eps(r.epsilon)} alone")
    return 0


def run_void(args: argparse.Namespace) -> int:
    record = _open(args).void(args.charge)
    if args.json:
        print_json(record.to_dict())
    else:
        print(f"charge #{record.id} of unit {record.unit} voided: it no longer counts")
    return 0


def run_settle_dead(args: argparse.Namespace) -> int:
    from dpinfer.accounting.ledger import settle_dead

    settled = settle_dead(_open(args))
    if args.json:
        print_json({"settled": [r.to_dict() for r in settled]})
        return 0
    for r in settled:
        print(f"charge #{r.id} of unit {r.unit} (holder {r.holder}, dead): {r.state}")
    print(f"{len(settled)} pending charge{'' if len(settled) == 1 else 's'} of dead holders settled "
          "(reserved: cancelled; releasing: committed)")
    return 0
