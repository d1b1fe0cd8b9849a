"""A driver whose every method does nothing: the GPU costs zero.

Run a model on WgpuBackend(NullDriver()) and what is left is tallow's host
work: shape checks, kernel choice, parameter packing, bind-group lists. That
is the ceiling no GPU can lift, so bench/gpu_host.py measures host time per
token with it, and tests count the dispatches one decoding step issues.
Results are zeros (download returns zero bytes), so logits are meaningless.
"""


class NullDriver:
    name = "null"
    has_f16 = True
    cpu_emulated = False
    info = {"adapter": "null (does nothing)", "vendor": "", "backend_type": "null", "adapter_type": "null"}
    limits = {
        "max_storage_binding": 1 << 30, "max_buffer": 1 << 31, "max_workgroups_per_dim": 65535,
        "max_invocations": 256, "max_workgroup_storage": 16384, "uniform_align": 256,
    }

    can_replay = True  # record/replay count the dispatches a captured step holds
    reads_js_buffers = False

    def __init__(self):
        self.dispatches = 0
        self.by_kernel = {}  # kernel label -> dispatches, for "where do they go" questions
        self.submits = 0
        self.replays = 0  # captured steps replayed (tallow.capture)

    def reset_counts(self):
        self.dispatches = 0
        self.by_kernel = {}
        self.replays = 0

    def alloc(self, dtype, numel):
        return object()

    def write(self, buf, byte_offset, data):
        pass

    def download(self, buf, byte_offset, nbytes):
        return bytes(nbytes)

    def copy(self, src, src_offset, dst, dst_offset, nbytes):
        pass

    def pipeline(self, wgsl, label):
        return (None, None, label)

    def dispatch(self, pipeline, bindings, params, workgroups):
        self.dispatches += 1
        label = pipeline[2]
        self.by_kernel[label] = self.by_kernel.get(label, 0) + 1

    def alloc_uniform(self, nbytes):
        return object()

    def record(self, launches):
        """A captured step: only its dispatch counts, which replay adds up."""
        by_kernel = {}
        for pipeline, _, _, _ in launches:
            by_kernel[pipeline[2]] = by_kernel.get(pipeline[2], 0) + 1
        return len(launches), by_kernel

    def replay(self, handle):
        n, by_kernel = handle
        self.dispatches += n
        for label, count in by_kernel.items():
            self.by_kernel[label] = self.by_kernel.get(label, 0) + count
        self.replays += 1

    def flush(self):
        pass
