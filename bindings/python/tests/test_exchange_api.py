"""The DLPack 1.3 C exchange API: every function of dlbridge's table called through ctypes, tvm-ffi
and torch using it, and dlbridge consuming torch's."""

import ctypes

import numpy as np
import pytest
import torch
import tvm_ffi

import dlbridge
from dlbridge import _native
from dlpack_ctypes import DLDataType, DLDevice, DLManagedTensorVersioned, DLTensor, DLPackVersion, pythonapi

SET_ERROR = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p)
ALLOCATOR = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(DLTensor), ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, SET_ERROR)
# Functions that take or make Python objects are called with the GIL held (PYFUNCTYPE), as the
# API requires; the others may run without it (CFUNCTYPE releases the GIL around the call).
FROM_PY = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(ctypes.c_void_p))
TO_PY = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p))
DLTENSOR_FROM_PY = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(DLTensor))
STREAM = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p))


class Header(ctypes.Structure):
    pass


Header._fields_ = [("version", DLPackVersion), ("prev_api", ctypes.POINTER(Header))]


class ExchangeAPI(ctypes.Structure):
    _fields_ = [("header", Header)] + [(n, ctypes.c_void_p) for n in (
        "managed_tensor_allocator", "managed_tensor_from_py_object_no_sync", "managed_tensor_to_py_object_no_sync",
        "dltensor_from_py_object_no_sync", "current_work_stream")]


def table(cls):
    capsule = cls.__dlpack_c_exchange_api__
    pythonapi.PyCapsule_GetName.restype = ctypes.c_char_p
    assert pythonapi.PyCapsule_GetName(capsule) == b"dlpack_exchange_api"
    return ExchangeAPI.from_address(pythonapi.PyCapsule_GetPointer(capsule, b"dlpack_exchange_api"))


def test_table_is_static_and_versioned():
    api = table(dlbridge.Tensor)
    assert (api.header.version.major, api.header.version.minor) == (1, 3)
    assert not api.header.prev_api
    assert all(getattr(api, n) for n, _ in ExchangeAPI._fields_[1:]), "all five functions are provided"
    assert ctypes.addressof(api) == ctypes.addressof(table(type(dlbridge.zeros(1))))


def test_every_function_pointer():
    api = table(dlbridge.Tensor)
    # allocator: a (2, 3) float64 prototype
    shape = (ctypes.c_int64 * 2)(2, 3)
    proto = DLTensor(None, DLDevice(1, 0), 2, DLDataType(2, 64, 1), shape, None, 0)
    out = ctypes.c_void_p()
    errors = []
    on_error = SET_ERROR(lambda ctx, kind, msg: errors.append((kind, msg)))
    assert ALLOCATOR(api.managed_tensor_allocator)(ctypes.byref(proto), ctypes.byref(out), None, on_error) == 0
    managed = DLManagedTensorVersioned.from_address(out.value)
    assert managed.dl_tensor.ndim == 2 and managed.dl_tensor.data % 64 == 0
    # to_py_object steals it and gives a dlbridge.Tensor
    obj = ctypes.c_void_p()
    assert TO_PY(api.managed_tensor_to_py_object_no_sync)(out, ctypes.byref(obj)) == 0
    t = ctypes.cast(obj, ctypes.py_object).value
    pythonapi.Py_DecRef.argtypes = [ctypes.c_void_p]
    pythonapi.Py_DecRef(obj)  # the new reference handed to us; `t` holds its own
    assert isinstance(t, dlbridge.Tensor) and t.shape == (2, 3) and t.dtype == "float64"
    assert t.tolist() == [[0.0] * 3] * 2
    # allocator errors go through SetError, not an exception
    proto.device = DLDevice(2, 0)
    assert ALLOCATOR(api.managed_tensor_allocator)(ctypes.byref(proto), ctypes.byref(out), None, on_error) == -1
    assert errors and errors[0][0] == b"BufferError" and b"CPU memory only" in errors[0][1]
    # owning export
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    src = dlbridge.from_dlpack(a)
    assert FROM_PY(api.managed_tensor_from_py_object_no_sync)(src, ctypes.byref(out)) == 0
    exported = DLManagedTensorVersioned.from_address(out.value)
    assert exported.dl_tensor.data == a.ctypes.data and (exported.version.major, exported.version.minor) == (1, 3)
    exported.deleter(out.value)
    # non-owning fill
    dl = DLTensor()
    assert DLTENSOR_FROM_PY(api.dltensor_from_py_object_no_sync)(src, ctypes.byref(dl)) == 0
    assert dl.data == a.ctypes.data and dl.ndim == 2 and [dl.strides[0], dl.strides[1]] == [3, 1]
    # stream: NULL for dlbridge, which queues no work
    stream = ctypes.c_void_p(1)
    assert STREAM(api.current_work_stream)(1, 0, ctypes.byref(stream)) == 0 and not stream.value
    # a foreign object is a TypeError, raised as a Python exception
    with pytest.raises(TypeError, match="not a dlbridge.Tensor"):
        FROM_PY(api.managed_tensor_from_py_object_no_sync)(np.zeros(2), ctypes.byref(out))
    # Called without the GIL (a caller error), the function takes it rather than crashing.
    unlocked = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(ctypes.c_void_p))
    assert unlocked(api.managed_tensor_from_py_object_no_sync)(src, ctypes.byref(out)) == 0
    DLManagedTensorVersioned.from_address(out.value).deleter(out.value)
    calls = _native._exchange_api_calls()
    assert all(calls[k] >= 1 for k in calls)


def test_tvm_ffi_takes_the_fast_path():
    before = _native._exchange_api_calls()["from_py_object"]
    z = dlbridge.zeros((3,), "int32")
    v = tvm_ffi.from_dlpack(z)
    assert _native._exchange_api_calls()["from_py_object"] == before + 1
    assert dlbridge.from_dlpack(v).data_ptr == z.data_ptr


def test_torch_import_goes_through_torchs_exchange_api(monkeypatch):
    def python_path_forbidden(self, *args, **kwargs):
        raise AssertionError("torch's Python __dlpack__ was called")

    monkeypatch.setattr(torch.Tensor, "__dlpack__", python_path_forbidden)
    x = torch.arange(8, dtype=torch.int16).reshape(2, 4)[:, ::2]
    t = dlbridge.from_dlpack(x)
    assert t.data_ptr == x.data_ptr() and t.strides == (4, 2)
    assert t.tolist() == x.tolist()
    c = dlbridge.from_dlpack(x, copy=True)
    assert c.data_ptr != x.data_ptr() and c.tolist() == x.tolist()


def test_legacy_integer_form_is_not_followed():
    """The 1.2 integer form (__c_dlpack_exchange_api__) could be any int: dlbridge never follows it
    and uses __dlpack__, which every producer that had the integer form also has."""
    address = ctypes.addressof(table(dlbridge.Tensor))
    a = np.arange(2.0)

    class OldStyle:
        __c_dlpack_exchange_api__ = address

        def __dlpack__(self, **kw):
            return a.__dlpack__(**kw)

    assert dlbridge.from_dlpack(OldStyle()).tolist() == [0.0, 1.0]


def test_incompatible_major_falls_back_to_dlpack():
    fake = Header(DLPackVersion(2, 0), None)
    capsule = pythonapi.PyCapsule_New(ctypes.addressof(fake), b"dlpack_exchange_api", None)
    a = np.arange(3.0)

    class Future:
        __dlpack_c_exchange_api__ = capsule

        def __dlpack__(self, **kw):
            return a.__dlpack__(**kw)

    assert dlbridge.from_dlpack(Future()).data_ptr == a.ctypes.data
    fake_keepalive = fake  # the table must outlive every lookup
    assert fake_keepalive.version.major == 2


def test_torch_consumes_what_our_table_produces():
    """torch's own consumer is Python code that never reads a foreign table, but it takes the owning
    export our table makes (wrapped in a standard capsule) and the tensors our allocator makes."""
    api = table(dlbridge.Tensor)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    src = dlbridge.from_dlpack(a)
    out = ctypes.c_void_p()
    assert FROM_PY(api.managed_tensor_from_py_object_no_sync)(src, ctypes.byref(out)) == 0
    capsule = pythonapi.PyCapsule_New(out.value, b"dltensor_versioned", None)  # torch renames it and owns it
    x = torch.from_dlpack(capsule)
    assert x.data_ptr() == a.ctypes.data and x.tolist() == a.tolist()
    x[0, 0] = 42.0
    assert a[0, 0] == 42.0

    shape = (ctypes.c_int64 * 1)(4)
    proto = DLTensor(None, DLDevice(1, 0), 1, DLDataType(0, 64, 1), shape, None, 0)
    on_error = SET_ERROR(lambda ctx, kind, msg: None)
    assert ALLOCATOR(api.managed_tensor_allocator)(ctypes.byref(proto), ctypes.byref(out), None, on_error) == 0
    obj = ctypes.c_void_p()
    assert TO_PY(api.managed_tensor_to_py_object_no_sync)(out, ctypes.byref(obj)) == 0
    t = ctypes.cast(obj, ctypes.py_object).value
    pythonapi.Py_DecRef(obj)
    y = torch.from_dlpack(t)
    y += 7
    assert t.tolist() == [7, 7, 7, 7] and y.dtype == torch.int64


def test_the_non_owning_fill_refuses_padded_sub_byte_elements():
    """A bare DLTensor has no flags: a consumer of our fill would read one-per-byte float4 values as
    packed (wrong values). The fill refuses them with BufferError; the owning export says so."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    api = table(dlbridge.Tensor)
    t = dlbridge.from_dlpack(np.zeros(4, dtype=ml_dtypes.float4_e2m1fn))
    assert t.nbytes == 4, "padded: one value per byte"
    dl = DLTensor()
    with pytest.raises(BufferError, match="padded sub-byte"):
        DLTENSOR_FROM_PY(api.dltensor_from_py_object_no_sync)(t, ctypes.byref(dl))
    out = ctypes.c_void_p()
    assert FROM_PY(api.managed_tensor_from_py_object_no_sync)(t, ctypes.byref(out)) == 0
    exported = DLManagedTensorVersioned.from_address(out.value)
    assert exported.flags & (1 << 2), "IS_SUBBYTE_TYPE_PADDED"
    exported.deleter(out.value)
