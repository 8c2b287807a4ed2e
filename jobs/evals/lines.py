"""Where each key of a TOML document sits: tomllib gives values only, errors need line numbers.

A light scan of the raw text, not a second parser: table headers (`[a.b]`, `[[a.b]]`) and
`key = ...` lines are mapped to paths like ("suite", 0, "metrics", 1, "type"). Keys inside
multi-line inline values fall back to the line of their nearest located ancestor.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

PathPart = str | int
_ARRAY_HEADER = re.compile(r"^\s*\[\[\s*([^\[\]]+?)\s*\]\]\s*(#.*)?$")
_TABLE_HEADER = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")
_KEY_LINE = re.compile(
    r"^\s*((?:[A-Za-z0-9_\-]+|\"[^\"]*\"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_\-]+|\"[^\"]*\"|'[^']*'))*)\s*="
)


def _split_key(dotted: str) -> list[str]:
    parts = re.findall(r"\"[^\"]*\"|'[^']*'|[A-Za-z0-9_\-]+", dotted)
    return [p[1:-1] if p[:1] in "\"'" else p for p in parts]


class LineIndex:
    """Path of keys and array indices -> 1-based line number, for error messages."""

    def __init__(self, text: str) -> None:
        self._lines: dict[tuple[PathPart, ...], int] = {}
        # index of the current element of each array of tables, keyed by its resolved path
        current: dict[tuple[PathPart, ...], int] = {}
        table: tuple[PathPart, ...] = ()
        multiline_string = False
        for number, line in enumerate(text.splitlines(), start=1):
            if line.count('"""') % 2 == 1 or line.count("'''") % 2 == 1:
                multiline_string = not multiline_string
                if not multiline_string:
                    continue
            elif multiline_string:
                continue
            array = _ARRAY_HEADER.match(line)
            header = array or _TABLE_HEADER.match(line)
            if header:
                table = self._resolve(_split_key(header.group(1)), current)
                if array:
                    current[table] = current.get(table, -1) + 1
                    table = (*table, current[table])
                self._lines.setdefault(table, number)
                continue
            key = _KEY_LINE.match(line)
            if key:
                self._lines.setdefault((*table, *_split_key(key.group(1))), number)

    @staticmethod
    def _resolve(keys: list[str], current: dict[tuple[PathPart, ...], int]) -> tuple[PathPart, ...]:
        """`a.b` under the latest `[[a]]` element means ("a", i, "b")."""
        path: tuple[PathPart, ...] = ()
        for i, key in enumerate(keys):
            path = (*path, key)
            if i < len(keys) - 1 and path in current:
                path = (*path, current[path])
        return path

    def line_of(self, path: Sequence[PathPart]) -> int | None:
        """Line of `path`, or of its nearest ancestor that has one; None for an empty document."""
        parts = tuple(path)
        while parts:
            if parts in self._lines:
                return self._lines[parts]
            parts = parts[:-1]
        return None
