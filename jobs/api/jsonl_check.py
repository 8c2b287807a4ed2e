"""The screen an uploaded batch file passes while it streams in: JSONL of objects, within the limits.

Checked per line, in one pass, at the cost of a byte scan (the file is never parsed whole here):
UTF-8 text; every non-blank line starts with `{` and ends with `}`; the first one parses as a JSON
object; at most `max_lines` non-blank lines. What a line says (custom_id, url, body) is the batch's
validation (jobs/batch_input.py), where a bad line is that request's error, not the file's.
"""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """Why the file is refused: an error `code` (OpenAI-style) and the message, naming the line."""

    code: str
    message: str


class JsonlCheck:
    """Feed the file's bytes in order (`feed`), then `finish`; `problem` is the first one found (the
    rest of the file is then only counted). `lines`: non-blank lines so far."""

    def __init__(self, max_lines: int) -> None:
        self.max_lines = max_lines
        self.lines = 0
        self.problem: Problem | None = None
        self._lineno = 0  # lines seen, blank ones included
        self._tail = b""  # the unfinished last line
        self._utf8 = codecs.getincrementaldecoder("utf-8")()

    def feed(self, data: bytes) -> None:
        if self.problem is not None:
            return
        try:
            self._utf8.decode(data)
        except UnicodeDecodeError as exc:
            line = self._lineno + 1 + data.count(b"\n", 0, max(exc.start, 0))
            self._refuse("invalid_file_format", f"line {line} is not UTF-8 text: a batch file is JSONL, one "
                         "JSON request object per line, in UTF-8")  # fmt: skip
            return
        pieces = (self._tail + data).split(b"\n")
        self._tail = pieces.pop()
        for line in pieces:
            self._line(line)
            if self.problem is not None:
                return

    def finish(self) -> Problem | None:
        if self.problem is None:
            try:
                self._utf8.decode(b"", final=True)
            except UnicodeDecodeError:
                self._refuse("invalid_file_format", "the file ends inside a UTF-8 character: not UTF-8 text")
        if self.problem is None and self._tail:
            self._line(self._tail)
            self._tail = b""
        if self.problem is None and self.lines == 0:
            self._refuse("empty_file", "the file holds no request: one JSON request object per line")
        return self.problem

    def _line(self, raw: bytes) -> None:
        self._lineno += 1
        line = raw.strip()
        if not line:
            return
        self.lines += 1
        if self.lines > self.max_lines:
            self._refuse("too_many_requests", f"the file holds more than {self.max_lines:,} requests (line "
                         f"{self._lineno} is request {self.lines:,}): split it into several batches")  # fmt: skip
            return
        if line[:1] != b"{" or line[-1:] != b"}":
            self._refuse("invalid_file_format", f"line {self._lineno} is not a JSON object: a batch file is "
                         "JSONL, one request object {\"custom_id\", \"method\", \"url\", \"body\"} per line")  # fmt: skip
            return
        if self.lines == 1:
            try:
                json.loads(line)
            except ValueError as exc:
                self._refuse("invalid_file_format", f"line {self._lineno} is not JSON ({exc}): a batch file is "
                             "JSONL, one request object per line")  # fmt: skip

    def _refuse(self, code: str, message: str) -> None:
        self.problem = Problem(code, message)
