"""A float checkpoint to GGUF (`tallow quantize`, see tallow/cli/quantize.py).

2-D float matrices whose rows are a whole number of blocks are quantised; every
other tensor is kept (f32 and f16 as they are, f64 and bf16 as f32, integers
as they are where GGUF has the type). Needs numpy.
"""
from ..dtypes import get_dtype
from ..errors import FormatError
from ..quant.formats import DTYPE_TO_GGML
from ..quant.quantize_numpy import ENCODERS, quantize_numpy
from .atomic_output import check_output_path


def _as_numpy(info, raw):
    import numpy as np
    if info.dtype.name == "bf16":
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32).reshape(info.shape)
    return np.frombuffer(raw, dtype=np.dtype(info.dtype.np_name).newbyteorder("<")).reshape(info.shape)


def quantize_file(src, dst, qtype, log=None):
    """Read `src` (any format tallow.io.open reads), write GGUF `dst` with 2-D float
    weights quantised to `qtype`. Returns {name: stored dtype name}."""
    from . import open as open_weights
    from .gguf import write_gguf
    import numpy as np
    qdtype = get_dtype(qtype)
    if qdtype.name not in ENCODERS:
        raise FormatError(f"cannot quantise to {qtype!r}; choose one of {', '.join(ENCODERS)}")
    # Before anything is opened: writing over the (memory-mapped) input would destroy it.
    check_output_path(dst, sources=[src])
    f = open_weights(src)
    out, kinds = {}, {}
    for name in f.keys():
        info = f.info(name)
        raw = f.raw(name)
        if info.dtype.is_quantized:
            out[name] = (info.dtype.name, info.shape, raw)
        elif info.dtype.is_float and len(info.shape) == 2 and info.shape[1] % qdtype.block_size == 0:
            blocks = quantize_numpy(_as_numpy(info, raw), qdtype)
            out[name] = (qdtype.name, info.shape, blocks.reshape(-1))
        elif info.dtype.name in ("f64", "bf16"):
            out[name] = _as_numpy(info, raw).astype(np.float32)
        elif info.dtype.name in DTYPE_TO_GGML:
            out[name] = (info.dtype.name, info.shape, raw)
        else:
            raise FormatError(f"{src}: tensor {name!r}: GGUF has no type for {info.dtype.name}")
        kinds[name] = out[name][0] if isinstance(out[name], tuple) else "f32"
        if log:
            log(f"{name}: {info.dtype.name} {list(info.shape)} -> {kinds[name]}")
    meta = {k: v for k, v in (f.metadata or {}).items() if isinstance(v, (str, int, float, bool, list))}
    write_gguf(dst, out, meta, getattr(f, "metadata_types", None))
    return kinds

