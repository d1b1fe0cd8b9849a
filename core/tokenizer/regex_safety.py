"""Refuse tokenizer regexes that can backtrack without bound.

A tokenizer.json's Split pre-tokenizer and Replace normalizer/decoder carry
regexes that run over every prompt. A backtracking engine (the stdlib `re`,
Oniguruma in `tokenizers`) takes time exponential in the text's length on
patterns such as `(a+)+$` or `(a|a)*$` against "aaaa...b": the pure-Python
tokenizer hangs, and the library gives up with a Rust panic. The stdlib `re`
has no step budget and a linear-time engine in pure Python would be ~100x
slower on every prompt, so the patterns are checked once, at load, and refused
when a repeated part can match the same text in more than one way:

- a quantifier over something holding a variable quantifier, where one of the
  two is unbounded: `(a+)+`, `(a*b?)*`, `(a{1,3})+`, `(a+){2,9}`;
- a repeated alternation whose branches do not start with distinct literal
  characters: `(a|ab)*`, `(a|a)*` (sre folds single-character branches such
  as `(\\w|\\d)` into one class, which matches each character one way: fine).

- two or more unbounded repeats in one sequence, each followed by something
  that can fail: `a*a*a*\\d` (polynomial: n^k steps per start; Oniguruma hits
  its retry limit and panics).

Real tokenizers' patterns (GPT-2, Llama-3, Qwen2, StarCoder/SmolLM2) pass. Not
caught: such repeats split across groups (`(a*a*)b`), and the quadratic cost
of one repeat that fails at every start (`a*b` over "aaaa..." with no b) --
tokenizer patterns end in a branch that matches any character, so they do not.
"""
import importlib
import re

try:  # Python 3.11+ (and Pyodide); sre_parse is the older, deprecated name
    _sre_constants = importlib.import_module("re._constants")
    _sre_parser = importlib.import_module("re._parser")
except ImportError:  # pragma: no cover
    _sre_constants = importlib.import_module("sre_constants")
    _sre_parser = importlib.import_module("sre_parse")

from ..errors import FormatError

_REPEATS = {_sre_constants.MAX_REPEAT, _sre_constants.MIN_REPEAT}
if hasattr(_sre_constants, "POSSESSIVE_REPEAT"):
    _REPEATS.add(_sre_constants.POSSESSIVE_REPEAT)
_UNBOUNDED = _sre_constants.MAXREPEAT
# \p{L}, \P{N}, \pL -> \w: the check needs the pattern's shape, not its classes (and sre knows no \p).
_PROPERTY = re.compile(r"\\(?:[pP](?:\{[^}]*\}|.)|.)", re.S)


class _Refused(Exception):
    pass


def _children(op, av):
    """The sub-patterns of one parsed node."""
    if op in _REPEATS:
        return [av[2]]
    if op is _sre_constants.SUBPATTERN:
        return [av[-1]]
    if op is _sre_constants.BRANCH:
        return list(av[1])
    if op in (_sre_constants.ASSERT, _sre_constants.ASSERT_NOT):
        return [av[1]]
    if op is _sre_constants.GROUPREF_EXISTS:
        return [p for p in av[1:] if p is not None]
    if getattr(_sre_constants, "ATOMIC_GROUP", None) is op:
        return [av]
    return []


def _first_literal(branch):
    """The literal character a branch must start with, or None."""
    for op, av in branch:
        if op is _sre_constants.SUBPATTERN:
            return _first_literal(av[-1])
        return av if op is _sre_constants.LITERAL else None
    return None


def _can_fail(op, av):
    """Whether one node can fail to match (a node that can match nothing never fails)."""
    if op in _REPEATS:
        return av[0] > 0 and _seq_can_fail(av[2])
    if op is _sre_constants.SUBPATTERN:
        return _seq_can_fail(av[-1])
    if op is _sre_constants.BRANCH:
        return all(_seq_can_fail(b) for b in av[1])
    return True


def _seq_can_fail(items):
    return any(_can_fail(op, av) for op, av in items)


def _has_unbounded(op, av):
    if op in _REPEATS and av[1] == _UNBOUNDED:
        return True
    return any(_has_unbounded(o, a) for child in _children(op, av) for o, a in child)


def _walk(items, enclosing):
    """enclosing: None, "bounded" or "unbounded": the loosest repeat (max > 1) around `items`."""
    items = list(items)
    # Two unbounded repeats in a row before something that can fail trade characters
    # back and forth: a*a*a*b takes n^3 steps a start on "aaa...".
    traded = [i for i, (op, av) in enumerate(items) if _has_unbounded(op, av) and _seq_can_fail(items[i + 1:])]
    if len(traded) >= 2:
        raise _Refused("unbounded repeats in a row before something that can fail")
    for op, av in items:
        if op in _REPEATS:
            low, high, body = av
            unbounded = high == _UNBOUNDED
            if enclosing is not None and low != high and (unbounded or enclosing == "unbounded"):
                raise _Refused("a quantifier nested inside another")
            inner = enclosing
            if high > 1:
                inner = "unbounded" if unbounded or enclosing == "unbounded" else "bounded"
            _walk(body, inner)
            continue
        if op is _sre_constants.BRANCH and enclosing is not None:
            firsts = [_first_literal(b) for b in av[1]]
            if None in firsts or len(set(firsts)) < len(firsts):
                raise _Refused("a repeated alternation whose branches can start alike")
        for child in _children(op, av):
            _walk(child, enclosing)


def check(pattern, owner="tokenizer"):
    """Raise FormatError if `pattern` (Oniguruma syntax) can backtrack without bound.
    A pattern sre cannot parse passes here: its compiler (ours or the library's) reports it."""
    shape = _PROPERTY.sub(lambda m: "\\w" if m.group()[1] in "pP" else m.group(), pattern)
    try:
        parsed = _sre_parser.parse(shape)
    except (re.error, RecursionError, OverflowError, ValueError):
        return
    try:
        _walk(parsed, None)
    except _Refused as e:
        raise FormatError(f"{owner} regex {pattern!r:.80} can backtrack without bound ({e}): tallow refuses such "
                          f"patterns; rewrite it without nested, ambiguous or back-to-back repeats") from None
    except RecursionError:
        raise FormatError(f"{owner} regex {pattern!r:.80} nests too deeply") from None


def check_spec(spec, source):
    """Check every {"Regex": ...} pattern in a tokenizer.json's normalizer, pre-tokenizer and decoder."""
    def walk(node, where):
        if isinstance(node, dict):
            pattern = node.get("pattern")
            if isinstance(pattern, dict) and isinstance(pattern.get("Regex"), str):
                check(pattern["Regex"], f"{source}: {where}")
            for value in node.values():
                walk(value, where)
        elif isinstance(node, list):
            for value in node:
                walk(value, where)
    for key in ("normalizer", "pre_tokenizer", "decoder"):
        walk(spec.get(key), key)
