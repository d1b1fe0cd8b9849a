// GGUF blocks stay on the GPU as raw little-endian u32 words; these read
// bytes, words and f16 scales at any byte offset. Blocks of Q4_0 (18 bytes),
// Q8_0 (34) and Q6_K (210) are not word-aligned.
@group(0) @binding(1) var<storage, read> wq: array<u32>;

fn q_byte(o: u32) -> u32 { return (wq[o >> 2u] >> ((o & 3u) * 8u)) & 0xffu; }

fn q_word(o: u32) -> u32 {
    let sh = (o & 3u) * 8u;
    if (sh == 0u) { return wq[o >> 2u]; }
    return (wq[o >> 2u] >> sh) | (wq[(o >> 2u) + 1u] << (32u - sh));
}

// f16 fields sit at even offsets in every block format.
fn q_half(o: u32) -> f32 { return unpack2x16float(wq[o >> 2u] >> ((o & 2u) * 8u)).x; }

fn sext8(b: u32) -> f32 { return f32(bitcast<i32>(b << 24u) >> 24u); }

// The 32 elements of x (and their sum) that a format's q_dot multiplies with
// one block, filled by qmatvec.wgsl. A private array: WGSL indexes only
// function-local or private arrays with a run-time index.
var<private> xb: array<vec4<f32>, 8>;
var<private> xsum: f32;
