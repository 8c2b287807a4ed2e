"""The screen an uploaded batch file passes while it streams in: JSONL of objects, within the limits.

Checked per line, in one pass, at the cost of a byte scan (the file is never parsed whole here):
UTF-8 text; every non-blank line starts with `{` and ends with `}`; the first one parses as a JSON
object; at most `max_lines` non-blank lines. What a line says (custom_id, url, body) is the batch's
validation (jobs/batch_input.py), where a bad line is that request's error, not the file's.
"""

from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """Why the file is refused: an error `code` (OpenAI-style) and the message, naming the line."""

    code: str
    message: str


# whitespace as bytes.strip() takes it, newlines included: a run of it holds blank lines only
_WHITESPACE = re.compile(rb"[ \t\n\r\x0b\x0c]*")
_TRAILING = b" \t\r\x0b\x0c"
_OPEN, _CLOSE = ord("{"), ord("}")


class JsonlCheck:
    """Feed the file's bytes in order (`feed`), then `finish`; `problem` is the first one found (the
    rest of the file is then only counted). `lines`: non-blank lines so far.

    Lines are found by searching the bytes in place (no line is copied but the first, which is
    parsed): the check stays a small part of an upload's cost (bench/serve_overhead.py)."""

    def __init__(self, max_lines: int) -> None:
        self.max_lines = max_lines
        self.lines = 0
        self.problem: Problem | None = None
        self._lineno = 0  # line ends seen
        self._tail = b""  # the unfinished last line (no newline in it)
        self._utf8 = codecs.getincrementaldecoder("utf-8")()

    def feed(self, data: bytes) -> None:
        if self.problem is not None:
            return
        try:
            self._utf8.decode(data)
        except UnicodeDecodeError as exc:
            line = self._lineno + 1 + data.count(b"\n", 0, max(exc.start, 0))  # the tail holds no newline
            self._refuse("invalid_file_format", f"line {line} is not UTF-8 text: a batch file is JSONL, one "
                         "JSON request object per line, in UTF-8")  # fmt: skip
            return
        self._tail = self._scan(self._tail + data if self._tail else data, final=False)

    def finish(self) -> Problem | None:
        if self.problem is None:
            try:
                self._utf8.decode(b"", final=True)
            except UnicodeDecodeError:
                self._refuse("invalid_file_format", "the file ends inside a UTF-8 character: not UTF-8 text")
        if self.problem is None and self._tail:
            self._scan(self._tail, final=True)
            self._tail = b""
        if self.problem is None and self.lines == 0:
            self._refuse("empty_file", "the file holds no request: one JSON request object per line")
        return self.problem

    def _scan(self, block: bytes, final: bool) -> bytes:
        """Check the whole lines of `block` (and, `final`, its unended last one); returns the unended
        rest, to be continued by the next piece."""
        pos, size = 0, len(block)
        while self.problem is None:
            start = _WHITESPACE.match(block, pos).end()  # type: ignore[union-attr]  # always matches
            self._lineno += block.count(b"\n", pos, start)  # blank lines, and the end of the last line
            if start >= size:
                return b""
            end = block.find(b"\n", start)
            if end < 0:
                if not final:
                    return block[start:]
                end = size
            last = end
            while block[last - 1] in _TRAILING:  # block[start] is not whitespace: the loop stops there
                last -= 1
            self._line(block, start, last)
            pos = end
        return b""

    def _line(self, block: bytes, start: int, end: int) -> None:
        """The non-blank line block[start:end] (stripped): line number self._lineno + 1."""
        lineno = self._lineno + 1
        self.lines += 1
        if self.lines > self.max_lines:
            self._refuse("too_many_requests", f"the file holds more than {self.max_lines:,} requests (line "
                         f"{lineno} is request {self.lines:,}): split it into several batches")  # fmt: skip
            return
        if block[start] != _OPEN or block[end - 1] != _CLOSE:
            self._refuse("invalid_file_format", f"line {lineno} is not a JSON object: a batch file is "
                         "JSONL, one request object {\"custom_id\", \"method\", \"url\", \"body\"} per line")  # fmt: skip
            return
        if self.lines == 1:
            try:
                json.loads(block[start:end])
            except ValueError as exc:
                self._refuse("invalid_file_format", f"line {lineno} is not JSON ({exc}): a batch file is "
                             "JSONL, one request object per line")  # fmt: skip

    def _refuse(self, code: str, message: str) -> None:
        self.problem = Problem(code, message)
