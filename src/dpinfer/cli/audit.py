"""``dpinfer audit MECHANISM``: the empirical privacy audit (:mod:`dpinfer.audit.command` holds its options)."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    from dpinfer.audit import command as audit_command  # light: torch loads only when the audit runs

    au = sub.add_parser("audit", parents=[common], help="empirical privacy audit: audited ε lower bound vs the claim",
                        description=audit_command.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    audit_command.add_arguments(au)
    au.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dpinfer.audit import command as audit_command

    return int(audit_command.run(args) or 0)
