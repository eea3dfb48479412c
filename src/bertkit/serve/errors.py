"""The service's one typed error and its one map to HTTP statuses.

Every failure a handler can meet becomes a `ServeError` of one `ErrorType`; `STATUS` turns the
type into the status code in one place, and `error_body` into TEI's JSON shape
`{"error": message, "error_type": type}`, so clients written for text-embeddings-inference read
our errors as they read its own.
"""

from __future__ import annotations

from enum import Enum


class ErrorType(str, Enum):
    VALIDATION = "validation"  # a field's value is wrong: type, emptiness, length, batch size
    PAYLOAD_TOO_LARGE = "payload_too_large"  # the request body is over --payload-limit
    OVERLOADED = "overloaded"  # no admission permit free: come back later (Retry-After)
    NOT_FOUND = "not_found"  # the `model` field names no model this process serves
    UNAUTHORIZED = "unauthorized"  # --api-key set and the request has no matching Bearer token
    UNSUPPORTED = "unsupported"  # the model has no head for this route (TEI answers 424 too)
    BACKEND = "backend"  # the model itself failed: a bug or the machine, not the request
    UNHEALTHY = "unhealthy"  # shutting down: no new work is taken
    FORBIDDEN = "forbidden"  # an admin route that is off, or a path outside the directory it may read


STATUS: dict[ErrorType, int] = {
    ErrorType.VALIDATION: 422,
    ErrorType.PAYLOAD_TOO_LARGE: 413,
    ErrorType.OVERLOADED: 429,
    ErrorType.NOT_FOUND: 404,
    ErrorType.UNAUTHORIZED: 401,
    ErrorType.UNSUPPORTED: 424,
    ErrorType.BACKEND: 500,
    ErrorType.UNHEALTHY: 503,
    ErrorType.FORBIDDEN: 403,
}


class ServeError(Exception):
    """A failure with its type (hence its status) and a message naming the field or limit."""

    def __init__(self, error_type: ErrorType, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.error_type = error_type
        self.message = message
        self.retry_after = retry_after  # seconds, sent as Retry-After with 429 and 503

    @property
    def status(self) -> int:
        return STATUS[self.error_type]

    def body(self) -> dict[str, str]:
        return {"error": self.message, "error_type": self.error_type.value}

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after is None else {"Retry-After": str(self.retry_after)}


def validation(message: str) -> ServeError:
    return ServeError(ErrorType.VALIDATION, message)
