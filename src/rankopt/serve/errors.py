"""The service's refusal: every bad input becomes an :class:`ApiError` (an HTTP 4xx status and a message naming
the item at fault), never an exception that reaches the server."""

from __future__ import annotations


class ApiError(Exception):
    """A request the service refuses: ``status`` (4xx) and ``message`` go back as ``{"error": message}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
