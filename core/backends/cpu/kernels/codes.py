"""The codes and tables the CPU kernels and their callers share, without numba: a process
that loads the kernels' machine code (machine_code.py) never imports the numba modules."""
import math

import numpy as np

# Format codes (the kernels branch on these once per block).
FORMATS = {"q4_0": 0, "q4_1": 1, "q5_0": 2, "q5_1": 3, "q8_0": 4, "q4_k": 5, "q5_k": 6, "q6_k": 7}
ACT_CODES = {"silu": 0, "gelu": 1, "gelu_tanh": 2, "relu": 3}  # the gated products' activations
BINARY_CODES = {"add": 0, "sub": 1, "mul": 2}  # fused_ops.binary_f32's ops
QK = 32  # activation values per block (one scale each)

# float32 value of every f16 bit pattern (256 KB; stays in L2): f16 -> f32 by lookup.
F16_TABLE = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)

# GELU's erf (gelu.py, fused_ops.gelu): erf(x) ~= x * P(x^2) / Q(x^2) on [-4, 4] (Eigen's generic_fast_erf_float).
ERF_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
         -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
ERF_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
         -1.42647390514189e-02)
INV_SQRT2 = 1.0 / math.sqrt(2.0)
# tanh(x) ~= x * P(x^2) / Q(x^2) on x clamped to +-TANH_CLAMP (Eigen's generic_fast_tanh_float
# coefficients; measured here within 3.4e-7 of float64 tanh over [-12, 12]): fused_ops.gate_rows' gelu_tanh.
TANH_P = (4.89352455891786e-03, 6.37261928875436e-04, 1.48572235717979e-05, 5.12229709037114e-08,
          -8.60467152213735e-11, 2.00018790482477e-13, -2.76076847742355e-16)
TANH_Q = (4.89352518554385e-03, 2.26843463243900e-03, 1.18534705686654e-04, 1.19825839466702e-06)
TANH_CLAMP = 7.90531110763549805
GELU_CLAMP = 4.0

# A captured step's program (runtime/step_program.py builds it, step_loop.run_step runs it): op codes,
# one row of WIDTH ints per kernel call. OP_CALL rows call a kernel's step form by its address (see entry).
OP_QUANTIZE, OP_PRODUCT, OP_CALL, OP_LAYER_NORM, OP_ATTENTION, OP_ROWS = range(1, 7)
OP_F16_PRODUCT, OP_CROSS_ATTENTION = 7, 8  # (shared among the threads as OP_PRODUCT: float models' steps)
WIDTH = 24  # ints per program row
SHARED_ROWS, SHARED_CHUNKS = 22, 23  # where a shared op's row count and chunk count sit in its row


def entry(*kinds, returns="void", step=False, name=None):
    """Declare a numba kernel a machine-code entry (machine_code.py): its argument kinds ("f32[2]": a
    C-contiguous 2-D float32 array; "f32[4A]": any 4-D view with non-negative strides; "i64", "f64",
    "f32", "bool": scalars) and result ("void", "bool", "i64"). machine_code reads these decorator
    lines from the source text, so a process that loads the machine code never imports numba.
    step=True (a "void" entry) also compiles its step form, which a captured decoding step's program
    calls with the arguments the call recorded (step_program.py): a kernel the backend records needs
    no other file edited to run inside the step program. name: the entry's name when not the function's."""
    def declare(kernel):
        return kernel
    return declare
