"""The op front end (tallow.ops): its unary table is the one list of unary ops, and the
tensors it makes on an input's device follow torch's Tensor.new_full / new_zeros."""
import pytest
import torch

import tallow
from tallow import ops

# Unary ops reached through another method (gelu(approximate="tanh"), pow, clamp, affine).
_THROUGH_ANOTHER_METHOD = {"gelu_tanh", "pow_scalar", "clamp", "affine"}


def test_every_unary_op_in_the_table_is_a_tensor_method():
    x = tallow.tensor([0.5, 1.0, 2.25, 3.0], device="cpu")  # in every op's domain (nan != nan)
    for name in sorted(set(ops.UNARY) - _THROUGH_ANOTHER_METHOD):
        method = getattr(tallow.Tensor, name)
        assert method(x).tolist() == ops.unary(x, name).tolist(), name


@pytest.mark.parametrize("dtype", ["f32", "i32", "bool"])
def test_new_full_and_new_zeros_follow_torch(dtype):
    torch_dtype = {"f32": torch.float32, "i32": torch.int32, "bool": torch.bool}[dtype]
    x, ref = tallow.tensor([1, 0], dtype=dtype, device="cpu"), torch.tensor([1, 0], dtype=torch_dtype)
    for ours, theirs in [(x.new_full((2, 3), 1), ref.new_full((2, 3), 1)), (x.new_zeros((3,)), ref.new_zeros((3,))),
                         (x.new_full((), 2, "f32"), ref.new_full((), 2, dtype=torch.float32))]:
        assert ours.tolist() == theirs.tolist() and ours.shape == tuple(theirs.shape)
        assert ours.dtype.name == {torch.float32: "f32", torch.int32: "i32", torch.bool: "bool"}[theirs.dtype]
        assert ours.device is x.device


def test_new_full_checks_the_value_fits():
    with pytest.raises(tallow.ValueRangeError, match="out of range for u8"):
        tallow.tensor([1], dtype="u8", device="cpu").new_full((2,), 300)


def test_gelu_gradient_at_zero_matches_torch():
    # Phi(x) = gelu(x) / x is 0/0 at zero: the table's rule substitutes Phi(0) = 1/2.
    values = [-1.0, 0.0, 0.5]
    x = tallow.tensor(values, dtype="f64", device="cpu", requires_grad=True)
    x.gelu().sum().backward()
    ref = torch.tensor(values, dtype=torch.float64, requires_grad=True)
    torch.nn.functional.gelu(ref).sum().backward()
    assert x.grad.tolist() == pytest.approx(ref.grad.tolist(), abs=1e-7)  # the backend's erf, to ~1e-9
