// GGUF block formats dequantised inside the kernels: Q8_0, Q4_0, Q4_1, Q4_K, Q6_K.
// Block layouts follow ggml (block_q8_0, ...; see gguf/quants.py). deq_<fmt>(block, j)
// decodes element j of one block; the matvec and dequantise kernels are built on it.
#include "common.cuh"

__device__ __forceinline__ float half_at(const unsigned char* p) {
    return f16_to_f32((unsigned short)(p[0] | (p[1] << 8)));  // 2-byte loads, any alignment
}

// Q8_0: f16 d, int8 qs[32]
__device__ __forceinline__ float deq_q8_0(const unsigned char* b, int j) { return half_at(b) * (float)(signed char)b[2 + j]; }

// Q4_0: f16 d, qs[16]: element j < 16 is the low nibble of qs[j], j >= 16 the high nibble of qs[j-16]
__device__ __forceinline__ float deq_q4_0(const unsigned char* b, int j) {
    unsigned char q = b[2 + (j & 15)];
    int v = j < 16 ? (q & 15) : (q >> 4);
    return half_at(b) * (float)(v - 8);
}

// Q4_1: f16 d, f16 m, qs[16]
__device__ __forceinline__ float deq_q4_1(const unsigned char* b, int j) {
    unsigned char q = b[4 + (j & 15)];
    int v = j < 16 ? (q & 15) : (q >> 4);
    return half_at(b) * (float)v + half_at(b + 2);
}

// Q4_K: f16 d, f16 dmin, scales[12] (8 six-bit scales and mins), qs[128]; 256 elements
// in 4 groups of 64: the low nibbles of 32 bytes, then their high nibbles.
__device__ __forceinline__ float deq_q4_k(const unsigned char* b, int j) {
    const unsigned char* s = b + 4;
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
    unsigned char q = b[16 + g * 32 + l];
    int v = hi ? (q >> 4) : (q & 15);
    return half_at(b) * (float)sc * (float)v - half_at(b + 2) * (float)mn;
}

// Q6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16], f16 d; 256 elements
// in 2 halves of 128, each 4 quarters of 32 (ggml's dequantize_row_q6_K order).
__device__ __forceinline__ float deq_q6_k(const unsigned char* b, int j) {
    int n = j / 128, quarter = (j % 128) / 32, l = j % 32;
    const unsigned char* ql = b + n * 64;
    const unsigned char* qh = b + 128 + n * 32;
    const signed char* sc = (const signed char*)(b + 192 + n * 8);
    unsigned char low = ql[l + 32 * (quarter & 1)];
    int v = (quarter >= 2 ? (low >> 4) : (low & 15)) | (((qh[l] >> (2 * quarter)) & 3) << 4);
    return half_at(b + 208) * (float)sc[l / 16 + 2 * quarter] * (float)(v - 32);
}

// out (m, n) = x (m, k) @ w^T with w n rows of k elements in blocks.
// One warp per output (row, column); lanes stride over the row's blocks.
#define QMATVEC(FMT, QK, BYTES)                                                                                    \
    extern "C" __global__ void qmatvec_##FMT(const unsigned char* w, const float* x, float* out, int n, int k, int m) { \
        int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;                                               \
        int lane = threadIdx.x % 32;                                                                               \
        int mi = blockIdx.y;                                                                                       \
        if (row >= n || mi >= m) return;                                                                           \
        int nb = k / QK;                                                                                           \
        const unsigned char* wrow = w + (long long)row * nb * BYTES;                                               \
        const float* xrow = x + (long long)mi * k;                                                                 \
        float acc = 0.0f;                                                                                          \
        for (int blk = lane; blk < nb; blk += 32) {                                                                \
            const unsigned char* b = wrow + (long long)blk * BYTES;                                                \
            const float* xb = xrow + blk * QK;                                                                     \
            for (int j = 0; j < QK; ++j) acc += deq_##FMT(b, j) * xb[j];                                           \
        }                                                                                                          \
        for (int off = 16; off > 0; off >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, off);                     \
        if (lane == 0) out[(long long)mi * n + row] = acc;                                                         \
    }                                                                                                              \
    /* Dequantise rows of k elements: all rows, or the rows listed in ids (an embedding lookup). */                \
    extern "C" __global__ void dequant_##FMT(const unsigned char* w, const long long* ids, float* out,             \
                                             long long n, int k, int has_ids) {                                    \
        int nb = k / QK;                                                                                           \
        for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) { \
            long long r = i / k;                                                                                   \
            int e = i % k;                                                                                         \
            long long src_row = has_ids ? ids[r] : r;                                                                 \
            const unsigned char* b = w + (src_row * nb + e / QK) * BYTES;                                          \
            out[i] = deq_##FMT(b, e % QK);                                                                         \
        }                                                                                                          \
    }
QMATVEC(q8_0, 32, 34)
QMATVEC(q4_0, 32, 18)
QMATVEC(q4_1, 32, 20)
QMATVEC(q4_k, 256, 144)
QMATVEC(q6_k, 256, 210)
