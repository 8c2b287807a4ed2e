"""A stuck S3 endpoint on 127.0.0.1 for the node keeper tests: it accepts every connection and reads
the request, then answers nothing until `release()` (an S3 endpoint that hangs, as boto3 meets it:
no error, no answer, for its whole read timeout). Released, it answers as an empty bucket: HEAD and
GET of a key 404 NoSuchKey, a ListObjectsV2 an empty listing."""

from __future__ import annotations

import time
from urllib.parse import parse_qs, urlsplit

from loopback_server import LoopbackServer, QuietHandler

_NO_SUCH_KEY = b"<?xml version='1.0'?><Error><Code>NoSuchKey</Code><Message>none</Message></Error>"
_EMPTY_LISTING = (
    "<?xml version='1.0' encoding='UTF-8'?><ListBucketResult xmlns='http://s3.amazonaws.com/doc/2006-03-01/'>"
    "<Name>{bucket}</Name><Prefix>{prefix}</Prefix><KeyCount>0</KeyCount><MaxKeys>1000</MaxKeys>"
    "<IsTruncated>false</IsTruncated></ListBucketResult>"
)


class StuckS3(LoopbackServer):
    """`requests`: (method, path) of every request in arrival order; `held` of them unanswered now."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        self.held = 0
        outer = self

        class Handler(QuietHandler):
            def do_HEAD(self) -> None:  # noqa: N802
                self._answer(with_body=False)

            def do_GET(self) -> None:  # noqa: N802
                self._answer(with_body=True)

            def _answer(self, *, with_body: bool) -> None:
                url = urlsplit(self.path)
                with outer.lock:
                    outer.requests.append((self.command, self.path))
                    outer.held += 1
                outer.released.wait(60)
                with outer.lock:
                    outer.held -= 1
                query = parse_qs(url.query)
                if with_body and "list-type" in query:
                    bucket = url.path.strip("/").split("/")[0]
                    prefix = query.get("prefix", [""])[0]
                    status, data = 200, _EMPTY_LISTING.format(bucket=bucket, prefix=prefix).encode()
                else:
                    status, data = 404, _NO_SUCH_KEY
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if with_body:
                        self.wfile.write(data)
                except OSError:
                    pass  # the client gave up

        super().__init__(Handler)

    def wait_held(self, n: int = 1, timeout: float = 10.0) -> bool:
        """Wait until `n` requests are held unanswered."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.held >= n:
                return True
            time.sleep(0.02)
        return False

