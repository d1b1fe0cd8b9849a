    // (tile_store.wgsl) the register block into y from element `out`; out-of-range elements
    // are not written.
    let row0 = row_t + 4u * lid.y;
    let col0 = col_t + 4u * lid.x;
    if (row0 >= m || col0 >= nn) { return; }
    let rows = array<vec4<f32>, 4>(c0, c1, c2, c3);
    for (var r = 0u; r < min(4u, m - row0); r = r + 1u) {
        for (var c = 0u; c < min(4u, nn - col0); c = c + 1u) {
            y[out + (row0 + r) * nn + col0 + c] = sx(rows[r][c]);
        }
    }
