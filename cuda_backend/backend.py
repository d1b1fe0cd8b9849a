"""The CUDA backend: tallow's backend contract as CUDA C kernels (core/backends/gpu_kernels/,
written once for CUDA and Metal) driven through CuPy, with cuBLAS (cupy.matmul) for dense matmul.

Storage is a DeviceStorage over a flat cupy array. f16 is computed in f32 and rounded
on store (as the numpy backend); bf16 is kept as its 16-bit pattern and converted with
integer ops inside the kernels, which works on every GPU (no __nv_bfloat16 needed), and
its matmul runs in f32 on cuBLAS (cupy has no bf16 dtype). GGUF blocks stay on the GPU
as bytes: Q8_0, Q4_0, Q4_1, Q4_K and Q6_K are dequantised inside the kernels.
"""
from tallow.backends.kernel.backend import KernelBackend
from tallow.backends.operand import Operand
from tallow.dtypes import bf16, f32
from tallow.layout import Layout, numel_of

from .driver import CupyDriver


class CudaBackend(KernelBackend):
    name = "cuda"
    pool_bytes = 0  # CuPy's memory pool already reuses device memory: no second pool over it

    def __init__(self):
        super().__init__(CupyDriver())  # raises DeviceError saying what is missing

    def features(self):
        d = self.driver
        major, minor = d.compute_capability
        feats = {"backend": "cuda", "adapter": d.device_name, "compute_capability": f"{major}.{minor}",
                 "cupy": d.cp.__version__, "f16": True, "bf16": True, "native_bf16": major >= 8,
                 "cuda_graphs": d.can_replay and d.graph_error is None,  # captured decode steps replay as graphs
                 **self.plan_features()}
        if d.graph_error:
            feats["cuda_graph_error"] = d.graph_error
        return feats

    source_language = "cuda"

    def custom_source(self, op):
        return op.cuda

    def _cupy_view(self, st, layout):
        """A strided cupy view of the layout (no copy), for cuBLAS."""
        cp = self.driver.cp
        arr = st.buf
        item = arr.itemsize
        return cp.ndarray(layout.shape, dtype=arr.dtype, memptr=arr.data + layout.offset * item,
                          strides=tuple(s * item for s in layout.strides))

    def matmul(self, a, b, dtype):
        self._check(dtype, "matmul")
        (a, la), (b, lb) = a, b
        few_rows = self._rows_matvec(a, la, b, lb, dtype)  # a decode step's projection: one kernel, graph-capturable
        if few_rows is not None:
            return few_rows
        if dtype is bf16:  # no bf16 in cupy: multiply in f32, round once at the end
            af, bf = self.cast(a, la, bf16, f32), self.cast(b, lb, bf16, f32)
            out = self.matmul(Operand(af, Layout(la.shape)), Operand(bf, Layout(lb.shape)), f32)
            return self.cast(out, Layout((out.numel,)), f32, bf16)
        cp = self.driver.cp
        shape = la.shape[:-1] + lb.shape[-1:]
        out = self.driver.alloc(dtype, numel_of(shape))
        if out.numel == 0:
            return out
        if la.shape[-1] == 0:
            return self.full(out.numel, 0, dtype)

        def run():  # cuBLAS into `out`: a captured step's CUDA graph records it (tallow.capture)
            cp.matmul(self._cupy_view(a, la), self._cupy_view(b, lb), out=out.buf.reshape(shape))
        self._host_call(run, ("matmul", la.shape, la.strides, la.offset, lb.shape, lb.strides, lb.offset, dtype.name))
        return out
