"""Sizes and durations as a user writes them in a flag (200MiB, 10GB; 30d, 12h), with the words for
"no limit"; `freight serve` and `freight keys` read their limits with them.
"""

from __future__ import annotations

import re

from jobs.errors import FreightError

_SIZE = re.compile(r"(\d+)\s*(|k|m|g|t)(i?)b?", re.IGNORECASE)


def parse_size(text: str, flag: str) -> int | None:
    """Bytes from 200MiB, 10GB, 5000000 (`none`: no limit); FreightError otherwise."""
    if text.strip().lower() in ("none", "unlimited"):
        return None
    match = _SIZE.fullmatch(text.strip())
    if not match:
        raise FreightError(f"{flag} {text!r}: give a size such as 200MiB, 10GB or 5000000 (or none)")
    digits, unit, binary = match.groups()
    base = 1024 if binary else 1000
    return int(digits) * base ** " kmgt".index(unit.lower() or " ")


def parse_ttl(text: str, flag: str) -> int | None:
    """Seconds from 30d, 12h, 90m (`never`: files are kept until deleted); FreightError otherwise."""
    from jobs.lifecycle import parse_window

    if text.strip().lower() in ("never", "none"):
        return None
    try:
        return int(parse_window(text, minimum=1, name=flag))
    except ValueError as exc:
        raise FreightError(str(exc)) from None
