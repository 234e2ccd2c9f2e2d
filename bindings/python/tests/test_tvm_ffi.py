"""tvm-ffi <-> dlbridge, zero-copy both ways."""

import numpy as np
import tvm_ffi

import dlbridge


def test_dlbridge_to_tvm_ffi_and_back():
    z = dlbridge.zeros((2, 3), "float32")
    np.from_dlpack(z)[:] = 7
    v = tvm_ffi.from_dlpack(z)
    assert tuple(v.shape) == (2, 3)
    t = dlbridge.from_dlpack(v)
    assert t.data_ptr == z.data_ptr
    assert t.tolist() == [[7.0] * 3] * 2


def test_numpy_through_tvm_ffi_negative_strides():
    a = np.arange(12, dtype=np.int32).reshape(3, 4)[::-1]
    v = tvm_ffi.from_dlpack(dlbridge.from_dlpack(a))
    t = dlbridge.from_dlpack(v)
    assert t.strides == (-4, 1)
    assert t.tolist() == a.tolist()
    np.from_dlpack(t)[0, 0] = 100
    assert a[0, 0] == 100


def test_tvm_ffi_tensor_dtypes():
    for dtype in ["int8", "uint16", "float64", "bool"]:
        a = np.zeros(3, dtype=dtype)
        t = dlbridge.from_dlpack(tvm_ffi.from_dlpack(a))
        assert t.dtype == dtype and t.data_ptr == a.ctypes.data
