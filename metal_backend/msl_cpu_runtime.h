// Test-only: runs tallow's MSL kernels on the CPU (see cpu_driver.py). On top of
// msl_shim.h it makes threadgroup arrays static (shared by a group's threads), and runs
// each threadgroup's threads as ucontext fibers on one OS thread, so that
// threadgroup_barrier and simd_sum really synchronise: every live thread runs to its
// next barrier before any goes past it. Atomics are plain adds (one OS thread).
#pragma once
#define TG_SHARED static
#include "msl_shim.h"
#include <cstdio>
#include <cstdlib>
#include <ucontext.h>
#include <vector>

struct TallowCtx { uint grid[3], block[3], group[3], local[3], flat; };
typedef void (*TallowEntry)(void** args, const TallowCtx* c);

namespace tallow_cpu {
struct Fiber { ucontext_t uc; TallowCtx ctx; bool done; };
static ucontext_t scheduler;
static Fiber* current = nullptr;
static bool fibers_on = false;
static TallowEntry entry = nullptr;
static void** entry_args = nullptr;
static float simd_slots[1024];

static void trampoline() {
    entry(entry_args, &current->ctx);
    current->done = true;  // returning resumes uc_link: the scheduler
}
}  // namespace tallow_cpu

void threadgroup_barrier(mem_flags::flags) {
    if (!tallow_cpu::fibers_on) {
        std::fprintf(stderr, "tallow msl-cpu: threadgroup_barrier in a kernel launched without fibers\n");
        std::abort();
    }
    swapcontext(&tallow_cpu::current->uc, &tallow_cpu::scheduler);
}

float simd_sum(float v) {
    const TallowCtx* c = &tallow_cpu::current->ctx;
    tallow_cpu::simd_slots[c->flat] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    uint first = c->flat / 32 * 32, size = c->block[0] * c->block[1] * c->block[2];
    float s = 0.0f;
    for (uint i = first; i < first + 32 && i < size; ++i) s += tallow_cpu::simd_slots[i];
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
// Run a dispatch of grid x block threads; with fibers, one threadgroup at a time.
static void tallow_run(TallowEntry fn, void** args, const unsigned* grid, const unsigned* block, int fibers) {
    using namespace tallow_cpu;
    const size_t stack_size = 64 * 1024;
    uint n = block[0] * block[1] * block[2];
    std::vector<Fiber> fs(fibers ? n : 1);
    std::vector<char> stacks(fibers ? n * stack_size : 0);
    entry = fn;
    entry_args = args;
    fibers_on = fibers != 0;
    for (uint gz = 0; gz < grid[2]; ++gz)
    for (uint gy = 0; gy < grid[1]; ++gy)
    for (uint gx = 0; gx < grid[0]; ++gx) {
        for (uint t = 0; t < n; ++t) {
            Fiber& f = fs[fibers ? t : 0];
            TallowCtx& c = f.ctx;
            for (int d = 0; d < 3; ++d) { c.grid[d] = grid[d]; c.block[d] = block[d]; }
            c.group[0] = gx; c.group[1] = gy; c.group[2] = gz;
            c.local[0] = t % block[0]; c.local[1] = t / block[0] % block[1]; c.local[2] = t / (block[0] * block[1]);
            c.flat = t;
            f.done = false;
            if (!fibers) {
                current = &f;
                fn(args, &c);
                continue;
            }
            getcontext(&f.uc);
            f.uc.uc_stack.ss_sp = &stacks[t * stack_size];
            f.uc.uc_stack.ss_size = stack_size;
            f.uc.uc_link = &scheduler;
            makecontext(&f.uc, trampoline, 0);
        }
        if (!fibers) continue;
        for (bool alive = true; alive;) {  // one pass: every live thread runs to its next barrier or its end
            alive = false;
            for (uint t = 0; t < n; ++t) {
                if (fs[t].done) continue;
                current = &fs[t];
                swapcontext(&scheduler, &fs[t].uc);
                alive = alive || !fs[t].done;
            }
        }
    }
}
