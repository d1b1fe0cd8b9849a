    // (matvec_rows_cols.wgsl, in main of matvec_rows*.wgsl) the input row, then this
    // invocation's 4 output columns from col0.
    input_begin(w, n, l);
    let nn = P(1u);
    let k4 = P(2u) / 4u;
    let col0 = (w.x + w.y * n.x) * 256u + l * 4u;
    if (col0 >= nn) { return; }
    // Columns past the end repeat the last one and are not written.
    let cols = min(vec4<u32>(col0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(nn - 1u));
