"""OpenAI-Batch JSONL input: one request per line -> a table of custom_id, url, body, line_error.

Each line keeps its `url` (the endpoint) and its raw `body` (JSON text); the worker validates the body
field by field per row (worker/request_body.py). Problems are sorted by reach:

- The whole file (refused at plan time, nothing written): empty, no line is a usable request (not
  JSONL at all), or a custom_id that repeats (OpenAI refuses such a file too).
- One line (that row's error, the job goes on): not JSON, not UTF-8, nested deeper than MAX_DEPTH,
  a lone surrogate escape ("\ud800"), a number past Python's 4,300 digits, not an object, no
  custom_id, an unknown line field, a method other than POST, an unsupported url, a body that is
  not an object. A line
  without a usable custom_id gets the id "line-N" (N: its line number in the file, from 1); a real
  custom_id equal to such a placeholder is refused with the file.

A line without `url` (OpenAI requires one) takes it from its body: `messages` -> chat completions,
`prompt` -> completions, `input` -> responses when it is a list of items or the body has a field only
the Responses API takes (RESPONSES_ONLY), else embeddings. The `url` column always holds one of ENDPOINT_URLS:
a row whose endpoint cannot be told (a line that is not JSON) is marked chat completions.
"""

from __future__ import annotations

import gzip
import io
import json
import zlib
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from contracts.json_nesting import nesting_depth
from jobs.endpoints import CHAT_URL, COMPLETIONS_URL, EMBEDDINGS_URL, ENDPOINT_URLS, RESPONSES_URL
from jobs.errors import InputError

LINE_FIELDS = ("custom_id", "method", "url", "body")
LINE_SHAPE = "each line must be one JSON object {custom_id, method, url, body}"
BATCH_COLUMNS = ("custom_id", "url", "body", "line_error")
SHOW = 5  # repeated ids named in a message, at most
# A batch file is parsed whole in memory, as Python objects several times its bytes (bench/hostile_input.py
# prints a big file's peak memory): OpenAI takes files up to 200 MB; a gzipped one counts decompressed.
DEFAULT_MAX_BYTES = 256 << 20
# The deepest a line's JSON may nest: JSON schemas in response_format run a few dozen levels deep; the
# worker's schema handling recurses per level, so a deeper line would exhaust Python's stack there.
MAX_DEPTH = 128
# Body fields that only a /v1/responses request has: a line without url that gives one is a response.
RESPONSES_ONLY = ("instructions", "max_output_tokens", "text", "include", "previous_response_id", "reasoning",
                  "truncation", "store", "top_logprobs", "metadata")  # fmt: skip


class BatchFileError(InputError):
    """A whole-file problem, with what it is per line: `problems` = (line number or None, code, what)
    (OpenAI's batch error codes: empty_file, invalid_file_format, duplicate_custom_id)."""

    def __init__(self, message: str, problems: tuple[tuple[int | None, str, str], ...]) -> None:
        super().__init__(message)
        self.problems = problems


@dataclass(frozen=True)
class BatchFile:
    """A parsed batch file: `table` (BATCH_COLUMNS, one row per non-blank line) and, per row, the
    text its prompt starts with (system and user messages, the prompt or the input), which the
    planner groups rows by."""

    table: pa.Table
    prompt_texts: list[str]


@dataclass
class _Line:
    custom_id: str | None
    url: str
    body: str | None
    error: str | None
    text: str


def read_batch(url: str, data: bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> BatchFile:
    """Parse a batch file's bytes (gzipped when `url` ends in .gz). InputError for a whole-file problem,
    among them a file over `max_bytes` once decompressed (FREIGHT_MAX_BATCH_FILE_BYTES)."""
    if url.endswith(".gz"):
        data = _gunzip(url, data, max_bytes)
    elif len(data) > max_bytes:
        raise InputError(_too_big(url, len(data), max_bytes))
    lines: list[_Line] = []
    numbers: list[int] = []
    for lineno, raw in enumerate(io.BytesIO(data), start=1):
        if raw.strip():
            lines.append(_parse_line(lineno, raw))
            numbers.append(lineno)
    if not lines:
        raise BatchFileError(f"input {url} is empty: no JSONL lines", ((None, "empty_file", "no JSONL lines"),))
    if all(line.error is not None for line in lines):
        raise BatchFileError(
            f"no line of {url} is an OpenAI-Batch request; {lines[0].error}",
            tuple((n, "invalid_request", line.error or "") for n, line in zip(numbers[:SHOW], lines, strict=False)),
        )
    ids = _ids(url, lines, numbers)
    table = pa.table(
        {
            "custom_id": pa.array(ids, pa.string()),
            "url": pa.array([line.url for line in lines], pa.string()),
            "body": pa.array([line.body for line in lines], pa.string()),
            "line_error": pa.array([line.error for line in lines], pa.string()),
        }
    )
    return BatchFile(table=table, prompt_texts=[line.text for line in lines])


def _gunzip(url: str, data: bytes, max_bytes: int) -> bytes:
    """`data` decompressed, in pieces, stopping at `max_bytes` + 1: a small file that expands a
    thousandfold is refused after `max_bytes` of output, not after all of it."""
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
            out = f.read(max_bytes + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"{url} is not a gzip file ({exc}): name it .jsonl, or gzip it") from None
    if len(out) > max_bytes:
        raise InputError(_too_big(url, None, max_bytes, len(data)))
    return out


def _too_big(url: str, size: int | None, max_bytes: int, compressed: int | None = None) -> str:
    what = f"expands from {compressed} bytes to more than" if compressed is not None else f"has {size} bytes, more than"
    return (f"{url} {what} {max_bytes} (FREIGHT_MAX_BATCH_FILE_BYTES): split it into smaller batch "
            "files, or raise the limit on a machine with the memory for it")  # fmt: skip


def _ids(url: str, lines: list[_Line], numbers: list[int]) -> list[str]:
    """custom_ids, with placeholders for lines without one; InputError for a repeated id."""
    seen: dict[str, list[int]] = {}
    for line, lineno in zip(lines, numbers, strict=True):
        if line.custom_id is not None:
            seen.setdefault(line.custom_id, []).append(lineno)
    repeated = [(cid, nos) for cid, nos in seen.items() if len(nos) > 1]
    if repeated:
        shown = "; ".join(f"{cid!r} on lines {', '.join(map(str, nos))}" for cid, nos in repeated[:SHOW])
        more = f" and {len(repeated) - SHOW} more" if len(repeated) > SHOW else ""
        raise BatchFileError(
            f"{url}: custom_id repeats ({shown}{more}): every request of a batch file needs its own "
            "custom_id, as OpenAI requires",
            tuple((no, "duplicate_custom_id", f"custom_id {cid!r} is also on line {nos[0]}")
                  for cid, nos in repeated for no in nos[1:]),
        )  # fmt: skip
    ids: list[str] = []
    for line, lineno in zip(lines, numbers, strict=True):
        if line.custom_id is None:
            placeholder = f"line-{lineno}"
            if placeholder in seen:
                raise BatchFileError(
                    f"{url}: line {lineno} has no usable custom_id and would be reported as "
                    f"{placeholder!r}, which line {seen[placeholder][0]} uses as its custom_id: rename that id",
                    ((seen[placeholder][0], "duplicate_custom_id", f"custom_id {placeholder!r} names line {lineno} too"),),
                )
            ids.append(placeholder)
        else:
            ids.append(line.custom_id)
    return ids


def _parse_line(lineno: int, raw: bytes) -> _Line:
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        return _Line(None, CHAT_URL, None, f"line {lineno}: not JSON ({exc.msg}): {LINE_SHAPE}", "")
    except UnicodeDecodeError:
        return _Line(None, CHAT_URL, None, f"line {lineno}: not UTF-8 text: {LINE_SHAPE}", "")
    except ValueError:  # Python's int() limit: a number of more than 4,300 digits
        why = "a number has more than 4,300 digits: no request field takes one"
        return _Line(None, CHAT_URL, None, f"line {lineno}: {why}", "")
    except RecursionError:
        why = f"JSON nested deeper than {MAX_DEPTH} levels: no request needs that"
        return _Line(None, CHAT_URL, None, f"line {lineno}: {why}", "")
    if not _unicode(obj):  # "\ud800": a JSON escape of half a UTF-16 pair, which no UTF-8 text holds
        why = r"holds a lone surrogate escape (such as \ud800), which is not Unicode text: escape whole characters"
        return _Line(None, CHAT_URL, None, f"line {lineno}: {why}", "")
    if nesting_depth(obj, MAX_DEPTH) > MAX_DEPTH:
        why = f"JSON nested deeper than {MAX_DEPTH} levels: no request needs that"
        return _Line(None, CHAT_URL, None, f"line {lineno}: {why}", "")
    if not isinstance(obj, dict):
        return _Line(None, CHAT_URL, None, f"line {lineno}: a JSON {type(obj).__name__}: {LINE_SHAPE}", "")
    custom_id = obj.get("custom_id")
    if isinstance(custom_id, int) and not isinstance(custom_id, bool):
        custom_id = str(custom_id)
    if not isinstance(custom_id, str) or not custom_id:
        custom_id = None
    body = obj.get("body")
    url = obj.get("url")
    endpoint = url if url in ENDPOINT_URLS else _endpoint_of(body)
    error = _line_error(obj, custom_id, url, body)
    error = None if error is None else f"line {lineno}: {error}"
    if not isinstance(body, dict):
        return _Line(custom_id, endpoint, None, error, "")
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    return _Line(custom_id, endpoint, text, error, prompt_text(body, endpoint))


def _unicode(value: Any) -> bool:
    """Whether every string in `value` (keys too) is Unicode text Arrow and UTF-8 can hold."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return False
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return True


def _line_error(obj: dict[str, Any], custom_id: str | None, url: Any, body: Any) -> str | None:
    unknown = [k for k in obj if k not in LINE_FIELDS]
    if unknown:
        return f"unknown line field {unknown[0]!r}: {LINE_SHAPE}"
    if custom_id is None:
        return f"custom_id {obj.get('custom_id')!r}: every line needs a custom_id (a non-empty string)"
    method = obj.get("method", "POST")
    if method != "POST":
        return f"method {method!r}: batch requests are POST"
    if url is not None and url not in ENDPOINT_URLS:
        return f"url {url!r} is not supported: use one of {', '.join(ENDPOINT_URLS)}"
    if not isinstance(body, dict):
        return f"body must be a JSON object (the request), not {type(body).__name__ if body is not None else 'missing'}"
    return None


def _endpoint_of(body: Any) -> str:
    if isinstance(body, dict):
        if "messages" not in body and "prompt" in body:
            return COMPLETIONS_URL
        if "messages" not in body and "input" in body:
            items = isinstance(body["input"], list) and any(isinstance(i, dict) for i in body["input"])
            return RESPONSES_URL if items or any(k in body for k in RESPONSES_ONLY) else EMBEDDINGS_URL
    return CHAT_URL


def prompt_text(body: dict[str, Any], url: str = CHAT_URL) -> str:
    """The text a request's prompt starts with, for grouping rows that share a prefix: the messages'
    roles and text in order (a response's: its instructions as a system message, then its input,
    a string input as a user message), the prompt, or the input (anything else: "")."""
    messages = body.get("messages")
    if url == RESPONSES_URL:
        given = body.get("input")
        messages = [{"role": "user", "content": given}] if isinstance(given, str) else given
        if isinstance(body.get("instructions"), str) and isinstance(messages, list):
            messages = [{"role": "system", "content": body["instructions"]}, *messages]
    if isinstance(messages, list):
        parts: list[str] = []
        for m in messages:
            if isinstance(m, dict):
                parts.append(f"{m.get('role')}\n{_content_text(m.get('content'))}\n")
        return "".join(parts)
    for key in ("prompt", "input"):
        value = body.get(key)
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        if isinstance(value, str):
            return value
    return ""


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""
