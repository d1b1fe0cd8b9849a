// Widen uploaded little-endian words into GPU elements: f16/bf16 halves -> f32,
// i8/u8/bool bytes -> 32-bit. P(0) is the element count.
@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<SY>;

fn half_of(i: u32) -> u32 { return (src[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu; }
fn byte_of(i: u32) -> u32 { return (src[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu; }

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) l: u32) {
    let i = flat_id(w, n, l, 256u);
    if (i >= P(0u)) { return; }
    y[i] = {{EXPR}};
}
