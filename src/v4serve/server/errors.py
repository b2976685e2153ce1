"""Errors a client can cause, and how they look on the wire.

Every handler raises `APIError`; the app turns it into the OpenAI error body
`{"error": {"message", "type", "param", "code"}}`, or into Anthropic's
`{"type": "error", "error": {"type", "message"}}` on the `/v1/messages` routes. The helpers below map the
library errors the request path can meet (pydantic validation, chat encoding, sampling parameters, engine
rejection) onto one status and one message that says what is wrong.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("v4serve.server")

# OpenAI error types by status; Anthropic's names for the same statuses.
_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                 405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
                 500: "server_error", 503: "server_error"}
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
                    429: "rate_limit_error", 500: "api_error", 503: "overloaded_error"}
# Union branches pydantic adds to an error location ("stop" -> "str" / "list[str]"): not part of the path.
_BRANCH_TAGS = {"str", "int", "float", "bool", "dict", "list", "none", "function-after", "function-plain"}


class APIError(Exception):
    """An error answered with `status`; `param` names the request field at fault, where there is one."""

    def __init__(self, message: str, status: int = 400, *, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.type = type or _OPENAI_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
        self.headers = headers or {}

    def openai_body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def anthropic_body(self) -> dict[str, Any]:
        kind = _ANTHROPIC_TYPES.get(self.status, "api_error" if self.status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": self.message}}


def is_anthropic_path(path: str) -> bool:
    return path.startswith("/v1/messages")


def error_body(path: str, err: APIError) -> dict[str, Any]:
    return err.anthropic_body() if is_anthropic_path(path) else err.openai_body()


def error_response(path: str, err: APIError) -> JSONResponse:
    return JSONResponse(error_body(path, err), status_code=err.status, headers=err.headers)


# ------------------------------------------------------------------------------------------------------------
# mapping library errors
# ------------------------------------------------------------------------------------------------------------
def from_validation(err: ValidationError) -> APIError:
    """The first problem pydantic found, as `param: what is wrong` (a malformed body says so)."""
    first = err.errors(include_url=False)[0]
    if first["type"] == "json_invalid":
        return APIError(f"the request body is not valid JSON: {first['msg'].removeprefix('Invalid JSON: ')}",
                        code="invalid_json")
    if first["type"] == "model_type" and not first["loc"]:
        return APIError("the request body must be a JSON object", code="invalid_json")
    path = [str(p) for p in first["loc"] if not (isinstance(p, str) and (p in _BRANCH_TAGS or "[" in p))]
    param = ".".join(path) or None
    if first["type"] == "missing":
        return APIError(f"{param}: this field is required", param=param, code="missing_required_parameter")
    if first["type"] == "extra_forbidden":
        return APIError(f"{param}: unknown field", param=param, code="unknown_parameter")
    message = first["msg"]
    got = first.get("input")
    if first["type"].endswith("_type") and not isinstance(got, (dict, list)):
        message += f", got {_short(got)}"
    return APIError(f"{param}: {message}" if param else message, param=param, code="invalid_type")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _respond(request: Request, err: APIError) -> JSONResponse:
    state = getattr(request.app.state, "v4", None)
    if state is not None:
        state.metrics.count_error(request.url.path, err.status)
    if err.status < 500:  # the access log shows only the status: say why the client was refused
        log.info("refused %s %s: %d %s", request.method, request.url.path, err.status, err.message)
    return error_response(request.url.path, err)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, err: APIError) -> JSONResponse:
        return _respond(request, err)

    @app.exception_handler(ValidationError)
    async def _validation(request: Request, err: ValidationError) -> JSONResponse:
        return _respond(request, from_validation(err))

    @app.exception_handler(RequestValidationError)
    async def _request_validation(request: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0] if err.errors() else {"loc": (), "msg": "invalid request"}
        param = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
        return _respond(request, APIError(f"{param}: {first['msg']}" if param else first["msg"], param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, err: StarletteHTTPException) -> JSONResponse:
        if err.status_code == 404:
            message = f"no route {request.method} {request.url.path}; see GET /v1/models and docs/server.md"
        elif err.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        else:
            message = str(err.detail)
        return _respond(request, APIError(message, err.status_code, headers=dict(err.headers or {})))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, err: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return _respond(request, APIError(f"internal server error: {type(err).__name__}: {err}", 500))
