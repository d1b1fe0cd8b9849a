"""Bounds on what an untrusted chat template may do while it renders.

A chat template is code shipped inside a model file. jinja2's sandbox stops it
from reaching Python internals, but not from burning time or memory:
`range(10**9)`, nested loops, `'a' * 10**10`, a macro calling itself. This
module adds a work budget to the sandbox:

- every loop step and every call costs one step (MAX_STEPS per render), and
  a wall-clock deadline backs that up, since steps differ in cost;
- calls nest at most MAX_DEPTH deep (a recursive macro stops long before
  Python's own recursion limit);
- no string, list or dict built by `*`, `+`, `~`, `%`, a filter or a call
  may exceed MAX_ITEMS characters / items, checked *before* the big value is
  built where its size is known up front, and `**` / `*` on integers may not
  exceed MAX_INT_BITS bits;
- the output itself is capped by the renderer (chat_template.render).

Exceeding any of them raises TemplateLimit; chat_template turns it (like every
other failure) into a ChatTemplateError.
"""
import functools
import math
import re
import threading
import time

MAX_STEPS = 200_000          # loop iterations + calls per render; real templates use a few hundred
MAX_DEPTH = 32               # nested calls (macros, loop(), functions)
MAX_ITEMS = 4_000_000        # characters in a string, items in a list / dict
MAX_INT_BITS = 4096          # `**` and `*` on integers
MAX_SECONDS = 5.0            # a render takes milliseconds; this only backs up the step count

# String methods and filters whose integer arguments are widths or counts of the output.
_WIDTH_METHODS = {"center", "ljust", "rjust", "zfill", "expandtabs", "indent", "wordwrap", "format", "tojson"}
_FORMAT_WIDTH = re.compile(r"(\d+)")


class TemplateLimit(Exception):
    """A template went past one of the bounds above."""


class Budget:
    """The work left to one render; one per render, found through a thread-local."""

    def __init__(self):
        self.steps = 0
        self.depth = 0
        self.deadline = time.monotonic() + MAX_SECONDS

    def step(self):
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise TemplateLimit(f"more than {MAX_STEPS} loop steps and calls")
        if self.steps % 256 == 0 and time.monotonic() > self.deadline:
            raise TemplateLimit(f"rendering took more than {MAX_SECONDS:g} s")


_active = threading.local()


def current_budget():
    """The running render's budget; outside one (jinja folding constants at
    compile time) a throwaway one, so sizes are still checked."""
    return getattr(_active, "budget", None) or Budget()


class budget_scope:
    """`with budget_scope():` gives the renders inside it a fresh budget (per thread)."""

    def __enter__(self):
        self.saved = getattr(_active, "budget", None)
        _active.budget = Budget()
        return _active.budget

    def __exit__(self, *exc):
        _active.budget = self.saved


def check_size(value, what):
    """Refuse a string / list / dict longer than MAX_ITEMS; return the value."""
    if isinstance(value, (str, bytes, list, tuple, dict, set, frozenset)) and len(value) > MAX_ITEMS:
        raise TemplateLimit(f"{what} made a value of {len(value)} items (the limit is {MAX_ITEMS})")
    return value


def _check_int(value, what):
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_INT_BITS:
        raise TemplateLimit(f"{what} made an integer of {value.bit_length()} bits (the limit is {MAX_INT_BITS})")
    return value


def _sized(value):
    return isinstance(value, (str, bytes, list, tuple))


def _check_widths(name, args, kwargs):
    """Integer arguments of width-taking methods / filters, and widths written in format strings."""
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > MAX_ITEMS:
            raise TemplateLimit(f"{name}() with a width or count of {a} (the limit is {MAX_ITEMS})")


def _check_format_string(fmt, name):
    """'%99999999d' or '{:>99999999}' would build a huge string from a short one."""
    if isinstance(fmt, str):
        for digits in _FORMAT_WIDTH.findall(fmt):
            if len(digits) > 7 and int(digits) > MAX_ITEMS and ("%" in fmt or "{" in fmt):
                raise TemplateLimit(f"{name}: a format width of {digits} (the limit is {MAX_ITEMS})")


def bounded_binop(operator, left, right):
    """The size of `left <op> right` before computing it, for the operators that can explode."""
    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            if _sized(seq) and isinstance(n, int):
                if len(seq) * max(n, 0) > MAX_ITEMS:
                    raise TemplateLimit(f"repeating {len(seq)} items {n} times (the limit is {MAX_ITEMS})")
                return left * right
        if isinstance(left, int) and isinstance(right, int):
            if left.bit_length() + right.bit_length() > MAX_INT_BITS:
                raise TemplateLimit(f"multiplying integers past {MAX_INT_BITS} bits")
        return left * right
    if operator == "**":
        if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
            if right * math.log2(abs(left)) > MAX_INT_BITS:
                raise TemplateLimit(f"{left} ** {right} has more than {MAX_INT_BITS} bits")
        return _check_int(left ** right, "**")
    if operator == "+":
        if _sized(left) and _sized(right) and len(left) + len(right) > MAX_ITEMS:
            raise TemplateLimit(f"joining {len(left)} and {len(right)} items (the limit is {MAX_ITEMS})")
        return left + right
    if operator == "%":
        if isinstance(left, str):
            _check_format_string(left, "%")
            for a in right if isinstance(right, tuple) else (right,):
                if isinstance(a, int) and not isinstance(a, bool) and abs(a) > MAX_ITEMS and "*" in left:
                    raise TemplateLimit(f"%: a '*' width of {a} (the limit is {MAX_ITEMS})")
            return check_size(left % right, "%")
        return left % right
    raise ValueError(f"bounded_binop: {operator!r} is not intercepted")


INTERCEPTED_BINOPS = frozenset({"*", "**", "+", "%"})


def bounded_call(call, obj, args, kwargs):
    """One sandboxed call: a step, one level deeper, widths and the result's size checked."""
    budget = current_budget()
    budget.step()
    name = getattr(obj, "__name__", type(obj).__name__)
    # The sandbox hands out str.format wrapped; __wrapped__ is the bound method.
    owner = getattr(getattr(obj, "__wrapped__", obj), "__self__", None)
    if name in _WIDTH_METHODS or (name == "replace" and isinstance(owner, str)):
        _check_widths(name, args, kwargs)
        if name == "format":
            _check_format_string(owner, "format")
        if name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
            s, old, new = owner, args[0], args[1]
            grows = (s.count(old) if old else len(s) + 1) * (len(new) - len(old))
            if len(s) + grows > MAX_ITEMS:
                raise TemplateLimit(f"replace() would make {len(s) + grows} characters (the limit is {MAX_ITEMS})")
    if budget.depth >= MAX_DEPTH:
        raise TemplateLimit(f"calls nested more than {MAX_DEPTH} deep (a macro that calls itself?)")
    budget.depth += 1
    try:
        result = call(obj, *args, **kwargs)
    finally:
        budget.depth -= 1
    return _check_int(check_size(result, f"{name}()"), f"{name}()")


def bounded_filter(name, fn):
    """Wrap a filter: widths and counts in its arguments, the size of its result.
    functools.wraps keeps jinja's pass_context/pass_environment mark."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        current_budget().step()
        # Skip the leading context/environment argument and the filtered value.
        rest = [a for a in args[1:] if isinstance(a, int)]
        _check_widths(f"|{name}", rest, kwargs)
        if name == "format" and args:
            _check_format_string(next((a for a in args if isinstance(a, str)), None), "|format")
        if name == "replace":
            strs = [a for a in args if isinstance(a, str)]
            if len(strs) >= 3:
                s, old, new = strs[:3]
                grows = (s.count(old) if old else len(s) + 1) * (len(new) - len(old))
                if len(s) + grows > MAX_ITEMS:
                    raise TemplateLimit(f"|replace would make {len(s) + grows} characters (the limit is {MAX_ITEMS})")
        return check_size(fn(*args, **kwargs), f"|{name}")

    return wrapper


def bounded_range(*args):
    """range() no longer than MAX_ITEMS (its steps are counted by the loop that walks it)."""
    r = range(*args)
    if len(r) > MAX_ITEMS:
        raise TemplateLimit(f"range of {len(r)} items (the limit is {MAX_ITEMS})")
    return r


def bounded_iter(iterable):
    """What every `{% for %}` walks: one budget step per item."""
    budget = current_budget()
    for item in iterable:
        budget.step()
        yield item


def bounded_concat(*parts):
    """`a ~ b ~ c`: the joined length is checked before joining."""
    texts = [p if isinstance(p, str) else str(p) for p in parts]
    if sum(map(len, texts)) > MAX_ITEMS:
        raise TemplateLimit(f"~ would make {sum(map(len, texts))} characters (the limit is {MAX_ITEMS})")
    return "".join(texts)


ITER_NAME, CONCAT_NAME = "__tallow_loop", "__tallow_concat"


def add_checks(ast):
    """Rewrite a parsed template so every for-loop walks bounded_iter and every
    `~` goes through bounded_concat (jinja offers no hook for either)."""
    from jinja2 import nodes
    from jinja2.visitor import NodeTransformer

    class Rewrite(NodeTransformer):
        def visit_For(self, node):
            self.generic_visit(node)
            node.iter = nodes.Call(nodes.Name(ITER_NAME, "load"), [node.iter], [], None, None, lineno=node.lineno)
            return node

        def visit_Concat(self, node):
            self.generic_visit(node)
            return nodes.Call(nodes.Name(CONCAT_NAME, "load"), list(node.nodes), [], None, None, lineno=node.lineno)

    return Rewrite().visit(ast)
