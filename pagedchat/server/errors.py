"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

_TYPES = {400: "invalid_request_error", 401: "authentication_error",
          404: "invalid_request_error", 405: "invalid_request_error", 413: "invalid_request_error",
          500: "server_error", 503: "service_unavailable"}
_MEMBER = re.compile(r"str|int|float|bool|\w+\[.*\]")


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": _TYPES.get(self.status, "error"),
                          "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def _validation_message(error: RequestValidationError) -> tuple[str, str | None]:
    """The first problem pydantic found, as ``field.path: what is wrong``; a value that fits
    none of a union's members (pydantic's ``str``, ``list[int]`` in the location) names them."""
    errors = error.errors()
    locs = [[part for part in e.get("loc", ()) if part != "body"] for e in errors]
    first, loc = errors[0], locs[0]
    cut = next((i for i, part in enumerate(loc) if _MEMBER.fullmatch(str(part))), len(loc))
    param = ".".join(map(str, loc[:cut])) or None
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON", None
    if first.get("type") == "invalid_text":  # the field is deeper than pydantic's location
        return str(first.get("msg")), first["ctx"]["param"]
    if param is None:
        return "the request body must be a JSON object (Content-Type: application/json)", None
    if cut == len(loc):
        return f"{param}: {first.get('msg')}", param
    members = dict.fromkeys(str(o[cut]) for o in locs if len(o) > cut and o[:cut] == loc[:cut])
    return f"{param}: should be one of {', '.join(members)}", param


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(_: Request, error: APIError) -> JSONResponse:
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(error)
        return APIError(400, message, param).response()

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, error: HTTPException) -> JSONResponse:
        return APIError(error.status_code, str(error.detail)).response()
