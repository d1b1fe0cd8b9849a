"""Untrusted chat templates: every failure is a ChatTemplateError naming the
model file, hostile ones stop fast in bounded memory, and ordinary ones render
exactly as plain jinja2's sandbox renders them.

"Fast" is bounded work, not a wall-clock figure (that fails on a busy machine): the
render's loop steps and calls, counted, and its peak memory."""
import tracemalloc

import pytest

from tallow.errors import ChatTemplateError, Error
from tallow.tokenizer import template_limits as limits
from tallow.tokenizer.chat_template import render

jinja2 = pytest.importorskip("jinja2")

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi ü"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}]

HOSTILE = {
    "divide by zero": "{{ 1/0 }}",
    "recursive macro": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "huge range": "{% for i in range(10**9) %}{% endfor %}",
    "nested loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "string repetition": "{{ 'a' * 10**10 }}",
    "list repetition": "{{ [0] * 10**9 }}",
    "huge power": "{{ 2 ** (10 ** 10) }}",
    "float overflow": "{{ 10.0 ** (10 ** 5) }}",
    "doubling with ~": ("{% set ns = namespace(s='ab') %}"
                        "{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"),
    "doubling with +": ("{% set ns = namespace(s='ab') %}"
                        "{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}"),
    "squaring": "{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}",
    "wide filter": "{{ 'a' | center(10000000000) }}",
    "wide method": "{{ 'a'.ljust(10000000000) }}",
    "wide % format": "{{ '%10000000000d' % 1 }}",
    "wide str.format": "{{ '{:>10000000000}'.format(1) }}",
    "growing replace": "{{ ('a' * 1000000).replace('a', 'a' * 1000) }}",
    "recursive loop": "{% for i in range(5) recursive %}{{ loop(range(5)) }}{% endfor %}",
    "deep nesting": "{{ " + "(" * 3000 + "1" + ")" * 3000 + " }}",
    "endless output": "{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}",
    "syntax error": "{% if %}",
    "undefined": "{{ nothing.here }}",
    "type error": "{{ 1 + 'a' }}",
    "sandbox escape": "{{ messages.__class__.__mro__ }}",
    "bad raise": "{{ raise_exception('no system prompts here') }}",
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_template_is_a_chat_template_error_fast_and_small(name, monkeypatch):
    steps = [0]
    step = limits.Budget.step

    def counted(budget):
        steps[0] += 1
        return step(budget)
    monkeypatch.setattr(limits.Budget, "step", counted)
    tracemalloc.start()
    try:
        with pytest.raises(ChatTemplateError) as err:
            render(HOSTILE[name], MESSAGES, origin="evil.gguf")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(err.value).startswith("evil.gguf: the chat template")
    assert steps[0] <= limits.MAX_STEPS + 1, f"{name}: {steps[0]} loop steps and calls"
    assert peak < 64 << 20, f"{name}: {peak >> 20} MiB"
    assert isinstance(err.value, Error)


def test_the_templates_own_refusal_keeps_its_message():
    with pytest.raises(ChatTemplateError, match="refused the conversation: no system prompts here"):
        render(HOSTILE["bad raise"], MESSAGES, origin="m.gguf")


ORDINARY = [
    # SmolLM2-135M-Instruct's own template
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
    # Llama-3 style: namespace, ~, filters, loop.index0, slicing
    "{{ bos_token }}{% set ns = namespace(sys='') %}{% if messages[0]['role'] == 'system' %}"
    "{% set ns.sys = messages[0]['content'] | trim %}{% set messages = messages[1:] %}{% endif %}"
    "{% if ns.sys %}<|start_header_id|>system<|end_header_id|>\n\n{{ ns.sys }}<|eot_id|>{% endif %}"
    "{% for m in messages %}{{ '<|start_header_id|>' ~ m['role'] ~ '<|end_header_id|>\n\n' ~ m['content'] | trim ~ "
    "'<|eot_id|>' }}{{ loop.index0 }}{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant{% endif %}",
    # macros, range, format, %, **, *, tojson-free arithmetic, loop.length / revindex
    "{% macro turn(m, i) %}[{{ '%02d' % i }}:{{ m.role | upper }}]{{ m.content | replace('?', '!') }}{% endmacro %}"
    "{% for m in messages %}{{ turn(m, loop.index) }}{{ '-' * loop.revindex }}"
    "{{ '{}/{}'.format(loop.index, loop.length) }}"
    "{% endfor %}{% for i in range(3) %}{{ 2 ** i }}{% endfor %}"
    "{{ (messages | map(attribute='role') | list) | join(',') }}"
    "{{ messages | selectattr('role', 'equalto', 'user') | list | length }}",
]


@pytest.mark.parametrize("source", ORDINARY)
def test_ordinary_templates_render_as_plain_jinja_does(source):
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    for gen in (True, False):
        want = plain.from_string(source).render(messages=MESSAGES, add_generation_prompt=gen, bos_token="<s>")
        assert render(source, MESSAGES, gen, {"bos_token": "<s>"}) == want


def test_each_render_gets_a_fresh_budget():
    """The budget is per render: a long conversation after a hostile render is not starved."""
    with pytest.raises(ChatTemplateError):
        render(HOSTILE["nested loops"], MESSAGES)
    long = MESSAGES * 2000
    assert render(ORDINARY[0], long).count("<|im_start|>") == len(long) + 1


def test_a_tokenizers_template_error_names_its_file(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tallow.tokenizer import Tokenizer
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"hi": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tok.save(str(tmp_path / "tokenizer.json"))
    ours = Tokenizer.from_file(tmp_path / "tokenizer.json")
    with pytest.raises(ChatTemplateError,
                       match=f"{tmp_path}.*tokenizer.json: the chat template failed: ZeroDivisionError"):
        ours.apply_chat_template(MESSAGES, template="{{ 1/0 }}")
