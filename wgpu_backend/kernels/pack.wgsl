// Narrow contiguous GPU elements into little-endian words for download:
// two f16/bf16 halves or four bytes per output word. P(0) is the element
// count, P(37) the word count.
@group(0) @binding(1) var<storage, read> x: array<SX>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;

fn item(i: u32) -> SX {
    if (i < P(0u)) { return x[i]; }
    return SX(0);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) l: u32) {
    let j = flat_id(w, n, l, 256u);
    if (j >= P(37u)) { return; }
    dst[j] = {{EXPR}};
}
