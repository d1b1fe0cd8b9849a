"""Chat templates: the Jinja template shipped in GGUF metadata or
tokenizer_config.json, rendered the way `transformers` renders it (sandboxed
Jinja, trim_blocks/lstrip_blocks, loop controls, `raise_exception`, a
`tojson` that keeps non-ASCII text, `strftime_now`).

The template is untrusted code from a model file: it renders in jinja2's
immutable sandbox with tallow's work and size bounds (template_limits.py), and
every way it can fail (syntax, undefined names, sandbox refusals, 1/0, deep
recursion, huge values, too much work or output) is a ChatTemplateError that
names the model file."""
import functools
import json

from ..errors import ChatTemplateError, UnsupportedError
from . import template_limits as limits

MAX_OUTPUT_CHARS = limits.MAX_ITEMS  # a prompt this long is far past any context window


class _Refused(Exception):
    """The template's own raise_exception(); its message is the template author's."""


def _raise_exception(message):
    raise _Refused(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    from datetime import datetime
    return datetime.now().strftime(fmt)


def _jinja():
    try:
        import jinja2
        import jinja2.sandbox
    except ImportError:
        raise UnsupportedError("apply_chat_template needs jinja2 (pip install jinja2)") from None
    return jinja2


@functools.lru_cache(maxsize=1)
def _environment():
    jinja2 = _jinja()
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        """`{% generation %}...{% endgeneration %}` marks assistant text for
        training masks in transformers; for rendering it is its body."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        """The immutable sandbox, with every call and the exploding operators checked."""
        intercepted_binops = limits.INTERCEPTED_BINOPS

        def call_binop(self, context, operator, left, right):
            return limits.bounded_binop(operator, left, right)

        def call(__self, __context, __obj, *args, **kwargs):
            def sandboxed(obj, *a, **k):
                return ImmutableSandboxedEnvironment.call(__self, __context, obj, *a, **k)
            return limits.bounded_call(sandboxed, __obj, args, kwargs)

    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = _tojson
    env.filters = {name: limits.bounded_filter(name, fn) for name, fn in env.filters.items()}
    env.globals.update({"raise_exception": _raise_exception, "strftime_now": _strftime_now,
                        "range": limits.bounded_range, limits.ITER_NAME: limits.bounded_iter,
                        limits.CONCAT_NAME: limits.bounded_concat})
    return env


@functools.lru_cache(maxsize=8)
def compile_template(source):
    """The compiled template, with loops and `~` rewritten to be bounded.
    Raises what jinja raises; render() turns it into a ChatTemplateError."""
    env = _environment()
    return env.from_string(limits.add_checks(env.parse(source)))


def render(source, messages, add_generation_prompt=True, special_tokens=None, origin="chat template", **kwargs):
    """Render `source` for `messages` (list of {"role", "content"} dicts).
    origin names where the template came from (the model file) in errors."""
    variables = dict(special_tokens or {})
    variables.update(kwargs)
    try:
        template = compile_template(source)
        with limits.budget_scope():
            pieces, size = [], 0
            for piece in template.generate(messages=messages, add_generation_prompt=add_generation_prompt,
                                           **variables):
                size += len(piece)
                if size > MAX_OUTPUT_CHARS:
                    raise limits.TemplateLimit(f"the output passed {MAX_OUTPUT_CHARS} characters")
                pieces.append(piece)
        return "".join(pieces)
    except _Refused as e:
        raise ChatTemplateError(f"{origin}: the chat template refused the conversation: {e}") from None
    except limits.TemplateLimit as e:
        raise ChatTemplateError(f"{origin}: the chat template went past tallow's bounds: {e}. "
                                f"Pass template=... to use another template.") from None
    except UnsupportedError:
        raise
    except Exception as e:  # syntax, undefined names, sandbox refusals, 1/0...
        kind = "does not parse" if type(e).__name__ == "TemplateSyntaxError" else "failed"
        raise ChatTemplateError(f"{origin}: the chat template {kind}: {type(e).__name__}: {e}. "
                                f"Pass template=... to use another template.") from None
