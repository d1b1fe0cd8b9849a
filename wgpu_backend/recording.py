"""What a captured step (tallow.capture; the one recording class is
tallow/backends/step_recording.py) holds on the wgpu backend, and the WGSL its
position-dependent kernels read the step buffer with.

Entries are (pipeline, bindings, params bytes, workgroups), as driver.dispatch takes them. The
kernels that depend on the position (cache_attention's and rope_kv_write's cache slots and
rotary rows, attention's key count over a KV cache written in the same step) are built in a
variant that reads the 16-byte uniform step buffer, so the entries -- pipelines, bindings,
parameters, workgroup counts -- are the same at every position. A driver's replay re-encodes
them (native: into one command encoder; browser: one JS call that encodes and submits the list
it keeps; null: counts) with no tallow op front end, layout work or kernel choice.
"""

# The WGSL that declares the step buffer (vec4<u32>: position, keys, 0, 0; step_buffer.py) at a
# kernel's next free binding, and the two accessors the position-dependent kernels call. The
# eager variant returns the neutral values (position 0, keys as the parameters say).
STEP_CAPTURED = """
@group(0) @binding({binding}) var<uniform> step_words: vec4<u32>;
fn step_position() -> u32 {{ return step_words.x; }}
fn step_keys(eager: u32) -> u32 {{ return step_words.y; }}
"""
STEP_EAGER = """
fn step_position() -> u32 { return 0u; }
fn step_keys(eager: u32) -> u32 { return eager; }
"""


def entry_signature(entry):
    """What must match for two dispatches to be the same at two positions: kernel, parameters,
    workgroups and binding ranges (buffers made in the step differ, of course)."""
    pipe, binds, params, grid = entry
    return (pipe[-1], params, grid, tuple((off, size) for _, off, size in binds))
