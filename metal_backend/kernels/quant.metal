// GGUF block formats dequantised inside the kernels (same decoders, names and arguments
// as tallow_cuda's quant.cu): Q8_0, Q4_0, Q4_1, Q4_K, Q6_K.

inline float half_at(device const uchar* p) { return f16_to_f32(ushort(p[0] | (p[1] << 8))); }

inline float deq_q8_0(device const uchar* b, int j) { return half_at(b) * float(char(b[2 + j])); }

inline float deq_q4_0(device const uchar* b, int j) {
    uchar q = b[2 + (j & 15)];
    int v = j < 16 ? (q & 15) : (q >> 4);
    return half_at(b) * float(v - 8);
}

inline float deq_q4_1(device const uchar* b, int j) {
    uchar q = b[4 + (j & 15)];
    int v = j < 16 ? (q & 15) : (q >> 4);
    return half_at(b) * float(v) + half_at(b + 2);
}

inline float deq_q4_k(device const uchar* b, int j) {
    device const uchar* s = b + 4;
    int g = j / 64, hi = (j % 64) / 32, l = j % 32;
    int is = 2 * g + hi;
    int sc, mn;
    if (is < 4) {
        sc = s[is] & 63;
        mn = s[is + 4] & 63;
    } else {
        sc = (s[is + 4] & 0xF) | ((s[is - 4] >> 6) << 4);
        mn = (s[is + 4] >> 4) | ((s[is] >> 6) << 4);
    }
    uchar q = b[16 + g * 32 + l];
    int v = hi ? (q >> 4) : (q & 15);
    return half_at(b) * float(sc) * float(v) - half_at(b + 2) * float(mn);
}

inline float deq_q6_k(device const uchar* b, int j) {
    int n = j / 128, quarter = (j % 128) / 32, l = j % 32;
    device const uchar* ql = b + n * 64;
    device const uchar* qh = b + 128 + n * 32;
    device const char* sc = (device const char*)(b + 192 + n * 8);
    uchar low = ql[l + 32 * (quarter & 1)];
    int v = (quarter >= 2 ? (low >> 4) : (low & 15)) | (((qh[l] >> (2 * quarter)) & 3) << 4);
    return half_at(b + 208) * float(sc[l / 16 + 2 * quarter]) * float(v - 32);
}

// One simdgroup (32 lanes) per output column; threadgroups of 4 simdgroups; grid.y over rows of x.
#define QMATVEC(FMT, QK, BYTES)                                                                                      \
    kernel void qmatvec_##FMT(device const uchar* w [[buffer(0)]], device const float* x [[buffer(1)]],               \
                              device float* out [[buffer(2)]], constant int& n [[buffer(3)]],                        \
                              constant int& k [[buffer(4)]], constant int& m [[buffer(5)]],                          \
                              uint2 group [[threadgroup_position_in_grid]],                                          \
                              uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]]) { \
        int row = int(group.x) * 4 + int(sg);                                                                        \
        int mi = int(group.y);                                                                                       \
        if (row >= n || mi >= m) return;                                                                             \
        int nb = k / QK;                                                                                             \
        device const uchar* wrow = w + long(row) * nb * BYTES;                                                       \
        device const float* xrow = x + long(mi) * k;                                                                 \
        float acc = 0.0f;                                                                                            \
        for (int blk = int(lane); blk < nb; blk += 32) {                                                             \
            device const uchar* b = wrow + long(blk) * BYTES;                                                        \
            device const float* xb = xrow + blk * QK;                                                                \
            for (int j = 0; j < QK; ++j) acc += deq_##FMT(b, j) * xb[j];                                             \
        }                                                                                                            \
        acc = simd_sum(acc);                                                                                         \
        if (lane == 0) out[long(mi) * n + row] = acc;                                                                \
    }                                                                                                                \
    kernel void dequant_##FMT(device const uchar* w [[buffer(0)]], device const long* ids [[buffer(1)]],             \
                              device float* out [[buffer(2)]], constant long& n [[buffer(3)]],                       \
                              constant int& k [[buffer(4)]], constant int& has_ids [[buffer(5)]],                    \
                              uint gid [[thread_position_in_grid]], uint gsize [[threads_per_grid]]) {               \
        int nb = k / QK;                                                                                             \
        for (long i = gid; i < n; i += gsize) {                                                                      \
            long r = i / k;                                                                                          \
            int e = i % k;                                                                                           \
            long src_row = has_ids ? ids[r] : r;                                                                     \
            out[i] = deq_##FMT(w + (src_row * nb + e / QK) * BYTES, e % QK);                                         \
        }                                                                                                            \
    }
QMATVEC(q8_0, 32, 34)
QMATVEC(q4_0, 32, 18)
QMATVEC(q4_1, 32, 20)
QMATVEC(q4_k, 256, 144)
QMATVEC(q6_k, 256, 210)
