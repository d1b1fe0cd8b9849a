// Test-only: runs tallow's MSL kernels on the CPU (see cpu_driver.py). On top of
// msl_shim.h it makes threadgroup arrays static (shared by a group's threads) and runs
// threadgroups as fibers (core/backends/kernel/cpu_fibers.h), so threadgroup_barrier and
// simd_sum really synchronise. Atomics are plain adds (one OS thread).
#pragma once
#define TG_SHARED static
#include "msl_shim.h"
#include "cpu_fibers.h"  // core/backends/kernel/: the fiber scheduler (shared with the CUDA emulator)

void threadgroup_barrier(mem_flags::flags) { tallow_barrier(); }

float simd_sum(float v) {
    const TallowCtx* c = &tallow_cpu::current->ctx;
    tallow_cpu::slots[c->flat] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    uint first = c->flat / 32 * 32, size = c->block[0] * c->block[1] * c->block[2];
    float s = 0.0f;
    for (uint i = first; i < first + 32 && i < size; ++i) s += tallow_cpu::slots[i];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    return s;
}

float atomic_fetch_add_explicit(atomic_float* p, float v, memory_order) { float o = p->v; p->v += v; return o; }
int atomic_fetch_add_explicit(atomic_int* p, int v, memory_order) { int o = p->v; p->v += v; return o; }
uint atomic_fetch_add_explicit(atomic_uint* p, uint v, memory_order) { uint o = p->v; p->v += v; return o; }

enum { TPIG, TPG, TGPIG, TPITG, TIITG, TPTG, TIISG, SIITG };
template <class T> T tallow_builtin(const TallowCtx* c, int kind);
template <> inline uint tallow_builtin<uint>(const TallowCtx* c, int kind) {
    switch (kind) {
    case TPIG: return c->group[0] * c->block[0] + c->local[0];
    case TPG: return c->grid[0] * c->block[0];
    case TGPIG: return c->group[0];
    case TPITG: return c->local[0];
    case TIITG: return c->flat;
    case TPTG: return c->block[0];
    case TIISG: return c->flat % 32;
    case SIITG: return c->flat / 32;
    }
    return 0;
}
template <> inline uint3 tallow_builtin<uint3>(const TallowCtx* c, int kind) {
    switch (kind) {
    case TPIG: return uint3{c->group[0] * c->block[0] + c->local[0], c->group[1] * c->block[1] + c->local[1],
                            c->group[2] * c->block[2] + c->local[2]};
    case TPG: return uint3{c->grid[0] * c->block[0], c->grid[1] * c->block[1], c->grid[2] * c->block[2]};
    case TGPIG: return uint3{c->group[0], c->group[1], c->group[2]};
    case TPITG: return uint3{c->local[0], c->local[1], c->local[2]};
    case TPTG: return uint3{c->block[0], c->block[1], c->block[2]};
    }
    return uint3{0, 0, 0};
}

template <> inline uint2 tallow_builtin<uint2>(const TallowCtx* c, int kind) {
    uint3 v = tallow_builtin<uint3>(c, kind);
    return uint2{v.x, v.y};
}
