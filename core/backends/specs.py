"""Specs: the options of the backend primitives that have more than one, as small frozen dataclasses.

A primitive takes its operands (operand.py), then the dtype it computes in, then at most one
spec (or a single plain option such as eps or an activation name). Specs are values: they
hold numbers and names, never storage, except the two layer specs of add_norm_linear, which
name the norm's and the projection's parameter operands together with their options.
Helpers adding a primitive add its spec here.
"""
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ConvSpec:
    """conv1d/conv2d options: ints for conv1d, (h, w) pairs for conv2d; padding is zeros on both ends."""
    stride: Any = 1
    padding: Any = 0
    dilation: Any = 1
    groups: int = 1


@dataclass(frozen=True, slots=True)
class AttentionSpec:
    """softmax(q k^T * scale + mask) v; causal masks key j > i + (tk - tq)."""
    scale: float
    causal: bool = False


@dataclass(frozen=True, slots=True)
class CacheAttentionSpec:
    """cache_attention: the step's new positions start at `position` in the cache, and its queries
    attend over the keys [key_start, position + t), scores times `scale`. window: set on a one-query
    step of a sliding-window layer, whose key_start is max(0, position + 1 - window): a backend that
    captures windowed steps (Backend.captures_windows) records the window, not the key_start, so a
    replay at a later position slides it."""
    position: int
    key_start: int
    scale: float
    window: int | None = None


@dataclass(frozen=True, slots=True)
class BatchCacheAttentionSpec:
    """batch_cache_attention: row i is written at positions[i] and attends over its keys
    [key_starts[i], positions[i] + 1), scores times `scale`."""
    positions: tuple
    key_starts: tuple
    scale: float


@dataclass(frozen=True, slots=True, eq=False)
class NormSpec:
    """The norm add_norm_linear applies: layer norm when `center` (subtract the mean, add
    `bias`), else RMS norm; `weight` and `bias` are Operands of shape (k,) or None."""
    weight: Any
    bias: Any
    eps: float
    center: bool = False


@dataclass(frozen=True, slots=True, eq=False)
class LinearSpec:
    """The projection add_norm_linear applies: `weight` an Operand of shape (rows, k) in the
    compute dtype (any layout) or a QuantWeight; `bias` an Operand (rows,) or None (never with
    `gated`); `act` a unary op name or None; `gated`: rows are [gate; up] and the result is
    act(gate) * up (rows / 2 wide)."""
    weight: Any
    bias: Any = None
    act: str | None = None
    gated: bool = False
