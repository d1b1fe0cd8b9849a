"""The Starlette app: routes, and the guard every request passes first (API key, requests in
flight, body size). Every refusal is OpenAI's error JSON with its status code."""
import dataclasses
import hmac
import sys
import tempfile

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.routing import Route

from ..errors import Error
from . import audio, text
from .errors import ApiError, busy, error_for, too_large

MB = 1024 * 1024
DRAIN_BYTES = 16 * MB  # read (and drop) this much of a refused body, so the client sees the 413, not a reset


@dataclasses.dataclass
class Limits:
    max_body_bytes: int = 1 * MB       # JSON requests
    max_upload_bytes: int = 200 * MB   # audio uploads (they stream to disk)
    max_tokens: int = 2048             # new tokens per request (also the default when a request names none)
    max_queue: int = 16                # requests waiting per model, beyond the ones it runs
    max_requests: int = 64             # requests in flight in all (reading a body, queued, running)
    request_timeout: float = 600.0     # seconds from the first byte of the body to the last of the answer
    upload_dir: str = dataclasses.field(default_factory=tempfile.gettempdir)


def _error_response(e):
    e = error_for(e)
    return JSONResponse(e.body(), status_code=e.status,
                        headers={"WWW-Authenticate": "Bearer"} if e.status == 401 else None)


async def _api_error(request, e):
    return _error_response(e)


async def _http_error(request, e):
    message = "no such endpoint" if e.status_code == 404 else e.detail
    return _error_response(ApiError(e.status_code, f"{request.method} {request.url.path}: {message}"))


async def _server_error(request, e):
    print(f"tallow serve: {request.method} {request.url.path} failed: {type(e).__name__}: {e}", file=sys.stderr)
    return _error_response(e)


async def health(request):
    return JSONResponse({"status": "ok", "models": request.app.state.models.health()})


async def models(request):
    return JSONResponse({"object": "list", "data": request.app.state.models.cards()})


def create_app(served, limits=None, api_key=None):
    """The ASGI app over loaded models (ServedModels). api_key: the Bearer token /v1 requires."""
    limits = limits or Limits()
    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", text.chat_completions, methods=["POST"]),
        Route("/v1/completions", text.completions, methods=["POST"]),
        Route("/v1/audio/transcriptions", audio.transcriptions, methods=["POST"]),
        Route("/v1/audio/translations", audio.translations, methods=["POST"]),
    ]
    handlers = {ApiError: _api_error, Error: _api_error, HTTPException: _http_error, Exception: _server_error}
    app = Starlette(routes=routes, exception_handlers=handlers)
    app.state.models, app.state.limits = served, limits
    return Guard(app, limits, api_key)


class Guard:
    """ASGI middleware, outermost: the API key (before any body is read), the bound on requests
    in flight, and the body size (Content-Length up front, counted bytes otherwise)."""

    def __init__(self, app, limits, api_key):
        self.app, self.limits = app, limits
        self.api_key = api_key.encode() if api_key else None
        self.in_flight = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] == "/health":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        refused = self._refusal(headers)
        if refused is not None:
            return await self._refuse(refused, scope, receive, send, headers)
        self.in_flight += 1
        try:
            await self.app(scope, self._counting(scope, receive), send)
        finally:
            self.in_flight -= 1

    def _refusal(self, headers):
        if self.api_key is not None:
            given = headers.get(b"authorization", b"")
            scheme, _, token = given.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.api_key):
                return ApiError(401, "Incorrect API key provided: send 'Authorization: Bearer <the key given "
                                     "to tallow serve --api-key>'", code="invalid_api_key")
        if self.in_flight >= self.limits.max_requests:
            return busy(f"the server has {self.in_flight} requests in flight, its limit (tallow serve "
                        f"--max-requests); retry shortly")
        return None

    def _limit(self, scope):
        if scope["path"].startswith("/v1/audio/"):
            return self.limits.max_upload_bytes, "upload", "--max-upload-mb"
        return self.limits.max_body_bytes, "request body", "--max-body-mb"

    def _counting(self, scope, receive):
        limit, what, option = self._limit(scope)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            async def refuse():
                await _drain(receive)
                raise too_large(what, limit, option)
            return refuse
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    if message.get("more_body"):
                        await _drain(receive)
                    raise too_large(what, limit, option)
            return message
        return counted

    async def _refuse(self, error, scope, receive, send, headers):
        if headers.get(b"content-length", b"") != b"0":
            await _drain(receive)
        await _error_response(error)(scope, receive, send)


async def _drain(receive):
    """Read the rest of a refused body (up to DRAIN_BYTES): closing a socket with unread
    data resets it, and the client would see a reset instead of the answer."""
    dropped = 0
    while dropped < DRAIN_BYTES:
        message = await receive()
        if message["type"] != "http.request":
            return
        dropped += len(message.get("body", b""))
        if not message.get("more_body"):
            return

