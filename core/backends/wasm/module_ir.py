"""kernels.wasm's whole IR module: kernels_ir's kernels, then decode_ir's, device_ir's, gemm_ir's and
elementwise_ir's (they build on its helpers), threads_ir's barrier, then program_ir's `run` over all
of them. build.py lowers what module() returns; module(threaded=True) is kernels_mt.wasm's (the same
kernels, the barrier's atomic body)."""
from . import decode_ir, device_ir, elementwise_ir, gemm_ir, kernels_ir, program_ir, threads_ir

exports = kernels_ir.exports


def module(threaded=False):
    m = kernels_ir.module()
    decode_ir.add_kernels(m)
    device_ir.add_kernels(m)
    gemm_ir.add_kernels(m)
    elementwise_ir.add_kernels(m)
    threads_ir.add_barrier(m, threaded)
    program_ir.add_run(m)
    return m
