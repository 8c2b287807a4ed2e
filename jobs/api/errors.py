"""API errors with OpenAI's status codes and body: `{"error": {"message", "type", "param", "code"}}`.

The `openai` SDK turns the status into its own exception class (400 BadRequestError, 401
AuthenticationError, 404 NotFoundError, 429 RateLimitError, ...) and keeps the body's fields, so a
pipeline that catches OpenAI's errors catches freight's the same way. An answer that retrying cannot
change carries `x-should-retry: false`, which the SDK obeys instead of its default retries (it
retries 408, 409, 429 and 5xx).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from jobs.errors import StorageError, StorageUnavailableError
from jobs.log import get_logger
from jobs.redact import redact

log = get_logger(__name__)

INVALID = "invalid_request_error"


class APIError(Exception):
    """An answer other than 2xx. `retry`: whether a later try of the same request may succeed."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = INVALID,
        param: str | None = None,
        code: str | None = None,
        retry: bool = False,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code, self.retry = (
            status, message, type, param, code, retry,
        )  # fmt: skip

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.type, self.param, self.code, self.retry)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def not_found(what: str, ident: str, param: str | None = None) -> APIError:
    """404 for an id this tenant does not own: the same answer whether the id exists elsewhere or not."""
    return APIError(404, f"No such {what}: '{ident}'", param=param, code=None)


def error_response(
    status: int, message: str, type: str = INVALID, param: str | None = None, code: str | None = None,
    retry: bool = False,
) -> JSONResponse:  # fmt: skip
    body = {"error": {"message": message, "type": type, "param": param, "code": code}}
    headers = None if retry else {"x-should-retry": "false"}
    return JSONResponse(body, status_code=status, headers=headers)


def _field(loc: tuple[Any, ...]) -> str | None:
    """A validation error's location as a parameter name (`metadata.key`), without body / query."""
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or None


def install_handlers(app: FastAPI) -> None:
    """Every error the app can raise answered in OpenAI's shape: ours, FastAPI's request validation
    (400, naming the first bad field), unknown routes and methods, storage outages (503, retried by
    the SDK) and anything unexpected (500, logged with its traceback)."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        param = _field(tuple(first.get("loc", ())))
        if first.get("type") == "missing":
            message = f"Missing required parameter: '{param}'."
        elif first.get("type") == "json_invalid":
            message = "The body is not valid JSON: send a JSON object with Content-Type: application/json."
            param = None
        else:
            message = f"Invalid value for '{param}': {first.get('msg', 'invalid')}."
        return error_response(400, message, param=param, code="missing_required_parameter"
                              if first.get("type") == "missing" else "invalid_value")  # fmt: skip

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            message = f"Invalid URL ({request.method} {request.url.path}): freight serves /v1/files and /v1/batches."
            return error_response(404, message, code="unknown_url")
        if exc.status_code == 405:
            return error_response(405, f"{request.method} is not allowed on {request.url.path}.",
                                  code="method_not_allowed")  # fmt: skip
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, exc: ClientDisconnect) -> Response:
        log.info("client_disconnected", method=request.method, path=request.url.path)
        return Response(status_code=499)  # nobody reads it: the connection is closed

    @app.exception_handler(StorageUnavailableError)
    async def _unavailable(request: Request, exc: StorageUnavailableError) -> JSONResponse:
        log.warning("storage_unavailable", path=request.url.path, error=str(exc))
        return error_response(503, "Storage did not answer; try again shortly.", type="server_error", retry=True)

    @app.exception_handler(StorageError)
    async def _storage(request: Request, exc: StorageError) -> JSONResponse:
        log.error("storage_error", path=request.url.path, error=str(exc))
        return error_response(500, "The server's storage refused the request; its operator must fix it.",
                              type="server_error", retry=True)  # fmt: skip

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("request_failed", path=request.url.path, error=redact(f"{type(exc).__name__}: {exc}"),
                  exc_info=exc)  # fmt: skip
        return error_response(500, "The server had an error while processing the request.",
                              type="server_error", retry=True)  # fmt: skip
