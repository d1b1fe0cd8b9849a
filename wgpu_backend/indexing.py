"""The wgpu backend's index ops (index_select, gather, scatter_add) and convolution."""

from tallow.backends.gpu_plan import MAX_DIMS
from tallow.backends.operand import Operand
from tallow.dtypes import f32, i32
from tallow.layout import Layout


class IndexOps:
    """WgpuBackend's index ops and convolution (a mixin)."""

    def _quantized_rows(self, storage, layout, dtype, ids, lids, dim):
        rows, k = layout.shape
        if storage.dequantized:  # a format without in-kernel decoding: dequantised on upload
            return self.index_select(Operand(storage, Layout((rows, k))), Operand(ids, lids), f32, dim)
        count = lids.numel()
        if not lids.is_contiguous() or lids.offset:
            ids, lids = self.copy(ids, lids, self._ids_dtype), Layout((count,))
        return self._dequant_rows(storage, dtype, ids, count, k, rows, f32, self._ids_dtype)

    def _index_select_kernel(self, storage, layout, dtype, ids, lids, dim, shape, out):
        ids_strides = [0] * len(shape)
        ids_strides[dim] = lids.strides[0] if lids.shape else 0
        self._ew("index", "index_select", {"X": dtype, "I": self._ids_dtype},
                 [(storage, layout.offset, layout.strides), (ids, lids.offset, ids_strides)], out, shape,
                 [dim, layout.shape[dim]], coalesce=False)

    # The contract passes index tensors without their dtype; integer ids are
    # i32 on the GPU for every signed dtype (i64/i32/i8) and u32 for unsigned
    # ones, and ids are never negative beyond -len, so reading as i32 is right
    # for both.
    _ids_dtype = i32

    def _gather_kernel(self, storage, layout, dtype, ids, lids, dim, out):
        self._ew("index", "gather", {"X": dtype, "I": self._ids_dtype},
                 [(storage, layout.offset, layout.strides), (ids, lids.offset, lids.strides)], out, lids.shape,
                 [dim, layout.shape[dim]], coalesce=False)

    def scatter_add(self, dst, ids, src, dtype, dim):
        (dst, ld), (ids, lids), (src, ls) = dst, ids, src
        out = self._new(ld.numel(), dtype)
        ids_shape = list(lids.shape) + [0] * (MAX_DIMS - len(lids.shape))
        self._ew("scatter_add", "scatter_add", {"X": dtype, "I": self._ids_dtype},
                 [(dst, ld.offset, ld.strides), (ids, lids.offset, lids.strides), (src, ls.offset, ls.strides)],
                 out, ld.shape, [dim] + ids_shape, coalesce=False)
        return out

    # ---- convolution ------------------------------------------------------------------------
    @staticmethod
    def _conv_words(numel, g):
        """conv.wgsl's and im2col.wgsl's words: the elements they write, then the geometry."""
        return [numel, g.b, g.cin, g.h, g.w, g.cout, g.cin_g, g.kh, g.kw, g.oh, g.ow, g.stride_h, g.stride_w,
                g.pad_h, g.pad_w, g.dilation_h, g.dilation_w, g.cout // g.groups]

    def _im2col_fits(self, col_numel, dtype):
        return col_numel * self._esize(dtype) <= self.limits["max_storage_binding"]

    def _im2col_kernel(self, xs, cols, col_numel, g, dtype):
        self._run("im2col", {"X": dtype}, [xs, cols], self._conv_words(col_numel, g), (col_numel + 255) // 256,
                  label="im2col")

    def _direct_conv_kernel(self, xs, ws, out, numel, g, dtype):
        """The unfolded input would not fit one binding: a direct convolution."""
        self._run("conv", {"X": dtype}, [xs, ws, out], self._conv_words(numel, g), (numel + 255) // 256, label="conv")
