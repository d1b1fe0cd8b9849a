// Indexing and layout kernels: index_select, gather, scatter_add (atomicAdd), rotary
// embedding (both forms) and im2col for convolutions (the matmul runs on cuBLAS).
#include "common.cuh"

#define GRID_LOOP(i, n) for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)

// Indices are i64 (the host casts them), may be negative (counted from the end, as numpy).
__device__ __forceinline__ long long wrap_index(long long id, long long size) { return id < 0 ? id + size : id; }

// index_select: meta operand 0 is the source viewed with the output's shape and a zero
// stride along `dim`; the picked index of output element i is ids[(i / inner) % J].
// gather: the same source view with the index's shape; the index is ids[i].
#define INDEX_BY_WIDTH(W, TYPE)                                                                                    \
    extern "C" __global__ void index_select_w##W(const TYPE* src, const long long* ids, TYPE* out, const int* meta, \
                                                 long long n, long long inner, long long J, long long dim_stride,  \
                                                 long long dim_size) {                                             \
        GRID_LOOP(i, n) {                                                                                          \
            long long id = wrap_index(ids[(i / inner) % J], dim_size);                                             \
            out[i] = src[strided_offset(meta, 0, i) + id * dim_stride];                                            \
        }                                                                                                          \
    }                                                                                                              \
    extern "C" __global__ void gather_w##W(const TYPE* src, const long long* ids, TYPE* out, const int* meta,      \
                                           long long n, long long dim_stride, long long dim_size) {               \
        GRID_LOOP(i, n) {                                                                                          \
            out[i] = src[strided_offset(meta, 0, i) + wrap_index(ids[i], dim_size) * dim_stride];                  \
        }                                                                                                          \
    }
INDEX_BY_WIDTH(1, unsigned char)
INDEX_BY_WIDTH(2, unsigned short)
INDEX_BY_WIDTH(4, unsigned int)
INDEX_BY_WIDTH(8, unsigned long long)

// scatter_add into a contiguous copy of dst (in a dtype CUDA can add atomically):
// meta operand 0 locates src, operand 1 is dst's contiguous strides with dim's zeroed.
__device__ __forceinline__ void atomic_add(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(double* p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(int* p, int v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(unsigned int* p, unsigned int v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(long long* p, long long v) {
    atomicAdd((unsigned long long*)p, (unsigned long long)v);  // two's complement: same bits
}

#define SCATTER(NAME, TYPE)                                                                                        \
    extern "C" __global__ void scatter_add_##NAME(TYPE* out, const long long* ids, const TYPE* src, const int* meta, \
                                                  long long n, long long dim_stride, long long dim_size) {        \
        GRID_LOOP(i, n) {                                                                                          \
            long long o = strided_offset(meta, 1, i) + wrap_index(ids[i], dim_size) * dim_stride;                  \
            atomic_add(out + o, src[strided_offset(meta, 0, i)]);                                                  \
        }                                                                                                          \
    }
SCATTER(f32, float)
SCATTER(f64, double)
SCATTER(i32, int)
SCATTER(u32, unsigned int)
SCATTER(i64, long long)

// Rotary embedding. x is (rows = b*h, t, d) read through meta operand 0 (any strides);
// cos/sin are contiguous (t, d/2). One thread per rotated pair.
template <class T>
__device__ void rope_impl(const typename T::S* x, const typename T::S* cs, const typename T::S* sn,
                          typename T::S* out, const int* meta, long long rows, long long t, long long d, int interleaved) {
    long long half = d / 2;
    GRID_LOOP(i, rows * t * half) {
        long long j = i % half;
        long long p = (i / half) % t;
        long long base = (i / half) * d;  // (row, p) in the contiguous output
        long long e1 = interleaved ? 2 * j : j;
        long long e2 = interleaved ? 2 * j + 1 : j + half;
        typename T::C x1 = T::load(x[strided_offset(meta, 0, base + e1)]);
        typename T::C x2 = T::load(x[strided_offset(meta, 0, base + e2)]);
        typename T::C c = T::load(cs[p * half + j]), s = T::load(sn[p * half + j]);
        out[base + e1] = T::store(x1 * c - x2 * s);
        out[base + e2] = T::store(x1 * s + x2 * c);
    }
}

// im2col: x contiguous (b, cin, h, w) -> cols (b, cin, kh, kw, oh, ow); zero padding.
template <class T>
__device__ void im2col_impl(const typename T::S* x, typename T::S* cols, long long n, int cin, int h, int w, int kh,
                            int kw, int oh, int ow, int sy, int sx, int py, int px, int dy, int dx) {
    GRID_LOOP(i, n) {
        long long r = i;
        int ox = r % ow; r /= ow;
        int oy = r % oh; r /= oh;
        int kx = r % kw; r /= kw;
        int ky = r % kh; r /= kh;
        int c = r % cin;
        long long b = r / cin;
        int iy = oy * sy - py + ky * dy;
        int ix = ox * sx - px + kx * dx;
        bool inside = iy >= 0 && iy < h && ix >= 0 && ix < w;
        cols[i] = inside ? x[((b * cin + c) * h + iy) * w + ix] : T::store((typename T::C)0);
    }
}

#define ROPE_IM2COL(NAME)                                                                                          \
    extern "C" __global__ void rope_##NAME(const T_##NAME::S* x, const T_##NAME::S* cs, const T_##NAME::S* sn,      \
                                           T_##NAME::S* out, const int* meta, long long rows, long long t,         \
                                           long long d, int interleaved) {                                         \
        rope_impl<T_##NAME>(x, cs, sn, out, meta, rows, t, d, interleaved);                                        \
    }                                                                                                              \
    extern "C" __global__ void im2col_##NAME(const T_##NAME::S* x, T_##NAME::S* cols, long long n, int cin, int h, \
                                             int w, int kh, int kw, int oh, int ow, int sy, int sx, int py, int px, \
                                             int dy, int dx) {                                                     \
        im2col_impl<T_##NAME>(x, cols, n, cin, h, w, kh, kw, oh, ow, sy, sx, py, px, dy, dx);                      \
    }
FOR_EACH_FLOAT(ROPE_IM2COL)
