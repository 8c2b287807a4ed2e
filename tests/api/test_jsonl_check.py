"""The upload screen (jobs/api/jsonl_check.py) finds, in any chunking of a file, what a plain
line-by-line reading of the whole file finds: the same first problem, named by the same line, and the
same count of requests."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.api.jsonl_check import JsonlCheck, Problem

LINES = st.sampled_from([
    b'{"custom_id": "a", "body": {}}', b'  {"custom_id": "b"}\r', b"", b"   ", b"\t\r", b"{not json}", b"id,prompt",
    b'{"a": 1} trailing', b"[1, 2]", b"{}", b'{"x": "caf\xc3\xa9"}',
])  # fmt: skip


def reference(data: bytes, max_lines: int) -> tuple[Problem | None, int]:
    """The whole file read line by line: the first problem and the requests counted up to it."""
    requests = 0
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        line = raw.strip()
        if not line:
            continue
        requests += 1
        if requests > max_lines:
            return Problem("too_many_requests", f"the file holds more than {max_lines:,} requests (line {lineno} is "
                           f"request {requests:,}): split it into several batches"), requests  # fmt: skip
        if line[:1] != b"{" or line[-1:] != b"}":
            return Problem("invalid_file_format", f"line {lineno} is not a JSON object: a batch file is JSONL, one "
                           'request object {"custom_id", "method", "url", "body"} per line'), requests  # fmt: skip
        if requests == 1:
            try:
                json.loads(line)
            except ValueError as exc:
                return Problem("invalid_file_format", f"line {lineno} is not JSON ({exc}): a batch file is JSONL, "
                               "one request object per line"), requests  # fmt: skip
    if requests == 0:
        return Problem("empty_file", "the file holds no request: one JSON request object per line"), 0
    return None, requests


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(lines=st.lists(LINES, max_size=12), ends=st.booleans(), cuts=st.lists(st.integers(0, 400), max_size=6),
       max_lines=st.integers(1, 8))  # fmt: skip
def test_any_chunking_finds_what_a_line_by_line_reading_finds(
    lines: list[bytes], ends: bool, cuts: list[int], max_lines: int
) -> None:
    data = b"\n".join(lines) + (b"\n" if ends else b"")
    check = JsonlCheck(max_lines)
    at = 0
    for cut in sorted(c for c in cuts if c <= len(data)):
        check.feed(data[at:cut])
        at = cut
    check.feed(data[at:])
    problem = check.finish()
    expected, requests = reference(data, max_lines)
    assert problem == expected
    assert check.lines == requests


def test_a_byte_that_is_not_utf8_is_named_by_its_line_in_any_piece() -> None:
    data = b'{"a": 1}\n\n{"b": 2}\n{"c": "\xff"}\n'
    for cut in range(len(data)):
        check = JsonlCheck(10)
        check.feed(data[:cut])
        check.feed(data[cut:])
        problem = check.finish()
        assert problem is not None and problem.message.startswith("line 4 is not UTF-8 text"), (cut, problem)
