"""Kernels the wasm device (backend.py) needs beside the decode and GEMM kernels: greedy decoding's
argmax over the logits.

  argmax_f32(x, rows, n, out)   out[r] (i64) = the first index of the largest of x[r, :n], a NaN
                                counting as larger than everything (numpy's argmax); n >= 1
"""
from llvmlite import ir

from .kernels_ir import _F32, _I64, _P32, _function, _Loop, _slot


def _argmax(module):
    b, (x, rows, n, out) = _function(module, "argmax_f32", [(_P32, _F32), (ir.IntType(32), _I64),
                                                            (ir.IntType(32), _I64), (_P32, ir.IntType(32))])
    out = b.bitcast(out, _I64.as_pointer())  # (an i64 pointer cannot be asked of _function: _I64 means a count)
    with _Loop(b, rows) as r:
        row = b.gep(x, [b.mul(r, n)])
        best = _slot(b, b.load(row))
        at = _slot(b, ir.Constant(_I64, 0))
        b.store(b.load(row), best)
        b.store(ir.Constant(_I64, 0), at)
        with _Loop(b, n, start=1) as j:
            v, top = b.load(b.gep(row, [j])), b.load(best)
            # v wins if it is larger, or a NaN while the best so far is not (the first NaN stays)
            wins = b.or_(b.fcmp_ordered(">", v, top), b.and_(b.fcmp_unordered("uno", v, v),
                                                             b.fcmp_ordered("ord", top, top)))
            b.store(b.select(wins, v, top), best)
            b.store(b.select(wins, j, b.load(at)), at)
        b.store(b.load(at), b.gep(out, [r]))
    b.ret_void()


def add_kernels(module):
    _argmax(module)
