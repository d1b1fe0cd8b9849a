"""What the writers accept for a tensor: a tallow Tensor, a numpy array, or a
(dtype_name, shape, bytes_like) triple. Each becomes (DType, shape, buffer)."""
from ..dtypes import get_dtype
from ..errors import DTypeError, FormatError
from .lazy_file import numel_of


def tensor_parts(name, value):
    """(tallow DType, shape tuple, C-contiguous little-endian bytes-like) for one tensor."""
    from ..tensor import Tensor
    if isinstance(value, Tensor):
        dtype, shape, data = value.dtype, tuple(value.shape), memoryview(bytes(value))
    elif isinstance(value, tuple) and len(value) == 3:
        dtype, shape, data = value
        dtype, shape = get_dtype(dtype), tuple(int(s) for s in shape)
        data = memoryview(data).cast("B")
    elif hasattr(value, "__array_interface__"):
        import numpy as np
        arr = np.ascontiguousarray(value)
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        try:
            dtype = get_dtype(arr.dtype.name)
        except DTypeError:
            raise DTypeError(f"tensor {name!r}: numpy dtype {arr.dtype} has no tallow dtype") from None
        shape, data = arr.shape, memoryview(arr.reshape(-1)).cast("B")
    else:
        raise FormatError(f"tensor {name!r}: expected a tallow Tensor, a numpy array or (dtype, shape, bytes), "
                          f"got {type(value).__name__}")
    expected = dtype.nbytes(numel_of(shape))
    if data.nbytes != expected:
        raise FormatError(f"tensor {name!r}: {data.nbytes} bytes given for {dtype.name} of shape {shape}, "
                          f"which needs {expected}")
    return dtype, shape, data
