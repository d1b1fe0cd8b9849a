"""Reading a JSON file a user handed us (config.json, tokenizer.json, ...): every
failure is a FormatError naming the file, including nesting so deep that the
parser would recurse past Python's stack (a RecursionError otherwise)."""
import json

from .errors import FormatError

# Real configs and tokenizer files nest a handful of levels; this leaves a wide margin.
MAX_DEPTH = 64


def _too_deep(value, limit):
    """True if `value` nests containers more than `limit` deep (checked without recursion)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            if depth > limit:
                return True
            children = v.values() if isinstance(v, dict) else v
            stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def parse_json(text, source, max_depth=MAX_DEPTH):
    """The parsed JSON `text` (str or bytes) read from `source` (a name for messages)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise FormatError(f"{source}: JSON nested too deeply (more than {max_depth} levels)") from None
    except UnicodeDecodeError as e:
        raise FormatError(f"{source}: not UTF-8 ({e.reason} at byte {e.start})") from None
    except ValueError as e:
        raise FormatError(f"{source}: not valid JSON: {e}") from None
    if _too_deep(value, max_depth):
        raise FormatError(f"{source}: JSON nested too deeply (more than {max_depth} levels)")
    return value


def read_json(path, max_depth=MAX_DEPTH):
    """The parsed JSON file at `path`; a missing, unreadable or malformed file is a FormatError."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise FormatError(f"{path}: no such file") from None
    except OSError as e:
        raise FormatError(f"{path}: cannot read: {e.strerror or e}") from None
    return parse_json(data, path, max_depth)
