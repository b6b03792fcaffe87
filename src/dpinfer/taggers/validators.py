"""The validators of dpinfer's recognisers (:mod:`dpinfer.taggers.patterns`): checksums (Luhn, IBAN mod-97), digit
counts, address syntax and URL trimming, run on a pattern's match to keep, drop or trim it.

>>> luhn_ok("4111 1111 1111 1111"), iban_prefix("GB82 WEST 1234 5698 7654 32"), trim_url("x.org/a).")
(True, 27, 7)
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable

Validator = Callable[[str], "bool | int | None"]
"""Receives the matched string; returns True (keep), False/None/0 (drop) or a positive int: keep that many
leading characters (used to trim trailing punctuation or find the longest valid prefix)."""


def digits(s: str) -> int:
    return sum(c.isdigit() for c in s)


def luhn_ok(s: str) -> bool:
    ds = [int(c) for c in s if c.isdigit()]
    if not 12 <= len(ds) <= 19:
        return False
    total = 0
    for i, d in enumerate(reversed(ds)):
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def iban_ok(compact: str) -> bool:
    s = compact.upper()
    if not 15 <= len(s) <= 34 or not (s[:2].isalpha() and s[2:4].isdigit() and s.isalnum()):
        return False
    rearranged = s[4:] + s[:4]
    try:
        return int("".join(str(int(c, 36)) for c in rearranged)) % 97 == 1
    except ValueError:
        return False


def iban_prefix(s: str) -> int:
    """Longest prefix of the match (ending on an alphanumeric) that is a valid IBAN."""
    for end in range(len(s), 14, -1):
        if not s[end - 1].isalnum():
            continue
        if iban_ok(s[:end].replace(" ", "")):
            return end
    return 0


def phone_ok(lo: int, hi: int) -> Validator:
    return lambda s: lo <= digits(s) <= hi


def trim_url(s: str) -> int:
    end = len(s)
    while end > 0 and s[end - 1] in ".,;:!?)]}'\"":
        end -= 1
    return end


def ipv6_ok(s: str) -> bool:
    if s.count(":") < 2:
        return False
    try:
        ipaddress.IPv6Address(s)
    except ValueError:
        return False
    return True


def numeric_date_ok(s: str) -> bool:
    parts = re.split(r"[./-]", s)
    if len(parts) != 3:
        return False
    a, b, _ = (int(p) for p in parts)
    if len(parts[2]) not in (2, 4):
        return False
    # D/M/Y or M/D/Y
    return (1 <= a <= 31 and 1 <= b <= 12) or (1 <= a <= 12 and 1 <= b <= 31)


def id_ok(s: str) -> bool:
    compact = s.replace("-", "")
    return len(compact) >= 6 and digits(compact) >= 2 and any(c.isalpha() for c in compact)
