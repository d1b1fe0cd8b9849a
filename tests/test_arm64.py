"""The CPU kernels for aarch64, where no ARM machine is at hand.

Cross-compiled here (fast, every run): the K-quants' decode kernel (kquant_ir) for a Cortex-A76
with the dot products has its byte dots as `sdot` (arm_ir), and for a Cortex-A72 (none) the
generic multiply-longs, no `sdot`.

Run under qemu-user (scripts/arm64_emulated.sh; marked arm64_emulated, minutes of emulated
compiling, so only when asked: `pytest -m arm64_emulated tests/test_arm64.py`, a skip with the
reason otherwise): the decode products against dequantise-then-numpy (test_cpu_kernels.py's
checks) on an emulated CPU with ARMv8.2's dot products (qemu `-cpu max`, numba told cortex-a76
+dotprod) and on one without (`-cpu cortex-a72`), and the machine code numba made for each read
for its instructions. Speed under emulation means nothing and is not looked at.
"""
import os
import struct
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TRIPLE = "aarch64-unknown-linux-gnu"

# The emulated run: tests of the quantised decode products (every format; the K-quants' byte dots).
SUBSET = ["tests/test_cpu_kernels.py", "-k", "match_dequantised_numpy or gated_and_biased"]


@pytest.fixture(scope="module")
def runner(request):
    if "arm64_emulated" not in (request.config.getoption("-m") or ""):
        pytest.skip("minutes of emulated compiling: run with -m arm64_emulated")
    home = Path(os.environ.get("TALLOW_HOME") or Path.home() / ".cache" / "tallow")
    path = home / "arm64" / "python"
    if not path.exists():
        pytest.skip(f"no emulated aarch64 Python at {path}: run scripts/arm64_emulated.sh first")
    return path


def _text_words(obj: bytes):
    """The 32-bit instruction words of an ELF64 little-endian object's executable sections."""
    assert obj[:4] == b"\x7fELF" and obj[4] == 2 and obj[5] == 1
    shoff, = struct.unpack_from("<Q", obj, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", obj, 0x3A)
    for i in range(shnum):
        _, kind, flags, _, offset, size = struct.unpack_from("<IIQQQQ", obj, shoff + i * shentsize)
        if kind == 1 and flags & 4:  # SHT_PROGBITS, SHF_EXECINSTR
            yield from struct.unpack_from(f"<{size // 4}I", obj, offset)


def _counts(folder: Path):
    """(sdot/udot, smull/smlal/umull/umlal) instructions (Advanced SIMD vector forms, any register or
    lane count: the A64 encodings) in the kernels' cached machine code."""
    dots = widening = 0
    for obj in folder.rglob("*.o"):
        for w in _text_words(obj.read_bytes()):
            dots += (w & 0x9FE0FC00) == 0x0E809400  # SDOT/UDOT (vector), size 10
            widening += (w & 0x9F20BC00) == 0x0E208000  # SMLAL/UMLAL/SMULL/UMULL (vector; bit 13: mul)
    return dots, widening


def _emulated(runner, cpu, home):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "PYTHON", "TALLOW"))}
    env.update(ARM64_CPU=cpu, TALLOW_HOME=str(home), NUMBA_CACHE_DIR=str(home / "numba"))
    done = subprocess.run(["nice", "-n", "10", str(runner), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-x", *SUBSET], cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert " passed" in done.stdout and " failed" not in done.stdout
    return _counts(home / "cpu_kernels")


@pytest.mark.arm64_emulated
def test_products_with_dot_instructions(runner, tmp_path):
    dots, _ = _emulated(runner, "max", tmp_path)
    assert dots > 0


@pytest.mark.arm64_emulated
def test_products_without_dot_instructions(runner, tmp_path):
    dots, widening = _emulated(runner, "cortex-a72", tmp_path)
    assert dots == 0 and widening > 0


def test_instruction_counter_reads_the_encodings():
    """_counts' masks against known encodings: sdot v0.4s, v1.16b, v2.16b = 0x4e829420; udot the
    same = 0x6e829420; smull v0.4s, v1.4h, v2.4h = 0x0e62c020; smlal2 v0.4s, v1.8h, v2.8h = 0x4e628020;
    add v0.4s, v1.4s, v2.4s = 0x4ea28420 (neither)."""
    def kinds(w):
        return (w & 0x9FE0FC00) == 0x0E809400, (w & 0x9F20BC00) == 0x0E208000
    assert kinds(0x4E829420) == (True, False)
    assert kinds(0x6E829420) == (True, False)
    assert kinds(0x0E62C020) == (False, True)
    assert kinds(0x4E628020) == (False, True)
    assert kinds(0x4EA28420) == (False, False)


def _kquant_kernel_ops(code, cpu, features, dotprod, monkeypatch):
    """The instructions of kquant_ir's kernel (one activation row, two weight rows) for format code,
    its IR generated as on an aarch64 host with or without dotprod and compiled for cpu."""
    pytest.importorskip("numba")
    import llvmlite.binding as llvm
    from llvmlite import ir

    from tallow.backends.cpu.kernels import kquant_ir, vector_ir
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    try:
        target = llvm.Target.from_triple(TRIPLE)
    except RuntimeError:
        pytest.skip(f"this llvmlite has no {TRIPLE} target")
    for name, value in (("_BYTE_DOT", None), ("_X86_PHADD", None), ("_X86_WIDE", False), ("_ARM_DOT", dotprod)):
        monkeypatch.setattr(kquant_ir, name, value)
    monkeypatch.setattr(vector_ir, "_X86_MADD", None)
    i64 = vector_ir._I64
    pointers = [t.as_pointer() for t in (vector_ir._I8, vector_ir._F32, vector_ir._I16, vector_ir._F32, vector_ir._I32)]
    module = ir.Module()
    module.triple = TRIPLE
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), pointers + [i64] * 4 + [vector_ir._F32.as_pointer()]),
                     "kernel")
    builder = ir.IRBuilder(fn.append_basic_block())
    raw, table, x, dx, sx, oa, ob, blocks, block_bytes, out = fn.args
    values = kquant_ir.kernel_body(builder, code, 1, raw, table, [(x, dx, sx)], oa, ob, blocks, block_bytes)
    for i, value in enumerate(values):
        builder.store(value, builder.gep(out, [ir.Constant(i64, i)]))
    builder.ret_void()
    parsed = llvm.parse_assembly(str(module))
    parsed.verify()
    machine = target.create_target_machine(cpu=cpu, features=features, opt=3)
    return [line.split()[0] for line in machine.emit_assembly(parsed).splitlines()
            if line.startswith("\t") and not line.startswith("\t.")]


@pytest.mark.parametrize("code", [5, 6, 7])  # q4_k, q5_k, q6_k
def test_kquant_byte_dots_are_sdot_where_the_cpu_has_dotprod(code, monkeypatch):
    """With dotprod every 32-value byte dot is two `sdot`s: 8 sub-blocks x 2 weight rows + 8 block
    sums (q4_k/q5_k's mins) or 8 shared offsets (q6_k), 48 in all; without it (and with it but the
    generic IR: LLVM does not form sdot from it) none, the pairs' multiply-longs instead."""
    with_dot = _kquant_kernel_ops(code, "cortex-a76", "+dotprod", True, monkeypatch)
    assert sum(op == "sdot" for op in with_dot) == 48
    for cpu, features in (("cortex-a72", ""), ("cortex-a76", "+dotprod")):
        generic = _kquant_kernel_ops(code, cpu, features, False, monkeypatch)
        assert not any(op in ("sdot", "udot") for op in generic)
        assert sum(op.startswith(("smull", "smlal", "umull", "umlal")) for op in generic) >= 64
