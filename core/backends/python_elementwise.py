"""Element-wise kernels of the pure-Python backend.

Each kernel maps a sequence of Python numbers to a list; the caller rounds or
wraps the result to the dtype. The fast path runs C-level `map` over the math
functions; IEEE corner cases that Python raises on (log(0), exp(1000), 1/0,
sqrt(-1), ...) retry with a per-element version that answers as numpy does.
"""
import math
import operator
from itertools import repeat

from ..errors import DTypeError
from .python_storage import int_range

INF = math.inf
NAN = math.nan
_ARITH_ERRORS = (ValueError, OverflowError, ZeroDivisionError)


def _guarded(fast, safe):
    """Run fast(xs); on a Python arithmetic error run safe per element instead."""
    def run(xs):
        try:
            return fast(xs)
        except _ARITH_ERRORS:
            return list(map(safe, xs))
    return run


# ---- IEEE-style scalar fallbacks -------------------------------------------------------
def _exp(x):
    try:
        return math.exp(x)
    except OverflowError:
        return INF


def _log(x):
    if x > 0 or x != x:
        return math.log(x)
    return -INF if x == 0 else NAN


def _sqrt(x):
    return NAN if x < 0 else math.sqrt(x)


def _rsqrt(x):
    if x > 0:
        return 1.0 / math.sqrt(x)
    return math.copysign(INF, x) if x == 0 else NAN


def _finite_only(fn):
    return lambda x: fn(x) if x - x == 0 else NAN  # sin(inf) is NaN, not an error


def _reciprocal(x):
    return 1.0 / x if x != 0 else math.copysign(INF, x)


def _integral(fn):
    return lambda x: float(fn(x)) if x - x == 0 else x  # floor(inf) = inf, floor(nan) = nan


def _sigmoid(x):
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)  # never overflows for x < 0
    return e / (1.0 + e)


def _is_odd_integer(y):
    return y - y == 0 and y == int(y) and int(y) % 2 == 1


def safe_pow(x, y):
    try:
        return math.pow(x, y)
    except OverflowError:
        return -INF if x < 0 and _is_odd_integer(y) else INF
    except ValueError:
        if x == 0:  # zero to a negative power
            return math.copysign(INF, x) if _is_odd_integer(y) else INF
        return NAN  # negative base, fractional exponent


def safe_div(x, y):
    try:
        return x / y
    except ZeroDivisionError:
        if x == 0 or x != x:
            return NAN
        return INF if (x > 0) == (math.copysign(1.0, y) > 0) else -INF


# ---- unary -----------------------------------------------------------------------------------
_SQRT_HALF = 1.0 / math.sqrt(2.0)
_TANH_C = math.sqrt(2.0 / math.pi)


def _sigmoid_list(xs):
    try:
        return [1.0 / (1.0 + e) for e in map(math.exp, [-x for x in xs])]
    except OverflowError:
        return list(map(_sigmoid, xs))


def _gelu(xs):
    return [0.5 * x * (1.0 + e) for x, e in zip(xs, map(math.erf, [x * _SQRT_HALF for x in xs]))]


def _gelu_tanh(xs):
    inner = [_TANH_C * (x + 0.044715 * x * x * x) for x in xs]
    return [0.5 * x * (1.0 + t) for x, t in zip(xs, map(math.tanh, inner))]


def _silu(xs):
    return [x * s for x, s in zip(xs, _sigmoid_list(xs))]


FLOAT_UNARY = {
    "neg": lambda xs: [-x for x in xs],
    "abs": lambda xs: list(map(abs, xs)),
    "exp": _guarded(lambda xs: list(map(math.exp, xs)), _exp),
    "expm1": _guarded(lambda xs: list(map(math.expm1, xs)), lambda x: math.expm1(x) if x < 709 else INF),
    "log": _guarded(lambda xs: list(map(math.log, xs)), _log),
    "sqrt": _guarded(lambda xs: list(map(math.sqrt, xs)), _sqrt),
    "rsqrt": _guarded(lambda xs: [1.0 / r for r in map(math.sqrt, xs)], _rsqrt),
    "sin": _guarded(lambda xs: list(map(math.sin, xs)), _finite_only(math.sin)),
    "cos": _guarded(lambda xs: list(map(math.cos, xs)), _finite_only(math.cos)),
    "tanh": lambda xs: list(map(math.tanh, xs)),
    "sigmoid": _sigmoid_list,
    "relu": lambda xs: [0.0 if x < 0 else x for x in xs],  # NaN stays NaN, as np.maximum
    "gelu": _gelu,
    "gelu_tanh": _gelu_tanh,
    "silu": _silu,
    "square": lambda xs: [x * x for x in xs],
    "reciprocal": _guarded(lambda xs: [1.0 / x for x in xs], _reciprocal),
    "floor": _guarded(lambda xs: list(map(math.floor, xs)), _integral(math.floor)),
    "ceil": _guarded(lambda xs: list(map(math.ceil, xs)), _integral(math.ceil)),
    "round": _guarded(lambda xs: list(map(round, xs)), _integral(round)),  # half to even
    "sign": lambda xs: [(x > 0) - (x < 0) if x == x else x for x in xs],
    "logical_not": lambda xs: [x == 0 for x in xs],
}

# Ops that stay within the integers; the rest need a float dtype.
INT_UNARY = {
    "neg": FLOAT_UNARY["neg"],
    "abs": FLOAT_UNARY["abs"],
    "relu": lambda xs: [0 if x < 0 else x for x in xs],
    "square": FLOAT_UNARY["square"],
    "floor": list, "ceil": list, "round": list,
    "sign": lambda xs: [(x > 0) - (x < 0) for x in xs],
    "logical_not": FLOAT_UNARY["logical_not"],
}


def clamp(xs, lo, hi):
    if lo is not None and hi is not None:
        return [lo if x < lo else (hi if x > hi else x) for x in xs]  # NaN passes through
    if lo is not None:
        return [lo if x < lo else x for x in xs]
    if hi is not None:
        return [hi if x > hi else x for x in xs]
    return list(xs)


def pow_scalar(xs, e, dtype):
    if dtype.kind in "iub" and isinstance(e, int):
        if e < 0:
            raise DTypeError(f"pow_scalar: integer tensor ({dtype.name}) to a negative integer power {e}")
        mod = int_range(dtype)[2]
        return [pow(x, e, mod) for x in xs]
    if e == 2:
        return [x * x for x in xs]
    if e == 1:
        return list(xs)
    return _guarded(lambda v: list(map(math.pow, v, repeat(e))), lambda x: safe_pow(x, e))(xs)


def affine(xs, mul, add):
    return [x * mul + add for x in xs]


def unary(op, xs, dtype, arg=None):
    """The op applied to xs (already read in row-major order), as a list."""
    if op == "clamp":
        return clamp(xs, *arg)
    if op == "pow_scalar":
        return pow_scalar(xs, arg, dtype)
    if op == "affine":
        return affine(xs, *arg)
    table = FLOAT_UNARY if dtype.is_float else INT_UNARY
    fn = table.get(op)
    if fn is None:
        if op in FLOAT_UNARY:
            raise DTypeError(f"unary {op} needs a float tensor, got {dtype.name}")
        raise DTypeError(f"unknown unary op {op!r}")
    return fn(xs)


# ---- binary and compare -------------------------------------------------------------------
def _map2(fn):
    return lambda a, b: list(map(fn, a, b))


FLOAT_BINARY = {
    "add": _map2(operator.add),
    "sub": _map2(operator.sub),
    "mul": _map2(operator.mul),
    "div": lambda a, b: _guarded2(operator.truediv, safe_div, a, b),
    "pow": lambda a, b: _guarded2(math.pow, safe_pow, a, b),
    # NaN in either operand propagates, as np.maximum / np.minimum.
    "maximum": lambda a, b: [x if x > y or x != x else y for x, y in zip(a, b)],
    "minimum": lambda a, b: [x if x < y or x != x else y for x, y in zip(a, b)],
}


def _guarded2(fast, safe, a, b):
    try:
        return list(map(fast, a, b))
    except _ARITH_ERRORS:
        return list(map(safe, a, b))


def _int_pow(dtype):
    mod = int_range(dtype)[2]

    def run(a, b):
        if any(y < 0 for y in b):
            raise DTypeError(f"pow: integer tensor ({dtype.name}) to a negative integer power")
        return [pow(x, y, mod) for x, y in zip(a, b)]
    return run


COMPARE = {
    "eq": operator.eq, "ne": operator.ne, "lt": operator.lt,
    "le": operator.le, "gt": operator.gt, "ge": operator.ge,
}


def binary(op, a, b, dtype):
    """op over two equally long sequences, as a list (ints unwrapped, floats unrounded)."""
    if dtype.is_float:
        fn = FLOAT_BINARY.get(op)
    elif op == "pow":
        fn = _int_pow(dtype)
    elif op == "maximum":
        fn = lambda a, b: [x if x > y else y for x, y in zip(a, b)]  # noqa: E731
    elif op == "minimum":
        fn = lambda a, b: [x if x < y else y for x, y in zip(a, b)]  # noqa: E731
    else:
        # div: the front end promotes ints to float first; here it is true division
        # truncated back to the integer dtype, as the numpy backend does.
        fn = FLOAT_BINARY.get(op)
    if fn is None:
        raise DTypeError(f"unknown binary op {op!r}")
    return fn(a, b)


def compare(op, a, b):
    fn = COMPARE.get(op)
    if fn is None:
        raise DTypeError(f"unknown compare op {op!r}")
    return list(map(fn, a, b))
