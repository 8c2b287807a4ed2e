"""Notification targets as submit checks and stores them, and as a sender opens them.

A webhook URL may carry a credential (`https://hooks.example.com/x?token=...`, `https://user:pass@
host/`). OUT/lifecycle.json and the claims under OUT/notify/ are plain JSON that anyone who reads
the job's results can read, so such a URL is stored sealed: its redacted form (for people and logs)
then ` sealed:` and a Fernet token (AES-128-CBC + HMAC-SHA256, from `cryptography`) of the whole
URL, keyed by HKDF-SHA256 of FREIGHT_WEBHOOK_SECRET, the key that signs the deliveries:

    https://hooks.example.com/x?token=*** sealed:gAAAAABm...

A URL without a credential is stored as given. Submitting a URL with a credential without
FREIGHT_WEBHOOK_SECRET set is refused (nothing could open it again). A URL holds no whitespace
(jobs/lifecycle.py refuses it), so the first space ends the shown part.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from jobs.redact import redact
from jobs.settings import Settings
from jobs.webhook_address import Resolver, check_webhook_url, system_resolver

_SEALED = " sealed:"


def _fernet(secret: str) -> Fernet:
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"freight notify target v1").derive(
        secret.encode()
    )
    return Fernet(base64.urlsafe_b64encode(key))


def is_webhook(target: str) -> bool:
    return not target.startswith("sns:")


def shown_target(stored: str) -> str:
    """The stored target fit to print: its redacted URL (or SNS ARN)."""
    return redact(stored.split(_SEALED, 1)[0])


def seal_target(url: str, secret: str | None) -> str:
    """`url` as stored: as is without a credential, sealed with one (ValueError without a secret)."""
    if redact(url) == url:
        return url
    if not secret:
        raise ValueError(
            f"--notify {redact(url)!r} carries a credential: set FREIGHT_WEBHOOK_SECRET (it signs the "
            "deliveries and seals such URLs in OUT/lifecycle.json), or give a URL without one"
        )
    return redact(url) + _SEALED + _fernet(secret).encrypt(url.encode()).decode()


def open_target(stored: str, secret: str | None) -> str:
    """The URL a stored target names; ValueError when it is sealed and `secret` cannot open it."""
    shown, sep, token = stored.partition(_SEALED)
    if not sep:
        return stored
    if not secret:
        raise ValueError(f"{shown} is sealed, and FREIGHT_WEBHOOK_SECRET is not set: set the secret it was submitted with")
    try:
        return _fernet(secret).decrypt(token.encode()).decode()
    except (InvalidToken, UnicodeDecodeError):
        raise ValueError(
            f"{shown} was sealed with another FREIGHT_WEBHOOK_SECRET: set the secret it was submitted with"
        ) from None


def submit_targets(
    targets: Iterable[str], settings: Settings, resolver: Resolver = system_resolver
) -> tuple[str, ...]:
    """`--notify` targets checked as submit checks them and in their stored form: each webhook's host
    resolves to addresses it may reach (jobs/webhook_address.py) and a credential is sealed;
    ValueError (one line) for the first that fails."""
    secret = settings.webhook_secret.get_secret_value() if settings.webhook_secret else None
    stored = []
    for target in targets:
        if is_webhook(target):
            try:
                check_webhook_url(target, settings.notify_allow_networks, resolver)
            except ValueError as exc:
                raise ValueError(f"--notify {redact(target)!r}: {exc}") from None
            target = seal_target(target, secret)
        stored.append(target)
    return tuple(stored)
