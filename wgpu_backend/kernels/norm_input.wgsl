// The input row of the matvec kernels (matvec_rows*, qmatvec*) normalised on load: a residual
// add and the norm before a projection, in the projection's own dispatch (add_norm_linear).
// Every workgroup reads the one row s = x + r (x at binding 2 from element P(53), r from
// P(54) when P(48) = 1), takes its mean (layer norm: P(49) = 1) and variance, and keeps
// norm(s) * w + b in workgroup memory (weight w[P(55) + j * P(56)] when P(51) = 1, bias
// b[P(57) + j * P(58)] when P(52) = 1, eps = P(50)); workgroup 0 also writes s to hidden.
// Each value is rounded to the dtype as the add and the norm apart would store it.
// The row length is K = P(2) <= {{K}}, the workgroup array's size.
@group(0) @binding(2) var<storage, read> a: array<SX>;
@group(0) @binding({{NB0}}) var<storage, read> res: array<SX>;
@group(0) @binding({{NB1}}) var<storage, read> nw: array<SX>;
@group(0) @binding({{NB2}}) var<storage, read> nb: array<SX>;
@group(0) @binding({{NB3}}) var<storage, read_write> hidden: array<SX>;

var<workgroup> xn: array<f32, {{K}}>;

// row_sum: row_sum.wgsl

fn input_begin(w: vec3<u32>, n: vec3<u32>, l: u32) {
    let d = P(2u);
    let first = w.x == 0u && w.y == 0u && w.z == 0u;
    var sum = 0.0;
    for (var j = l; j < d; j = j + 64u) {
        var v = lx(a[P(53u) + j]);
        if (P(48u) == 1u) {
            v = lx(sx(v + lx(res[P(54u) + j])));
            if (first) { hidden[j] = sx(v); }
        }
        xn[j] = v;
        sum = sum + v;
    }
    var mean = 0.0;
    if (P(49u) == 1u) { mean = row_sum(l, sum) / f32(d); }
    var q = 0.0;
    for (var j = l; j < d; j = j + 64u) {
        let c = xn[j] - mean;  // this invocation's own writes above
        q = q + c * c;
    }
    let inv = 1.0 / sqrt(row_sum(l, q) / f32(d) + PF(50u));
    for (var j = l; j < d; j = j + 64u) {
        var v = (xn[j] - mean) * inv;
        if (P(51u) == 1u) { v = v * lx(nw[P(55u) + j * P(56u)]); }
        if (P(52u) == 1u) { v = v + lx(nb[P(57u) + j * P(58u)]); }
        xn[j] = lx(sx(v));
    }
    workgroupBarrier();  // every invocation reads the whole row
}

// One row only (decoding): `row` is 0.
fn xin4(row: u32, i: u32) -> vec4<f32> { return vec4<f32>(xn[i], xn[i + 1u], xn[i + 2u], xn[i + 3u]); }
