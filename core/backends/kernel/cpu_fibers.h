// Test-only: the fiber scheduler behind tallow's CPU emulators of its GPU kernels
// (cuda_backend/cpu_driver.py, metal_backend/cpu_driver.py; built by tallow.backends.kernel.emulator). A dispatch runs one block
// (threadgroup) at a time; with fibers, each of its threads is a ucontext fiber on one OS
// thread, and tallow_barrier() switches back to the scheduler, which runs every live
// thread to its next barrier before any goes past it. Without fibers (kernels that never
// synchronise) the threads simply run one after another.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <ucontext.h>
#include <vector>

struct TallowCtx { unsigned grid[3], block[3], group[3], local[3], flat; };
typedef void (*TallowEntry)(void** args, const TallowCtx* c);

namespace tallow_cpu {
struct Fiber { ucontext_t uc; TallowCtx ctx; bool done; };
static ucontext_t scheduler;
static Fiber* current = nullptr;
static bool fibers_on = false;
static TallowEntry entry = nullptr;
static void** entry_args = nullptr;
static float slots[1024];  // per-thread exchange (simd_sum, __shfl_down_sync)

static void trampoline() {
    entry(entry_args, &current->ctx);
    current->done = true;  // returning resumes uc_link: the scheduler
}
}  // namespace tallow_cpu

inline void tallow_barrier() {
    if (!tallow_cpu::fibers_on) {
        std::fprintf(stderr, "tallow cpu emulator: a barrier in a kernel launched without fibers\n");
        std::abort();
    }
    swapcontext(&tallow_cpu::current->uc, &tallow_cpu::scheduler);
}

// Run a dispatch of grid x block threads; with fibers, one threadgroup at a time.
static void tallow_run(TallowEntry fn, void** args, const unsigned* grid, const unsigned* block, int fibers) {
    using namespace tallow_cpu;
    const size_t stack_size = 64 * 1024;
    unsigned n = block[0] * block[1] * block[2];
    std::vector<Fiber> fs(fibers ? n : 1);
    std::vector<char> stacks(fibers ? n * stack_size : 0);
    entry = fn;
    entry_args = args;
    fibers_on = fibers != 0;
    for (unsigned gz = 0; gz < grid[2]; ++gz)
    for (unsigned gy = 0; gy < grid[1]; ++gy)
    for (unsigned gx = 0; gx < grid[0]; ++gx) {
        for (unsigned t = 0; t < n; ++t) {
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
            for (unsigned t = 0; t < n; ++t) {
                if (fs[t].done) continue;
                current = &fs[t];
                swapcontext(&scheduler, &fs[t].uc);
                alive = alive || !fs[t].done;
            }
        }
    }
}
