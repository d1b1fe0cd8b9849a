// Dense matmul with batch strides (Metal has no cuBLAS here): out (batch, m, n) =
// a (batch, m, k) @ b (batch, k, n). meta locates each batch's a and b (operands 0, 1)
// over the batch shape; mk = [a row stride, a col stride, b row stride, b col stride].
// A 16x16 tile per threadgroup, k in steps of 16 through threadgroup memory.
// Metal-only (tallow_metal.driver.OWN_MODULES), in plain MSL; the driver puts the shared
// msl.h and common.h (tallow/backends/gpu_kernels/) before it: strided_offset, T_<dtype>.

#define TILE 16

template <class T, class A>
inline void matmul_impl(device const typename T::S* a, device const typename T::S* b, device typename T::S* out,
                        constant int* meta, constant int* mk, int m, int n, int k, uint3 group, uint3 local,
                        threadgroup A* ta, threadgroup A* tb) {
    long bi = group.z;
    int r = int(group.y) * TILE + int(local.y);
    int c = int(group.x) * TILE + int(local.x);
    device const typename T::S* ab = a + strided_offset(meta, 0, bi);
    device const typename T::S* bb = b + strided_offset(meta, 1, bi);
    A acc = A(0);
    for (int t0 = 0; t0 < k; t0 += TILE) {
        int ka = t0 + int(local.x), kb = t0 + int(local.y);
        ta[local.y * TILE + local.x] = (r < m && ka < k) ? A(T::load(ab[long(r) * mk[0] + long(ka) * mk[1]])) : A(0);
        tb[local.y * TILE + local.x] = (kb < k && c < n) ? A(T::load(bb[long(kb) * mk[2] + long(c) * mk[3]])) : A(0);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (int j = 0; j < TILE; ++j) acc += ta[local.y * TILE + j] * tb[j * TILE + local.x];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    if (r < m && c < n) out[(bi * m + r) * long(n) + c] = T::store(typename T::C(acc));
}

#define MATMUL(NAME, ACC)                                                                                            \
    kernel void matmul_##NAME(device const T_##NAME::S* a [[buffer(0)]], device const T_##NAME::S* b [[buffer(1)]],   \
                              device T_##NAME::S* out [[buffer(2)]], constant int* meta [[buffer(3)]],               \
                              constant int* mk [[buffer(4)]], constant int& m [[buffer(5)]],                         \
                              constant int& n [[buffer(6)]], constant int& k [[buffer(7)]],                          \
                              uint3 group [[threadgroup_position_in_grid]],                                          \
                              uint3 local [[thread_position_in_threadgroup]]) {                                      \
        TG_SHARED ACC ta[TILE * TILE];                                                                             \
        TG_SHARED ACC tb[TILE * TILE];                                                                             \
        matmul_impl<T_##NAME, ACC>(a, b, out, meta, mk, m, n, k, group, local, ta, tb);                              \
    }
MATMUL(f32, float)
MATMUL(f16, float)
MATMUL(bf16, float)
MATMUL(i32, int)
MATMUL(i64, long)
