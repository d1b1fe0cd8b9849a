// Element-wise kernels over arbitrary strides: unary, binary, compare, where, cast,
// strided copy/assign and fill. Outputs are contiguous; inputs are located through
// the packed meta (see common.cuh: strided_offset). One thread per output element.
#include "common.cuh"

#define GRID_LOOP(i, n) for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)

template <class T>
__device__ void unary_impl(const typename T::S* x, typename T::S* out, const int* meta, long long n, int op, double a0, double a1) {
    GRID_LOOP(i, n) {
        out[i] = T::store(apply_unary(op, T::load(x[strided_offset(meta, 0, i)]), a0, a1));
    }
}

template <class T>
__device__ void binary_impl(const typename T::S* a, const typename T::S* b, typename T::S* out, const int* meta, long long n, int op) {
    GRID_LOOP(i, n) {
        out[i] = T::store(apply_binary(op, T::load(a[strided_offset(meta, 0, i)]), T::load(b[strided_offset(meta, 1, i)])));
    }
}

template <class T>
__device__ void compare_impl(const typename T::S* a, const typename T::S* b, unsigned char* out, const int* meta, long long n, int op) {
    GRID_LOOP(i, n) {
        out[i] = apply_compare(op, T::load(a[strided_offset(meta, 0, i)]), T::load(b[strided_offset(meta, 1, i)]));
    }
}

template <class T>
__device__ void where_impl(const unsigned char* c, const typename T::S* a, const typename T::S* b, typename T::S* out, const int* meta, long long n) {
    GRID_LOOP(i, n) {
        out[i] = c[strided_offset(meta, 0, i)] ? a[strided_offset(meta, 1, i)] : b[strided_offset(meta, 2, i)];
    }
}

#define ELEMENTWISE(NAME)                                                                                          \
    extern "C" __global__ void unary_##NAME(const T_##NAME::S* x, T_##NAME::S* out, const int* meta, long long n,   \
                                            int op, double a0, double a1) {                                       \
        unary_impl<T_##NAME>(x, out, meta, n, op, a0, a1);                                                         \
    }                                                                                                              \
    extern "C" __global__ void binary_##NAME(const T_##NAME::S* a, const T_##NAME::S* b, T_##NAME::S* out,          \
                                             const int* meta, long long n, int op) {                               \
        binary_impl<T_##NAME>(a, b, out, meta, n, op);                                                             \
    }                                                                                                              \
    extern "C" __global__ void compare_##NAME(const T_##NAME::S* a, const T_##NAME::S* b, unsigned char* out,       \
                                              const int* meta, long long n, int op) {                              \
        compare_impl<T_##NAME>(a, b, out, meta, n, op);                                                            \
    }                                                                                                              \
    extern "C" __global__ void where_##NAME(const unsigned char* c, const T_##NAME::S* a, const T_##NAME::S* b,     \
                                            T_##NAME::S* out, const int* meta, long long n) {                      \
        where_impl<T_##NAME>(c, a, b, out, meta, n);                                                               \
    }
FOR_EACH_DTYPE(ELEMENTWISE)

// ---- cast: float kinds go through double, integer kinds through long long ------------
template <class D, class S>
__device__ __forceinline__ typename D::S convert(typename S::S s) {
    if (S::is_float) {
        double v = (double)S::load(s);
        if (D::is_float) return D::store((typename D::C)v);
        return D::store((typename D::C)(long long)v);  // float -> int truncates toward zero; -> bool is v != 0 below
    }
    long long v = (long long)S::load(s);
    return D::store((typename D::C)v);
}

template <class D, class S>
__device__ void cast_impl(const typename S::S* x, typename D::S* out, const int* meta, long long n) {
    GRID_LOOP(i, n) {
        typename S::S s = x[strided_offset(meta, 0, i)];
        out[i] = convert<D, S>(s);
    }
}

// To bool: any non-zero (NaN included) is true, before any truncation.
template <class S>
__device__ void cast_to_bool_impl(const typename S::S* x, unsigned char* out, const int* meta, long long n) {
    GRID_LOOP(i, n) {
        out[i] = S::load(x[strided_offset(meta, 0, i)]) != (typename S::C)0;
    }
}

#define CAST_PAIR(SRC, DST)                                                                                        \
    extern "C" __global__ void cast_##SRC##_##DST(const T_##SRC::S* x, T_##DST::S* out, const int* meta, long long n) { \
        cast_impl<T_##DST, T_##SRC>(x, out, meta, n);                                                              \
    }
#define CAST_FROM(SRC)                                                                                             \
    CAST_PAIR(SRC, f32) CAST_PAIR(SRC, f16) CAST_PAIR(SRC, bf16) CAST_PAIR(SRC, f64) CAST_PAIR(SRC, i64)           \
    CAST_PAIR(SRC, i32) CAST_PAIR(SRC, i8) CAST_PAIR(SRC, u32) CAST_PAIR(SRC, u8)                                 \
    extern "C" __global__ void cast_##SRC##_bool(const T_##SRC::S* x, unsigned char* out, const int* meta, long long n) { \
        cast_to_bool_impl<T_##SRC>(x, out, meta, n);                                                               \
    }
FOR_EACH_DTYPE(CAST_FROM)

// ---- strided copy / assign / fill, by element width ------------------------------------
#define BY_WIDTH(W, TYPE)                                                                                          \
    extern "C" __global__ void copy_w##W(const TYPE* x, TYPE* out, const int* meta, long long n) {                \
        GRID_LOOP(i, n) { out[i] = x[strided_offset(meta, 0, i)]; }                                                \
    }                                                                                                              \
    extern "C" __global__ void assign_w##W(TYPE* dst, const TYPE* src, const int* meta, long long n) {            \
        GRID_LOOP(i, n) { dst[strided_offset(meta, 0, i)] = src[strided_offset(meta, 1, i)]; }                     \
    }                                                                                                              \
    extern "C" __global__ void fill_w##W(TYPE* out, unsigned long long bits, long long n) {                       \
        GRID_LOOP(i, n) { out[i] = (TYPE)bits; }                                                                   \
    }
BY_WIDTH(1, unsigned char)
BY_WIDTH(2, unsigned short)
BY_WIDTH(4, unsigned int)
BY_WIDTH(8, unsigned long long)
