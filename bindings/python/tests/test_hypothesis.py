"""Random shapes, dtypes and steps (negative included) round-trip through dlbridge without copying."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import dlbridge

DTYPES = ["bool", "int8", "uint16", "int32", "int64", "float16", "float32", "float64", "complex64"]


@st.composite
def strided_arrays(draw):
    ndim = draw(st.integers(0, 4))
    shape = tuple(draw(st.integers(0, 5)) for _ in range(ndim))
    dtype = draw(st.sampled_from(DTYPES))
    base = (np.arange(int(np.prod(shape, dtype=np.int64)) or 1) % 7).astype(dtype)[: int(np.prod(shape))]
    a = base.reshape(shape)
    steps = tuple(draw(st.sampled_from([1, 2, -1, -2])) for _ in range(ndim))
    view = a[tuple(slice(None, None, s) for s in steps)] if ndim else a
    if ndim >= 2 and draw(st.booleans()):
        view = view.T
    return view


@settings(max_examples=300, deadline=None)
@given(strided_arrays())
def test_random_round_trips(a):
    t = dlbridge.from_dlpack(a)
    assert t.shape == a.shape and t.dtype == a.dtype.name
    assert t.tolist() == a.tolist()
    b = np.from_dlpack(t)
    np.testing.assert_array_equal(b, a)
    if a.size:
        assert b.__array_interface__["data"][0] == a.__array_interface__["data"][0]
    c = np.from_dlpack(t.copy())
    assert c.flags.c_contiguous
    np.testing.assert_array_equal(c, a)
    np.testing.assert_array_equal(np.asarray(memoryview(t)), a)
