// The sum of v over a 64-invocation workgroup (one row per workgroup: the norms), returned to
// every invocation. l is the local invocation index.
var<workgroup> red: array<f32, 64>;

fn row_sum(l: u32, v: f32) -> f32 {
    red[l] = v;
    workgroupBarrier();
    for (var k = 32u; k > 0u; k = k >> 1u) {
        if (l < k) { red[l] = red[l] + red[l + k]; }
        workgroupBarrier();
    }
    let total = red[0];
    workgroupBarrier();
    return total;
}
