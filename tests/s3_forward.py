"""Forwarding one request of a loopback S3 proxy (tests/distributed/slow_down_s3.py,
tests/lost_response_s3.py) to the real endpoint behind it (moto), in parts a proxy can stop between:
read the client's body, send it upstream and read the answer, answer the client."""

from __future__ import annotations

import http.client
from http.server import BaseHTTPRequestHandler
from urllib.parse import SplitResult

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "content-length"}


def read_body(handler: BaseHTTPRequestHandler) -> bytes:
    """The request body the client sent (Content-Length or chunked), trailers skipped."""
    if "chunked" in handler.headers.get("Transfer-Encoding", ""):
        data = b""
        while size := int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16):
            data += handler.rfile.read(size)
            handler.rfile.readline()
        while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass  # trailers
        return data
    return handler.rfile.read(int(handler.headers.get("Content-Length") or 0))


def send_upstream(
    handler: BaseHTTPRequestHandler, upstream: SplitResult, body: bytes
) -> tuple[int, list[tuple[str, str]], bytes]:
    """Send the handler's request (with `body`) to `upstream`; -> (status, headers, body) of its answer."""
    headers = {k: v for k, v in handler.headers.items() if k.lower() not in HOP_BY_HOP}
    conn = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=30)
    try:
        conn.request(handler.command, handler.path, body=body or None, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.getheaders(), resp.read()
    finally:
        conn.close()


def answer(handler: BaseHTTPRequestHandler, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
    """Answer the client with an upstream answer (hop-by-hop headers dropped, a fresh Content-Length)."""
    handler.send_response(status)
    for k, v in headers:
        if k.lower() not in HOP_BY_HOP:
            handler.send_header(k, v)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(data)
