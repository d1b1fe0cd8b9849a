"""A kernel driver that does nothing (the kernel backend's twin of wgpu_backend/driver_null.py):
every call returns at once, so what a decode step costs over it is tallow's own Python -- the
ceiling on tokens/s no GPU can lift -- and `launches` counts what a GPU would run.

Buffers hold no bytes: downloads are zeros (greedy decoding picks token 0), uploads keep only
their size. A replay counts the recorded launches and costs one call, as a CUDA graph launch
does (bench/kernel_host.py).
"""
from .backend import DeviceStorage


class NullKernelDriver:
    can_replay = True

    def __init__(self, name="metal", has_f64=False, atomic64=False):
        self.name, self.has_f64, self.atomic64 = name, has_f64, atomic64
        self.launches = 0

    def alloc(self, dtype, numel):
        return DeviceStorage(None, dtype, numel)

    def upload(self, data, dtype):
        nbytes = memoryview(data).nbytes
        return DeviceStorage(None, dtype, nbytes if dtype.is_quantized else nbytes // dtype.itemsize)

    def download(self, st, byte_offset, nbytes):
        return bytes(nbytes)

    def write(self, st, byte_offset, data):
        pass

    def launch(self, module, kernel, grid, block, args):
        self.launches += 1

    def load_source(self, name, source):
        return name

    def record(self, entries):
        return len(entries)

    def replay(self, count):
        self.launches += count
