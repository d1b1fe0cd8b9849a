"""The codes and tables the CPU kernels and their callers share, without numba: a process
that loads the kernels' machine code (native_kernels.py) never imports the numba modules."""
import numpy as np

# Format codes (the kernels branch on these once per block).
FORMATS = {"q4_0": 0, "q4_1": 1, "q5_0": 2, "q5_1": 3, "q8_0": 4, "q4_k": 5, "q5_k": 6, "q6_k": 7}
ACT_CODES = {"silu": 0, "gelu": 1, "gelu_tanh": 2, "relu": 3}  # the gated products' activations
QK = 32  # activation values per block (one scale each)

# float32 value of every f16 bit pattern (256 KB; stays in L2): f16 -> f32 by lookup.
F16_TABLE = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
