"""VarBuilder: models pull their weights by checkpoint name (Candle's idea).

`vb.pp("model.layers.0").get((576, 576), "self_attn.q_proj.weight")` looks up
"model.layers.0.self_attn.q_proj.weight" in the weights source, checks the
shape and places the tensor on the device. Loading is a dictionary walk: the
names are the checkpoint's own.
"""
from .. import dtypes as D
from ..device import Device, default_device
from ..errors import FormatError, ShapeError
from ..tensor import Tensor


class VarBuilder:
    def __init__(self, source, device=None, dtype=None, prefix="", keep_f16=None):
        """source: a dict {name: Tensor} or a tallow.io reader (anything with .keys() and .tensor(name, device)).
        dtype: float weights are converted to it (default f32); quantised weights stay quantised.
        keep_f16: None, or a test of a full tensor name: a 2-D f16 tensor it passes stays f16 (held
        once, as stored, for a device whose products read f16 weights: backend.f16_weight_products)."""
        self.source = source
        self.device = default_device() if device is None else Device(device)
        self.dtype = D.get_dtype(dtype) or D.f32
        self.prefix = prefix
        self.keep_f16 = keep_f16

    def pp(self, name):
        """A builder for the sub-module `name` (push prefix)."""
        return VarBuilder(self.source, self.device, self.dtype, f"{self.prefix}{name}.", self.keep_f16)

    def _kept(self, t, full, dtype):
        """Whether t, the stored tensor `full`, stays f16 (keep_f16) rather than going to the dtype."""
        return (dtype is None and self.keep_f16 is not None and t.dtype is D.f16 and t.ndim == 2
                and self.keep_f16(full))

    def _keys(self):
        return self.source.keys()

    def contains(self, name):
        return (self.prefix + name) in self._keys()

    def get(self, shape, name, dtype=None):
        full = self.prefix + name
        if hasattr(self.source, "get_or_create"):  # a VarMap: create on first use (training)
            return self.source.get_or_create(full, tuple(shape), self.device, D.get_dtype(dtype) or self.dtype,
                                             "zeros" if name.endswith("bias") else "kaiming")
        t = self._fetch(shape, name).to(self.device)
        return t if self._kept(t, full, dtype) else self._as_float(t, dtype)

    def _fetch(self, shape, name, device=None):
        """The stored tensor `name` (shape checked) on `device` (default: the builder's)."""
        full = self.prefix + name
        if full not in self._keys():
            raise FormatError(f"the weights have no tensor {full!r} (expected shape {tuple(shape)}); "
                              "is this checkpoint for this architecture and config?")
        src = self.source
        t = src[full] if isinstance(src, dict) else src.tensor(full, device=device or self.device)
        if not isinstance(t, Tensor):
            raise FormatError(f"weights entry {full!r} is not a tensor")
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise ShapeError(f"tensor {full!r} has shape {tuple(t.shape)}, the config expects {tuple(shape)}")
        return t

    def _as_float(self, t, dtype=None):
        want = D.get_dtype(dtype) or self.dtype
        if t.dtype.is_float and t.dtype is not want:
            t = t.to(want)
        return t

    def get_rows(self, parts, dtype=None):
        """The tensors `parts` [(shape, name), ...] joined along dim 0 into one, on the device:
        several Linear weights (or biases) over one input become one matmul. GGUF block rows
        are whole blocks, so quantised rows join byte for byte. A name None stands for zeros
        (a part without a bias: Whisper's k_proj). None when they cannot join (block formats
        that differ, as a Q4_K_M file's q6_k attn_v beside q4_k attn_q, or a VarMap, whose
        parameters train apart): then load the parts one by one."""
        if hasattr(self.source, "get_or_create"):
            return None
        from ..creation import cat, zeros
        want = D.get_dtype(dtype) or self.dtype
        # Each part goes to the device as get() places it (in the browser, straight from the
        # fetched file's JS buffer to the GPU) and is joined there.
        tensors = [zeros(*shape, dtype=want, device=self.device) if name is None
                   else self._fetch(shape, name).to(self.device) for shape, name in parts]
        kinds = {t.dtype for t in tensors if t.dtype.is_quantized}
        if kinds and (len(kinds) > 1 or len(kinds) != len({t.dtype for t in tensors})
                      or len({t.shape[1:] for t in tensors}) > 1):
            return None
        if not kinds and all(name is not None for _, name in parts) and all(
                self._kept(t, self.prefix + name, dtype) for t, (_, name) in zip(tensors, parts)):
            return cat(tensors, 0)  # f16 rows kept (keep_f16), joined as f16
        return cat(tensors if kinds else [self._as_float(t, dtype) for t in tensors], 0)
