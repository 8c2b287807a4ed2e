"""Ids of files and batches: time-ordered, unguessable, and checked before they name a store key.

`file-` / `batch_` + 11 hex digits of Unix milliseconds + 16 random hex digits. Fixed width, so the
order of ids (and of the store keys named by them) is the order of creation, which listings page
through without reading any record; 64 random bits per millisecond keep concurrent creates distinct
and ids unguessable. An id from a request is matched against its pattern before it becomes part of
a key, so no request can name a key outside its tenant's prefix.
"""

from __future__ import annotations

import re
import secrets
import time

FILE_PREFIX = "file-"
BATCH_PREFIX = "batch_"
_PATTERN = {prefix: re.compile(re.escape(prefix) + r"[0-9a-f]{27}") for prefix in (FILE_PREFIX, BATCH_PREFIX)}


def new_id(prefix: str, now: float | None = None) -> str:
    """A fresh id of this kind (`FILE_PREFIX` or `BATCH_PREFIX`), created at `now` (default: now)."""
    ms = int((time.time() if now is None else now) * 1000)
    return f"{prefix}{ms:011x}{secrets.token_hex(8)}"


def is_id(prefix: str, value: str) -> bool:
    """Whether `value` is an id of this kind (and so safe inside a store key)."""
    return _PATTERN[prefix].fullmatch(value) is not None
