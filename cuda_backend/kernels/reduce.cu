// Row kernels over contiguous (rows, L) data, one block of BLOCK threads per row:
// reductions (the host permutes the reduced dims last and copies), arg-reductions,
// cumsum, softmax, layer norm and RMS norm.
#include "common.cuh"

// Float reductions accumulate in the compute type (f32 for f16/bf16) and store in the dtype.
// Integer reductions accumulate in long long and store i64 (the host casts max/min back).
enum { R_SUM, R_PROD, R_MAX, R_MIN };

template <class A>
__device__ __forceinline__ A combine(int op, A a, A b) {
    switch (op) {
    case R_SUM: return a + b;
    case R_PROD: return a * b;
    case R_MAX: return (a != a || a > b) ? a : b;
    case R_MIN: return (a != a || a < b) ? a : b;
    }
    return a;
}

template <class T, class A>
__device__ A reduce_row(const typename T::S* row, long long L, int op, A init, A* shm) {
    A acc = init;
    for (long long j = threadIdx.x; j < L; j += blockDim.x) acc = combine<A>(op, acc, (A)T::load(row[j]));
    shm[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) shm[threadIdx.x] = combine<A>(op, shm[threadIdx.x], shm[threadIdx.x + s]);
        __syncthreads();
    }
    return shm[0];
}

template <class T>
__device__ void reduce_float_impl(const typename T::S* x, typename T::S* out, long long L, int op) {
    typedef typename T::C A;
    __shared__ A shm[BLOCK];
    const typename T::S* row = x + (long long)blockIdx.x * L;
    // The identity of max/min is the first element: the host never reduces empty rows with them.
    A init = op == R_SUM ? A(0) : (op == R_PROD ? A(1) : (A)T::load(row[0]));
    A r = reduce_row<T, A>(row, L, op, init, shm);
    if (threadIdx.x == 0) out[blockIdx.x] = T::store(r);
}

template <class T>
__device__ void reduce_int_impl(const typename T::S* x, long long* out, long long L, int op) {
    __shared__ long long shm[BLOCK];
    const typename T::S* row = x + (long long)blockIdx.x * L;
    long long init = op == R_SUM ? 0 : (op == R_PROD ? 1 : (long long)T::load(row[0]));
    long long r = reduce_row<T, long long>(row, L, op, init, shm);
    if (threadIdx.x == 0) out[blockIdx.x] = r;
}

// argmax/argmin: the first index of the extreme value; a NaN wins (numpy's rule).
template <class T>
__device__ void argreduce_impl(const typename T::S* x, long long* out, long long L, int is_max) {
    typedef typename T::C A;
    __shared__ A sv[BLOCK];
    __shared__ long long si[BLOCK];
    const typename T::S* row = x + (long long)blockIdx.x * L;
    A best = (A)0;
    long long bi = -1;
    for (long long j = threadIdx.x; j < L; j += blockDim.x) {
        A v = T::load(row[j]);
        bool better = bi < 0 || (v != v && best == best) || (best == best && (is_max ? v > best : v < best));
        if (better) { best = v; bi = j; }
    }
    sv[threadIdx.x] = best;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            A a = sv[threadIdx.x], b = sv[threadIdx.x + s];
            long long ia = si[threadIdx.x], ib = si[threadIdx.x + s];
            bool take_b;
            if (ib < 0) take_b = false;
            else if (ia < 0) take_b = true;
            else if (a != a) take_b = (b != b) && ib < ia;
            else if (b != b) take_b = true;
            else if (a == b) take_b = ib < ia;
            else take_b = is_max ? b > a : b < a;
            if (take_b) { sv[threadIdx.x] = b; si[threadIdx.x] = ib; }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = si[0];
}

// cumsum along the row: one thread per row (rows are many, rows are short).
template <class T, class O>
__device__ void cumsum_impl(const typename T::S* x, typename O::S* out, long long rows, long long L) {
    long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    typename O::C acc = 0;
    for (long long j = 0; j < L; ++j) {
        acc += (typename O::C)T::load(x[r * L + j]);
        out[r * L + j] = O::store(acc);
    }
}

template <class T>
__device__ void softmax_impl(const typename T::S* x, typename T::S* out, long long L, int log_out) {
    typedef typename T::C A;
    __shared__ A shm[BLOCK];
    const typename T::S* row = x + (long long)blockIdx.x * L;
    typename T::S* orow = out + (long long)blockIdx.x * L;
    A m = -INFINITY;
    for (long long j = threadIdx.x; j < L; j += blockDim.x) { A v = T::load(row[j]); m = (v > m || v != v) ? v : m; }
    m = block_max<A>(m, shm);
    A s = 0;
    for (long long j = threadIdx.x; j < L; j += blockDim.x) s += exp(T::load(row[j]) - m);
    s = block_sum<A>(s, shm);
    A ls = log(s);
    for (long long j = threadIdx.x; j < L; j += blockDim.x) {
        A z = T::load(row[j]) - m;
        orow[j] = T::store(log_out ? z - ls : exp(z) / s);
    }
}

// Layer norm: two passes (mean, then centred variance) for accuracy, as the numpy backend.
template <class T>
__device__ void layer_norm_impl(const typename T::S* x, const typename T::S* w, const typename T::S* b,
                                typename T::S* out, long long L, double eps, int has_w, int has_b) {
    typedef typename T::C A;
    __shared__ A shm[BLOCK];
    const typename T::S* row = x + (long long)blockIdx.x * L;
    typename T::S* orow = out + (long long)blockIdx.x * L;
    A s = 0;
    for (long long j = threadIdx.x; j < L; j += blockDim.x) s += T::load(row[j]);
    A mean = block_sum<A>(s, shm) / (A)L;
    A v = 0;
    for (long long j = threadIdx.x; j < L; j += blockDim.x) { A c = T::load(row[j]) - mean; v += c * c; }
    A inv = A(1) / sqrt(block_sum<A>(v, shm) / (A)L + (A)eps);
    for (long long j = threadIdx.x; j < L; j += blockDim.x) {
        A y = (T::load(row[j]) - mean) * inv;
        if (has_w) y *= T::load(w[j]);
        if (has_b) y += T::load(b[j]);
        orow[j] = T::store(y);
    }
}

template <class T>
__device__ void rms_norm_impl(const typename T::S* x, const typename T::S* w, typename T::S* out, long long L,
                              double eps, int has_w) {
    typedef typename T::C A;
    __shared__ A shm[BLOCK];
    const typename T::S* row = x + (long long)blockIdx.x * L;
    typename T::S* orow = out + (long long)blockIdx.x * L;
    A s = 0;
    for (long long j = threadIdx.x; j < L; j += blockDim.x) { A v = T::load(row[j]); s += v * v; }
    A inv = A(1) / sqrt(block_sum<A>(s, shm) / (A)L + (A)eps);
    for (long long j = threadIdx.x; j < L; j += blockDim.x) {
        A y = T::load(row[j]) * inv;
        if (has_w) y *= T::load(w[j]);
        orow[j] = T::store(y);
    }
}

#define ROW_FLOAT(NAME)                                                                                            \
    extern "C" __global__ void reduce_##NAME(const T_##NAME::S* x, T_##NAME::S* out, long long L, int op) {       \
        reduce_float_impl<T_##NAME>(x, out, L, op);                                                                \
    }                                                                                                              \
    extern "C" __global__ void cumsum_##NAME(const T_##NAME::S* x, T_##NAME::S* out, long long rows, long long L) { \
        cumsum_impl<T_##NAME, T_##NAME>(x, out, rows, L);                                                          \
    }                                                                                                              \
    extern "C" __global__ void softmax_##NAME(const T_##NAME::S* x, T_##NAME::S* out, long long L, int log_out) {  \
        softmax_impl<T_##NAME>(x, out, L, log_out);                                                                \
    }                                                                                                              \
    extern "C" __global__ void layer_norm_##NAME(const T_##NAME::S* x, const T_##NAME::S* w, const T_##NAME::S* b, \
                                                 T_##NAME::S* out, long long L, double eps, int has_w, int has_b) { \
        layer_norm_impl<T_##NAME>(x, w, b, out, L, eps, has_w, has_b);                                             \
    }                                                                                                              \
    extern "C" __global__ void rms_norm_##NAME(const T_##NAME::S* x, const T_##NAME::S* w, T_##NAME::S* out,       \
                                               long long L, double eps, int has_w) {                               \
        rms_norm_impl<T_##NAME>(x, w, out, L, eps, has_w);                                                         \
    }
FOR_EACH_FLOAT(ROW_FLOAT)

#define ROW_INT(NAME)                                                                                              \
    extern "C" __global__ void reduce_##NAME(const T_##NAME::S* x, long long* out, long long L, int op) {         \
        reduce_int_impl<T_##NAME>(x, out, L, op);                                                                  \
    }                                                                                                              \
    extern "C" __global__ void cumsum_##NAME(const T_##NAME::S* x, long long* out, long long rows, long long L) { \
        cumsum_impl<T_##NAME, T_i64>(x, out, rows, L);                                                             \
    }
ROW_INT(i64) ROW_INT(i32) ROW_INT(i8) ROW_INT(u32) ROW_INT(u8) ROW_INT(bool)

#define ARG(NAME)                                                                                                  \
    extern "C" __global__ void argreduce_##NAME(const T_##NAME::S* x, long long* out, long long L, int is_max) {  \
        argreduce_impl<T_##NAME>(x, out, L, is_max);                                                               \
    }
FOR_EACH_DTYPE(ARG)
