"""The one GGUF writer of the tests and scripts (scripts/make_synthetic_gguf.py imports it too).

Files a test reads as a reference are written by the `gguf` package (llama.cpp's own writer),
not by tallow.io.write_gguf, so a reader bug cannot hide behind a matching writer bug:
- write(): a whole file from metadata (a function given the GGUFWriter, so keys get the types
  llama.cpp's converter gives them) and tensors;
- write_streamed(): a file too big for memory, each tensor written as it is made;
- raw(), kv(), relabel(): bytes from raw pieces, for the broken layouts the fuzz and probe
  tests need (counts, types and offsets no writer would produce).
"""
import os
import struct

import numpy as np


def _writer(path, arch):
    import gguf
    return gguf.GGUFWriter(os.fspath(path), arch)


def _stored(array, qtype):
    """(data, raw_dtype) for GGUFWriter.add_tensor: `array` as qtype ('f32', 'f16' or a block type
    such as 'q8_0'); None keeps its dtype."""
    import gguf
    if qtype is None:
        return array, None
    if qtype == "f32":
        return np.asarray(array, np.float32), None
    if qtype == "f16":
        return np.asarray(array, np.float16), None
    qt = gguf.GGMLQuantizationType[qtype.upper()]
    return gguf.quants.quantize(np.asarray(array, np.float32), qt), qt


def write(path, arch, metadata=None, tensors=(), qtype=None):
    """Write `path` with gguf.GGUFWriter and return it.

    metadata: a function given the writer, to call its add_* methods (it may add tensors too:
    they come first in the file). tensors: {name: array} or (name, array) pairs in file order;
    an array is kept in its dtype, a 2-D float32 one is stored as qtype ('f16', 'q8_0', ...)
    when given (llama.cpp keeps 1-D norms and biases in f32), and (array, qtype) chooses for one."""
    w = _writer(path, arch)
    if metadata is not None:
        metadata(w)
    for name, t in tensors.items() if isinstance(tensors, dict) else tensors:
        if isinstance(t, tuple):
            data, raw_dtype = _stored(*t)
        elif qtype is not None and t.ndim == 2 and t.dtype == np.float32:
            data, raw_dtype = _stored(t, qtype)
        else:
            data, raw_dtype = t, None
        w.add_tensor(name, data, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def add_hparams(writer, cfg, rope_theta):
    """The hyperparameters every decoder GGUF carries, from a transformers config, as
    convert_hf_to_gguf.py writes them (architecture-specific keys are the caller's)."""
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(rope_theta)


def llama_permute(w, n_head):
    """convert_hf_to_gguf.py's LlamaModel.permute for q (n_head = heads) or k (n_head = kv heads):
    HF's half-split rotary rows -> ggml's interleaved pairs. transformers undoes it on load
    (modeling_gguf_pytorch_utils.py, _reverse_permute_weights)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_bytes(arch, metadata=None, tensors=(), qtype=None):
    """The bytes write() would put in a file (written to a temporary folder and read back)."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.gguf")
        write(path, arch, metadata, tensors, qtype)
        with open(path, "rb") as f:
            return f.read()


def write_streamed(path, arch, metadata, plan, data):
    """Write `path` one tensor at a time: the whole file is never in memory.

    plan: [(name, shape as (rows, cols) or (n,), ggml type name)] in file order; data: an
    iterable giving each tensor's array in plan order (float32 for F32, uint8 blocks of
    shape (rows, row bytes) for block types). Returns the file's size in bytes."""
    import gguf
    w = _writer(path, arch)
    metadata(w)
    for name, shape, type_name in plan:
        if type_name == "F32":
            w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
            continue
        qt = gguf.GGMLQuantizationType[type_name]
        per_block, block_bytes = gguf.GGML_QUANT_SIZES[qt]
        rows, cols = shape
        w.add_tensor_info(name, (rows, cols // per_block * block_bytes), np.dtype(np.uint8),
                          rows * cols // per_block * block_bytes, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for array in data:
        w.write_tensor_data(array)
    w.close()
    return os.path.getsize(path)


# -- raw bytes, for layouts no writer produces ------------------------------------------

def _string(b):
    return struct.pack("<Q", len(b)) + b


def kv(key, type_id, payload):
    """One metadata entry: key (bytes), GGUF value type id, the value's raw bytes."""
    return _string(key) + struct.pack("<I", type_id) + payload


def raw(kvs=b"", n_kv=0, tensors=(), n_tensors=None, data=b"", version=3):
    """A GGUF from raw pieces: kvs (kv() entries joined) with n_kv as the declared count;
    tensors: (name bytes, dims innermost-first, type id, offset); n_tensors overrides the
    declared tensor count; data follows the header padded to 32 bytes."""
    infos = b"".join(_string(n) + struct.pack("<I", len(d)) + b"".join(struct.pack("<Q", x) for x in d)
                     + struct.pack("<IQ", t, o) for n, d, t, o in tensors)
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors, n_kv) + kvs + infos
    return head + b"\0" * (-len(head) % 32) + data


def type_offset(blob, name):
    """The byte offset of tensor `name`'s ggml type id in the header of a GGUF file's bytes."""
    key = _string(name.encode())
    pos = blob.index(key) + len(key)
    n_dims = struct.unpack_from("<I", blob, pos)[0]
    return pos + 4 + 8 * n_dims


def relabel(blob, name, type_id):
    """A copy of the file's bytes with tensor `name` declared as ggml type `type_id` (data untouched)."""
    pos = type_offset(blob, name)
    return blob[:pos] + struct.pack("<I", type_id) + blob[pos + 4:]
