"""The non-DLPack protocols: the buffer protocol both ways, __array_interface__ both ways, and
__cuda_array_interface__ (parsed only: no device memory is touched)."""

import array
import ctypes
import mmap

import numpy as np
import pytest

import dlbridge


def test_asarray_from_buffer_exporters():
    b = bytearray(b"\x01\x02\x03\x04")
    t = dlbridge.asarray(b)
    assert t.dtype == "uint8" and t.shape == (4,) and not t.readonly
    np.from_dlpack(t)[0] = 9
    assert b[0] == 9, "zero-copy: the write reaches the bytearray"

    ro = dlbridge.asarray(b"abc")
    assert ro.readonly and ro.tolist() == [97, 98, 99]

    arr = array.array("d", [1.5, 2.5])
    t = dlbridge.asarray(arr)
    assert t.dtype == "float64" and t.tolist() == [1.5, 2.5]

    source = np.arange(12, dtype=np.int16).reshape(3, 4)[::2, ::-1]
    m = memoryview(source)
    t = dlbridge.asarray(m)
    assert t.shape == (2, 4) and t.strides == (8, -1)
    assert t.tolist() == source.tolist() and t.data_ptr == source.ctypes.data

    with mmap.mmap(-1, 16) as mm:
        mm[:4] = b"\x07\x00\x00\x00"
        t = dlbridge.asarray(mm)
        assert t.shape == (16,) and t.tolist()[0] == 7
        del t


def test_asarray_copy_and_identity():
    z = dlbridge.zeros(3)
    assert dlbridge.asarray(z) is z
    c = dlbridge.asarray(z, copy=True)
    assert c is not z and c.data_ptr != z.data_ptr
    b = bytearray(4)
    assert dlbridge.asarray(b, copy=True).data_ptr != dlbridge.asarray(b).data_ptr


def test_unsupported_buffer_formats():
    with pytest.raises(BufferError, match="format"):
        dlbridge.asarray(np.array(["a"]).data)
    with pytest.raises(BufferError, match="format"):
        dlbridge.asarray(np.zeros(2, dtype=[("x", "i4"), ("y", "f4")]).data)
    with pytest.raises(BufferError, match="native byte order"):
        dlbridge.asarray(np.arange(3, dtype=">i4").data)
    with pytest.raises(TypeError, match="cannot make a tensor"):
        dlbridge.asarray(object())


def test_buffer_protocol_export():
    t = dlbridge.from_dlpack(np.arange(6, dtype=np.float32).reshape(2, 3))
    m = memoryview(t)
    assert (m.format, m.shape, m.strides, m.readonly, m.itemsize) == ("f", (2, 3), (12, 4), False, 4)
    assert m.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert bytes(dlbridge.from_dlpack(np.array([1, 2], dtype=np.uint8))) == b"\x01\x02"
    strided = dlbridge.from_dlpack(np.arange(6.0)[::-2])
    assert memoryview(strided).strides == (-16,)
    assert np.asarray(strided).tolist() == [5.0, 3.0, 1.0]
    a = np.arange(3.0)
    a.flags.writeable = False
    ro = dlbridge.from_dlpack(a)
    assert memoryview(ro).readonly
    with pytest.raises(TypeError, match="read-only"):
        memoryview(ro)[0] = 1.0
    get_buffer = ctypes.pythonapi.PyObject_GetBuffer
    get_buffer.argtypes = [ctypes.py_object, ctypes.c_void_p, ctypes.c_int]
    view = (ctypes.c_char * 128)()  # room for a Py_buffer
    with pytest.raises(BufferError, match="read-only"):
        get_buffer(ro, ctypes.addressof(view), 0x1)  # PyBUF_WRITABLE
    bf16 = dlbridge.zeros(2, "bfloat16")
    with pytest.raises(BufferError, match="buffer-protocol"):
        memoryview(bf16)


def test_array_interface_export():
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    t = dlbridge.from_dlpack(a)
    ai = t.__array_interface__
    assert ai["version"] == 3 and ai["typestr"] == "<i4" and ai["shape"] == (3, 4)
    assert ai["data"] == (a.ctypes.data, False) and ai["strides"] is None
    f = dlbridge.from_dlpack(a.T).__array_interface__
    assert f["strides"] == (4, 16)
    with pytest.raises(AttributeError):
        t.__cuda_array_interface__


class Interface:
    def __init__(self, **kw):
        self.__array_interface__ = kw


class CudaInterface:
    def __init__(self, **kw):
        self.__cuda_array_interface__ = kw


def test_array_interface_import():
    a = np.arange(6, dtype=np.float64).reshape(2, 3)
    t = dlbridge.asarray(Interface(**a.__array_interface__))
    assert t.data_ptr == a.ctypes.data and t.tolist() == a.tolist()
    t = dlbridge.asarray(Interface(**a.T.__array_interface__))
    assert t.strides == (1, 3)
    ro = dlbridge.asarray(Interface(shape=(2,), typestr="<f8", data=(a.ctypes.data, True), version=3))
    assert ro.readonly


@pytest.mark.parametrize(
    "bad, exc, match",
    [
        (dict(typestr="<f8", data=(1, False), version=3), ValueError, "shape"),
        (dict(shape=(2,), data=(1, False), version=3), ValueError, "typestr"),
        (dict(shape="x", typestr="<f8", data=(1, False), version=3), TypeError, "shape"),
        (dict(shape=(2,), typestr=8, data=(1, False), version=3), TypeError, "typestr"),
        (dict(shape=(2,), typestr="<f8", data="ptr", version=3), TypeError, "data"),
        (dict(shape=(2,), typestr="<O8", data=(1, False), version=3), BufferError, "kind"),
        (dict(shape=(2,), typestr=">f8", data=(1, False), version=3), BufferError, "byte order"),
        (dict(shape=(2,), typestr="<f8", data=(0, False), version=3), BufferError, "NULL"),
        (dict(shape=(2,), typestr="<f8", data=(1, False), version=3, mask=object()), BufferError, "mask"),
        (dict(shape=(2,), typestr="<f8", data=(1, False)), ValueError, "version"),
        (dict(shape=(2,), typestr="<f8", data=(1, False), version=3, strides=(8,) * 3), ValueError, "strides"),
        (dict(shape=(-2,), typestr="<f8", data=(1, False), version=3), BufferError, "negative"),
    ],
)
def test_malformed_array_interfaces(bad, exc, match):
    with pytest.raises(exc, match=match):
        dlbridge.asarray(Interface(**bad))


def test_array_interface_not_a_dict():
    with pytest.raises(TypeError, match="must be a dict"):
        dlbridge.asarray(Interface.__new__(type("X", (), {"__array_interface__": 3})))


def test_cuda_array_interface_import_touches_no_memory():
    # A made-up device address: it is only recorded, never dereferenced.
    t = dlbridge.asarray(CudaInterface(shape=(4, 2), typestr="<f4", data=(0x7000_0000, False), version=3, stream=1))
    assert t.device == (2, 0) and t.data_ptr == 0x7000_0000
    cai = t.__cuda_array_interface__
    assert cai["shape"] == (4, 2) and cai["data"] == (0x7000_0000, False) and cai["version"] == 3
    with pytest.raises(AttributeError):
        t.__array_interface__
    with pytest.raises(BufferError):
        memoryview(t)
    with pytest.raises(BufferError, match="not accessible from the CPU"):
        t.tolist()
    with pytest.raises(BufferError):
        t.copy()
    cap = t.__dlpack__(max_version=(1, 0), stream=1)
    assert dlbridge.from_dlpack(cap).device == (2, 0)
    with pytest.raises(ValueError, match="stream 0"):
        t.__dlpack__(stream=0)
    with pytest.raises(ValueError, match="stream 0"):
        dlbridge.asarray(CudaInterface(shape=(1,), typestr="<f4", data=(0x7000_0000, False), version=3, stream=0))
    t = dlbridge.asarray(CudaInterface(shape=(2,), typestr="<f4", data=(0x7000_0000, False), version=3,
                                       strides=(8,)))
    assert t.strides == (2,)
