"""POST /v1/audio/transcriptions and /v1/audio/translations: the upload streams to a
temporary file (multipart.py), and the model's worker transcribes it in 30 s windows as
`tallow transcribe` does, so long audio stays in bounded memory.

srt, vtt and verbose_json decode with timestamp tokens (segments at the model's own
timestamps, as `tallow transcribe --format srt` does); json and text without (one segment
per window: tiny.en's text for jfk.wav keeps a comma that its timestamped decode drops)."""
import asyncio
import math

from starlette.responses import JSONResponse, PlainTextResponse

from .bridge import Waiter, submit
from .errors import bad_request
from .multipart import Upload

FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
TIMESTAMPED = ("srt", "vtt", "verbose_json")


async def transcriptions(request):
    return await _audio(request, "transcribe")


async def translations(request):
    return await _audio(request, "translate")


async def _audio(request, task):
    state = request.app.state
    limits = state.limits
    deadline = asyncio.get_running_loop().time() + limits.request_timeout
    upload = Upload(limits.upload_dir)
    try:
        await upload.receive(request, deadline, limits.request_timeout)
        if upload.path is None:
            raise bad_request("'file' is required: the audio as a multipart file part", param="file")
        served = state.models.get(upload.field("model"), "whisper")
        fmt = upload.field("response_format") or "json"
        if fmt not in FORMATS:
            raise bad_request(f"'response_format' must be one of {', '.join(FORMATS)} (got {fmt!r:.40})",
                              param="response_format")
        if "word" in (upload.fields.get("timestamp_granularities[]") or ()):
            raise bad_request("word timestamps are not supported; ask for 'segment'",
                              param="timestamp_granularities")
        options = _options(served, task, upload, fmt)
        model, path = served.model, upload.path
        job = submit(served, lambda job: model.transcribe(path, on_window=lambda _: job.check(), **options))
        async with Waiter(job, deadline, limits.request_timeout, request) as waiter:
            _, result = await waiter.next()
        return _response(result, fmt, options["task"])
    finally:
        upload.remove()  # a worker still reading it (cancelled) keeps its open file


def _options(served, task, upload, fmt):
    model = served.model
    language = upload.field("language") if task == "transcribe" else None  # translations take no language
    if not model.is_multilingual:
        if language not in (None, "", "en", "english", "English"):
            raise bad_request(f"{served.id} is an English-only model: it transcribes English ('en'), not "
                              f"{language!r:.20}; serve a multilingual Whisper model for other languages",
                              param="language", code="unsupported_language")
        # Translating English speech into English is its transcript.
        language, task = "en", "transcribe"
    elif language and language not in model.tokens.languages:
        raise bad_request(f"unknown language {language!r:.20}: use an ISO-639-1 code such as "
                          f"{', '.join(sorted(model.tokens.languages)[:8])}, ...", param="language",
                          code="unsupported_language")
    options = dict(language=language or None, task=task, timestamps=fmt in TIMESTAMPED,
                   initial_prompt=upload.field("prompt") or None)
    temperature = _temperature(upload.field("temperature"))
    if temperature:  # 0 or absent: 0 with the usual fallback to higher temperatures, as OpenAI's 0 means
        options["temperature"] = temperature
    return options


def _temperature(text):
    if text is None or text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 <= value <= 1):
        raise bad_request(f"'temperature' must be a number in [0, 1], got {text!r:.40}", param="temperature")
    return value


def _response(result, fmt, task):
    text = result.text.strip()
    usage = {"type": "duration", "seconds": math.ceil(result.duration)}
    if fmt == "json":
        return JSONResponse({"text": text, "usage": usage})
    if fmt == "verbose_json":
        return JSONResponse({"task": task, "language": result.language, "duration": result.duration, "text": text,
                             "segments": [s.to_dict() for s in result.segments if s.text.strip()], "usage": usage})
    if fmt == "text":
        return PlainTextResponse(text + "\n")
    if fmt == "srt":
        return PlainTextResponse(result.to_srt())
    return PlainTextResponse(result.to_vtt(), media_type="text/vtt")
