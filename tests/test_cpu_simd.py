"""The vector-IR kernels (tallow.backends.cpu.kernels.vector_ir) against their numpy statement (dot_py),
with the target's multiply-pairs instruction and with the generic IR other targets (arm64) get.
End to end, tests/test_cpu_kernels.py checks the products against dequantise-then-numpy."""
import numpy as np
import pytest

pytest.importorskip("numba")
from numba import njit

from tallow.dtypes import get_dtype
from tallow.quant import dequantize_numpy
from tallow.backends.cpu.kernels import float_rows, int_dot, vector_ir

NAMES = dict(enumerate(vector_ir.NAMES))


def _compiled(rows, x86_madd, monkeypatch):
    """A fresh kernel for `rows` activation rows, its IR generated with or without the x86
    instruction (at compile time)."""
    monkeypatch.setattr(vector_ir, "_X86_MADD", x86_madd)
    dot = vector_ir._make_kernel(rows)

    @njit
    def run(fmt, raw, oa, ob, blocks, bb, qx, dx, sx, table, i0):
        return dot(fmt, raw, oa, ob, blocks, bb, qx, dx, sx, table, i0)
    return run


def _inputs(fmt, rng, blocks, extreme, m=1):
    """Two rows of `blocks` blocks and m quantised activation rows. extreme: every quant bit set
    and activations at +-32767 (the largest int32 sums the kernels can meet)."""
    d = get_dtype(NAMES[fmt])
    raw = rng.integers(0, 256, size=(2 * blocks, d.block_bytes), dtype=np.uint8)
    scales = {5: (0, 2), 6: (0, 2), 7: (208,)}.get(fmt, (0, vector_ir.MIN_AT.get(fmt, 0)))
    if extreme:  # every quant bit set (q8_0: -128; q6_k: 31 with int8 scales of 127)
        raw[:, :] = 0xFF if fmt != 4 else 0x80
        if fmt == 7:
            raw[:, 192:208] = 127
    for at in scales:
        raw[:, at:at + 2] = rng.uniform(-2, 2, size=2 * blocks).astype(np.float16).view(np.uint8).reshape(-1, 2)
    k = d.block_size * blocks
    x = rng.standard_normal((m, k)).astype(np.float32)
    if extreme:
        x = np.broadcast_to(np.where(np.arange(k) % 3 == 0, -1.0, 1.0).astype(np.float32), (m, k)).copy()
    qx = np.empty((m, k), np.int16)
    dx, sx = np.empty((m, k // 32), np.float32), np.empty((m, k // 32), np.int32)
    int_dot.quantize_rows(x, 32767, qx, dx, sx)
    return raw.reshape(-1), blocks * d.block_bytes, qx, dx, sx


@pytest.mark.parametrize("x86_madd", ["llvm.x86.avx2.pmadd.wd", None], ids=["x86", "generic"])
@pytest.mark.parametrize("rows", [1, vector_ir.TILE_ROWS])
def test_kernel_matches_its_numpy_statement(x86_madd, rows, monkeypatch):
    """Every format (the format code chosen at run time), random and extreme blocks."""
    if x86_madd and not vector_ir._has_avx2():
        pytest.skip("this CPU has no AVX2: the x86 form is never generated here")
    run = _compiled(rows, x86_madd, monkeypatch)
    for fmt in sorted(NAMES):
        for extreme in (False, True):
            rng = np.random.default_rng(fmt)
            blocks = 7 if fmt <= 4 else 3
            m, i0 = rows + 2, 1  # activation rows around the ones used: the kernel must pick rows i0...
            raw, row_bytes, qx, dx, sx = _inputs(fmt, rng, blocks, extreme, m)
            d = get_dtype(NAMES[fmt])
            got = np.array(run(fmt, raw, 0, row_bytes, blocks, d.block_bytes, qx, dx, sx, float_rows.F16_TABLE, i0))
            want = np.array(vector_ir.dot_py(fmt, raw, 0, row_bytes, blocks, d.block_bytes, qx, dx, sx,
                                             float_rows.F16_TABLE, i0, rows))
            # The same product: only float32 rounding differs (relative to the sum of the terms' sizes).
            w = np.abs(dequantize_numpy(raw, NAMES[fmt], 2 * qx.shape[1]).reshape(2, -1).astype(np.float64))
            x = np.abs(qx[i0:i0 + rows].astype(np.float64).reshape(rows, -1, 32) * dx[i0:i0 + rows, :, None])
            size = (w @ x.reshape(rows, -1).T).reshape(-1)
            assert got.shape == (2 * rows,)
            assert np.all(np.abs(got - want) <= 1e-6 * size + 1e-30), (NAMES[fmt], extreme, got, want)


def test_only_contiguous_arrays_of_the_right_dtypes_compile():
    """The IR reads raw memory: a strided or wrongly typed array must fail to compile, not read garbage."""
    from numba.core.errors import TypingError
    rng = np.random.default_rng(3)
    raw, row_bytes, qx, dx, sx = _inputs(1, rng, 2, False)

    @njit
    def run(raw, qx):
        return vector_ir.dot(1, raw, 0, row_bytes, 2, 20, qx, dx, sx, float_rows.F16_TABLE, 0)
    with pytest.raises(TypingError):
        run(raw, np.repeat(qx, 2, axis=1)[:, ::2])
    with pytest.raises(TypingError):
        run(raw, qx.astype(np.int32))


def _kernel_module(fmt, rows, triple):
    """The generic IR of one format's kernel as a plain LLVM module for `triple` (no numba around it)."""
    from llvmlite import ir
    i64 = vector_ir._I64
    pointers = [t.as_pointer() for t in (vector_ir._I8, vector_ir._F32, vector_ir._I16, vector_ir._F32, vector_ir._I32)]
    module = ir.Module()
    module.triple = triple
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), pointers + [i64] * 4 + [vector_ir._F32.as_pointer()]),
                     "kernel")
    builder = ir.IRBuilder(fn.append_basic_block())
    raw, table, x, dx, sx, oa, ob, blocks, block_bytes, out = fn.args
    values = vector_ir._kernel_body(builder, fmt, rows, raw, table, [(x, dx, sx)] * rows, oa, ob, blocks, block_bytes)
    for i, value in enumerate(values):
        builder.store(value, builder.gep(out, [ir.Constant(i64, i)]))
    builder.ret_void()
    return str(module)


@pytest.mark.parametrize("triple,cpu", [("aarch64-unknown-linux-gnu", "cortex-a72"),  # Raspberry Pi 4
                                        ("aarch64-unknown-linux-gnu", "cortex-a78"),  # Jetson Orin
                                        ("x86_64-unknown-linux-gnu", "x86-64")])      # x86 without AVX2
def test_generic_form_compiles_for_other_targets_into_widening_multiplies(triple, cpu, monkeypatch):
    """The edge boxes cannot be run here, so compile the generic IR for them: every format and row
    count must compile, and on arm64 the pair products must become multiply-long instructions
    (smull/smlal: 16-bit products into 32-bit lanes), not scalar code."""
    import llvmlite.binding as llvm
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    try:
        target = llvm.Target.from_triple(triple)
    except RuntimeError:
        pytest.skip(f"this llvmlite has no {triple} target")
    monkeypatch.setattr(vector_ir, "_X86_MADD", None)
    machine = target.create_target_machine(cpu=cpu, opt=3)
    for fmt in sorted(NAMES):
        for rows in (1, vector_ir.TILE_ROWS):
            module = llvm.parse_assembly(_kernel_module(fmt, rows, triple))
            module.verify()
            ops = [line.split()[0] for line in machine.emit_assembly(module).splitlines()
                   if line.startswith("\t") and not line.startswith("\t.")]
            if triple.startswith("aarch64"):
                assert sum(op.startswith(("smull", "smlal")) for op in ops) >= 4 * rows, (NAMES[fmt], rows)
