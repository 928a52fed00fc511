"""One JSON error shape for every failure: {"error": {"code", "message", "hint"}}."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

__all__ = ["RegistryError", "install_handlers"]

_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
          409: "conflict", 411: "length_required", 413: "too_large", 415: "unsupported_media_type",
          422: "invalid", 429: "too_many_requests", 500: "internal"}


class RegistryError(Exception):
    def __init__(self, status: int, message: str, hint: str = "", *, code: str | None = None,
                 details: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.hint = hint
        self.code = code or _CODES.get(status, "error")
        self.details = details


def error_body(code: str, message: str, hint: str = "", details: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": message, "hint": hint}
    if details is not None:
        body["details"] = details
    return {"error": body}


def _allowed(request: Request) -> set[str]:
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match is not Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return methods


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(RegistryError)
    async def _registry(_request: Request, exc: RegistryError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse(error_body(exc.code, exc.message, exc.hint, exc.details), status_code=exc.status,
                            headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _CODES.get(exc.status_code, "error")
        hint = "see /docs for the API" if exc.status_code in (404, 405) else ""
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # every method the path takes, over all its routes (Starlette names one route's)
            headers["Allow"] = ", ".join(sorted(_allowed(request)))
        return JSONResponse(error_body(code, str(exc.detail), hint), status_code=exc.status_code, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [{"field": ".".join(str(x) for x in e["loc"]), "message": e["msg"]} for e in exc.errors()]
        first = problems[0] if problems else {"field": "", "message": "invalid request"}
        return JSONResponse(
            error_body("invalid", f"{first['field']}: {first['message']}", "fix the fields listed in details",
                       problems),
            status_code=422,
        )

    @app.exception_handler(Exception)
    async def _internal(_request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(error_body("internal", "the registry failed to handle this request",
                                       "retry; if it persists, report it with the time of the request"),
                            status_code=500)
