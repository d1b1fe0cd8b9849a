"""User-defined ops (the analogue of Candle's CustomOp1/2/3).

Subclass CustomOp, implement `cpu` (numpy arrays in, a numpy array out) and,
optionally, `python` (for the pure-Python backend / Pyodide without numpy),
GPU kernel sources (`wgsl`, `cuda`, `msl`) and `backward`. Then call
`tallow.custom_op(op, *tensors)`; it works like any other op, autograd
included. A backend for which the op has no implementation raises
UnsupportedError naming the op and the backend.

Kernel conventions (so one source serves every tensor shape):
* wgsl: entry point `main`, @workgroup_size(64); binding 0 is a uniform
  `struct { numel: u32 }`, bindings 1..n the contiguous f32 inputs
  (`array<f32>`, read) and binding n+1 the output (`array<f32>`, read_write).
* cuda: `extern "C" __global__ void main_kernel(const float* in0, ..., float* out, unsigned int numel)`.
* msl: `kernel void main_kernel(device const float* in0 [[buffer(0)]], ..., device float* out [[buffer(n)]],
  constant uint& numel [[buffer(n+1)]], uint i [[thread_position_in_grid]])`.
  cuda and msl kernels run one thread per output element in 1-D blocks of 256 threads; the grid
  is rounded up to whole blocks, so the kernel returns when i >= numel. Inputs and output are f32.
"""
from __future__ import annotations

from . import ops
from .tensor import Tensor


class CustomOp:
    name = "custom"
    wgsl = None
    cuda = None
    msl = None

    def output_shape(self, *shapes):
        """Shape of the result from the inputs' shapes (default: the first input's)."""
        return shapes[0]

    def output_dtype(self, *dtypes):
        return dtypes[0]

    def cpu(self, *arrays):
        """numpy implementation: numpy arrays (in compute precision) in, a numpy array out."""
        raise NotImplementedError

    def python(self, *inputs):
        """Pure-Python implementation: (flat list, shape) pairs in, a flat list out. Optional."""
        raise NotImplementedError

    def backward(self, inputs, output, grad):
        """Gradients (tensors or None) for each input, written with tensor ops. Optional."""
        raise NotImplementedError(f"custom op {self.name!r} defines no backward")


def custom_op(op: CustomOp, *tensors: Tensor) -> Tensor:
    """Run a user-defined op on tensors of one device; autograd uses op.backward."""
    return ops.custom(op, tensors)
