"""Whisper's one-token decoding step on the CPU as one step program (backends/cpu/kernels/step_loop.py): no
Python between its kernels, and the threads share each product's rows and the cross-attention's
heads through atomic counters instead of a hand-off per product.

whisper_cpu_decoder.py's step made about 100 numpy and kernel calls a token (Whisper tiny.en),
each product a BLAS call or a pool hand-off: at two threads that was 11-14 ms a token on
jfk.wav, where reading the weights once takes about 2 ms. Here, for a state's batch (the
beams), the program is built once: the token rows plus their positions, then per layer the
norm with its residual add, q, k and v as three products (so each lands contiguous for any
batch), cache_attention (the new key and value written at the step buffer's position, then
causal attention over the cache), the out product, the cross-attention over the audio's keys,
the MLP with GELU; the final norm and the output head. Products run on f16 copies of the
matrices (CpuDecoder makes them where every value converts exactly) or on GGUF blocks (q8_0:
activations quantised to 16 bits first, as int_dot does).

`build(decoder, state, b)` returns None where a matrix is neither (the eager step then runs). The
values are the eager step's up to float32 rounding: the same f16 and block kernels and norms, but
attention runs in compiled loops instead of BLAS.
"""
import numpy as np

from ..backends.cpu.kernels.codes import (OP_ATTENTION, OP_CROSS_ATTENTION, OP_F16_PRODUCT, OP_GELU, OP_LAYER_NORM,
                                          OP_PRODUCT, OP_QUANTIZE, OP_ROWS, OP_TOKEN_ROWS, SHARED_ROWS)
from ..backends.cpu.runtime import kernel_calls
from ..backends.cpu.runtime.step_program import SHARE_MIN_BYTES, Program
from ..backends.cpu.runtime.threads import CHUNKS_PER_THREAD
from ..quant import quant_dtype


class StepProgram:
    """One decoding state's one-token step at batch b: run(ids, position) -> logits (b, vocab)."""

    def __init__(self, program, ids, logits):
        self.program, self.ids, self.logits = program, ids, logits

    def run(self, ids, position):
        self.ids[:] = ids
        self.program.step[0] = position
        self.program.run()
        return self.logits.copy()


def build(decoder, state, b):
    """The StepProgram of `state` (a CpuDecoderState whose caches hold b rows), or None when a
    matrix has neither an f16 copy nor blocks the kernels read, and under NUMBA_DISABLE_JIT=1."""
    from ..backends.cpu.kernels import machine_code
    if machine_code.jit_disabled():  # run_step's pointer intrinsics are compiled code only
        return None
    linears = [decoder.head] + [getattr(layer, name) for layer in decoder.layers
                                for name in ("qkv", "out", "cross_q", "cross_out", "fc1", "fc2")]
    if any(lin.f16 is None and not (lin.blocks and kernel_calls.supports(lin.qtype)) for lin in linears):
        return None
    return _Builder(decoder, state, b).program()


class _Builder:
    def __init__(self, decoder, state, b):
        self.decoder, self.state, self.b = decoder, state, b
        self.rows, self.reals, self.keep = [], [], []
        self.threads = kernel_calls.threads()
        self.quantized = {}  # id(x) -> (qx, dx, sx) of the activations last quantised from x

    def at(self, a):
        assert a.flags.c_contiguous
        self.keep.append(a)
        return a.__array_interface__["data"][0]

    def row(self, *values, real=0.0, shared=(0, 0)):
        self.rows.append(list(values) + [0] * (SHARED_ROWS - len(values)) + list(shared))
        self.reals.append(float(real))

    def chunks(self, n_rows, nbytes):
        return min(n_rows, self.threads * CHUNKS_PER_THREAD) if self.threads > 1 and nbytes >= SHARE_MIN_BYTES else 1

    def buffer(self, *shape):
        a = np.zeros(shape, np.float32)
        self.keep.append(a)
        return a

    def norm(self, x, residual, norm, out):
        self.row(OP_LAYER_NORM, self.at(x), self.at(residual), self.at(norm.w), self.at(x), self.at(out),
                 x.shape[0], x.shape[1], self.at(norm.b), norm.w.size, norm.b.size, real=norm.eps)

    def product(self, linear, x, out, lo=0, hi=None, quantized=False):
        """out = x W[lo:hi]^T + b[lo:hi] (rows lo ... hi - 1 of the linear layer); quantized: x's
        values are the ones the last quantize(x) row read (blocks: no second OP_QUANTIZE)."""
        hi = linear.n if hi is None else hi
        bias = np.empty(0, np.float32) if linear.bias is None else linear.bias[lo:hi]
        m, k = x.shape
        if linear.f16 is not None:
            raw = linear.f16[lo:hi].reshape(-1).view(np.uint8)
            self.row(OP_F16_PRODUCT, self.at(raw), self.at(x), self.at(out), self.at(bias), m, k, hi - lo,
                     raw.size, bias.size, shared=(hi - lo, self.chunks(hi - lo, raw.nbytes)))
            return
        d = quant_dtype(linear.qtype)
        fmt = kernel_calls.kernels().FORMATS[d.name]
        raw = kernel_calls._blocks(linear.raw, d, linear.n, linear.k).reshape(linear.n, -1)[lo:hi].reshape(-1)
        qx, dx, sx = self.quantized[id(x)] if quantized else self.quantize(x)
        self.row(OP_PRODUCT, fmt, d.block_size, d.block_bytes, self.at(raw), self.at(qx), self.at(dx),
                 self.at(sx), self.at(out), self.at(bias), 0, 0, m, k, hi - lo, bias.size, raw.size,
                 shared=(hi - lo, self.chunks(hi - lo, raw.nbytes)))

    def quantize(self, x):
        """A row quantising x's activations to 16-bit blocks (int_dot.quantize_rows) into
        buffers kept per x array."""
        if id(x) not in self.quantized:
            m, k = x.shape
            ints = kernel_calls.int_kernels()
            bufs = (np.zeros((m, k), np.int16), np.zeros((m, k // ints.QK), np.float32),
                    np.zeros((m, k // ints.QK), np.int32))
            self.keep.extend(bufs)
            self.quantized[id(x)] = bufs
        qx, dx, sx = self.quantized[id(x)]
        self.row(OP_QUANTIZE, self.at(x), x.shape[0], x.shape[1], self.at(qx), self.at(dx), self.at(sx),
                 kernel_calls.ACTIVATION_MAX)
        return qx, dx, sx

    def program(self):
        dec, st, b = self.decoder, self.state, self.b
        first = dec.layers[0]
        heads, hd = first.heads, first.head_dim
        dm = heads * hd
        ids = np.zeros(b, np.int64)
        self.keep.append(ids)
        x, zero, h = self.buffer(b, dm), self.buffer(b, dm), self.buffer(b, dm)
        q, k, v, attn, r = (self.buffer(b, dm) for _ in range(5))
        f = self.buffer(b, first.fc1.n)
        logits = self.buffer(b, dec.head.n)
        no_table = self.buffer(1)
        positions = np.ascontiguousarray(dec.positions, np.float32)
        if dec.embed_blocks:  # the token rows dequantised, then added to their positions
            e = self.buffer(b, dm)
            d = quant_dtype(dec.embed.dtype)
            raw = kernel_calls._blocks(dec.embed._storage, d, dec.embed.shape[0], dm)
            self.row(OP_ROWS, kernel_calls.kernels().FORMATS[d.name], d.block_size, d.block_bytes, self.at(raw),
                     self.at(ids), dm, self.at(e), b, raw.size)
            rows = np.arange(b, dtype=np.int64)
            self.row(OP_TOKEN_ROWS, self.at(e), b, dm, self.at(rows), b, self.at(positions), positions.shape[0],
                     self.at(x), 0)
        else:
            emb = np.ascontiguousarray(dec.embed, np.float32)
            self.row(OP_TOKEN_ROWS, self.at(emb), emb.shape[0], dm, self.at(ids), b, self.at(positions),
                     positions.shape[0], self.at(x), 0)
        residual = zero
        for layer, kc, vc, (ck, cv) in zip(dec.layers, st.k, st.v, st.cross):
            scale = layer.head_dim ** -0.5
            cap = kc.shape[2]
            self.norm(x, residual, layer.norm1, h)
            for out, lo in ((q, 0), (k, dm), (v, 2 * dm)):
                self.product(layer.qkv, h, out, lo, lo + dm, quantized=lo > 0)
            self.row(OP_ATTENTION, self.at(q), self.at(k), self.at(v), self.at(no_table), self.at(no_table), 0,
                     self.at(kc), self.at(vc), 0, 0, self.at(attn), b, heads, heads, 1, hd, hd, cap, 0, 0, real=scale)
            self.product(layer.out, attn, r)
            self.norm(x, r, layer.norm2, h)
            self.product(layer.cross_q, h, q)
            bk, _h, frames, _d = ck.shape
            self.row(OP_CROSS_ATTENTION, self.at(q), self.at(ck), self.at(cv), self.at(attn), b, heads, 1, hd, hd,
                     bk, frames, real=scale, shared=(b * heads, self.chunks(b * heads, ck.nbytes)))
            self.product(layer.cross_out, attn, r)
            self.norm(x, r, layer.norm3, h)
            self.product(layer.fc1, h, f)
            self.row(OP_GELU, self.at(f), f.size)
            self.product(layer.fc2, f, r)
            residual = r
        self.norm(x, residual, dec.final, h)
        self.product(dec.head, h, logits)
        step = np.zeros(4, dtype=np.uint32)
        return StepProgram(Program(self.rows, self.reals, self.keep, step, []), ids, logits)
