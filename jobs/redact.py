"""Secrets never printed: the one place that blanks passwords and tokens out of URLs and messages.

`redact(text)` replaces, in any text, the password of every `scheme://user:password@host` URL
(`rediss://:TOKEN@host:6379/0` -> `rediss://:***@host:6379/0`) and the value of query parameters
that carry credentials (`?password=`, `token=`, `X-Amz-Signature=`, ...). Every message and log line
that shows a Redis or S3 URL goes through it; `redact_processor` is the structlog safety net that runs
it over every string value of every log event (jobs/log.py), including exception text.

Pure Python, no project imports: the autoscaler Lambda package carries it (through jobs/log.py).
"""

from __future__ import annotations

import re
from collections.abc import MutableMapping
from typing import Any

MASK = "***"

# scheme://[user]:password@ -- the password stops at the first '@' that ends the userinfo.
_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s/@:]*:)(?P<secret>[^\s/@]+)(?P<at>@)")
# scheme://token@host (no colon): Redis's `redis://TOKEN@host` form names the password alone.
_BARE_TOKEN = re.compile(r"(?P<head>\b(?:redis|rediss|unix)://)(?P<secret>[^\s/@:]+)(?P<at>@)")
_QUERY = re.compile(
    r"(?P<head>[?&;](?:password|passwd|pwd|token|auth|auth_token|secret|access_key|secret_key|api_key|"
    r"apikey|x-amz-signature|x-amz-credential|x-amz-security-token|signature|sig)=)(?P<secret>[^&\s#'\"]+)",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """`text` with every URL password and credential-bearing query value replaced by ***."""
    if "://" not in text and "=" not in text:
        return text
    text = _USERINFO.sub(lambda m: m["head"] + MASK + m["at"], text)
    text = _BARE_TOKEN.sub(lambda m: m["head"] + MASK + m["at"], text)
    return _QUERY.sub(lambda m: m["head"] + MASK, text)


def redact_url(url: str | None) -> str:
    """A URL fit to print (None -> "")."""
    return redact(url) if url else ""


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list | tuple):
        return type(value)(_redact_value(v) for v in value)
    if isinstance(value, dict):
        return {k: _redact_value(v) for k, v in value.items()}
    if isinstance(value, BaseException):
        return redact(f"{type(value).__name__}: {value}")
    return value


def redact_processor(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: redact every string in the event (place it after format_exc_info, so
    rendered tracebacks are covered too)."""
    for key, value in list(event.items()):
        event[key] = _redact_value(value)
    return event
