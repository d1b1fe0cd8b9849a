"""One captured step on the wgpu backend (tallow.capture): its launches in order, and the
buffers they bind, held so the pool never hands them to another tensor.

The values that change per step live in a 16-byte uniform "step buffer": the position of
the step's first new token and the key count after it (position + tokens). The kernels
that depend on them (cache_attention's and rope_kv_write's cache slots and rotary rows,
attention's key count over a KV cache written in the same step) are built in a variant
that reads them from
there, so the launches -- pipelines, bindings, parameters, workgroup counts -- are the
same at every position. replay() writes the step buffer and hands the list to the driver,
which re-encodes it (native: one command encoder; browser: one JS call that encodes and
submits the list it keeps; null: counts) with no tallow op front
end, layout work or kernel choice.
"""
from tallow.backends.step_buffer import STEP_BYTES, step_words  # vec4<u32>: position, keys, 0, 0

# The WGSL that declares the step buffer at a kernel's next free binding, and the two
# accessors the position-dependent kernels call. The eager variant returns the neutral
# values (position 0, keys as the parameters say).
STEP_CAPTURED = """
@group(0) @binding({binding}) var<uniform> step_words: vec4<u32>;
fn step_position() -> u32 {{ return step_words.x; }}
fn step_keys(eager: u32) -> u32 {{ return step_words.y; }}
"""
STEP_EAGER = """
fn step_position() -> u32 { return 0u; }
fn step_keys(eager: u32) -> u32 { return eager; }
"""


class Recording:
    def __init__(self, driver, position, tokens):
        self.position, self.tokens = position, tokens
        self.step_buf = driver.create_uniform(STEP_BYTES)
        driver.write_buffer(self.step_buf, 0, step_words(position, tokens))
        self.launches = []    # (pipeline, bindings, params bytes, workgroups), as driver.dispatch takes them
        self.keep = []        # the storages the launches bind
        self.cache_bufs = set()  # ids of the KV-cache buffers rope_kv_write wrote in this step
        self.handle = None    # the driver's prepared form, after finish()

    @property
    def step_binding(self):
        return (self.step_buf, 0, STEP_BYTES)

    def add(self, pipeline, binds, params, grid, storages):
        self.launches.append((pipeline, binds, params, grid))
        self.keep.extend(storages)

    def finish(self, driver):
        self.handle = driver.record(self.launches)
        return self

    def signature(self):
        """What must match for two recordings to be the same step at two positions: kernels,
        parameters, workgroups and binding ranges (buffers made in the step differ, of course)."""
        return [(pipe[-1], params, grid, tuple((off, size) for _, off, size in binds))
                for pipe, binds, params, grid in self.launches]

    def replay(self, driver, position, tokens):
        driver.write_buffer(self.step_buf, 0, step_words(position, tokens))
        driver.replay(self.handle)
