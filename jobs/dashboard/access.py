"""Who is looking: a tenant signed in with its API key, or, in a store without keys, the one local user.

- With API keys in the store, a browser signs in with a key once; the session cookie then holds the
  tenant and the key's SHA-256 (never the key), signed with the dashboard's secret (itsdangerous)
  and at most SESSION_S old. Each request checks the key is still active, through the API's
  Authenticator cache, so revoking a key ends its sessions within a second.
- Without keys, the dashboard shows every job to whoever reaches it, so it serves only on a
  loopback address; the server refuses the pages when it listens elsewhere.
- The all-tenants view (`freight dashboard --all-tenants`, loopback only) shows every job to
  whoever reaches it, keys or not: the operator's view of a store, for someone who may read the
  store itself (its jobs outside tenants/ included, which no tenant's key shows).

The cookie is HttpOnly, SameSite=Lax, and Secure when the request came over TLS (directly, or
through a proxy whose X-Forwarded-Proto uvicorn trusts).
"""

from __future__ import annotations

import ipaddress
import re
import secrets
import threading
import time
from dataclasses import dataclass

from itsdangerous import BadSignature, URLSafeTimedSerializer
from starlette.requests import Request
from starlette.responses import Response

from jobs.api.auth import Authenticator
from jobs.api.keys import hash_key
from jobs.api.layout import KEYS_PREFIX
from jobs.settings import Settings
from jobs.storage import ObjectStore

SESSION_COOKIE = "freight_session"
SESSION_S = 12 * 3600
KEYS_CHECK_S = 2.0  # how long "the store has keys" is reused: a first key closes the open mode this fast
_DIGEST = re.compile(r"[0-9a-f]{64}")


class SignInRequired(Exception):
    """No valid session: the browser goes to the sign-in page."""


class LocalOnly(Exception):
    """A store without API keys, on a server that listens beyond loopback: no page is shown."""


@dataclass(frozen=True)
class Viewer:
    """tenant None: the local user of a store without keys, who sees every job."""

    tenant: str | None
    signed_in: bool


def loopback_host(host: str) -> bool:
    """Whether listening on `host` reaches this machine only (127.0.0.0/8, ::1, localhost)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def make_secret(settings: Settings) -> str:
    """The signing key: FREIGHT_DASHBOARD_SECRET, or a random one for this process."""
    given = settings.dashboard_secret
    return given.get_secret_value() if given is not None else secrets.token_urlsafe(32)


class Access:
    """Sessions and the open (keyless, loopback-only) mode of one dashboard."""

    def __init__(self, store: ObjectStore, auth: Authenticator, secret: str, *, loopback: bool,
                 all_tenants: bool = False) -> None:  # fmt: skip
        if all_tenants and not loopback:
            raise ValueError("the all-tenants view listens on a loopback address only")
        self.store, self.auth, self.loopback, self.all_tenants = store, auth, loopback, all_tenants
        self._sessions = URLSafeTimedSerializer(secret, salt="freight-dashboard-session")
        self._keys_seen: tuple[float, bool] = (-1e18, False)
        self._lock = threading.Lock()

    def keys_exist(self) -> bool:
        """Whether the store holds any API key (the answer is reused for KEYS_CHECK_S)."""
        now = time.monotonic()
        with self._lock:
            at, seen = self._keys_seen
        if now - at < KEYS_CHECK_S:
            return seen
        seen = bool(self.store.list(KEYS_PREFIX))
        with self._lock:
            self._keys_seen = (now, seen)
        return seen

    def viewer(self, request: Request) -> Viewer:
        """The request's viewer; SignInRequired or LocalOnly when there is none."""
        if self.all_tenants:
            return Viewer(None, signed_in=False)
        if not self.keys_exist():
            if not self.loopback:
                raise LocalOnly()
            return Viewer(None, signed_in=False)
        raw = request.cookies.get(SESSION_COOKIE)
        if not raw:
            raise SignInRequired()
        try:
            data = self._sessions.loads(raw, max_age=SESSION_S)
        except BadSignature:  # forged, damaged, signed by another secret, or older than SESSION_S
            raise SignInRequired() from None
        digest = data.get("k") if isinstance(data, dict) else None
        if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
            raise SignInRequired()
        tenant = self.auth.tenant_of_hash(digest)
        if tenant is None or tenant != data.get("t"):  # revoked, or the key moved
            raise SignInRequired()
        return Viewer(tenant, signed_in=True)

    def sign_in(self, key: str, request: Request, response: Response) -> str | None:
        """Set the session cookie for `key`'s tenant and return the tenant; None for a wrong or
        revoked key (nothing set)."""
        digest = hash_key(key.strip())
        tenant = self.auth.tenant_of_hash(digest)
        if tenant is None:
            return None
        token = self._sessions.dumps({"t": tenant, "k": digest})
        response.set_cookie(SESSION_COOKIE, token, max_age=SESSION_S, path="/", httponly=True,
                            secure=request.url.scheme == "https", samesite="lax")  # fmt: skip
        return tenant

    @staticmethod
    def sign_out(request: Request, response: Response) -> None:
        response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, secure=request.url.scheme == "https",
                               samesite="lax")  # fmt: skip
