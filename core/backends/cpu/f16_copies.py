"""f16 copies of float32 weight matrices whose every value converts to f16 exactly, for the
CPU kernels' few-row products (kernel_calls.f16_matmul).

A decoding step multiplies one row (or a few: beams) by each matrix, so it reads every weight
once a token: the step's time is reading memory. Whisper's checkpoints are stored in f16 and
load as float32, so the same values fit in half the bytes; float_rows.f16_rows widens each
weight with the CPU's own instruction. The copy is made once per matrix, at its first such
product, only when it is exact (the product then reads the same values), and lives as long as
the matrix's storage. A matrix that does not convert exactly is remembered as such (None), so
the check runs once.
"""
import weakref

import numpy as np

_copies: dict = {}  # (id(storage), offset, n, k) -> (weakref to the storage, f16 bits or None)


def exact_f16(st, offset, n, k):
    """The (n, k) float32 matrix at `offset` of the flat storage st as C-contiguous f16 bit
    patterns (uint16), or None when a value does not convert exactly."""
    key = (id(st), offset, n, k)
    hit = _copies.get(key)
    if hit is not None and hit[0]() is st:
        return hit[1]
    w = st[offset:offset + n * k].reshape(n, k)
    h = w.astype(np.float16)
    bits = h.view(np.uint16) if np.array_equal(h, w) else None
    _copies[key] = (weakref.ref(st, lambda _r, key=key: _copies.pop(key, None)), bits)
    return bits
