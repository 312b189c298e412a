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


@dataclass(frozen=True)
class Refusal:
    """A stream refused before its first frame, as its only item: the reference then answers
    plain JSON, ``status`` and the error envelope ``body``, instead of a stream."""

    status: int
    body: bytes


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


class RequestError(Exception):
    """What a Python caller of the graph's handle gets instead of an HTTP error answer: the status
    and the envelope ``{"error": {"code", "message", "type"}}`` the same request gets over HTTP.

    Ray re-raises it on the caller's side as a subclass of both ``RayTaskError`` and this class,
    so ``except RequestError`` works; attributes are set per instance (no class-level defaults)
    so they resolve through that wrapper too.
    """

    def __init__(self, status: int, envelope: dict):
        super().__init__(status, envelope)
        self.status = status
        self.envelope = envelope

    @classmethod
    def from_api_error(cls, err: ApiError) -> RequestError:
        return cls(err.code or 500, err.body())

    @property
    def message(self) -> str:
        return self.envelope["error"]["message"]

    @property
    def error_type(self) -> str:
        return self.envelope["error"]["type"]

    def __str__(self) -> str:
        return f"{self.status} {self.error_type}: {self.message}"
