// Fused attention (same algorithm, names and arguments as tallow_cuda's attention.cu):
// one threadgroup per (batch*head, query row), keys in chunks of BLOCK with an online
// softmax; q, k, v, mask read through their strides (ameta).

#define ATT_MAX_D 256

template <class T>
inline void attention_impl(device const typename T::S* q, device const typename T::S* k, device const typename T::S* v,
                           device const typename T::S* mask, device typename T::S* out, constant int* ameta, int h,
                           int tq, int tk, int d, int dv, float scale, int has_mask, int causal,
                           threadgroup float* qs, threadgroup float* acc, threadgroup float* p, threadgroup float* red,
                           uint group, uint tid) {
    long bh = group / tq;
    int i = group % tq;
    long bi = bh / h, hi = bh % h;
    constant int* qst = ameta + 4;
    constant int* kst = ameta + 8;
    constant int* vst = ameta + 12;
    constant int* mst = ameta + 16;
    device const typename T::S* qrow = q + ameta[0] + bi * qst[0] + hi * qst[1] + long(i) * qst[2];
    device const typename T::S* kb = k + ameta[1] + bi * kst[0] + hi * kst[1];
    device const typename T::S* vb = v + ameta[2] + bi * vst[0] + hi * vst[1];
    device const typename T::S* mrow = mask + ameta[3] + bi * mst[0] + hi * mst[1] + long(i) * mst[2];
    for (int c = tid; c < d; c += BLOCK) qs[c] = T::load(qrow[long(c) * qst[3]]);
    for (int c = tid; c < dv; c += BLOCK) acc[c] = 0.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float m = -INFINITY, l = 0.0f;
    int last_visible = causal ? i + tk - tq : tk - 1;
    for (int j0 = 0; j0 < tk; j0 += BLOCK) {
        int j = j0 + int(tid);
        float s = -INFINITY;
        if (j < tk && j <= last_visible) {
            device const typename T::S* krow = kb + long(j) * kst[2];
            float dot = 0.0f;
            for (int c = 0; c < d; ++c) dot += qs[c] * T::load(krow[long(c) * kst[3]]);
            s = dot * scale;
            if (has_mask) s += T::load(mrow[long(j) * mst[3]]);
        }
        float cm = group_max<float>(s, red, tid);
        float new_m = cm > m ? cm : m;
        float pj = (s == -INFINITY) ? 0.0f : exp(s - new_m);
        float cs = group_sum<float>(pj, red, tid);
        float alpha = (m == -INFINITY) ? 0.0f : exp(m - new_m);
        if (new_m == -INFINITY) alpha = 1.0f;
        l = l * alpha + cs;
        p[tid] = pj;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        int chunk = min(BLOCK, tk - j0);
        for (int c = tid; c < dv; c += BLOCK) {
            float a = acc[c] * alpha;
            for (int jj = 0; jj < chunk; ++jj) a += p[jj] * T::load(vb[long(j0 + jj) * vst[2] + long(c) * vst[3]]);
            acc[c] = a;
        }
        m = new_m;
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    device typename T::S* orow = out + (bh * tq + i) * long(dv);
    for (int c = tid; c < dv; c += BLOCK) orow[c] = T::store(acc[c] / l);
}

#define ATTENTION(NAME)                                                                                              \
    kernel void attention_##NAME(device const T_##NAME::S* q [[buffer(0)]], device const T_##NAME::S* k [[buffer(1)]], \
                                 device const T_##NAME::S* v [[buffer(2)]], device const T_##NAME::S* mask [[buffer(3)]], \
                                 device T_##NAME::S* out [[buffer(4)]], constant int* ameta [[buffer(5)]],           \
                                 constant int& h [[buffer(6)]], constant int& tq [[buffer(7)]],                      \
                                 constant int& tk [[buffer(8)]], constant int& d [[buffer(9)]],                      \
                                 constant int& dv [[buffer(10)]], constant float& scale [[buffer(11)]],              \
                                 constant int& has_mask [[buffer(12)]], constant int& causal [[buffer(13)]],         \
                                 uint group [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]]) { \
        TG_SHARED float qs[ATT_MAX_D];                                                                             \
        TG_SHARED float acc[ATT_MAX_D];                                                                            \
        TG_SHARED float p[BLOCK];                                                                                  \
        TG_SHARED float red[BLOCK];                                                                                \
        attention_impl<T_##NAME>(q, k, v, mask, out, ameta, h, tq, tk, d, dv, scale, has_mask, causal, qs, acc, p,   \
                                 red, group, tid);                                                                   \
    }
FOR_EACH_FLOAT(ATTENTION)
