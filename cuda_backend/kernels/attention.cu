// Fused attention: softmax(q k^T * scale + mask) v with an optional causal mask
// (key j is hidden from query i when j > i + tk - tq, so tk may exceed tq: a KV cache).
// One block per (batch*head, query row); keys are visited in chunks of BLOCK with an
// online softmax, so tk is unbounded; d and dv are at most ATT_MAX_D.
// q, k, v and mask are read through their own strides (ameta: offsets[4], then the
// (b, h, t, d) strides of q, k, v, mask), so a GQA-expanded k/v (stride 0 over heads),
// a narrowed KV cache and a broadcast mask need no copies.
#include "common.cuh"

#define ATT_MAX_D 256

template <class T>
__device__ void attention_impl(const typename T::S* q, const typename T::S* k, const typename T::S* v,
                               const typename T::S* mask, typename T::S* out, const int* ameta, int h, int tq,
                               int tk, int d, int dv, double scale, int has_mask, int causal) {
    typedef typename T::C A;
    __shared__ A qs[ATT_MAX_D];
    __shared__ A acc[ATT_MAX_D];
    __shared__ A p[BLOCK];
    __shared__ A red[BLOCK];
    long long bh = blockIdx.x / tq;
    int i = blockIdx.x % tq;
    long long bi = bh / h, hi = bh % h;
    const int* qst = ameta + 4;
    const int* kst = ameta + 8;
    const int* vst = ameta + 12;
    const int* mst = ameta + 16;
    const typename T::S* qrow = q + ameta[0] + bi * qst[0] + hi * qst[1] + (long long)i * qst[2];
    const typename T::S* kb = k + ameta[1] + bi * kst[0] + hi * kst[1];
    const typename T::S* vb = v + ameta[2] + bi * vst[0] + hi * vst[1];
    const typename T::S* mrow = mask + ameta[3] + bi * mst[0] + hi * mst[1] + (long long)i * mst[2];
    for (int c = threadIdx.x; c < d; c += blockDim.x) qs[c] = T::load(qrow[(long long)c * qst[3]]);
    for (int c = threadIdx.x; c < dv; c += blockDim.x) acc[c] = 0;
    __syncthreads();
    A m = -INFINITY, l = 0;
    int last_visible = causal ? i + tk - tq : tk - 1;
    for (int j0 = 0; j0 < tk; j0 += blockDim.x) {
        int j = j0 + threadIdx.x;
        A s = -INFINITY;
        if (j < tk && j <= last_visible) {
            const typename T::S* krow = kb + (long long)j * kst[2];
            A dot = 0;
            for (int c = 0; c < d; ++c) dot += qs[c] * T::load(krow[(long long)c * kst[3]]);
            s = dot * (A)scale;
            if (has_mask) s += T::load(mrow[(long long)j * mst[3]]);
        }
        A cm = block_max<A>(s, red);
        A new_m = cm > m ? cm : m;
        A pj = (s == -INFINITY) ? A(0) : exp(s - new_m);
        A cs = block_sum<A>(pj, red);
        A alpha = (m == -INFINITY) ? A(0) : exp(m - new_m);
        if (new_m == -INFINITY) alpha = 1;  // nothing visible yet: keep the zero accumulators
        l = l * alpha + cs;
        p[threadIdx.x] = pj;
        __syncthreads();
        int chunk = min((int)blockDim.x, tk - j0);
        for (int c = threadIdx.x; c < dv; c += blockDim.x) {
            A a = acc[c] * alpha;
            for (int jj = 0; jj < chunk; ++jj) a += p[jj] * T::load(vb[(long long)(j0 + jj) * vst[2] + (long long)c * vst[3]]);
            acc[c] = a;
        }
        m = new_m;
        __syncthreads();
    }
    typename T::S* orow = out + ((long long)bh * tq + i) * dv;  // contiguous (b, h, tq, dv)
    for (int c = threadIdx.x; c < dv; c += blockDim.x) orow[c] = T::store(acc[c] / l);  // l == 0: all hidden -> NaN, as numpy
}

#define ATTENTION(NAME)                                                                                            \
    extern "C" __global__ void attention_##NAME(const T_##NAME::S* q, const T_##NAME::S* k, const T_##NAME::S* v,   \
                                                const T_##NAME::S* mask, T_##NAME::S* out, const int* ameta, int h, \
                                                int tq, int tk, int d, int dv, double scale, int has_mask,         \
                                                int causal) {                                                      \
        attention_impl<T_##NAME>(q, k, v, mask, out, ameta, h, tq, tk, d, dv, scale, has_mask, causal);            \
    }
FOR_EACH_FLOAT(ATTENTION)
