"""The backend contract: the short list of primitives every backend implements.

Storage is whatever the backend likes (a numpy array, an array.array, a GPU
buffer). A tensor reaches a backend as its storage and a Layout -- any strides,
including 0 for broadcast dims -- and every op returns new *contiguous* storage
holding `layout.numel()` elements of the result in row-major order. The tensor
front end does all shape checking, broadcasting and dtype promotion before
calling here, so a backend only computes. Anything a backend does not implement
raises UnsupportedError naming the backend and the op: never a silent fallback.

How arguments are passed (two conventions, by primitive; no primitive takes more
than 6 parameters besides self, tests/test_backend_contract.py checks every backend):

  Operands (OPERAND_PRIMITIVES): where, matmul, qmatmul, index_select, gather,
      scatter_add, conv1d, conv2d, layer_norm, rms_norm, rope, attention and every
      fused decode op. Each tensor is one Operand (storage, layout) NamedTuple --
      a backend unpacks it as `x, lx = op` -- or None where the tensor is optional;
      operands that travel together are grouped (operand.py: QuantWeight, KVCache,
      QKV, Rotary). The order is always: operands, then the dtype computed in, then
      the options -- one plain value (eps, act, dim) or one frozen spec dataclass
      (specs.py: ConvSpec, AttentionSpec, CacheAttentionSpec, NormSpec, ...).
  (storage, layout) pairs as positional arguments: the rest -- memory (from/to
      bytes and lists, full, arange, overwrite, concat_rows), copy, assign, cast,
      unary, binary, compare, reduce, cumsum, softmax, dequantize, to_numpy,
      custom: single-tensor or element-wise primitives whose few parameters need no
      grouping, kept as pairs so the hottest calls build no tuples.

A new primitive with more than one tensor or more than one option takes Operands
and a spec; a helper adding one adds its spec class to specs.py.

Unary op names:  neg abs exp log sqrt rsqrt sin cos tanh sigmoid relu gelu
                 gelu_tanh silu square reciprocal floor ceil round sign
                 logical_not, and with an argument: clamp (lo, hi; either
                 may be None), pow_scalar (exponent), affine (mul, add).
Binary op names: add sub mul div pow maximum minimum (operands same dtype)
Compare op names: eq ne lt le gt ge (result dtype bool)
Reduce op names: sum prod max min (result dtype as input, except sum/prod of
                 bool/ints -> i64) and argmax argmin (single dim, result i64).
Transcendental unary ops (exp, log, sin, gelu, ...) get float dtypes: the front end
promotes integer inputs to f32 first.
Integer ids (index_select, gather, scatter_add) arrive in [0, size): the front end
checks them once for every backend (core/index_check.py), so a backend need not.
"""
from ..dtypes import bf16
from ..errors import FormatError, UnsupportedError
from ..layout import Layout
from .operand import KVCache, Operand, QKV, QuantWeight, Rotary
from .specs import AttentionSpec, CacheAttentionSpec


# The primitives whose tensors arrive as Operands (the module docstring's first convention).
OPERAND_PRIMITIVES = frozenset((
    "where", "matmul", "qmatmul", "index_select", "gather", "scatter_add", "conv1d", "conv2d", "layer_norm",
    "rms_norm", "rope", "attention", "add_rms_norm", "add_layer_norm", "matmul_bias", "qmatmul_bias",
    "gated_matmul", "gated_qmatmul", "add_norm_linear", "kv_write", "rope_kv_write", "cache_attention",
    "batch_cache_attention"))


class Backend:
    name = "base"
    # Whether matmul (and matmul_bias, gated_matmul, add_norm_linear) take an f16 right operand with
    # f32 activations and dtype f32, reading the f16 values where they lie (widened exactly in the
    # kernel) instead of a widened copy of the weight: ops.linear and add_norm_linear then pass an
    # f16 weight as it is (ops.linalg.keeps_f16_weight). False: the weight is cast to f32 first.
    f16_weight_products = False

    def _missing(self, op):
        raise UnsupportedError(f"the {self.name} backend does not implement {op}")

    def _check_whole_elements(self, nbytes, dtype):
        """from_bytes of a plain dtype: a byte count that is not whole elements is a truncated or corrupt input."""
        if not dtype.is_quantized and nbytes % dtype.itemsize:
            raise FormatError(f"{self.name} from_bytes: {nbytes} bytes is not a whole number of {dtype.name} "
                              f"elements ({dtype.itemsize} bytes each)")

    def features(self):
        """Dict describing the device (adapter name, f16 support, ...), shown by `tallow devices`."""
        return {}

    def batch_rows(self, wdtype, dtype):
        """The most rows of x (of dtype) whose product with a weight of wdtype computes each row
        exactly as a product of that row alone does (the same kernel and summation order): a
        batched decode step (CausalLM.decode_batch) shares products among at most this many
        sequences, so each gets the logits it gets alone. 1: no such guarantee here."""
        return 1

    # ---- capture and replay (tallow.capture) ----------------------------------
    def can_capture(self):
        """Whether begin_capture/end_capture/replay work here (tallow.capture falls back to eager when not)."""
        return False

    def captures_windows(self):
        """Whether a captured one-token step may hold sliding-window attention: cache_attention then
        records its spec's window (key_start = max(0, position + 1 - window), read from the step
        buffer's position at replay) instead of the key_start. False: a model with a window decodes
        eagerly here."""
        return False

    def begin_capture(self, position, tokens):
        """Record the launches that follow (running them too) until end_capture. position: where the
        step's `tokens` new positions start in the KV cache; kernels that depend on it read it from a
        step buffer, so the recording is valid at any position."""
        raise UnsupportedError(f"the {self.name} backend cannot capture and replay launches")

    def end_capture(self):
        """The recording since begin_capture (an object for replay and signature)."""
        raise UnsupportedError(f"the {self.name} backend cannot capture and replay launches")

    def replay(self, recording, position, tokens):
        """Launch a recording again with the step buffer set to position, tokens."""
        raise UnsupportedError(f"the {self.name} backend cannot capture and replay launches")

    def overwrite(self, storage, data, dtype):
        """Write raw little-endian bytes of dtype elements over the start of an existing storage in place
        (a captured graph's input)."""
        self._missing("overwrite")

    # ---- memory -----------------------------------------------------------
    def from_bytes(self, data, dtype):
        """Storage from raw little-endian bytes (bytes/bytearray/memoryview). For
        quantised dtypes the bytes are the GGUF blocks, kept as they are."""
        self._missing("from_bytes")

    def to_bytes(self, storage, layout, dtype):
        """Raw little-endian bytes of the layout's elements in row-major order."""
        self._missing("to_bytes")

    def from_list(self, values, dtype):
        """Storage from a flat list of Python numbers."""
        self._missing("from_list")

    def to_list(self, storage, layout, dtype):
        """Flat list of Python numbers (float/int/bool) in row-major order."""
        self._missing("to_list")

    def full(self, numel, value, dtype):
        self._missing("full")

    def arange(self, start, step, numel, dtype):
        """start + step * i for i < numel, computed on the host and stored with from_list (a backend
        with a fill kernel computes it on the device instead)."""
        if dtype.is_float:
            values = [start + step * float(i) for i in range(numel)]
        else:
            values = [int(start) + int(step) * i for i in range(numel)]
        return self.from_list(values, dtype)

    # ---- element-wise -----------------------------------------------------
    def copy(self, storage, layout, dtype):
        self._missing("copy")

    def assign(self, dst, ld, src, ls, dtype):
        """In place: write src (layout ls) into dst at layout ld (same shape). The one
        mutating primitive: cat, pad and the preallocated KV cache are built on it."""
        self._missing("assign")

    def cast(self, storage, layout, src_dtype, dst_dtype):
        self._missing("cast")

    def unary(self, op, storage, layout, dtype, arg=None):
        self._missing(f"unary {op}")

    def binary(self, op, a, la, b, lb, dtype):
        self._missing(f"binary {op}")

    def compare(self, op, a, la, b, lb, dtype):
        self._missing(f"compare {op}")

    def where(self, cond, a, b, dtype):
        """a where cond else b; the three Operands have the result's shape (broadcast views)."""
        self._missing("where")

    # ---- reductions and scans ---------------------------------------------
    def reduce(self, op, storage, layout, dtype, dims):
        """Reduce over `dims` (a sorted tuple); the result has those dims removed."""
        self._missing(f"reduce {op}")

    def cumsum(self, storage, layout, dtype, dim):
        self._missing("cumsum")

    # ---- linear algebra and indexing --------------------------------------
    def matmul(self, a, b, dtype):
        """a (*batch, m, k), b (*batch, k, n) with identical batch dims -> (*batch, m, n)."""
        self._missing("matmul")

    def qmatmul(self, x, w, dtype):
        """x (..., k) float times the transpose of w, a QuantWeight of n rows of k -> (..., n)."""
        self._missing(f"quantised matmul ({w.dtype.name})")

    def dequantize(self, w, wdtype, numel, dtype):
        """Contiguous float storage from quantised blocks."""
        self._missing(f"dequantize {wdtype.name}")

    def index_select(self, x, ids, dtype, dim):
        """Pick entries along dim with a 1-D integer index. For a quantised dtype
        (layout contiguous, dim 0) the picked rows come back dequantised to f32."""
        self._missing("index_select")

    def gather(self, x, ids, dtype, dim):
        """out[i][j][k] = src[i][ids[i][j][k]][k] (for dim 1); ids has the output's shape."""
        self._missing("gather")

    def scatter_add(self, dst, ids, src, dtype, dim):
        """A copy of dst with src added at ids along dim (ids has src's shape)."""
        self._missing("scatter_add")

    def conv1d(self, x, w, dtype, spec):
        """x (b, cin, l), w (cout, cin/groups, kl) -> (b, cout, lout); spec a ConvSpec of ints."""
        self._missing("conv1d")

    def conv2d(self, x, w, dtype, spec):
        """x (b, cin, h, w), w (cout, cin/groups, kh, kw); spec a ConvSpec of (h, w) pairs."""
        self._missing("conv2d")

    # ---- fused ops --------------------------------------------------------
    def softmax(self, storage, layout, dtype, log=False):
        """(log-)softmax over the last dim, computed in at least f32."""
        self._missing("softmax")

    def layer_norm(self, x, w, b, dtype, eps):
        """Normalise over the last dim; w and b (shape (d,)) may be None."""
        self._missing("layer_norm")

    def rms_norm(self, x, w, dtype, eps):
        self._missing("rms_norm")

    def rope(self, x, rotary, dtype):
        """x (b, h, t, d) rotated by rotary (a Rotary: cos/sin (t, d/2) and their pairing)."""
        self._missing("rope")

    def attention(self, q, k, v, mask, dtype, spec):
        """softmax(q k^T * scale + mask) v (spec an AttentionSpec). q (b, h, tq, d), k/v (b, h, tk,
        d[v]); mask is additive, already broadcast to (b, h, tq, tk), or None. causal masks key
        j > i + (tk - tq)."""
        self._missing("attention")

    def concat_rows(self, parts, dtype):
        """One storage holding the contiguous tensors `parts` [(storage, layout)] one after another:
        cat along dim 0 that also joins quantised blocks (which the element-wise assign cannot
        write), e.g. q/k/v weight rows joined at load time. Default: through host bytes."""
        return self.from_bytes(b"".join(self.to_bytes(st, lay, dtype) for st, lay in parts), dtype)

    # ---- fused decode ops: defaults composed from the primitives above ---------
    # One-token decoding issues a few dispatches per layer only if these are single kernels;
    # a backend that has no kernel for one inherits the composition, with the same result.
    def add_rms_norm(self, x, r, w, dtype, eps):
        """(x + r, rms_norm(x + r) * w), both contiguous: a residual add and the next norm.
        x and r have the same shape; w (d,) may be None."""
        total = self.binary("add", x.storage, x.layout, r.storage, r.layout, dtype)
        return total, self.rms_norm(Operand(total, Layout(x.layout.shape)), w, dtype, eps)

    def add_layer_norm(self, x, r, w, b, dtype, eps):
        """(x + r, layer_norm(x + r) * w + b), both contiguous; w and b (d,) may be None."""
        total = self.binary("add", x.storage, x.layout, r.storage, r.layout, dtype)
        return total, self.layer_norm(Operand(total, Layout(x.layout.shape)), w, b, dtype, eps)

    def matmul_bias(self, a, b, bias, dtype):
        """a . b + bias: a Linear layer with its bias. a (m, k), b (k, n), bias (n,) -> (m, n)."""
        m, n = a.layout.shape[0], b.layout.shape[1]
        return self._add_bias(self.matmul(a, b, dtype), m, n, bias, dtype)

    def qmatmul_bias(self, x, w, bias, dtype):
        """qmatmul plus a bias (n,): x (..., k) -> (..., n)."""
        k = w.cols
        m = x.layout.numel() // k if k else 0
        return self._add_bias(self.qmatmul(x, w, dtype), m, w.rows, bias, dtype)

    def _add_bias(self, y, m, n, bias, dtype):
        return self.binary("add", y, Layout((m, n)), bias.storage, bias.layout.broadcast_to((m, n), "bias"), dtype)

    def gated_matmul(self, a, b, dtype, act):
        """act(a . b[:, :n]) * (a . b[:, n:]): a gate/up projection with its GLU. a (m, k),
        b (k, 2n) (the transpose of [gate; up] rows) -> (m, n). act is a unary op name."""
        return self._gate(self.matmul(a, b, dtype), a.layout.shape[0], b.layout.shape[1] // 2, dtype, act)

    def gated_qmatmul(self, x, w, dtype, act):
        """As gated_matmul with w a QuantWeight of 2n rows of k ([gate; up]): x (..., k) -> (..., n)."""
        k = w.cols
        m = x.layout.numel() // k if k else 0
        return self._gate(self.qmatmul(x, w, dtype), m, w.rows // 2, dtype, act)

    def _gate(self, y, m, n, dtype, act):
        gate = self.unary(act, y, Layout((m, n), (2 * n, 1), 0), dtype)
        return self.binary("mul", gate, Layout((m, n)), y, Layout((m, n), (2 * n, 1), n), dtype)

    def add_norm_linear(self, x, r, norm, linear, dtype):
        """A residual add, the norm after it and the projection that reads it: (hidden, y) with
        hidden = x + r (contiguous; None when r is None: hidden is x) and, over the m rows of
        norm(hidden) (m, k), y = act(norm . w^T + bias) (m, rows), or gated, act(gate) * up
        (m, rows / 2) for w's rows [gate; up] as gated_matmul. norm: a NormSpec (layer norm when
        center, else RMS norm; weight and bias (k,) may be None); linear: a LinearSpec (w an
        Operand (rows, k) of dtype in any layout, or a QuantWeight; bias (rows,) or None, never
        with gated; act a unary op name or None)."""
        lx = x.layout
        k = lx.shape[-1]
        m = lx.numel() // k if k else 0
        if r is None:
            total = None
            normed = (self.layer_norm(x, norm.weight, norm.bias, dtype, norm.eps) if norm.center
                      else self.rms_norm(x, norm.weight, dtype, norm.eps))
        elif norm.center:
            total, normed = self.add_layer_norm(x, r, norm.weight, norm.bias, dtype, norm.eps)
        else:
            total, normed = self.add_rms_norm(x, r, norm.weight, dtype, norm.eps)
        hidden, w, bias, act = Operand(normed, Layout((m, k))), linear.weight, linear.bias, linear.act
        if isinstance(w, QuantWeight):
            rows = w.rows
            if linear.gated:
                return total, self.gated_qmatmul(hidden, w, dtype, act)
            y = self.qmatmul(hidden, w, dtype) if bias is None else self.qmatmul_bias(hidden, w, bias, dtype)
        else:
            rows = w.layout.shape[0]
            wt = Operand(w.storage, w.layout.permute([1, 0]))
            if linear.gated:
                return total, self.gated_matmul(hidden, wt, dtype, act)
            y = self.matmul(hidden, wt, dtype) if bias is None else self.matmul_bias(hidden, wt, bias, dtype)
        return total, y if act is None else self.unary(act, y, Layout((m, rows)), dtype)

    def kv_write(self, k, v, slots, dtype):
        """In place: k into slots.keys and v into slots.values (a KV cache's new positions; all 4-D)."""
        self.assign(*slots.keys, *k, dtype)
        self.assign(*slots.values, *v, dtype)

    def rope_kv_write(self, qkv, rotary, slots, dtype):
        """Rotary embedding fused with the KV-cache write: returns rope(q) (contiguous) and, in
        place, writes rope(k) into slots.keys and v into slots.values. q (b, h, t, d); k, v and
        the cache slots (b, hk, t, d); rotary's cos/sin (t, d/2); every operand of dtype."""
        q, k, v = qkv
        k_rot = self.rope(k, rotary, dtype)
        self.assign(*slots.keys, k_rot, Layout(k.layout.shape), dtype)
        self.assign(*slots.values, *v, dtype)
        return self.rope(q, rotary, dtype)

    def cache_attention(self, qkv, cache, rotary, mask, dtype, spec):
        """Append inside attention: writes k (rope(k) when rotary is not None) and v into the caches
        (b, hk, capacity, d/dv) at positions [spec.position, spec.position + t) and returns causal
        attention (contiguous (b, h, t, dv)) of q (rope(q)) over the cache's keys [spec.key_start,
        position + t), scores times spec.scale (a CacheAttentionSpec). q (b, h, t, d), k/v (b, hk,
        t, d/dv), h a multiple of hk; mask additive, broadcast to (b, h, t, keys), or None."""
        q, k, v = qkv
        (kc, lkc), (vc, lvc) = cache
        position, key_start = spec.position, spec.key_start
        lq = q.layout
        b, h, t, d = lq.shape
        hk = k.layout.shape[1]
        slots = KVCache(Operand(kc, lkc.narrow(2, position, t)), Operand(vc, lvc.narrow(2, position, t)))
        if rotary is None:
            self.kv_write(k, v, slots, dtype)
            qs = q.storage
        else:
            qs = self.rope_kv_write(qkv, rotary, slots, dtype)
            lq = Layout(lq.shape)
        n = position + t - key_start
        keys, values = lkc.narrow(2, key_start, n), lvc.narrow(2, key_start, n)
        rep = h // hk
        if rep > 1 and t == 1 and mask is None:
            # The query heads that share a KV head become its query rows (one query masks nothing).
            sb, sh, _, sd = lq.strides
            lq = Layout((b, hk, rep, d), (sb, rep * sh, sh, sd), lq.offset)
            return self.attention(Operand(qs, lq), Operand(kc, keys), Operand(vc, values), None, dtype,
                                  AttentionSpec(spec.scale, False))
        if rep > 1:  # each query head gets its own copy of its KV head
            kc, keys = self._repeat_heads(kc, keys, rep, dtype), Layout((b, h, n, d))
            vc, values = self._repeat_heads(vc, values, rep, dtype), Layout((b, h, n, lvc.shape[3]))
        return self.attention(Operand(qs, lq), Operand(kc, keys), Operand(vc, values), mask, dtype,
                              AttentionSpec(spec.scale, True))

    def batch_cache_attention(self, qkv, caches, rotary, dtype, spec):
        """cache_attention of b sequences, one new position each, every one with its own caches:
        row i of q (b, h, 1, d), k/v (b, hk, 1, d/dv) and rotary's cos/sin (b, d/2) (rotary may be
        None) is written into caches[i] (a KVCache, each (1, hk, capacity, d/dv)) at
        spec.positions[i] and attends over its keys [spec.key_starts[i], positions[i] + 1) (a
        BatchCacheAttentionSpec). Returns contiguous (b, h, 1, dv), row i as cache_attention of
        that row alone. Default: exactly that, row by row."""
        q, k, v = qkv
        b, h = q.layout.shape[:2]
        dv = v.layout.shape[3]
        out, whole, one = self.full(b * h * dv, 0.0, dtype), Layout((b, h, 1, dv)), Layout((1, h, 1, dv))
        for i, cache in enumerate(caches):
            row = QKV(*(Operand(op.storage, op.layout.narrow(0, i, 1)) for op in qkv))
            rot = None if rotary is None else Rotary(Operand(rotary.cos.storage, rotary.cos.layout.narrow(0, i, 1)),
                                                     Operand(rotary.sin.storage, rotary.sin.layout.narrow(0, i, 1)),
                                                     rotary.interleaved)
            st = self.cache_attention(row, cache, rot, None, dtype,
                                      CacheAttentionSpec(spec.positions[i], spec.key_starts[i], spec.scale))
            self.assign(out, whole.narrow(0, i, 1), st, one, dtype)
        return out

    def _repeat_heads(self, st, lay, rep, dtype):
        """Contiguous (b, hk * rep, n, d) from (b, hk, n, d): every head `rep` times in a row."""
        b, hk, n, d = lay.shape
        sb, sh, sn, sd = lay.strides
        return self.copy(st, Layout((b, hk, rep, n, d), (sb, sh, 0, sn, sd), lay.offset), dtype)

    # ---- optional capabilities: defaults that every backend has ---------------
    def to_numpy(self, storage, layout, dtype, copy=True):
        """The layout's elements as a numpy array of its shape (bf16 as float32: numpy has no
        bf16). copy=False lets a backend return a read-only view of its storage instead of a
        copy. Default: through to_bytes (a copy)."""
        import numpy as np
        raw = np.frombuffer(self.to_bytes(storage, layout, dtype), dtype=np.dtype(dtype.np_name).newbyteorder("<"))
        if dtype is bf16:
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        return raw.astype(raw.dtype.newbyteorder("="), copy=True).reshape(layout.shape)

    def from_js_buffer(self, array_buffer, offset, nbytes, dtype):
        """Storage for nbytes of a JS ArrayBuffer at offset, copied without entering Python
        memory, or None when this backend cannot (the caller then reads the bytes and calls
        from_bytes). Default: None; the wgpu backend over the browser driver imports them."""
        return None

    # ---- user-defined ops (tallow.custom_op) ------------------------------
    def custom(self, op, inputs, out_shape, out_dtype):
        """Run a tallow.CustomOp on [(storage, layout, dtype)] inputs with this backend's implementation
        (numpy: op.cpu, pure Python: op.python, wgpu: op.wgsl, cuda: op.cuda, metal: op.msl)."""
        raise UnsupportedError(f"custom op {op.name!r} has no implementation for the {self.name} backend")
