"""The host constants and choices both GPU planners share (WgpuBackend, and KernelBackend for
CUDA/Metal): defined once here, so the two cannot drift apart. The rest of what they share is
the strided-kernel plan in tallow.layout (coalesce_dims, Layout.moved_last, kernel_meta), the
step buffer (step_buffer.py) and the step recording (step_recording.py).
"""
import struct

# Strided kernels index at most this many dims (after coalescing): the size of the meta arrays.
MAX_DIMS = 8

# GGUF block formats every GPU kernel set dequantises in place (matvec, matmul, row lookup);
# others are dequantised once on the host.
IN_KERNEL_QUANTS = ("q8_0", "q4_0", "q4_1", "q4_k", "q6_k")


def in_kernel_quant(wdtype):
    """Whether the GPU kernels read this block format's bytes themselves."""
    return wdtype.name in IN_KERNEL_QUANTS


def runs_matvec(m, max_rows, wdtype=None):
    """Whether a product with m rows of x runs a matvec kernel (a decode step, a short prompt:
    the weight is read once per row of x, no dequantised copy) rather than the many-row path
    (dequantise once then a dense matmul, or a quantised matmul kernel). max_rows is the
    backend's own threshold: where the matvec stops winning on its kernels. A quantised weight
    (wdtype) must also be a format the kernels read in place."""
    return m <= max_rows and (wdtype is None or in_kernel_quant(wdtype))


def conv_output_size(size, kernel, stride, padding, dilation):
    """A convolution's output length along one dim (as torch computes it)."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def f32_bits(value):
    """The IEEE bits of value as an f32, a kernel parameter word (OverflowError beyond f32)."""
    return struct.unpack("<I", struct.pack("<f", float(value)))[0]
