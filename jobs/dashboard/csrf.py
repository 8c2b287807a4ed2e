"""CSRF protection of every form that posts (sign in, sign out): a token the page carries, bound to
a cookie that only this site can have set.

The browser holds a random value in the `freight_csrf` cookie (HttpOnly, SameSite=Strict); each
form carries that value signed with the dashboard's secret. A post is taken only when its form
token is the signature of its cookie, and, when the browser sends an Origin header, when that
origin is the dashboard's own. Another site can neither read the token nor make one for a cookie it
planted (it lacks the secret).
"""

from __future__ import annotations

import hmac
import secrets

from itsdangerous import BadSignature, Signer
from starlette.requests import Request
from starlette.responses import Response

CSRF_COOKIE = "freight_csrf"
CSRF_FIELD = "csrf_token"


class CsrfError(Exception):
    """A post without a valid token: refused with 403."""


class Csrf:
    def __init__(self, secret: str) -> None:
        self._signer = Signer(secret, salt="freight-dashboard-csrf")

    def token(self, request: Request, response: Response) -> str:
        """The form token for this browser; sets its cookie on `response` when it has none yet."""
        value = request.cookies.get(CSRF_COOKIE)
        if not value or len(value) > 64:
            value = secrets.token_urlsafe(24)
            response.set_cookie(CSRF_COOKIE, value, path="/", httponly=True, samesite="strict",
                                secure=request.url.scheme == "https")  # fmt: skip
        return self._signer.sign(value).decode()

    def check(self, request: Request, form_token: str | None) -> None:
        """CsrfError unless `form_token` signs this browser's cookie and the origin, if sent, is ours."""
        origin = request.headers.get("origin")
        if origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}":
            raise CsrfError(f"a form of {origin} posted here")
        cookie = request.cookies.get(CSRF_COOKIE)
        if not cookie or not form_token:
            raise CsrfError("the form carried no token, or the browser no cookie")
        try:
            value = self._signer.unsign(form_token).decode()
        except BadSignature:
            raise CsrfError("the form's token is not this dashboard's") from None
        if not hmac.compare_digest(value, cookie):
            raise CsrfError("the form's token belongs to another browser")
