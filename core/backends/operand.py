"""Operands: what a backend primitive computes on.

An Operand is one tensor as a backend sees it, its storage and the Layout that reads it
(any strides, 0 for broadcast dims), as Candle passes (storage, &Layout) pairs. It is a
NamedTuple, so a backend unpacks it as `x, lx = op`. The other tuples here group the
operands a fused primitive takes together (a quantised weight, the two halves of a KV
cache, the new token's q/k/v, the rotary tables), so that no primitive needs more than a
few parameters; the options of a primitive are frozen dataclasses in specs.py.
"""
from typing import Any, NamedTuple

from ..dtypes import DType
from ..layout import Layout


class Operand(NamedTuple):
    """A tensor's storage and the layout that reads it."""
    storage: Any
    layout: Layout


class QuantWeight(NamedTuple):
    """A whole stored matrix of GGUF blocks: `rows` rows of `cols` weights each, of block type
    `dtype` (contiguous, no offset: blocks are not addressable by element strides)."""
    storage: Any
    dtype: DType
    rows: int
    cols: int


class KVCache(NamedTuple):
    """The key and value caches (b, kv_heads, capacity, d/dv), or the slots of them a step writes."""
    keys: Operand
    values: Operand


class QKV(NamedTuple):
    """A step's new queries (b, h, t, d), keys (b, kv_heads, t, d) and values (b, kv_heads, t, dv)."""
    q: Operand
    k: Operand
    v: Operand


class Rotary(NamedTuple):
    """Rotary embedding tables cos and sin (t, d/2) and their pairing: the half-split form rotates
    (x[:d/2], x[d/2:]), interleaved (GPT-J) rotates (x[0::2], x[1::2])."""
    cos: Operand
    sin: Operand
    interleaved: bool = False


def operand_of(tensor):
    """The Operand of a tensor, or None for None (an optional input)."""
    return None if tensor is None else Operand(tensor._storage, tensor._layout)


def parts(op):
    """(storage, layout) of an optional Operand: (None, None) for None."""
    return (None, None) if op is None else op
