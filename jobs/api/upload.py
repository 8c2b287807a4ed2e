"""`POST /v1/files`: a multipart upload streamed into the store as it arrives, never held whole.

The body is parsed piece by piece (python-multipart's streaming parser); the `file` part's bytes go
through the JSONL screen (jobs/api/jsonl_check.py) into an ObjectWriter (a temp file beside the key,
or S3 multipart parts), off the event loop, one piece at a time. Nothing is published until the
caller commits the writer, after every check passed: a refused file, a client that disconnects
mid-upload, or any error leaves no object behind. Past the size limit the rest of the body is read
and dropped (up to twice the limit, so the client sees the answer rather than a reset connection).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from anyio import to_thread
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import Request

from jobs.api.errors import bad_request
from jobs.api.jsonl_check import JsonlCheck
from jobs.storage.base import ObjectWriter

MAX_FIELD_BYTES = 4096  # a form field other than the file (purpose, expires_after[...])
# A worker thread parses, checks and writes the body while the next bytes are received; the pieces
# that arrive meanwhile (as the socket gives them, tens of kB) are handed on together at its next
# hop, at most this many bytes waiting: a hop per piece, awaited before reading on, made an upload
# wait on thread handoffs rather than work (bench/serve_overhead.py measures the upload rate).
HOP_BYTES = 1 << 20


@dataclass
class Upload:
    """A received upload whose bytes wait, unpublished, in `writer` (the caller commits or aborts it)."""

    writer: ObjectWriter
    filename: str
    bytes: int
    lines: int
    fields: dict[str, str] = field(default_factory=dict)  # the other form fields


class _Receiver:
    """python-multipart callbacks: headers and fields kept, the file part fed to the check and writer."""

    def __init__(self, open_writer: Callable[[], ObjectWriter], max_bytes: int, max_lines: int) -> None:
        self.open_writer, self.max_bytes = open_writer, max_bytes
        self.check = JsonlCheck(max_lines)
        self.writer: ObjectWriter | None = None
        self.filename: str | None = None
        self.fields: dict[str, str] = {}
        self.file_bytes = 0
        self.too_big = False
        self._header_field = bytearray()
        self._header_value = bytearray()
        self._headers: dict[bytes, bytes] = {}
        self._name: str | None = None
        self._value = bytearray()
        self._in_file = False

    def callbacks(self) -> dict[str, Callable[..., None]]:
        return {
            "on_part_begin": self._part_begin,
            "on_header_field": lambda d, s, e: self._header_field.extend(d[s:e]),
            "on_header_value": lambda d, s, e: self._header_value.extend(d[s:e]),
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
        }

    def _part_begin(self) -> None:
        self._headers, self._name, self._in_file = {}, None, False
        self._value = bytearray()

    def _header_end(self) -> None:
        self._headers[bytes(self._header_field).lower()] = bytes(self._header_value)
        self._header_field, self._header_value = bytearray(), bytearray()

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        self._name = options.get(b"name", b"").decode("utf-8", "replace")
        if self._name == "file":
            if self.writer is not None:
                raise bad_request("The upload holds more than one 'file' part: send one file.", "file")
            self.filename = options.get(b"filename", b"").decode("utf-8", "replace") or "upload.jsonl"
            self.writer = self.open_writer()
            self._in_file = True

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if not self._in_file:
            if len(self._value) + end - start > MAX_FIELD_BYTES:
                raise bad_request(f"Form field '{self._name}' is longer than {MAX_FIELD_BYTES} bytes.", self._name)
            self._value.extend(data[start:end])
            return
        self.file_bytes += end - start
        if self.file_bytes > self.max_bytes:
            self.too_big = True
        if self.too_big or self.check.problem is not None:
            return  # counted and dropped: the answer will refuse the file
        piece = data[start:end]
        self.check.feed(piece)
        assert self.writer is not None  # invariant: _in_file is set only with a writer
        self.writer.write(piece)

    def _part_end(self) -> None:
        if not self._in_file and self._name:
            self.fields[self._name] = self._value.decode("utf-8", "replace")
        self._in_file = False

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.abort()


async def receive_upload(
    request: Request, open_writer: Callable[[], ObjectWriter], max_bytes: int, max_lines: int
) -> Upload:
    """Stream the request's multipart body; the `file` part goes into `open_writer()`'s writer.

    Raises APIError (400) for a body that is not multipart form data, a missing file, a file that is
    not JSONL, over `max_bytes` or over `max_lines` requests; the writer is aborted then.
    """
    ctype, options = parse_options_header(request.headers.get("content-type", ""))
    boundary = options.get(b"boundary")
    if ctype != b"multipart/form-data" or not boundary:
        raise bad_request(
            f"Content-Type {request.headers.get('content-type', '(none)')!r}: upload a file as "
            "multipart/form-data with the fields 'file' and 'purpose'.", code="unsupported_content_type",
        )  # fmt: skip
    receiver = _Receiver(open_writer, max_bytes, max_lines)
    try:
        parser = MultipartParser(boundary, receiver.callbacks())  # type: ignore[arg-type]
    except MultipartParseError as exc:
        raise bad_request(f"The multipart boundary is unusable ({exc}).", code="invalid_multipart") from None
    drop_limit = 2 * max_bytes + (1 << 20)
    received = 0
    pending = bytearray()  # body bytes received and not handed on yet: HOP_BYTES at most, plus a piece
    hop: asyncio.Future[None] | None = None  # the piece being parsed, while the next one is received

    def parse(data: bytes, final: bool) -> None:
        if data:
            parser.write(data)
        if final:
            parser.finalize()

    try:
        async for chunk in request.stream():
            received += len(chunk)
            if received > drop_limit:
                break  # answered now; the server closes the connection on the unread rest
            pending += chunk
            if hop is None or hop.done() or len(pending) >= HOP_BYTES:
                if hop is not None:
                    await hop  # pieces are parsed in order, one at a time
                data = bytes(pending)
                pending.clear()
                hop = asyncio.ensure_future(to_thread.run_sync(parse, data, False))
        else:
            if hop is not None:
                await hop
            hop = None
            await to_thread.run_sync(parse, bytes(pending), True)
        if hop is not None:
            await hop
        return _accepted(receiver, max_bytes)
    except MultipartParseError as exc:
        await _settled(hop)
        receiver.abort()
        raise bad_request(f"The multipart body is malformed ({exc}).", code="invalid_multipart") from None
    except BaseException:  # a disconnect (ClientDisconnect), a refusal, a storage error: no object
        await _settled(hop)
        receiver.abort()
        raise


async def _settled(hop: asyncio.Future[None] | None) -> None:
    """Wait for a piece still being parsed (its thread cannot be stopped) before the writer is aborted."""
    if hop is not None and not hop.done():
        await asyncio.wait([hop])
    if hop is not None and not hop.cancelled():
        hop.exception()  # retrieved: the error that matters is the one being raised


def _accepted(receiver: _Receiver, max_bytes: int) -> Upload:
    """The upload when every check passed; APIError (the writer aborted by the caller's handler) else."""
    if receiver.writer is None:
        raise bad_request("Missing required parameter: 'file'.", "file", "missing_required_parameter")
    if receiver.too_big:
        raise bad_request(f"The file is larger than this server's limit of {max_bytes:,} bytes: split it "
                          "into several batches.", "file", "file_too_large")  # fmt: skip
    problem = receiver.check.finish()
    if problem is not None:
        raise bad_request(f"Invalid batch file: {problem.message}.", "file", problem.code)
    return Upload(
        writer=receiver.writer, filename=receiver.filename or "upload.jsonl", bytes=receiver.file_bytes,
        lines=receiver.check.lines, fields=receiver.fields,
    )  # fmt: skip
