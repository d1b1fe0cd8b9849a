"""The type the op front end (tallow.ops) recognises as a tensor.

Tensor (tensor.py) is its one subclass. It exists so that the front end can tell
tensors from Python numbers without importing tensor.py, which imports the front
end: the dependency runs one way, Tensor -> ops -> backends.
"""


class TensorBase:
    __slots__ = ()
