"""Random GGUF blocks for kernel tests: every quant bit exercised, scale fields finite and moderate."""
import numpy as np

from tallow.dtypes import get_dtype

FORMATS = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k"]
# byte offsets of each block's f16 scale fields (d, and dmin where the format has one)
SCALE_AT = {"q4_0": [0], "q4_1": [0, 2], "q5_0": [0], "q5_1": [0, 2], "q8_0": [0], "q4_k": [0, 2], "q5_k": [0, 2],
            "q6_k": [208]}


def random_blocks(q, n_blocks, rng):
    """n_blocks blocks of format q as one flat uint8 array."""
    d = get_dtype(q)
    raw = rng.integers(0, 256, size=(n_blocks, d.block_bytes), dtype=np.uint8)
    for at in SCALE_AT[q]:
        raw[:, at:at + 2] = rng.uniform(-2, 2, size=n_blocks).astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(-1)
