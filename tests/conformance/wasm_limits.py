"""What the wasm device (kernels.wasm under wasmtime) has no kernel for yet, each with its reason.
The conformance suite runs on it (tests/conftest.py adds "wasm" to `device` in this directory); a
test that meets one of these limits -- its UnsupportedError starts with a key below, naming the
wasm device and the op -- is a skip with the listed reason. Any other error on wasm fails, and so
does an UnsupportedError that is not listed here."""

_LATER = "not in kernels.wasm yet (docs/wasm.md, what comes next: step 2)"
_NO = "the wasm device has no kernel for "

# The start of the wasm device's UnsupportedError -> why the op is refused.
WASM_LIMITS = {
    "the wasm device computes": "the wasm kernels compute in f32 only; other dtypes are held and copied",
    _NO + "unary": f"unary ops outside the strided kernel's set (log, sin, cos, pow_scalar, ...) are {_LATER}",
    _NO + "binary": f"binary pow is {_LATER}",
    _NO + "compare": f"comparisons are {_LATER}",
    _NO + "where": f"where is {_LATER}",
    _NO + "cast": f"casts other than f16 <-> f32 are {_LATER}",
    _NO + "reduce": f"reductions other than sum, prod, max, min and argmax are {_LATER}",
    _NO + "cumsum": f"scans are {_LATER}",
    _NO + "a strided copy": f"copies of non-f32 views whose last dim is strided are {_LATER}",
    _NO + "a strided view": f"strided views of more than 4 dims after merging are {_LATER}",
    _NO + "a copy of": f"byte copies of block data that is not whole words are {_LATER}",
    _NO + "assign": f"strided assignment is {_LATER}",
    _NO + "a product": f"products with weights other than the 8 GGUF block formats are {_LATER}",
    _NO + "a quantised product": f"quantised products over rows that are not whole 32-value blocks are {_LATER}",
    _NO + "dequantize": f"whole-tensor dequantisation is {_LATER}",
    _NO + "index_select": f"row lookups in tables other than contiguous f32 ones along dim 0 are {_LATER}",
    _NO + "row lookup": f"row lookups in block formats without a kernel are {_LATER}",
    _NO + "gather": f"gather is {_LATER}",
    _NO + "scatter_add": f"scatter_add is {_LATER}",
    _NO + "conv": f"conv2d, and conv1d with groups or dilation, are {_LATER}",
    _NO + "cache_attention with": f"masked or windowed attention over the cache is {_LATER}",
    _NO + "log_softmax": f"log_softmax is {_LATER}",
    _NO + "add + norm with": f"broadcast residual adds are {_LATER}",
    _NO + "a gated product": f"gated products other than SiLU's are {_LATER}",
    _NO + "rope": f"rope over strided views or rotary tables is {_LATER}",
    _NO + "a KV": f"KV caches laid out other than (b, kv_heads, capacity, d) with d contiguous are {_LATER}",
    "custom op": "custom ops have no wasm source form",
}


def wasm_limit(message):
    """The listed reason for a wasm device's UnsupportedError message, or None when it is not listed."""
    for start, reason in WASM_LIMITS.items():
        if message.startswith(start) and (start != "custom op" or "wasm device" in message):
            return reason
    return None
