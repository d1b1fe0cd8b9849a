        // (tile_multiply.wgsl) once the tiles are filled: BK steps of 16 multiply-adds.
        workgroupBarrier();
        for (var c = 0u; c < BK; c = c + 1u) {
            let av = ta[c * AW + lid.y];
            let bv = tb[c * BW + lid.x];
            c0 = c0 + av.x * bv;
            c1 = c1 + av.y * bv;
            c2 = c2 + av.z * bv;
            c3 = c3 + av.w * bv;
        }
        workgroupBarrier();
