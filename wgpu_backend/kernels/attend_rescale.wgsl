        // (attend_rescale.wgsl, per chunk of the attention kernels) the online softmax: with the
        // chunk's scores in ps and this lane's max cm, the running max m, sum total and output acc
        // rescale to the new max, and ps becomes the chunk's weights.
        let new_m = max(m, reduce_max(l, cm));
        // Until some key scores above -inf there is nothing to rescale or weigh.
        let alpha = select(exp(m - new_m), 1.0, new_m == -f32_inf());
        var part = 0.0;
        for (var jj = l; jj < count; jj = jj + 64u) {
            let pj = select(exp(ps[jj] - new_m), 0.0, new_m == -f32_inf());
            ps[jj] = pj;
            part = part + pj;
        }
        total = total * alpha + reduce_sum(l, part);  // its barriers publish ps
        acc = acc * alpha;
