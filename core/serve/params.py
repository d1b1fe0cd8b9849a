"""Checked request fields: a wrong type or value is a 400 naming the field (`param`), in
OpenAI's words where it has them. Fields tallow does not use are ignored, as OpenAI's
clients send many; ones whose meaning tallow cannot honour are refused."""
import json
import math

from .errors import bad_request


def parse_json(body):
    """The request body as a JSON object."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, ValueError) as e:
        raise bad_request(f"the request body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise bad_request(f"the request body must be a JSON object, not {type(data).__name__}")
    return data


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v):
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def optional(data, name, check, rule, default=None):
    """data[name] when present and not null and check(value), else default; a bad value is a 400."""
    value = data.get(name)
    if value is None:
        return default
    if not check(value):
        raise bad_request(f"'{name}' must be {rule}, got {json.dumps(value)[:60]}", param=name,
                          code="invalid_type" if not _same_kind(value, rule) else "invalid_value")
    return value


def _same_kind(value, rule):
    return ("integer" in rule and _is_int(value)) or ("number" in rule and _is_number(value))


def integer(data, name, low, high=None):
    rule = f"an integer >= {low}" + (f" and <= {high}" if high is not None else "")
    return optional(data, name, lambda v: _is_int(v) and v >= low and (high is None or v <= high), rule)


def number(data, name, low, high, default, low_open=False):
    rule = f"a number in {'(' if low_open else '['}{low:g}, {high:g}]"
    ok = lambda v: _is_number(v) and (v > low if low_open else v >= low) and v <= high
    return optional(data, name, ok, rule, default)


def flag(data, name):
    return optional(data, name, lambda v: isinstance(v, bool), "true or false", False)


def stop_strings(data):
    """'stop': a string or up to 4 strings."""
    stop = data.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) for s in stop):
        return [s for s in stop if s]
    raise bad_request("'stop' must be a string or a list of at most 4 strings", param="stop")


def sampling(data):
    """The generation settings every text endpoint shares."""
    n = integer(data, "n", 1)
    if n not in (None, 1):
        raise bad_request(f"'n' must be 1: this server generates one choice per request (got {n})", param="n",
                          code="invalid_value")
    stream_options = data.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise bad_request("'stream_options' must be an object", param="stream_options")
    usage = stream_options and stream_options.get("include_usage")
    if usage is not None and not isinstance(usage, bool):
        raise bad_request("'stream_options.include_usage' must be true or false", param="stream_options")
    for name in ("logprobs", "tools", "functions"):
        if data.get(name):
            raise bad_request(f"'{name}' is not supported by this server", param=name)
    response_format = data.get("response_format")
    if response_format is not None and (not isinstance(response_format, dict) or response_format.get("type") != "text"):
        raise bad_request("'response_format' may only be {\"type\": \"text\"} on this server", param="response_format")
    max_tokens = integer(data, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = integer(data, "max_tokens", 1)
    return dict(
        max_tokens=max_tokens,
        temperature=number(data, "temperature", 0, 2, 1.0),  # OpenAI's default is 1, not greedy
        top_p=number(data, "top_p", 0, 1, 1.0, low_open=True),
        seed=integer(data, "seed", -2 ** 63, 2 ** 64 - 1),
        stop=stop_strings(data),
        stream=flag(data, "stream"),
        include_usage=bool(usage),
    )


ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def _content(message, i):
    content = message.get("content")
    if content is None and message.get("role") == "assistant":
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: only text parts can be served
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad_request(f"messages[{i}].content: only text parts are supported here, not {kind!r}",
                                  param=f"messages[{i}].content")
            texts.append(part["text"])
        return "".join(texts)
    raise bad_request(f"messages[{i}].content must be a string or a list of text parts",
                      param=f"messages[{i}].content")


def messages(data):
    """'messages' as the chat template wants them: [{"role", "content"}] with text content."""
    msgs = data.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad_request("'messages' must be a non-empty list of {\"role\", \"content\"} objects",
                          param="messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise bad_request(f"messages[{i}] must be an object", param=f"messages[{i}]")
        role = m.get("role")
        if role not in ROLES:
            raise bad_request(f"messages[{i}].role must be one of {', '.join(ROLES)} (got {json.dumps(role)[:40]})",
                              param=f"messages[{i}].role")
        out.append({"role": ROLES[role], "content": _content(m, i)})
    return out


def prompt(data):
    """'prompt' of /v1/completions: a string, or a list holding one string."""
    p = data.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
        p = p[0]
    if not isinstance(p, str):
        raise bad_request("'prompt' must be a string (one prompt per request)", param="prompt")
    for name in ("echo", "suffix"):
        if data.get(name):
            raise bad_request(f"'{name}' is not supported by this server", param=name)
    if data.get("best_of") not in (None, 1):
        raise bad_request("'best_of' must be 1 on this server", param="best_of")
    return p
