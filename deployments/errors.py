"""llama-server's error envelope: ``{"error": {"code", "message", "type"}}`` and its statuses."""

from __future__ import annotations

from dataclasses import dataclass, field

STATUS_BY_TYPE = {
    "invalid_request_error": 400,
    "exceed_context_size_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "server_error": 500,
    "not_supported_error": 501,
    "unavailable_error": 503,
}


@dataclass
class ApiError(Exception):
    """An answer that is an error. ``middleware`` errors (401, 404, 503 while loading) put the
    keys in the order message, type, code, as the reference's HTTP middlewares do."""

    message: str
    type: str = "invalid_request_error"
    code: int | None = None
    extra: dict = field(default_factory=dict)
    middleware: bool = False

    def __post_init__(self) -> None:
        if self.code is None:
            self.code = STATUS_BY_TYPE.get(self.type, 500)
        super().__init__(self.message)

    def body(self) -> dict:
        if self.middleware:
            inner = {"message": self.message, "type": self.type, "code": self.code}
        else:
            inner = {"code": self.code, "message": self.message, "type": self.type}
        inner.update(self.extra)
        return {"error": inner}


def invalid(message: str) -> ApiError:
    return ApiError(message, "invalid_request_error")
