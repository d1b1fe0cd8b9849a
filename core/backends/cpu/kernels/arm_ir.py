"""aarch64's byte dot products for the kernels' IR: ARMv8.2's `sdot` (the dotprod extension: the
Raspberry Pi 5's Cortex-A76, Jetson Orin's Cortex-A78AE, Apple M1 on) by name, where the CPU
the code is compiled for has it.

kquant_ir._byte_dot multiplies 32 unsigned bytes (weight fields of at most 6 bits: 0...63) by 32
signed ones (the int8 activations) into 8 int32 lanes, lane i the sum of products 4i...4i + 3.
That is exactly what `sdot` does on a 128-bit register (16 bytes into 4 lanes), once the weights,
being <= 63, are read as signed bytes: two `sdot`s per 32 values, accumulating into the dot's start
value. LLVM does not form it from the generic IR (both sides widened to 16 bits and multiplied
in pairs): llvmlite 0.50's LLVM 22, compiling kquant_ir's q4_k kernel for a Cortex-A76 with
+dotprod, made no `sdot` and 192 multiply-longs (smull/smlal); with this, 48 `sdot`s and 64
multiply-longs (those left are the activations' requantisation), 572 instructions against 968
(tests/test_arm64.py).

Without dotprod (Cortex-A72/A53: the Raspberry Pi 4 and 3) the generic form stays. Which one a
kernel gets follows the features the code numba makes may use (vector_ir._cpu_features: the
host's as LLVM reads them, or $NUMBA_CPU_NAME / $NUMBA_CPU_FEATURES), as the x86 paths do.
Checked under qemu-user (scripts/arm64_emulated.sh; docs/cpu-kernels.md, "aarch64"): same
integers either way; speed not measured (emulation).
"""
from llvmlite import ir
from numba.core import cgutils

_I8, _I32 = ir.IntType(8), ir.IntType(32)


def has_dotprod(features):
    """Whether code compiled with these LLVM target features (a set of "+name" / "-name") may use
    sdot / udot."""
    return "+dotprod" in features


def _arm_module(builder):
    triple = builder.module.triple
    return not triple or triple.startswith(("aarch64", "arm64"))


def _half(builder, v, h, n):
    """Elements h*n ... h*n + n - 1 of vector v."""
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, n), [ir.Constant(_I32, h * n + i)
                                                                             for i in range(n)]))


def byte_dot(builder, u, s, acc=None):
    """<32 x i8> u (values 0...127, read as signed) times <32 x i8> s (signed) -> <8 x i32>, lane i
    the sum of products 4i...4i + 3 (plus acc's lane i): two llvm.aarch64.neon.sdot on 16 bytes.
    None where the module is not an aarch64 one (the caller's generic form then)."""
    if not _arm_module(builder):
        return None
    v4, v16 = ir.VectorType(_I32, 4), ir.VectorType(_I8, 16)
    sdot = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v4, [v4, v16, v16]),
                                          "llvm.aarch64.neon.sdot.v4i32.v16i8")
    zero = ir.Constant(v4, [ir.Constant(_I32, 0)] * 4)
    halves = [builder.call(sdot, [zero if acc is None else _half(builder, acc, h, 4),
                                  _half(builder, u, h, 16), _half(builder, s, h, 16)]) for h in (0, 1)]
    return builder.shuffle_vector(halves[0], halves[1], ir.Constant(ir.VectorType(_I32, 8),
                                                                    [ir.Constant(_I32, i) for i in range(8)]))
