"""Whisper's encoder on the numpy CPU backend as direct numpy calls on few buffers.

The encoder's time is its matrix products (BLAS) and its attention over 1,500
frames (backends/cpu/attention.py); this path keeps everything else off the
tensor front end, whose copies (a contiguous copy per head split and merge, a new
array per bias add, residual add and activation) cost about 10% of an encode:

* each convolution is one product over an im2col matrix built once, in time-major
  order, so conv2's output is already the (frames, d) layout the layers read;
* q, k and v are one product over the model's joined rows; attention reads them
  as strided views (no copies per head);
* biases, GELU (backends/cpu/gelu.py) and residual adds run in place on the
  product's output.

Measured (tiny.en, one 30 s window, busy shared 2-core box, best of 3-4): at one BLAS
thread 0.56 s of CPU through the generic Encoder, 0.48-0.52 s here; at two threads
the row split below (CpuEncoder) took 0.53-0.59 s of CPU against 0.69-0.76 s with
BLAS's own threads. What is left is BLAS: the products run at 55-110 GFLOP/s per
core with OpenBLAS's AVX2 kernels (twice that with its AVX-512 ones, where the
environment does not pin OPENBLAS_CORETYPE).

The generic Encoder is the reference (tests/test_whisper_cpu_encoder.py). Quantised
matrices (`quantize="q8_0"`) are dequantised into one float32 buffer per product and
multiplied by BLAS: numpy has no int8 matrix product.
"""
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..backends.cpu import attention
from ..backends.cpu.gelu import gelu
from .whisper_cpu_decoder import _array, _layer_norm, _Norm


class _Linear:
    def __init__(self, weight, bias):
        self.weight, self.bias = weight, None if bias is None else _array(bias)
        self.w = None if weight.dtype.is_quantized else _array(weight)

    def dense(self):
        """The float32 (n, k) matrix: a view, or for blocks a new dequantised array (the CPU
        kernels' vector IR where they run: q8_0 fc1 of tiny 0.76 -> 0.22 ms, the same bits)."""
        if self.w is not None:
            return self.w
        from ..backends.cpu.runtime import kernel_calls
        from ..quant import dequantize_numpy
        n, k = self.weight.shape
        if kernel_calls.supports(self.weight.dtype):
            return kernel_calls.dequant_rows(self.weight._storage, self.weight.dtype, k, np.arange(n, dtype=np.int64))
        return dequantize_numpy(self.weight._storage, self.weight.dtype, n * k).reshape(n, k)

    def __call__(self, x, w):
        """x (rows, k) -> x w^T + b, a new array (w^T read in place by BLAS); w: dense()."""
        y = np.matmul(x, w.T)
        if self.bias is not None:
            y += self.bias
        return y


class _Weights:
    """One encode's float32 matrices by linear layer: views, or for quantised layers dequantised
    once (not once per thread), and dropped after their layer (drop) so a large model never
    holds a float32 copy of every layer."""

    def __init__(self):
        self.lock = threading.Lock()
        self.made = {}

    def __call__(self, linear):
        with self.lock:
            w = self.made.get(id(linear))
            if w is None:
                w = self.made[id(linear)] = linear.dense()
            return w

    def drop(self, layer):
        with self.lock:
            for linear in (layer.qkv, layer.out, layer.fc1, layer.fc2):
                self.made.pop(id(linear), None)


class _Conv:
    """Conv1d with kernel size k, padding (k - 1) / 2 and a stride, on time-major input."""

    def __init__(self, conv):
        w = _array(conv.weight)  # (out, in, k)
        self.k, self.stride, self.pad = w.shape[2], conv.stride, conv.padding
        # (out, k * in): the im2col rows below are k consecutive frames of `in` channels each
        self.w = np.ascontiguousarray(w.transpose(0, 2, 1).reshape(w.shape[0], -1))
        self.bias = None if conv.bias is None else _array(conv.bias)

    def __call__(self, x):
        """x (frames, in) -> (out_frames, out)."""
        frames, cin = x.shape
        xp = np.zeros((frames + 2 * self.pad, cin), np.float32)
        xp[self.pad:self.pad + frames] = x
        n = (xp.shape[0] - self.k) // self.stride + 1
        rows = np.lib.stride_tricks.as_strided(xp, (n, self.k * cin), (xp.strides[0] * self.stride, 4),
                                               writeable=False)
        y = np.matmul(np.ascontiguousarray(rows), self.w.T)  # one product over the im2col matrix
        if self.bias is not None:
            y += self.bias
        return y


class _Layer:
    def __init__(self, layer):
        sa = layer.self_attn
        self.heads, self.head_dim = sa.heads, sa.head_dim
        self.norm1, self.norm2 = _Norm(layer.self_attn_layer_norm), _Norm(layer.final_layer_norm)
        self.qkv = _Linear(sa.qkv_proj.weight, sa.qkv_proj.bias)
        self.out = _Linear(sa.out_proj.weight, sa.out_proj.bias)
        self.fc1, self.fc2 = _Linear(layer.fc1.weight, layer.fc1.bias), _Linear(layer.fc2.weight, layer.fc2.bias)

    def project(self, x, qkv, lo, hi, weights):
        """Rows lo:hi of q, k and v (into the shared qkv buffer) from rows lo:hi of x."""
        qkv[lo:hi] = self.qkv(_layer_norm(x[lo:hi], self.norm1), weights(self.qkv))

    def finish(self, x, qkv, lo, hi, weights):
        """Rows lo:hi of the layer's output, in place in x: attention of those queries over
        every key, then the out projection, the MLP and both residual adds."""
        t, d = x.shape
        q, k, v = (qkv[:, i * d:(i + 1) * d].reshape(t, self.heads, self.head_dim).transpose(1, 0, 2)
                   for i in range(3))
        y = attention.attention(q[:, lo:hi], k, v, None, self.head_dim ** -0.5, False)  # (heads, rows, hd)
        rows = x[lo:hi]
        rows += self.out(y.transpose(1, 0, 2).reshape(hi - lo, d), weights(self.out))
        h = self.fc1(_layer_norm(rows, self.norm2), weights(self.fc1))
        rows += self.fc2(gelu(h, out=h), weights(self.fc2))


def _layers(layers, x, lo, hi, barrier, weights):
    """Rows lo:hi of x through every layer; with a barrier, other threads do the other rows and
    each layer waits once, for all its keys and values (a new qkv buffer per layer, so a thread
    never overwrites keys another thread still reads)."""
    try:
        for i, (layer, qkv) in enumerate(layers):
            layer.project(x, qkv, lo, hi, weights)
            if barrier is not None:
                barrier.wait()
            if i and lo == 0:  # past the barrier every thread has finished the layer before
                weights.drop(layers[i - 1][0])
            layer.finish(x, qkv, lo, hi, weights)
    except BaseException:
        if barrier is not None:
            barrier.abort()  # the other threads stop waiting (BrokenBarrierError) instead of hanging
        raise


class CpuEncoder:
    """numpy views of one model's encoder weights, built once (Whisper.encode uses it).

    Threads: with BLAS at n > 1 threads (threadpoolctl, main thread), the frames are split
    into n row ranges, each run by one Python thread with BLAS held at one thread, and the
    threads meet once per layer. BLAS's own threads meet inside every product (about 12
    times per layer, counting attention's), and on a busy box each meeting waits for the
    slowest thread to be scheduled."""

    def __init__(self, model):
        enc = model.encoder
        self.conv1, self.conv2 = _Conv(enc.conv1), _Conv(enc.conv2)
        self.positions = _array(enc.embed_positions.weight)
        self.layers = [_Layer(layer) for layer in enc.layers]
        self.final = _Norm(enc.layer_norm)
        from ..backends.cpu.runtime import kernel_calls
        kernel_calls.kernels()  # where numba is installed: GELU's compiled kernel (gelu.py), 12 -> 0.4 ms a call

    @staticmethod
    def supports(model):
        """numpy backend, float32 activations, exact GELU, float32 (or dequantisable) weights."""
        enc = model.encoder
        if model.device.backend.name != "cpu" or model.dtype.name != "f32" or enc.cfg.activation != "gelu":
            return False
        convs = (enc.conv1, enc.conv2)
        if any(c.weight.dtype.name != "f32" or c.groups != 1 or c.dilation != 1
               or 2 * c.padding != c.weight.shape[2] - 1 for c in convs):
            return False
        return all(layer.self_attn.qkv_proj.separate is None for layer in enc.layers)

    def __call__(self, mel):
        """mel (b, n_mels, frames) float32 numpy -> (b, frames / 2, d)."""
        return np.stack([self._one(m) for m in mel])

    def _one(self, mel):
        x = self.conv1(np.ascontiguousarray(mel.T))
        x = self.conv2(gelu(x, out=x))
        x = gelu(x, out=x)
        x += self.positions[:x.shape[0]]
        t, d = x.shape
        layers = [(layer, np.empty((t, 3 * d), np.float32)) for layer in self.layers]
        blas, threads = attention.blas_threads()
        threads = min(threads, t)
        if threads < 2 or threading.current_thread() is not threading.main_thread():
            _layers(layers, x, 0, t, None, _Weights())
        else:
            bounds = [t * i // threads for i in range(threads + 1)]
            barrier = threading.Barrier(threads)
            with blas.limit(limits=1), ThreadPoolExecutor(threads) as pool:
                weights = _Weights()
                jobs = [pool.submit(_layers, layers, x, lo, hi, barrier, weights)
                        for lo, hi in zip(bounds, bounds[1:])]
                errors = [job.exception() for job in jobs]
            # the thread that failed first, not one that a broken barrier then stopped
            for error in sorted((e for e in errors if e is not None),
                                key=lambda e: isinstance(e, threading.BrokenBarrierError)):
                raise error
        return _layer_norm(x, self.final)
