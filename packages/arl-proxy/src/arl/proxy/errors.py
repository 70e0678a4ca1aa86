"""Errors of arl-proxy: one base `ProxyError`, each subclass naming one problem.

Every error carries the HTTP status and the OpenAI error `type`/`code` the server answers with, so a bad
request is reported to the agent as an OpenAI-style error body and never takes the server down.
"""

from __future__ import annotations


class ProxyError(Exception):
    """Base of every error raised by arl-proxy."""

    status: int = 500
    error_type: str = "internal_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def to_openai(self) -> dict[str, object]:
        """The OpenAI-style error body: {"error": {"message", "type", "param", "code"}}."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


class BadRequestError(ProxyError):
    """The request body is not a valid chat completion request (bad JSON, wrong field types, n > 1, ...)."""

    status = 400
    error_type = "invalid_request_error"
    code = "invalid_request"


class InvalidMessagesError(BadRequestError):
    """`messages` is missing, empty, malformed, or holds a message with an unknown role."""

    code = "invalid_messages"


class TemplateRenderError(BadRequestError):
    """The chat template refused the conversation (it raised, e.g. 'only single tool-calls supported')."""

    code = "chat_template_error"


class ContextLengthError(BadRequestError):
    """The rendered prompt does not fit the context limit (`ProxyConfig.max_context_len`)."""

    code = "context_length_exceeded"


class RequestTooLargeError(ProxyError):
    """The request body is over `ProxyConfig.max_body_bytes`."""

    status = 413
    error_type = "invalid_request_error"
    code = "request_too_large"


class UnauthorizedError(ProxyError):
    """A bearer token is configured and the request did not carry it."""

    status = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


class UnknownSessionError(ProxyError):
    """No open session has this id (never opened, already popped, or mistyped)."""

    status = 404
    error_type = "not_found_error"
    code = "unknown_session"


class SessionClosedError(ProxyError):
    """The session has ended (e.g. `max_consecutive_no_tool` turns without a tool call) and takes no more turns."""

    status = 409
    error_type = "invalid_request_error"
    code = "session_closed"


class NotFoundError(ProxyError):
    """The route does not exist."""

    status = 404
    error_type = "not_found_error"
    code = "not_found"


class GeneratorError(ProxyError):
    """The generator (inference engine, upstream server) failed to produce a completion."""

    status = 502
    error_type = "upstream_error"
    code = "generator_failed"


class GeneratorTimeoutError(GeneratorError):
    """The generator did not answer within `ProxyConfig.generate_timeout_s`."""

    status = 504
    code = "generator_timeout"


class ToolParserError(ProxyError):
    """An unknown tool parser name was configured."""

    status = 500
    error_type = "configuration_error"
    code = "unknown_tool_parser"


class ScriptExhaustedError(ProxyError):
    """`ScriptedGenerator` was asked for more completions than it was scripted with."""

    status = 502
    error_type = "upstream_error"
    code = "script_exhausted"
