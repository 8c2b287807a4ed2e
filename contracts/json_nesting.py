"""How deeply untrusted JSON nests: both planes bound it (a request line, a row's JSON schema) before
recursing into it, so a deeply nested value is that row's error, never a RecursionError."""

from __future__ import annotations

from typing import Any


def nesting_depth(value: Any, limit: int) -> int:
    """How deep objects (dicts) and arrays (lists) nest in `value`: 0 for a scalar, 1 for a flat
    list. Counted without recursion; counting stops one level past `limit` (a result > limit says
    only "too deep")."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d)
            if d <= limit:
                stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest
