"""GGUF block formats as tallow dtypes ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0",
"q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q8_k"), their dequantisation (numpy
and pure Python, bit-identical to ggml), quantisation (numpy) and quantised
matmul. Importing this package registers the dtypes.

Nothing here imports numpy at import time: the numpy functions import it when
called, so the pure-Python functions work in Pyodide without it.
"""
from .formats import (DTYPE_TO_GGML, GGML_TO_DTYPE, GGML_TYPES, QUANT_NAMES, ggml_type_name, ggml_type_of,
                      quant_dtype)
from .dequant_numpy import dequantize_numpy, dequantize_rows_numpy
from .dequant_python import dequantize_python, dequantize_rows_python
from .quantize_numpy import quantize_numpy
from .matmul import qmatmul_numpy, qmatmul_python
from .quantize_tensor import quantize

__all__ = [
    "GGML_TYPES", "GGML_TO_DTYPE", "DTYPE_TO_GGML", "QUANT_NAMES", "ggml_type_name", "ggml_type_of", "quant_dtype",
    "dequantize_numpy", "dequantize_rows_numpy", "dequantize_python", "dequantize_rows_python",
    "quantize_numpy", "quantize", "qmatmul_numpy", "qmatmul_python",
]
