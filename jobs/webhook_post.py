"""One webhook try: a POST to the checked address, no redirects, under one total deadline.

`post_webhook` resolves the URL's host and checks every address (jobs/webhook_address.py), then
connects to the checked address itself (HTTP's Host header and TLS's server name and certificate
check still use the URL's host), so the address that was checked is the address that is reached.
A 3xx answer is a failed try: a redirect is never followed (a receiver could point a signed POST,
or its retry as a GET, anywhere). The whole try (connect, TLS, send, the answer's status line and
headers) shares one deadline: a watchdog shuts the socket down when it passes, so a receiver that
trickles a byte every few seconds holds a sender no longer than a silent one. The answer's body is
never read. A URL's `user:password@` is sent as HTTP basic authentication.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import socket
import ssl
import threading
from collections.abc import Iterable, Mapping
from urllib.parse import unquote, urlunsplit

from jobs.webhook_address import IPNetwork, Resolver, WebhookDestination, resolve_webhook, system_resolver


class WebhookSendError(OSError):
    """A try that got no 2xx: refused, timed out, redirected or answered an error status."""


def _pinned(conn: http.client.HTTPConnection, dest: WebhookDestination) -> http.client.HTTPConnection:
    """`conn` (made for the URL's host: its Host header, TLS server name and certificate check)
    connecting to the checked address instead of resolving the host again. http.client opens its
    socket through the instance's `_create_connection` (socket.create_connection by default)."""

    def create_connection(address, timeout, source_address=None):  # type: ignore[no-untyped-def]
        return socket.create_connection((dest.address, dest.port), timeout, source_address)

    conn._create_connection = create_connection  # type: ignore[attr-defined]
    return conn


def _abort(conn: http.client.HTTPConnection, fired: threading.Event) -> None:
    fired.set()
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked send or recv on the sender's thread


def post_webhook(
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    deadline_s: float,
    allow: Iterable[IPNetwork],
    resolver: Resolver = system_resolver,
) -> int:
    """POST `body` to `url` once; returns the 2xx status. Raises WebhookAddressError (a ValueError)
    when the host resolves to an address that may not be reached, WebhookSendError otherwise."""
    dest = resolve_webhook(url, allow, resolver)
    if dest.url.scheme.lower() == "https":
        conn = http.client.HTTPSConnection(dest.host, dest.port, timeout=deadline_s,
                                           context=ssl.create_default_context())  # fmt: skip
    else:
        conn = http.client.HTTPConnection(dest.host, dest.port, timeout=deadline_s)
    _pinned(conn, dest)
    fired = threading.Event()
    watchdog = threading.Timer(deadline_s, _abort, (conn, fired))
    watchdog.daemon = True
    watchdog.start()
    path = urlunsplit(("", "", dest.url.path or "/", dest.url.query, ""))
    headers = dict(headers)
    if dest.url.username is not None:  # https://user:pass@host/: HTTP basic authentication
        userinfo = f"{unquote(dest.url.username)}:{unquote(dest.url.password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(userinfo.encode()).decode()
    try:
        conn.request("POST", path, body=body, headers=headers)
        status = conn.getresponse().status
    except (OSError, http.client.HTTPException) as exc:
        if fired.is_set():
            raise WebhookSendError(f"no answer within {deadline_s:g} s (FREIGHT_NOTIFY_TIMEOUT_S)") from None
        raise WebhookSendError(f"{type(exc).__name__}: {exc}") from None
    finally:
        watchdog.cancel()
        conn.close()
    if 300 <= status < 400:
        raise WebhookSendError(f"answered {status}, a redirect: redirects are not followed; give the final URL")
    if not 200 <= status < 300:
        raise WebhookSendError(f"answered {status}, not 2xx")
    return status
