"""POST /v1/chat/completions and /v1/completions: OpenAI's request and response shapes
over tallow.generation, streamed as server-sent events when `stream` is true."""
import asyncio
import json
import random
import time
import uuid

from starlette.responses import JSONResponse, StreamingResponse

from ..generation import Sampler, StopText, TextStream, chat_prompt_ids, sequence
from . import params
from .bridge import Waiter, read_body, submit
from .errors import bad_request, error_for


class Generation:
    """One request's generation as the model's BatchWorker steps it (workers.py): text pieces
    emitted as they are final (stop strings held back, as tallow.generation.stream does), the
    cancel flag checked between tokens. The tokens are the ones generate_ids gives alone."""

    def __init__(self, model, ids, settings, job):
        self.model, self.ids, self.settings, self.job = model, list(ids), settings, job
        self.stats = TextStream(None)
        # A private generator seeded like manual_seed(seed): the same stream, no state shared between requests.
        self.sampler = Sampler(settings["temperature"], top_p=settings["top_p"], rng=random.Random(settings["seed"]))
        self.decoder = model.tokenizer.stream_decoder(skip_special_tokens=True)
        self.stops = StopText(settings["stop"])
        self.sequence = None

    def start(self, cache):
        """Prefill the prompt on cache; False when the request is already complete."""
        self.sequence = sequence(self.model, self.ids, self.settings["max_tokens"], self.sampler, cache=cache,
                                 stats=self.stats)
        return self.feed(self.sequence.prefill())

    def feed(self, token):
        """Report the next token (None: the sequence stopped); False when the request is complete."""
        job, stops = self.job, self.stops
        if token is None:
            tail = stops.feed(self.decoder.flush()) + stops.finish()
            if tail:
                job.emit(tail)
            return False
        job.tokens += 1
        piece = stops.feed(self.decoder.step(token))
        if piece:
            job.emit(piece)
        if stops.stopped:
            return False
        job.check()
        return True

    def result(self):
        reason = "stop" if self.stops.stopped else self.stats.finish_reason
        return {"finish_reason": "length" if reason in ("length", "context") else "stop",
                "completion_tokens": len(self.stats.token_ids)}


def _fit(served, ids, settings, max_tokens_limit):
    """Check the prompt and max_tokens against the context window and the server's limit;
    an absent max_tokens becomes what is left of the window (at most the limit)."""
    if not ids:
        raise bad_request("the prompt has no tokens", param="prompt")
    window = served.model.context_window
    asked = settings["max_tokens"]
    if asked is not None and asked > max_tokens_limit:
        raise bad_request(f"'max_tokens' is {asked}, more than this server allows ({max_tokens_limit}; "
                          f"tallow serve --max-tokens)", param="max_tokens", code="invalid_value")
    if len(ids) + (asked or 1) > window:
        raise bad_request(f"This model's maximum context length is {window} tokens. However, you requested "
                          f"{len(ids) + (asked or 1)} tokens ({len(ids)} in the messages, {asked or 1} in the "
                          f"completion). Please reduce the length of the messages or completion.",
                          param="messages", code="context_length_exceeded")
    settings["max_tokens"] = asked or min(max_tokens_limit, window - len(ids))


async def chat_completions(request):
    return await _complete(request, chat=True)


async def completions(request):
    return await _complete(request, chat=False)


async def _complete(request, chat):
    state = request.app.state
    limits = state.limits
    deadline = asyncio.get_running_loop().time() + limits.request_timeout
    data = params.parse_json(await read_body(request, deadline, limits.request_timeout))
    settings = params.sampling(data)
    served = state.models.get(data.get("model"), "llm")
    model = served.model
    if chat:
        messages = params.messages(data)
        ids = await asyncio.to_thread(chat_prompt_ids, model, messages)  # tokenizing is CPU work too
    else:
        text = params.prompt(data)
        ids = await asyncio.to_thread(model.tokenizer.encode, text, add_special_tokens=True)
    _fit(served, ids, settings, limits.max_tokens)
    job = submit(served, task=lambda job: Generation(model, ids, settings, job))
    reply = Reply(chat, served.id, len(ids))
    if settings["stream"]:
        async with Waiter(job, deadline, limits.request_timeout, request) as waiter:
            first = await waiter.next()  # the status line waits for the worker: a queued request can still fail
        return StreamingResponse(_events(job, first, reply, settings, deadline, limits.request_timeout),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    pieces = []
    async with Waiter(job, deadline, limits.request_timeout, request) as waiter:
        while True:
            kind, value = await waiter.next()
            if kind == "done":
                return JSONResponse(reply.whole("".join(pieces), value))
            pieces.append(value)


async def _events(job, first, reply, settings, deadline, timeout):
    """The SSE body: a role chunk (chat), one chunk per piece, the finish chunk, usage when asked, [DONE].
    A client that disconnects cancels this generator (Starlette watches), and the finally
    stops the generation at its next token."""
    try:
        if reply.chat:
            yield _sse(reply.chunk(None, None, role=True))
        event = first
        async with Waiter(job, deadline, timeout) as waiter:
            while event[0] == "event":
                yield _sse(reply.chunk(event[1], None))
                event = await waiter.next()
        done = event[1]
        yield _sse(reply.chunk(None, done["finish_reason"]))
        if settings["include_usage"]:
            yield _sse(reply.usage_chunk(done))
    except Exception as e:  # the status is sent already: the error goes in the stream, as OpenAI does
        yield _sse(error_for(e).body())
    finally:
        job.cancel.set()
    yield "data: [DONE]\n\n"


def _sse(obj):
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


class Reply:
    """OpenAI's response objects for one request."""

    def __init__(self, chat, model_id, prompt_tokens):
        self.chat, self.model, self.prompt_tokens = chat, model_id, prompt_tokens
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def _head(self, chunk):
        obj = "chat.completion" if self.chat else "text_completion"
        return {"id": self.id, "object": obj + (".chunk" if chunk and self.chat else ""), "created": self.created,
                "model": self.model, "system_fingerprint": None}

    def usage(self, done):
        n = done["completion_tokens"]
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": n, "total_tokens": self.prompt_tokens + n}

    def whole(self, text, done):
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                      "logprobs": None, "finish_reason": done["finish_reason"]}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": done["finish_reason"]}
        return {**self._head(False), "choices": [choice], "usage": self.usage(done)}

    def chunk(self, text, finish_reason, role=False):
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return {**self._head(True), "choices": [choice]}

    def usage_chunk(self, done):
        return {**self._head(True), "choices": [], "usage": self.usage(done)}
