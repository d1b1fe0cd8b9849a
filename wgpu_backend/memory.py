"""The wgpu backend's memory: uploads (widening narrow dtypes on the GPU), downloads (packing
them again), fills, and i64 arithmetic computed exactly on the host (_exact_i64)."""
import math
import struct
from array import array

from tallow.backends.gpu_plan import f32_bits, in_kernel_quant
from tallow.dtypes import bf16, bool_, f16, f32, i32, i64, u32
from tallow.errors import ShapeError, UnsupportedError
from tallow.layout import Layout

from . import expressions as ex
from . import wgsl
from .common import I32_MAX, I32_MIN


class MemoryOps:
    """WgpuBackend's transfers and fills (a mixin: the plumbing is in backend.py)."""

    def _upload(self, data):
        mv = memoryview(data)
        if mv.format != "B" or mv.ndim != 1:
            mv = mv.cast("B")
        n = len(mv)
        st = self._alloc(n)
        if n:
            payload = mv if n % 4 == 0 else bytes(mv) + bytes(-n % 4)
            self.driver.write(st.buf, 0, payload)
        return st

    def _widen(self, raw, numel, dtype, expr):
        out = self._new(numel, dtype)
        if numel:
            self._run("unpack", {"Y": dtype}, [raw, out], self._params([numel], []), (numel + 255) // 256,
                      {"EXPR": expr}, label=f"unpack {dtype.name}")
        return out

    def from_bytes(self, data, dtype):
        if dtype.is_quantized:
            if in_kernel_quant(dtype):
                return self._upload(data)
            return self._dequantize_on_upload(data, dtype)
        mv = memoryview(data).cast("B") if not isinstance(data, (bytes, bytearray)) else memoryview(data)
        self._check_whole_elements(len(mv), dtype)
        numel = len(mv) // dtype.itemsize
        st_type = wgsl.storage_type(dtype, self.has_f16)
        if dtype is i64:
            vals = array("q")
            vals.frombytes(mv)
            self._check_i32(vals, "from_bytes")
            return self._upload(array("i", vals).tobytes())
        if dtype.itemsize == 4 or (dtype is f16 and st_type == "f16"):
            st = self._upload(mv)
            st.nbytes = numel * dtype.itemsize
            return st
        return self._widen_raw(self._upload(mv), numel, dtype)

    def from_js_buffer(self, array_buffer, offset, nbytes, dtype):
        """Storage for nbytes of a JS ArrayBuffer at offset (a fetched weights file in the browser),
        copied into the GPU buffer in JS without entering the wasm heap; then widened on the GPU like
        from_bytes. None when that cannot be done (not the browser driver, or a dtype that needs the
        CPU: i64's range check, quantisations the kernels do not read): read the bytes and use from_bytes."""
        if (not self.driver.reads_js_buffers or dtype is i64
                or (dtype.is_quantized and not in_kernel_quant(dtype))):
            return None
        if not dtype.is_quantized and nbytes % dtype.itemsize:
            raise ShapeError(f"wgpu from_js_buffer: {nbytes} bytes is not a whole number of {dtype.name} elements")
        raw = self._alloc(nbytes)
        if nbytes:
            self.driver.write_from_js(raw.buf, 0, array_buffer, offset, nbytes)
        if (dtype.is_quantized or dtype.itemsize == 4
                or (dtype is f16 and wgsl.storage_type(dtype, self.has_f16) == "f16")):
            return raw
        return self._widen_raw(raw, nbytes // dtype.itemsize, dtype)

    def _widen_raw(self, raw, numel, dtype):
        """f32/i32/u32 storage from packed 1- or 2-byte elements already on the GPU."""
        if dtype is f16:
            expr = "unpack2x16float(half_of(i)).x"
        elif dtype is bf16:
            expr = "bitcast<f32>(half_of(i) << 16u)"
        elif dtype.kind == "i":
            expr = "bitcast<i32>(byte_of(i) << 24u) >> 24u"
        elif dtype is bool_:
            expr = "select(0u, 1u, byte_of(i) != 0u)"
        else:
            expr = "byte_of(i)"
        return self._widen(raw, numel, dtype, expr)

    def _dequantize_on_upload(self, data, dtype):
        from tallow.backends.host import dequantize_on_host
        numel = len(memoryview(data).cast("B")) // dtype.block_bytes * dtype.block_size
        st = self._upload(dequantize_on_host(data, dtype, numel))
        st.dequantized = True
        return st

    def _exact_i64(self, what, out_shape, compute):
        """An i64 op whose result may leave the i32 range that i64 is kept in here: computed exactly
        (64 bits) on the host backend, and kept only when every value fits; else UnsupportedError,
        never a 32-bit wrap-around. compute(host, up) runs the op on the host, up(st, layout, dtype)
        moving an operand there."""
        from tallow.backends.host import host_device
        host = host_device().backend
        cap = self._capture()
        if cap is not None:  # computed from the step's own data: a replay would upload stale values
            cap.computed_on_host(f"wgpu {what} (i64, exactly on the host)")

        def up(st, layout, dtype):
            return host.from_bytes(self.to_bytes(st, layout, dtype), dtype), Layout(layout.shape)

        vals = array("q")
        vals.frombytes(host.to_bytes(compute(host, up), Layout(tuple(out_shape)), i64))
        if len(vals) and (min(vals) < I32_MIN or max(vals) > I32_MAX):
            raise UnsupportedError(f"wgpu {what}: the i64 result leaves the i32 range (min {min(vals)}, max "
                                   f"{max(vals)}), and the wgpu backend keeps i64 as i32; compute it on the cpu "
                                   "device, or in f32")
        return self._upload(array("i", vals).tobytes())

    @staticmethod
    def _check_i32(vals, what):
        if len(vals) and (min(vals) < I32_MIN or max(vals) > I32_MAX):
            raise UnsupportedError(f"wgpu {what}: i64 values outside the i32 range (min {min(vals)}, max {max(vals)}); "
                                   "the wgpu backend stores i64 as i32")

    def _read(self, st, offset_bytes, nbytes):
        if nbytes == 0:
            return b""
        return self.driver.download(st.buf, offset_bytes, nbytes)

    def concat_rows(self, parts, dtype):
        """Buffer-to-buffer copies on the GPU: joined weights never pass through Python memory."""
        spans = []
        for st, lay in parts:
            if dtype.is_quantized and not st.dequantized:
                start, nbytes = lay.offset // dtype.block_size * dtype.block_bytes, dtype.nbytes(lay.numel())
            else:
                size = 4 if dtype.is_quantized else self._esize(dtype)
                start, nbytes = lay.offset * size, lay.numel() * size
            spans.append((st, start, nbytes))
        if any(start % 4 or nbytes % 4 for _, start, nbytes in spans):  # copies move whole words
            return super().concat_rows(parts, dtype)
        out = self._alloc(sum(nbytes for _, _, nbytes in spans))
        out.dequantized = bool(parts) and parts[0][0].dequantized
        pos = 0
        for st, start, nbytes in spans:
            if nbytes:
                self.driver.copy(st.buf, start, out.buf, pos, nbytes)
            pos += nbytes
        return out

    def to_bytes(self, st, layout, dtype):
        numel = layout.numel()
        if dtype.is_quantized:
            if st.dequantized:
                raise UnsupportedError(f"wgpu to_bytes: {dtype.name} weights were dequantised on upload; "
                                       "their blocks are not kept on the GPU")
            start = layout.offset // dtype.block_size * dtype.block_bytes
            return self._read(st, start, dtype.nbytes(numel))
        if numel == 0:
            return b""
        src, off = self._contiguous(st, layout, dtype)
        esize = self._esize(dtype)
        if dtype is i64:
            vals = array("i")
            vals.frombytes(self._read(src, off * 4, numel * 4))
            return array("q", vals).tobytes()
        if dtype.itemsize == esize:
            return self._read(src, off * esize, numel * esize)
        if off:
            src, off = self.copy(src, Layout((numel,), (1,), off), dtype), 0
        per_word = 4 // dtype.itemsize
        nwords = (numel + per_word - 1) // per_word
        prelude = ""
        if dtype is f16:
            expr, prelude = "f16_bits(item(2u * j)) | (f16_bits(item(2u * j + 1u)) << 16u)", ex.F16_BITS
        elif dtype is bf16:
            expr = "(bitcast<u32>(item(2u * j)) >> 16u) | (bitcast<u32>(item(2u * j + 1u)) & 0xffff0000u)"
        else:
            expr = ("(bitcast<u32>(item(4u * j)) & 255u) | ((bitcast<u32>(item(4u * j + 1u)) & 255u) << 8u) | "
                    "((bitcast<u32>(item(4u * j + 2u)) & 255u) << 16u) | (bitcast<u32>(item(4u * j + 3u)) << 24u)")
        out = self._alloc(nwords * 4)
        self._run("pack", {"X": dtype}, [src, out], self._params([numel], [nwords]), (nwords + 255) // 256,
                  {"EXPR": expr}, label=f"pack {dtype.name}", prelude=prelude)
        return self._read(out, 0, numel * dtype.itemsize)

    def from_list(self, values, dtype):
        values = list(values)
        if dtype.is_float:
            base, code = f32, "f"
            if dtype is f16:  # round once, from the double, as numpy does: f32 then f16 rounds twice
                values = [_nearest_f16(v) for v in values]
        elif dtype.kind == "i":
            base, code = i32, "i"
            if dtype is i64:
                self._check_i32(values, "from_list")
        else:
            base, code = u32, "I"
            if dtype is bool_:
                values = [1 if v else 0 for v in values]
        st = self._upload(array(code, values).tobytes())
        if base is dtype or (dtype is i64):
            return st
        return self.cast(st, Layout((len(values),)), base, dtype)

    def to_list(self, st, layout, dtype):
        numel = layout.numel()
        if numel == 0:
            return []
        if dtype.is_quantized:
            raise UnsupportedError(f"wgpu to_list: dequantise the {dtype.name} tensor first")
        if dtype is f16 and self.has_f16:
            st, layout, dtype = self.cast(st, layout, f16, f32), Layout((numel,)), f32
        src, off = self._contiguous(st, layout, dtype)
        code = {"f32": "f", "i32": "i", "u32": "I"}[wgsl.compute_type(dtype)]
        vals = array(code)
        vals.frombytes(self._read(src, off * 4, numel * 4))
        if dtype is bool_:
            return [v != 0 for v in vals]
        return vals.tolist()

    def full(self, numel, value, dtype):
        return self._fill(numel, value, 0, dtype)

    def arange(self, start, step, numel, dtype):
        return self._fill(numel, start, step, dtype)

    def _fill(self, numel, start, step, dtype):
        out = self._new(numel, dtype)
        if numel == 0:
            return out
        if dtype.is_float:
            words, value = [f32_bits(start), f32_bits(step)], "PF(37u) + PF(38u) * f32(i)"
        else:
            start, step = int(start), int(step)
            last = start + step * (numel - 1)
            if dtype is i64:
                self._check_i32([start, last], "full/arange")
            words = [start, step]
            value = "PI(37u) + PI(38u) * i32(i)" if dtype.kind == "i" else "P(37u) + P(38u) * i"
        self._run("fill", {"Y": dtype}, [out], self._params([numel], words), (numel + 255) // 256,
                  {"VALUE": value}, label=f"fill {dtype.name}")
        return out


def _nearest_f16(value):
    """The f16 value nearest a Python float (ties to even; past the largest finite half, infinity),
    which f32 holds exactly, so the device's f32 -> f16 cast leaves it as it is."""
    try:
        return struct.unpack("<e", struct.pack("<e", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)
