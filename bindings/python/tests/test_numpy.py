"""NumPy <-> dlbridge: zero-copy both ways, every standard dtype, every layout, read-only,
version negotiation, copy/device/stream, lifetime and capsule rules."""

import ctypes
import ctypes.util
import weakref

import numpy as np
import pytest

import dlbridge
from dlpack_ctypes import IS_COPIED, READ_ONLY, capsule_name, read_capsule, shape_and_strides

STANDARD_DTYPES = [
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
]


def sample(dtype, shape=(3, 4)):
    n = int(np.prod(shape))
    if dtype == "bool":
        return (np.arange(n) % 3 == 0).reshape(shape)
    if dtype.startswith("complex"):
        return (np.arange(n) + 1j * np.arange(n)[::-1]).astype(dtype).reshape(shape)
    return np.arange(n).astype(dtype).reshape(shape)


def test_module_names():
    assert isinstance(dlbridge.__version__, str) and dlbridge.__version__
    assert dlbridge.DLPACK_VERSION == (1, 3)


def test_numpy_to_dlbridge_to_numpy_is_zero_copy():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = dlbridge.from_dlpack(a)
    assert t.data_ptr == a.ctypes.data
    assert (t.shape, t.strides, t.ndim, t.size, t.nbytes) == ((3, 4), (4, 1), 2, 12, 48)
    b = np.from_dlpack(t)
    assert b.ctypes.data == a.ctypes.data
    b[1, 2] = -7
    assert a[1, 2] == -7, "a write through NumPy's view of our tensor is seen in the source"
    a[0, 0] = 99
    assert t.tolist()[0][0] == 99


@pytest.mark.parametrize("dtype", STANDARD_DTYPES)
def test_every_standard_dtype_round_trips(dtype):
    a = sample(dtype)
    t = dlbridge.from_dlpack(a)
    assert str(t.dtype) == dtype and t.dtype == dtype
    assert t.tolist() == a.tolist()
    back = np.from_dlpack(t)
    assert back.dtype == a.dtype
    np.testing.assert_array_equal(back, a)
    assert back.ctypes.data == a.ctypes.data


def test_dtype_object():
    t = dlbridge.zeros((2,), "complex64")
    d = t.dtype
    assert (d.code, d.bits, d.lanes, d.itemsize) == (5, 64, 1, 8)
    assert d == "complex64" and d != "complex128" and d == dlbridge.DType("complex64")
    assert hash(d) == hash("complex64")
    assert repr(d) == "dlbridge.DType('complex64')"
    assert str(dlbridge.DType("float32x4")) == "float32x4"
    with pytest.raises(ValueError, match="unknown dtype name"):
        dlbridge.DType("float33")


LAYOUTS = {
    "C": lambda a: a,
    "F": lambda a: np.asfortranarray(a),
    "transposed": lambda a: a.T,
    "negative strides": lambda a: a[::-1, ::-2],
    "offset": lambda a: a[1:, 1:],
    "0-d": lambda a: np.array(a[1, 1]),
    "zero-size": lambda a: a[:0],
    "broadcast": lambda a: np.broadcast_to(a[:1], (5, a.shape[1])),
    "size-1 axis": lambda a: a[:, 1:2],
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layouts_round_trip_zero_copy(layout):
    base = np.arange(20, dtype=np.float64).reshape(4, 5)
    a = LAYOUTS[layout](base)
    t = dlbridge.from_dlpack(a)
    assert t.shape == a.shape
    itemsize = a.itemsize
    if a.size > 1:
        expected = tuple(s // itemsize for s, d in zip(a.strides, a.shape))
        assert all(ts == es for ts, es, d in zip(t.strides, expected, a.shape) if d > 1)
    assert t.tolist() == a.tolist()
    b = np.from_dlpack(t)
    np.testing.assert_array_equal(b, a)
    if a.size:
        assert b.__array_interface__["data"][0] == a.__array_interface__["data"][0]
    c = t.copy()
    assert c.strides == tuple(int(np.prod(a.shape[i + 1:])) for i in range(a.ndim))
    np.testing.assert_array_equal(np.from_dlpack(c), a)


def test_read_only_flag_is_carried_both_ways():
    a = np.arange(4.0)
    a.flags.writeable = False
    t = dlbridge.from_dlpack(a)
    assert t.readonly
    cap = t.__dlpack__(max_version=(1, 0))
    assert read_capsule(cap).flags & READ_ONLY
    b = np.from_dlpack(t)
    assert not b.flags.writeable
    w = dlbridge.from_dlpack(np.arange(3.0))
    assert not w.readonly and np.from_dlpack(w).flags.writeable


def test_legacy_export_of_read_only_tensor():
    a = np.arange(4.0)
    a.flags.writeable = False
    t = dlbridge.from_dlpack(a)
    with pytest.raises(BufferError, match="read-only"):
        t.__dlpack__()
    with pytest.raises(BufferError, match="read-only"):
        t.__dlpack__(max_version=(0, 8))
    cap = t.__dlpack__(copy=True)
    assert capsule_name(cap) == "dltensor"


@pytest.mark.parametrize(
    "max_version, name, version",
    [(None, "dltensor", None), ((0, 8), "dltensor", None), ((1, 0), "dltensor_versioned", (1, 3)),
     ((1, 3), "dltensor_versioned", (1, 3)), ((2, 0), "dltensor_versioned", (1, 3))],
)
def test_version_negotiation(max_version, name, version):
    t = dlbridge.from_dlpack(np.arange(6, dtype=np.int16).reshape(2, 3))
    cap = t.__dlpack__() if max_version is None else t.__dlpack__(max_version=max_version)
    assert capsule_name(cap) == name
    managed = read_capsule(cap)
    if version:
        assert (managed.version.major, managed.version.minor) == version
        assert managed.flags == 0
    shape, strides = shape_and_strides(managed.dl_tensor)
    assert shape == [2, 3] and strides == [3, 1], "strides are always filled in"
    assert np.from_dlpack(t).tolist() == [[0, 1, 2], [3, 4, 5]]


def test_bad_max_version_and_copy_types():
    t = dlbridge.zeros(3)
    with pytest.raises(TypeError, match="max_version"):
        t.__dlpack__(max_version=1)
    with pytest.raises(TypeError, match="copy"):
        t.__dlpack__(copy="yes")
    with pytest.raises(TypeError):
        t.__dlpack__(None)  # keyword-only


def test_export_copy_flags():
    a = np.arange(6.0).reshape(2, 3)
    t = dlbridge.from_dlpack(a)
    cap = t.__dlpack__(max_version=(1, 3), copy=True)
    managed = read_capsule(cap)
    assert managed.flags & IS_COPIED
    assert managed.dl_tensor.data != a.ctypes.data
    assert managed.dl_tensor.data % 64 == 0
    copied = np.from_dlpack(dlbridge.from_dlpack(cap))
    np.testing.assert_array_equal(copied, a)
    cap = t.__dlpack__(max_version=(1, 3), copy=False)
    assert read_capsule(cap).dl_tensor.data == a.ctypes.data
    assert not read_capsule(cap).flags & IS_COPIED


def test_export_dl_device_and_stream():
    t = dlbridge.from_dlpack(np.ones(3))
    assert t.__dlpack_device__() == (1, 0) == t.device
    assert capsule_name(t.__dlpack__(dl_device=(1, 0), max_version=(1, 0))) == "dltensor_versioned"
    # Host to CUDA is a copy dlbridge makes, as from_dlpack(a, device=(2, 0)) does (the GPU suite and
    # tests/fake_driver check it); without a driver it says so.
    if ctypes.util.find_library("cuda") is None:
        with pytest.raises(BufferError, match="CUDA is not available"):
            t.__dlpack__(dl_device=(2, 0))
    # The method reference: copy=False with a cross-device move is a BufferError; only a copy
    # needed for CPU access is a ValueError (the device suites check that direction).
    for device in ((2, 0), (3, 0), (13, 0)):
        with pytest.raises(BufferError, match="copy=False"):
            t.__dlpack__(dl_device=device, copy=False)
    with pytest.raises(BufferError, match="unsupported device"):
        t.__dlpack__(dl_device=(10, 0))
    with pytest.raises(TypeError, match="dl_device"):
        t.__dlpack__(dl_device="cpu")
    for stream in (0, 1, -1, 2):
        with pytest.raises(ValueError, match="stream must be None"):
            t.__dlpack__(stream=stream)
    t.__dlpack__(stream=None)


def test_from_dlpack_copy_and_device():
    a = np.arange(4.0)
    t = dlbridge.from_dlpack(a, copy=True)
    assert t.data_ptr != a.ctypes.data and t.is_copied
    a[0] = 50
    assert t.tolist()[0] == 0.0
    t = dlbridge.from_dlpack(a, copy=False)
    assert t.data_ptr == a.ctypes.data and not t.is_copied
    assert dlbridge.from_dlpack(a, device="cpu").data_ptr == a.ctypes.data
    assert dlbridge.from_dlpack(a, device=(1, 0)).data_ptr == a.ctypes.data
    with pytest.raises(BufferError):
        dlbridge.from_dlpack(a, device=(2, 0))
    with pytest.raises(ValueError, match="not understood"):
        dlbridge.from_dlpack(a, device="gpu")


def test_from_dlpack_rejects_non_producers():
    with pytest.raises(TypeError, match="does not support DLPack"):
        dlbridge.from_dlpack([1, 2, 3])
    with pytest.raises(TypeError):
        dlbridge.from_dlpack(b"bytes have a buffer but no __dlpack__")


def test_raw_capsules_are_consumed_once():
    a = np.arange(3.0)
    for cap in (a.__dlpack__(), a.__dlpack__(max_version=(1, 0))):
        name = capsule_name(cap)
        t = dlbridge.from_dlpack(cap)
        assert capsule_name(cap) == "used_" + name
        assert t.data_ptr == a.ctypes.data
        with pytest.raises(ValueError, match="already consumed"):
            dlbridge.from_dlpack(cap)


def test_foreign_capsule_name():
    cap = ctypes.pythonapi.PyCapsule_New(ctypes.c_void_p(8), b"not_a_tensor", None)
    with pytest.raises(ValueError, match="not a DLPack capsule"):
        dlbridge.from_dlpack(cap)


def test_lifetime_source_lives_until_tensor_and_capsules_are_gone(collect):
    class Array(np.ndarray):
        pass

    a = np.arange(10.0).view(Array)
    ref = weakref.ref(a)
    t = dlbridge.from_dlpack(a)
    caps = [t.__dlpack__(), t.__dlpack__(max_version=(1, 0))]
    view = np.from_dlpack(t)
    del a
    collect()
    assert ref() is not None
    del t
    collect()
    assert ref() is not None, "capsules and NumPy's view still hold it"
    del view
    collect()
    assert ref() is not None
    del caps
    collect()
    assert ref() is None


def test_producer_without_keywords_and_early_draft_producer():
    class OldProducer:
        """A pre-2023 producer: no keywords at all."""

        def __init__(self, a):
            self.a = a

        def __dlpack__(self, stream=None):
            return self.a.__dlpack__()

        def __dlpack_device__(self):
            return (1, 0)

    class DraftProducer:
        """The early draft's protocol: __dlpack_info__ and a version= keyword."""

        def __init__(self, a):
            self.a = a
            self.calls = []

        def __dlpack__(self, stream=None, version=None):
            self.calls.append(version)
            return self.a.__dlpack__()

        def __dlpack_info__(self):
            return 60

        def __dlpack_device__(self):
            return (1, 0)

    a = np.arange(5, dtype=np.int32)
    assert dlbridge.from_dlpack(OldProducer(a)).data_ptr == a.ctypes.data
    draft = DraftProducer(a)
    assert dlbridge.from_dlpack(draft).tolist() == [0, 1, 2, 3, 4]
    assert draft.calls == [None], "the draft producer is asked for its legacy ABI"
    t = dlbridge.from_dlpack(OldProducer(a), copy=True)
    assert t.data_ptr != a.ctypes.data


def test_producer_with_max_version_but_no_copy_keyword_still_gives_versioned():
    """The keyword ladder drops dl_device/copy before max_version, so the capsule stays versioned."""
    seen = []

    class Midway:
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, *, stream=None, max_version=None):
            seen.append(max_version)
            return self.a.__dlpack__(max_version=max_version)

    a = np.arange(3.0)
    a.flags.writeable = False
    t = dlbridge.from_dlpack(Midway(a), copy=False)
    assert t.readonly, "a versioned capsule carried READ_ONLY"
    assert seen == [(1, 3)]
    c = dlbridge.from_dlpack(Midway(a), copy=True)
    assert c.data_ptr != a.ctypes.data and not c.readonly


def test_copy_true_from_a_producer_that_cannot_copy():
    """TensorFlow refuses copy=True with RuntimeError, tvm-ffi with BufferError: dlbridge copies itself."""

    class NoCopy:
        def __init__(self, a, exc):
            self.a, self.exc = a, exc

        def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
            if copy:
                raise self.exc("this producer cannot copy")
            return self.a.__dlpack__(max_version=max_version)

    a = np.arange(4.0)
    for exc in (RuntimeError, BufferError):
        t = dlbridge.from_dlpack(NoCopy(a, exc), copy=True)
        assert t.data_ptr != a.ctypes.data and t.tolist() == a.tolist()

    class Broken:
        def __dlpack__(self, **kw):
            raise RuntimeError("broken producer")

    with pytest.raises(RuntimeError, match="broken producer"):
        dlbridge.from_dlpack(Broken(), copy=True)


def test_producer_errors_propagate():
    class Raising:
        def __dlpack__(self, **kw):
            raise BufferError("no export today")

    class NotACapsule:
        def __dlpack__(self, **kw):
            return 42

    with pytest.raises(BufferError, match="no export today"):
        dlbridge.from_dlpack(Raising())
    with pytest.raises(TypeError, match="not a DLPack capsule"):
        dlbridge.from_dlpack(NotACapsule())


def test_numpy_consumer_arguments_are_honoured():
    """np.from_dlpack passes dl_device, copy and max_version; we must honour each."""
    a = np.arange(6.0)
    t = dlbridge.from_dlpack(a)
    c = np.from_dlpack(t, copy=True)
    assert c.ctypes.data != a.ctypes.data
    np.testing.assert_array_equal(c, a)
    assert np.from_dlpack(t, copy=False).ctypes.data == a.ctypes.data
    assert np.from_dlpack(t, device="cpu").ctypes.data == a.ctypes.data


def test_empty_zeros_repr_len():
    z = dlbridge.zeros((2, 3), "int64")
    assert z.tolist() == [[0, 0, 0], [0, 0, 0]]
    assert z.data_ptr % 64 == 0
    assert repr(z) == "Tensor(shape=(2, 3), dtype=int64, device=cpu:0)"
    e = dlbridge.empty(4)
    assert e.shape == (4,) and e.dtype == "float32" and len(e) == 4
    assert dlbridge.zeros((), "bool").tolist() is False
    with pytest.raises(TypeError):
        len(dlbridge.zeros(()))
    assert dlbridge.zeros((0, 3)).tolist() == []
    with pytest.raises(ValueError, match="negative dimensions are not allowed"):
        dlbridge.zeros((-1,))
    n = np.from_dlpack(dlbridge.zeros((3,), dlbridge.DType("uint16")))
    n[:] = 7
    assert n.dtype == np.uint16


def test_non_native_byte_order_and_unsupported_dtypes_from_numpy():
    with pytest.raises(BufferError):
        dlbridge.from_dlpack(np.arange(3, dtype=">f4"))
    with pytest.raises(BufferError):
        dlbridge.asarray(np.arange(3, dtype=">f4").data)


def test_arrays_numpy_itself_refuses_are_refused_the_same_way():
    """Exact ndarrays of standard dtypes are read without a capsule; anything else goes through
    NumPy's __dlpack__, so its refusals are ours too."""
    record = np.zeros(4, dtype=[("a", "i4"), ("b", "i2")])["a"]  # stride 6, itemsize 4
    with pytest.raises(BufferError, match="multiple of itemsize"):
        dlbridge.from_dlpack(record)
    with pytest.raises(BufferError):
        dlbridge.from_dlpack(np.zeros(2, dtype=np.longdouble))
    with pytest.raises(BufferError):
        dlbridge.from_dlpack(np.array(["x"], dtype=object))

    class Sub(np.ndarray):
        pass

    s = np.arange(4.0).view(Sub)
    assert dlbridge.from_dlpack(s).data_ptr == s.ctypes.data
    m = np.arange(4.0).reshape(2, 2)[:, :1]  # size-1 axis with any stride
    assert dlbridge.from_dlpack(m).tolist() == [[0.0], [2.0]]


def test_nbytes_is_exact_however_large():
    # A stride-0 broadcast of 2**62 float32 elements takes 2**64 bytes when contiguous; nbytes once
    # saturated at 2**64 - 1 (probes, finding 6).
    torch = pytest.importorskip("torch")
    t = dlbridge.from_dlpack(torch.ones(1).expand(2**62))
    assert t.size * 4 == t.nbytes == 2**64
    assert dlbridge.zeros(5, "int4").nbytes == 3 and dlbridge.zeros((2, 3), "float64").nbytes == 48


def test_messages_pick_a_or_an():
    import array

    import scale_inplace
    with pytest.raises(TypeError, match=r"got an array\.array of float64"):
        scale_inplace.total(array.array("d", [1.0]))

    class IntReturner:
        def __dlpack__(self, **kwargs):
            return 3

        def __dlpack_device__(self):
            return (1, 0)
    with pytest.raises(TypeError, match="__dlpack__ returned an int, not a DLPack capsule"):
        dlbridge.from_dlpack(IntReturner())
