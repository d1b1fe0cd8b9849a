"""The front end of every tensor op: argument and shape checks, dtype promotion,
gradient recording and the one backend primitive each op calls (core/backends/base.py).

Tensor methods and operators (tensor.py), tallow.functional, indexing and custom ops
all call these functions; nothing else calls a backend's compute primitives. The
front end never imports tensor.py (which imports it): it makes results through
its inputs (x._new, x._view, x._on_device) and recognises tensors by their base
class (tensor_base.py).

Modules, by concept: elementwise (the unary table, binary ops and comparisons, where, casts),
shape (views, cat/stack/split/pad), reduce (sum ... softmax), linalg (matmul),
index (index_select, gather, scatter_add, assignment), nn (norms, rope, attention,
conv, custom ops), decode (the fused ops one-token decoding runs on: add + norm, gated
projection, KV-cache writes), quantized (GGUF block tensors), new (tensors on an
input's device).
"""
from .arguments import dim_index
from .decode import (GATE_ACTS, add_layer_norm, add_norm_linear, add_rms_norm, batch_cache_attention, cache_attention,
                     gated_linear, kv_write, rope_kv_write)
from .elementwise import (COMPARISONS, UNARY, binary, cast, clone, gelu, logical, parse_target, pow, to_device, unary,
                          where)
from .index import as_index, assign, gather, index_select, scatter_add
from .linalg import linear, matmul
from .new import new_arange, new_full, new_values
from .nn import attention, conv, custom, layer_norm, repeat_kv, rms_norm, rotary_emb
from .reduce import arg_reduce, cumsum, mean, reduce, softmax, var
from .shape import (cat, chunk, contiguous, expand, flatten, narrow, pad, permute, reshape, split, squeeze, stack, t,
                    transpose, unsqueeze)

__all__ = [
    "dim_index", "GATE_ACTS", "add_layer_norm", "add_norm_linear", "add_rms_norm", "batch_cache_attention",
    "cache_attention", "gated_linear",
    "kv_write", "rope_kv_write",
    "linear",
    "COMPARISONS", "UNARY", "binary", "cast", "clone", "gelu", "logical", "parse_target", "pow",
    "to_device", "unary",
    "where", "as_index", "assign", "gather", "index_select", "scatter_add", "matmul", "new_arange", "new_full",
    "new_values", "attention", "conv", "custom", "layer_norm", "repeat_kv", "rms_norm", "rotary_emb", "arg_reduce",
    "cumsum", "mean", "reduce", "softmax", "var", "cat", "chunk", "contiguous", "expand", "flatten", "narrow", "pad",
    "permute", "reshape", "split", "squeeze", "stack", "t", "transpose", "unsqueeze",
]
