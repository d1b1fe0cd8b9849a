// Element-wise kernels over arbitrary strides (see tallow_cuda's elementwise.cu: same
// names and arguments): unary, binary, compare, where, cast, copy/assign, fill.
// Each thread loops over the grid: i = gid, gid + threads_per_grid, ...

#define GRID_ARGS uint gid [[thread_position_in_grid]], uint gsize [[threads_per_grid]]
#define GRID_LOOP(i, n) for (long i = gid; i < (n); i += gsize)

template <class T>
inline void unary_impl(device const typename T::S* x, device typename T::S* out, constant int* meta, long n, int op,
                       float a0, float a1, uint gid, uint gsize) {
    GRID_LOOP(i, n) { out[i] = T::store(apply_unary(op, T::load(x[strided_offset(meta, 0, i)]), a0, a1)); }
}

template <class T>
inline void binary_impl(device const typename T::S* a, device const typename T::S* b, device typename T::S* out,
                        constant int* meta, long n, int op, uint gid, uint gsize) {
    GRID_LOOP(i, n) {
        out[i] = T::store(apply_binary(op, T::load(a[strided_offset(meta, 0, i)]), T::load(b[strided_offset(meta, 1, i)])));
    }
}

template <class T>
inline void compare_impl(device const typename T::S* a, device const typename T::S* b, device uchar* out,
                         constant int* meta, long n, int op, uint gid, uint gsize) {
    GRID_LOOP(i, n) { out[i] = apply_compare(op, T::load(a[strided_offset(meta, 0, i)]), T::load(b[strided_offset(meta, 1, i)])); }
}

template <class T>
inline void where_impl(device const uchar* c, device const typename T::S* a, device const typename T::S* b,
                       device typename T::S* out, constant int* meta, long n, uint gid, uint gsize) {
    GRID_LOOP(i, n) { out[i] = c[strided_offset(meta, 0, i)] ? a[strided_offset(meta, 1, i)] : b[strided_offset(meta, 2, i)]; }
}

#define ELEMENTWISE(NAME)                                                                                            \
    kernel void unary_##NAME(device const T_##NAME::S* x [[buffer(0)]], device T_##NAME::S* out [[buffer(1)]],        \
                             constant int* meta [[buffer(2)]], constant long& n [[buffer(3)]],                       \
                             constant int& op [[buffer(4)]], constant float& a0 [[buffer(5)]],                       \
                             constant float& a1 [[buffer(6)]], GRID_ARGS) {                                          \
        unary_impl<T_##NAME>(x, out, meta, n, op, a0, a1, gid, gsize);                                               \
    }                                                                                                                \
    kernel void binary_##NAME(device const T_##NAME::S* a [[buffer(0)]], device const T_##NAME::S* b [[buffer(1)]],   \
                              device T_##NAME::S* out [[buffer(2)]], constant int* meta [[buffer(3)]],               \
                              constant long& n [[buffer(4)]], constant int& op [[buffer(5)]], GRID_ARGS) {           \
        binary_impl<T_##NAME>(a, b, out, meta, n, op, gid, gsize);                                                   \
    }                                                                                                                \
    kernel void compare_##NAME(device const T_##NAME::S* a [[buffer(0)]], device const T_##NAME::S* b [[buffer(1)]],  \
                               device uchar* out [[buffer(2)]], constant int* meta [[buffer(3)]],                    \
                               constant long& n [[buffer(4)]], constant int& op [[buffer(5)]], GRID_ARGS) {          \
        compare_impl<T_##NAME>(a, b, out, meta, n, op, gid, gsize);                                                  \
    }                                                                                                                \
    kernel void where_##NAME(device const uchar* c [[buffer(0)]], device const T_##NAME::S* a [[buffer(1)]],          \
                             device const T_##NAME::S* b [[buffer(2)]], device T_##NAME::S* out [[buffer(3)]],       \
                             constant int* meta [[buffer(4)]], constant long& n [[buffer(5)]], GRID_ARGS) {          \
        where_impl<T_##NAME>(c, a, b, out, meta, n, gid, gsize);                                                     \
    }
FOR_EACH_DTYPE(ELEMENTWISE)

// cast: float kinds go through float, integer kinds through long; to bool is "!= 0".
template <class D, class S>
inline typename D::S convert(typename S::S s) {
    if (S::is_float) {
        float v = float(S::load(s));
        return D::is_float ? D::store(typename D::C(v)) : D::store(typename D::C(long(v)));
    }
    return D::store(typename D::C(long(S::load(s))));
}

#define CAST_PAIR(SRC, DST)                                                                                          \
    kernel void cast_##SRC##_##DST(device const T_##SRC::S* x [[buffer(0)]], device T_##DST::S* out [[buffer(1)]],   \
                                   constant int* meta [[buffer(2)]], constant long& n [[buffer(3)]], GRID_ARGS) {    \
        GRID_LOOP(i, n) { out[i] = convert<T_##DST, T_##SRC>(x[strided_offset(meta, 0, i)]); }                       \
    }
#define CAST_FROM(SRC)                                                                                               \
    CAST_PAIR(SRC, f32) CAST_PAIR(SRC, f16) CAST_PAIR(SRC, bf16) CAST_PAIR(SRC, i64) CAST_PAIR(SRC, i32)             \
    CAST_PAIR(SRC, i8) CAST_PAIR(SRC, u32) CAST_PAIR(SRC, u8)                                                        \
    kernel void cast_##SRC##_bool(device const T_##SRC::S* x [[buffer(0)]], device uchar* out [[buffer(1)]],          \
                                  constant int* meta [[buffer(2)]], constant long& n [[buffer(3)]], GRID_ARGS) {     \
        GRID_LOOP(i, n) { out[i] = T_##SRC::load(x[strided_offset(meta, 0, i)]) != T_##SRC::C(0); }                  \
    }
FOR_EACH_DTYPE(CAST_FROM)

#define BY_WIDTH(W, TYPE)                                                                                            \
    kernel void copy_w##W(device const TYPE* x [[buffer(0)]], device TYPE* out [[buffer(1)]],                        \
                          constant int* meta [[buffer(2)]], constant long& n [[buffer(3)]], GRID_ARGS) {             \
        GRID_LOOP(i, n) { out[i] = x[strided_offset(meta, 0, i)]; }                                                  \
    }                                                                                                                \
    kernel void assign_w##W(device TYPE* dst [[buffer(0)]], device const TYPE* src [[buffer(1)]],                     \
                            constant int* meta [[buffer(2)]], constant long& n [[buffer(3)]], GRID_ARGS) {           \
        GRID_LOOP(i, n) { dst[strided_offset(meta, 0, i)] = src[strided_offset(meta, 1, i)]; }                       \
    }                                                                                                                \
    kernel void fill_w##W(device TYPE* out [[buffer(0)]], constant ulong& bits [[buffer(1)]],                         \
                          constant long& n [[buffer(2)]], GRID_ARGS) {                                               \
        GRID_LOOP(i, n) { out[i] = TYPE(bits); }                                                                     \
    }
BY_WIDTH(1, uchar)
BY_WIDTH(2, ushort)
BY_WIDTH(4, uint)
BY_WIDTH(8, ulong)
