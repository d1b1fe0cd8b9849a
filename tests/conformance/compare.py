"""Host-side comparison of a case's result (what cases.out makes: dtype, shape, values) with
its numpy/torch reference: exact for integers and bools; within (rtol, atol) for floats, and
exact with the sign of zero when both are 0. Used natively, for Pyodide and for Chromium."""
import numpy as np

from cases import DTYPE_NAMES


def assert_matches(got, want, where, rtol, atol):
    if isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), f"{where}: keys {sorted(got)} != {sorted(want)}"
        for key in want:
            assert_matches(got[key], want[key], f"{where}.{key}", rtol, atol)
        return
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{where}: {len(got)} parts, expected {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_matches(g, w, f"{where}[{i}]", rtol, atol)
        return
    if isinstance(want, str):
        assert got == want, f"{where}: {got!r} != {want!r}"
        return
    want, dtype = want if isinstance(want, tuple) else (np.asarray(want), None)
    dtype = dtype or DTYPE_NAMES[want.dtype.name]
    assert (got["dtype"], got["shape"]) == (dtype, list(want.shape)), \
        f"{where}: got {got['dtype']} {got['shape']}, expected {dtype} {list(want.shape)}"
    values = np.asarray(got["values"], dtype=np.float64)
    expected = want.astype(np.float64)
    if dtype in ("bool", "i8", "i32", "i64", "u8", "u32"):
        np.testing.assert_array_equal(values, expected, err_msg=where)
    else:
        np.testing.assert_allclose(values, expected, rtol=rtol, atol=atol, equal_nan=True, err_msg=where)
    if not rtol and not atol:  # exact cases: the sign of zero counts too (a NaN's sign does not)
        signs = np.where(np.isnan(values), False, np.signbit(values))
        np.testing.assert_array_equal(signs, np.where(np.isnan(expected), False, np.signbit(expected)), err_msg=f"{where} (signs)")
