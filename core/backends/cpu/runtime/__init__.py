"""What runs the CPU device's kernels (kernels/): no numba is imported here.

  kernel_calls.py which kernels this process uses (kernels(): machine code, numba's, or none), the
                  thread count, and the checked quantised/f16 products and embedding lookup
  threads.py      RowPool: a decoding step's large products shared among threads, chunk by chunk
  polls.py        bounded waits on a counter without the GIL (the atomics kernel)
  capture.py      capture and replay of a decode step (tallow.capture's contract, as on the GPUs)
  step_program.py a captured step's kernel calls as one program that step_loop.run_step runs
"""
