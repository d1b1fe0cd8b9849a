"""OpenAI's error JSON: {"error": {"message", "type", "param", "code"}} with a status code.
Every refusal the server makes is an ApiError; app.py turns it into the response."""
from ..errors import ContextWindowError, Error


class ApiError(Exception):
    def __init__(self, status, message, type="invalid_request_error", param=None, code=None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self):
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message, param=None, code=None):
    return ApiError(400, message, param=param, code=code)


def too_large(what, limit, option):
    return ApiError(413, f"the {what} is larger than this server's limit of {limit} bytes (tallow serve {option})",
                    code="request_too_large")


def busy(message):
    # OpenAI's own 429 body: type "requests", code "rate_limit_exceeded"; clients retry after a pause.
    return ApiError(429, message, type="requests", code="rate_limit_exceeded")


def timed_out(limit):
    return ApiError(504, f"the request took longer than this server's limit of {limit:g} s (tallow serve "
                         f"--request-timeout); ask for fewer tokens or a shorter file", type="timeout_error",
                    code="request_timeout")


def error_for(e):
    """The ApiError an exception from a request's work becomes: tallow's own errors (bad input:
    a chat template that refuses the messages, audio that cannot be decoded) are 400s; anything
    else is a 500 whose message names it (the traceback goes to the server's log, not the client)."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, ContextWindowError):
        return ApiError(400, str(e), param="messages", code="context_length_exceeded")
    if isinstance(e, Error):
        return ApiError(400, str(e))
    return ApiError(500, f"the server failed: {type(e).__name__}: {e}", type="server_error")
