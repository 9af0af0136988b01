"""Errors of the agent engine.

Hierarchy::

    AgentError                  base; carries an ErrorType for the error policy
    ├── ToolError               a tool failed (unknown tool, bad arguments, blocked, raised)
    ├── ModelError              the model/driver failed
    │   ├── RateLimitError      HTTP 429 or a provider's rate limit
    │   └── ModelTimeoutError   the request timed out
    └── ValidationError         input that does not validate (e.g. tool arguments)

Errors never escape the agent loop: they become recorded failure steps that the error
policy judges (see docs/agent_core.md).
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "AgentError",
    "ErrorType",
    "ModelError",
    "ModelTimeoutError",
    "RateLimitError",
    "ToolError",
    "ValidationError",
]


class ErrorType(StrEnum):
    TOOL = "tool"
    MODEL = "model"
    VALIDATION = "validation"
    RATE_LIMIT = "rate_limit"
    TIMEOUT = "timeout"
    UNKNOWN = "unknown"


class AgentError(Exception):
    """Base of the engine's errors."""

    error_type: ErrorType = ErrorType.UNKNOWN

    def __init__(self, message: str, *, error_type: ErrorType | None = None) -> None:
        super().__init__(message)
        self.message = message
        if error_type is not None:
            self.error_type = error_type

    @classmethod
    def from_exception(cls, exc: BaseException) -> AgentError:
        """Wrap any exception (keeping an AgentError as it is)."""
        if isinstance(exc, AgentError):
            return exc
        wrapped = cls(f"{type(exc).__name__}: {exc}")
        wrapped.__cause__ = exc
        return wrapped


class ToolError(AgentError):
    error_type = ErrorType.TOOL

    def __init__(self, message: str, *, tool_name: str = "", tool_call_id: str = "") -> None:
        super().__init__(message)
        self.tool_name = tool_name
        self.tool_call_id = tool_call_id


class ValidationError(AgentError):
    error_type = ErrorType.VALIDATION


class ModelError(AgentError):
    error_type = ErrorType.MODEL

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class RateLimitError(ModelError):
    """``retry_after`` is the provider's advised wait in seconds, when it gave one."""

    error_type = ErrorType.RATE_LIMIT

    def __init__(
        self, message: str, *, status_code: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message, status_code=status_code)
        self.retry_after = retry_after


class ModelTimeoutError(ModelError):
    error_type = ErrorType.TIMEOUT
