"""The 16-byte step buffer every capturing backend (wgpu, and CUDA/Metal through the kernel
backend) gives its position-dependent kernels: the position of the step's first new token, the
key count after it, and two zero words. Written once per replay, so a recorded step's launches
are the same at every position."""
import struct

STEP_BYTES = 16


def step_words(position, tokens):
    """The buffer's bytes: four little-endian 32-bit words (position, position + tokens, 0, 0)."""
    return struct.pack("<4I", position, position + tokens, 0, 0)
