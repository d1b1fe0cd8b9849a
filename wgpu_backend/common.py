"""What every op family of the wgpu backend shares: the storage type and the words of the
kernels' parameter uniforms."""
import struct

from tallow.backends.gpu_plan import MAX_DIMS
from tallow.layout import contiguous_strides, kernel_meta, numel_of

I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1


class WgpuStorage:
    """A GPU buffer holding `nbytes` of one tensor's elements. `dequantized` marks
    block-format weights that were dequantised to f32 on upload."""
    __slots__ = ("buf", "cap", "nbytes", "dequantized", "__weakref__")

    def __init__(self, buf, cap, nbytes, dequantized=False):
        self.buf, self.cap, self.nbytes, self.dequantized = buf, cap, nbytes, dequantized

    def __repr__(self):
        return f"WgpuStorage({self.nbytes} bytes)"


def _u32(v):
    return v & 0xFFFFFFFF


def _pack(words):
    return struct.pack(f"<{len(words)}I", *[_u32(w) for w in words])


def _layout_words(shape, operands, coalesce=True, what="op"):
    """Words 0..36 of the element-wise layout (see kernels/common.wgsl): numel, then the
    strided-kernel meta of tallow.layout.kernel_meta with three operand slots."""
    return [numel_of(shape)] + kernel_meta(shape, operands, MAX_DIMS, f"wgpu {what}", slots=3, coalesce=coalesce)


def _contig_strides(shape):
    return list(contiguous_strides(tuple(shape)))


# The matvec kernels' output activation when there is none.
_NO_ACT = {"ACT": "v"}
# qmatvec*.wgsl read x through input_strided.wgsl, a block at a time (qmatvec_block.wgsl).
_QMATVEC_INPUT = ("input_strided", "qmatvec_block")


def _qmatvec_words(m, n, k, row_bytes, xoff):
    """Words 0..11 of qmatvec*.wgsl: m rows of x, contiguous from xoff, times n rows of k of w."""
    return [m, n, k, row_bytes, xoff, 0, k, 1, 0, 0, 0, 0]

