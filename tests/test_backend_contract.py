"""The backend contract's shape (issue 30): every backend's primitives take at most 6 parameters
besides self; those of OPERAND_PRIMITIVES take Operands (no layout parameters of their own) under
the names the contract gives them; base.py's docstring says which convention holds where."""
import inspect
import re

import pytest

from tallow.backends import base
from tallow.backends.base import OPERAND_PRIMITIVES, Backend

MAX_PARAMETERS = 6
FUSED_DECODE_OPS = {"add_rms_norm", "add_layer_norm", "matmul_bias", "qmatmul_bias", "gated_matmul", "gated_qmatmul",
                    "add_norm_linear", "kv_write", "rope_kv_write", "cache_attention", "batch_cache_attention"}
# A layout passed beside its storage: layout, lx, lw, lkc, lcos, ... (the pair convention's names).
LAYOUT_NAME = re.compile(r"^(layout|l[a-z]{1,3})$")


def _backend_classes():
    """Every backend class: the contract's own, the CPU and pure-Python ones, both GPU planners,
    the CUDA and Metal backends and their CPU emulators, and the wasm device."""
    from tallow.backends.cpu.backend import NumpyBackend
    from tallow.backends.gpu_backend import GpuBackend
    from tallow.backends.kernel.backend import KernelBackend
    from tallow.backends.python_backend import PythonBackend
    from tallow_cuda.backend import CudaBackend
    from tallow_cuda.cpu_driver import CudaCpuEmulatorBackend
    from tallow_metal.backend import MetalBackend
    from tallow_metal.cpu_driver import MetalCpuEmulatorBackend
    from tallow.backends.wasm.backend import WasmBackend
    from tallow_wgpu.backend import WgpuBackend
    return [Backend, PythonBackend, NumpyBackend, GpuBackend, WgpuBackend, KernelBackend, CudaBackend,
            CudaCpuEmulatorBackend, MetalBackend, MetalCpuEmulatorBackend, WasmBackend]


PRIMITIVES = sorted(name for name, member in vars(Backend).items()
                    if callable(member) and not name.startswith("_") and name not in ("features",))


def _parameters(cls, name):
    return [p for p in inspect.signature(getattr(cls, name)).parameters.values() if p.name != "self"]


def test_the_contract_lists_its_primitives():
    assert len(PRIMITIVES) >= 40 and OPERAND_PRIMITIVES <= set(PRIMITIVES)
    assert {"cache_attention", "add_norm_linear", "rope_kv_write", "attention", "conv2d"} <= OPERAND_PRIMITIVES


@pytest.mark.parametrize("cls", _backend_classes(), ids=lambda c: c.__name__)
def test_no_primitive_takes_more_than_six_parameters(cls):
    wide = {name: len(_parameters(cls, name)) for name in PRIMITIVES
            if len(_parameters(cls, name)) > MAX_PARAMETERS}
    assert not wide, f"{cls.__name__}: primitives with more than {MAX_PARAMETERS} parameters: {wide}"


@pytest.mark.parametrize("cls", _backend_classes(), ids=lambda c: c.__name__)
def test_operand_primitives_take_operands_under_the_contracts_names(cls):
    for name in sorted(OPERAND_PRIMITIVES):
        names = [p.name for p in _parameters(cls, name)]
        assert names == [p.name for p in _parameters(Backend, name)], f"{cls.__name__}.{name}{tuple(names)}"
        assert not [n for n in names if LAYOUT_NAME.match(n)], f"{cls.__name__}.{name} takes a layout: {names}"


def test_the_docstring_describes_the_convention():
    """base.py's docstring names each convention and, under the Operand one, its primitives (the
    fused decode ops, all Operand primitives, by that name)."""
    doc = base.__doc__
    for words in ("Operand", "specs.py", "operand.py", "(storage, layout) pairs", "6 parameters", "fused decode op"):
        assert words in doc, words
    operand_part = doc.split("(storage, layout) pairs as")[0]
    for name in sorted(OPERAND_PRIMITIVES - FUSED_DECODE_OPS):
        assert re.search(rf"\b{name}\b", operand_part), name
