"""Chat templates: the Jinja template shipped in GGUF metadata or
tokenizer_config.json, rendered the way `transformers` renders it (sandboxed
Jinja, trim_blocks/lstrip_blocks, loop controls, `raise_exception`, a
`tojson` that keeps non-ASCII text, `strftime_now`)."""
import functools
import json

from ..errors import Error, UnsupportedError


class ChatTemplateError(Error, ValueError):
    """The template itself refused the conversation (its `raise_exception` was called)."""


def _raise_exception(message):
    raise ChatTemplateError(f"chat template: {message}")


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    from datetime import datetime
    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=8)
def compile_template(source):
    try:
        import jinja2
        from jinja2.ext import Extension, loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise UnsupportedError("apply_chat_template needs jinja2 (pip install jinja2)") from None

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

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template does not parse: {e}") from None


def render(source, messages, add_generation_prompt=True, special_tokens=None, **kwargs):
    """Render `source` for `messages` (list of {"role", "content"} dicts)."""
    template = compile_template(source)
    variables = dict(special_tokens or {})
    variables.update(kwargs)
    import jinja2
    try:
        return template.render(messages=messages, add_generation_prompt=add_generation_prompt, **variables)
    except jinja2.TemplateError as e:  # undefined names, sandbox refusals
        raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from None
