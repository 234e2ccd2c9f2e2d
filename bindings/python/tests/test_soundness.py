"""The soundness and faithfulness contract, one test per defect found from outside: no wrong data,
no write into read-only memory, no crash on plain Python input, and the same refusals as going
directly. Cases that crashed the process before run in a child process, so a crash is a failure."""

import ctypes
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import dlbridge
from dlbridge import _native
from dlpack_ctypes import READ_ONLY, FakeProducer, read_capsule
from test_exchange_api import ALLOCATOR, SET_ERROR, DLDataType, DLDevice, DLTensor, table

HERE = Path(__file__).parent


def run_child(code):
    """Runs `code` in a fresh interpreter; returns its stdout, failing on any crash."""
    prelude = f"import sys; sys.path.insert(0, {str(HERE)!r})\n"
    proc = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"child died with {proc.returncode}: {proc.stderr[-3000:]}"
    return proc.stdout


# --- writability is relayed faithfully -------------------------------------------------------


def test_legacy_import_is_read_only_when_relayed():
    p = FakeProducer(versioned=False)
    t = dlbridge.from_dlpack(p.capsule())
    assert t.readonly, "a legacy capsule cannot say it is writable"
    caps = t.__dlpack__(max_version=(1, 3))
    assert read_capsule(caps).flags & READ_ONLY, "re-exported versioned with READ_ONLY"
    del caps
    a = np.from_dlpack(t)
    assert not a.flags.writeable
    assert memoryview(t).readonly
    assert not np.asarray(t).flags.writeable
    with pytest.raises(TypeError, match="read-only"):
        memoryview(t).cast("B")[0:1] = b"\x00"
    # A legacy consumer loses nothing it had: the legacy export is still given.
    legacy = t.__dlpack__()
    assert read_capsule(legacy).dl_tensor.ndim == 2
    # And the chain keeps the unknown: a Tensor made from this Tensor is still read-only.
    assert dlbridge.from_dlpack(t).readonly
    assert dlbridge.from_dlpack(dlbridge.from_dlpack(t)).__dlpack__() is not None


def test_jax_array_through_dlbridge_stays_immutable():
    jax = pytest.importorskip("jax")
    x = jax.numpy.arange(4.0)
    t = dlbridge.from_dlpack(x)
    assert t.readonly
    a = np.from_dlpack(t)
    assert not a.flags.writeable
    with pytest.raises(ValueError):
        a[0] = 42.0
    assert np.asarray(x).tolist() == [0.0, 1.0, 2.0, 3.0]
    # JAX still takes it back (it asks for a legacy capsule).
    assert np.asarray(jax.numpy.from_dlpack(t)).tolist() == [0.0, 1.0, 2.0, 3.0]


def test_versioned_writable_import_stays_writable():
    a = np.arange(4.0)
    t = dlbridge.from_dlpack(a)
    assert not t.readonly
    b = np.from_dlpack(t)
    b[0] = 7.0
    assert a[0] == 7.0


# --- writable borrows only where the producer said so -----------------------------------------


def test_read_then_write_refuses_read_only_and_unknown_memory():
    data = b"\x01\x02\x03\x04"
    with pytest.raises(BufferError, match="read-only"):
        _native._read_then_write(np.zeros(1, np.uint8), dlbridge.asarray(memoryview(data)))
    assert data == b"\x01\x02\x03\x04"
    ro = np.zeros(4, np.uint8)
    ro.flags.writeable = False
    with pytest.raises(BufferError, match="read-only"):
        _native._read_then_write(np.zeros(1, np.uint8), ro)
    # Bound to a name: the fake's ctypes destructor must not run while the error is in flight.
    legacy = FakeProducer(values=(1.0,), shape=(1,), versioned=False, dtype=(1, 8, 1))
    capsule = legacy.capsule()
    with pytest.raises(BufferError, match="legacy DLPack capsule"):
        _native._read_then_write(np.zeros(1, np.uint8), capsule)
    del capsule
    with pytest.raises(BufferError, match="overlap"):
        _native._read_then_write(np.zeros(1, np.uint8), np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), (4,), (0,)))
    assert _native._live_borrows() == 0


def test_writable_arguments_write_in_place():
    a = np.zeros(4, np.uint8)
    assert _native._read_then_write(np.zeros(3, np.uint8), a) == 3
    assert a.tolist() == [1, 1, 1, 1]
    b = bytearray(2)
    _native._read_then_write(b"", b)
    assert b == b"\x01\x01"
    torch = pytest.importorskip("torch")
    t = torch.zeros(3, dtype=torch.uint8)
    _native._read_then_write(t, t[:0])
    _native._read_then_write(a, t)
    assert t.tolist() == [1, 1, 1]


def test_aliasing_arguments_are_refused():
    a = np.zeros(8, np.uint8)
    with pytest.raises(BufferError, match="already borrowed as read"):
        _native._read_then_write(a, a)
    with pytest.raises(BufferError, match="already borrowed as read"):
        _native._read_then_write(a[2:6], a[4:])
    assert a.tolist() == [0] * 8, "nothing was written through a refused borrow"
    _native._read_then_write(a[:4], a[4:])  # disjoint halves are fine
    assert a.tolist() == [0] * 4 + [1] * 4
    assert _native._live_borrows() == 0


def test_scale_inplace_refuses_immutable_bytes():
    scale_inplace = pytest.importorskip("scale_inplace")
    data = bytes(np.arange(4, dtype=np.float32).tobytes())
    before = bytes(data)
    with pytest.raises(BufferError, match="read-only"):
        scale_inplace.scale(dlbridge.asarray(memoryview(data).cast("f")), 2.0)
    assert data == before


# --- an import through a producer's C table equals its __dlpack__ -----------------------------


def test_torch_table_import_refuses_what_dunder_dlpack_refuses():
    torch = pytest.importorskip("torch")
    conj = torch.tensor([1 + 1j, 2 - 3j]).conj()
    with pytest.raises(BufferError, match="conjugate"):
        conj.__dlpack__()
    with pytest.raises(BufferError, match="conjugate"):
        dlbridge.from_dlpack(conj)
    assert dlbridge.from_dlpack(conj.resolve_conj()).tolist() == [1 - 1j, 2 + 3j]
    grad = torch.ones(3, requires_grad=True)
    with pytest.raises(BufferError, match="require gradient"):
        dlbridge.from_dlpack(grad)
    with pytest.raises(BufferError, match="require gradient"):
        dlbridge.from_dlpack(torch.nn.Parameter(torch.ones(2)))
    assert dlbridge.from_dlpack(grad.detach()).tolist() == [1.0, 1.0, 1.0]
    # torch's own __dlpack__ gives the un-negated values of a negative view; dlbridge refuses.
    neg = torch.tensor([1.0, -2.0])._neg_view()
    with pytest.raises(BufferError, match="negative bit"):
        dlbridge.from_dlpack(neg)
    assert dlbridge.from_dlpack(neg.resolve_neg()).tolist() == [-1.0, 2.0]


def test_torch_table_failures_fall_back_to_dunder_dlpack():
    torch = pytest.importorskip("torch")
    sparse = torch.eye(3).to_sparse()
    with pytest.raises(BufferError, match="strided"):
        dlbridge.from_dlpack(sparse)
    q = torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8)
    with pytest.raises(BufferError) as direct:
        q.__dlpack__()
    with pytest.raises(type(direct.value)):
        dlbridge.from_dlpack(q)


def test_subclass_overriding_dunder_dlpack_is_honoured():
    torch = pytest.importorskip("torch")

    class Refusing(torch.Tensor):
        def __dlpack__(self, *args, **kwargs):
            raise BufferError("this subclass exports nothing")

    x = torch.ones(2).as_subclass(Refusing)
    with pytest.raises(BufferError, match="exports nothing"):
        dlbridge.from_dlpack(x)


# --- plain Python cannot crash the process ----------------------------------------------------


def test_a_class_named_numpy_ndarray_is_not_read_as_numpy():
    out = run_child("""
        import dlbridge
        Fake = type("numpy.ndarray", (), {})
        for attempt in range(2):
            try:
                dlbridge.from_dlpack(Fake())
            except TypeError as e:
                print("refused", attempt)
        import numpy as np
        try:
            dlbridge.from_dlpack(Fake())
        except TypeError:
            print("refused after numpy")
        a = np.arange(3.0)
        t = dlbridge.from_dlpack(a)
        print(t.data_ptr == a.ctypes.data, t.tolist())
    """)
    assert out.split("\n")[:4] == ["refused 0", "refused 1", "refused after numpy", "True [0.0, 1.0, 2.0]"]


def test_numpy_ndarray_rebound_to_an_impostor_is_not_read_as_numpy():
    # numpy.ndarray is an attribute anyone can rebind. Rebound while dlbridge first looked, it once
    # made a plain class, whose slots lie where NumPy's struct keeps data, descr and flags, read as
    # a writable float32 array: `scale` then wrote into the object its "data" slot held.
    out = run_child("""
        import sys, numpy as np, dlbridge, scale_inplace
        Imp = type("numpy.ndarray", (), {"__slots__": ("s0", "s1", "s2", "s3", "s4", "s5", "s6")})
        target = bytearray(b"victim")
        imp = Imp()
        imp.s0 = target                   # "data": the bytearray's own header
        imp.s5 = 0x3D0000 + 11 * 2**30    # "descr": an int whose bytes say float32
        imp.s6 = next(o for o in (object() for _ in range(1000)) if id(o) & 0x400)  # "WRITEABLE"
        before = sys.getrefcount(target)
        real, np.ndarray = np.ndarray, Imp
        for take in (scale_inplace.total, lambda x: scale_inplace.scale(x, 2.0), dlbridge.from_dlpack):
            try:
                take(imp)
                print("taken")
            except TypeError:
                print("refused")
        np.ndarray = real
        print(sys.getrefcount(target) == before, bytes(target))
        a = np.ones(3, np.float32)
        scale_inplace.scale(a, 2.0)
        print(scale_inplace.total(a), dlbridge.from_dlpack(a).data_ptr == a.ctypes.data)
    """)
    assert out.split("\n")[:5] == ["refused", "refused", "refused", "True b'victim'", "6.0 True"]


def test_torch_tensor_rebound_while_dlbridge_first_looks_changes_no_trust():
    # torch.Tensor is an attribute too. Rebound to torch's ReadOnlyTensorWrapper while dlbridge
    # first looked at torch, it once made the wrapper's read-only table trusted as torch's own:
    # `scale` then wrote a copy-on-write clone's memory, shared with a tensor never passed in.
    pytest.importorskip("torch")
    out = run_child("""
        import torch, scale_inplace
        from torch.utils.dlpack import ReadOnlyTensorWrapper
        base = torch.arange(4, dtype=torch.float32)
        wrapped = ReadOnlyTensorWrapper(torch._lazy_clone(base))
        real, torch.Tensor = torch.Tensor, ReadOnlyTensorWrapper
        with torch._C.DisableTorchFunctionSubclass():
            print(scale_inplace.total(wrapped))
        torch.Tensor = real
        with torch._C.DisableTorchFunctionSubclass():
            try:
                scale_inplace.scale(wrapped, 10.0)
                print("written")
            except BufferError:
                print("refused")
        print(base.tolist())
        # torch's checks still run on plain tensors, and torch's own table is still writable.
        x = torch.ones(2, requires_grad=True)
        try:
            scale_inplace.total(x)
            print("taken")
        except BufferError:
            print("refused")
        y = torch.ones(2)
        scale_inplace.scale(y, 3.0)
        print(y.tolist())
    """)
    assert out.split("\n")[:5] == ["6.0", "refused", "[0.0, 1.0, 2.0, 3.0]", "refused", "[3.0, 3.0]"]


def test_integer_exchange_api_attribute_is_not_followed():
    out = run_child("""
        import dlbridge, numpy as np
        class Liar:
            __c_dlpack_exchange_api__ = 0x10
            def __init__(self): self.a = np.arange(2.0)
            def __dlpack__(self, **kw): return self.a.__dlpack__(**kw)
        print(dlbridge.from_dlpack(Liar()).tolist())
        class LiarCapsule:
            __dlpack_c_exchange_api__ = 0x10
        try:
            dlbridge.from_dlpack(LiarCapsule())
        except TypeError:
            print("refused")
    """)
    assert out.split("\n")[:2] == ["[0.0, 1.0]", "refused"]


def test_ctypes_arrays_and_scalars():
    out = run_child("""
        import ctypes, dlbridge, numpy as np
        t = dlbridge.asarray((ctypes.c_int * 3)(1, 2, 3))
        print(t.shape, t.tolist())
        t = dlbridge.asarray(((ctypes.c_double * 2) * 3)())
        print(t.shape, t.strides)
        for scalar in (ctypes.c_double(3.5), np.float64(3.5), memoryview(np.array(3.5))):
            t = dlbridge.asarray(scalar)
            print(t.shape, t.tolist())
    """)
    assert out.split("\n")[:5] == ["(3,) [1, 2, 3]", "(3, 2) (2, 1)", "() 3.5", "() 3.5", "() 3.5"]


def test_failed_allocations_raise_memory_error():
    with pytest.raises(MemoryError):
        dlbridge.zeros((2**50,), "uint8")
    huge = np.broadcast_to(np.float64(1.0), (2**22, 2**22))
    with pytest.raises(MemoryError):
        dlbridge.from_dlpack(huge, copy=True)
    t = dlbridge.from_dlpack(huge)
    with pytest.raises(MemoryError):
        np.from_dlpack(t, copy=True)
    with pytest.raises(MemoryError):
        t.copy()


def test_exchange_allocator_reports_memory_error_through_set_error():
    api = table(dlbridge.Tensor)
    shape = (ctypes.c_int64 * 1)(2**50)
    proto = DLTensor(None, DLDevice(1, 0), 1, DLDataType(1, 8, 1), shape, None, 0)
    out = ctypes.c_void_p()
    errors = []
    on_error = SET_ERROR(lambda ctx, kind, msg: errors.append(kind))
    assert ALLOCATOR(api.managed_tensor_allocator)(ctypes.pointer(proto), ctypes.byref(out), None, on_error) == -1
    assert errors == [b"MemoryError"] and not out.value


def test_current_work_stream_with_null_out_sets_an_exception():
    api = table(dlbridge.Tensor)
    stream = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p)(api.current_work_stream)
    with pytest.raises(ValueError, match="NULL out pointer"):
        stream(2, 0, None)


def test_failed_dunder_dlpack_calls_do_not_leak():
    t = dlbridge.from_dlpack(FakeProducer(versioned=True).capsule())
    ro = dlbridge.asarray(b"abcd")
    before = sys.getrefcount(BufferError)
    for _ in range(20_000):
        try:
            ro.__dlpack__()  # read-only: refused as legacy
        except BufferError:
            pass
        try:
            t.__dlpack__(stream=5)  # a stream on the CPU
        except ValueError:
            pass
        try:
            t.__dlpack__(bogus=1)
        except TypeError:
            pass
    assert sys.getrefcount(BufferError) - before < 100


def test_unknown_device_type_is_a_buffer_error():
    out = run_child("""
        import gc, dlbridge
        from dlpack_ctypes import FakeProducer
        p = FakeProducer(); p.tensor.device.device_type = 99
        capsule = p.capsule()
        try:
            dlbridge.from_dlpack(capsule)
        except BufferError as e:
            print("BufferError:", e)
        del capsule
        gc.collect()
        print("deleted", p.deleted)
    """)
    assert "BufferError: device type 99 is not one that DLPack defines" in out and "deleted 1" in out


# --- found by the adversarial review ----------------------------------------------------------


@pytest.mark.parametrize("shape", [(2**62 + 1,), (2**61,), (2**31, 2**31)])
def test_a_broadcast_too_large_for_the_buffer_protocol_is_refused(shape):
    # A broadcast of one element can name more bytes than a Py_ssize_t holds: the buffer's length
    # once wrapped (to 4 bytes, a negative size, or 0), and bytes(t) copied the shape's worth of
    # elements into it, a crash.
    pytest.importorskip("torch")
    out = run_child(f"""
        import torch, dlbridge
        t = dlbridge.from_dlpack(torch.ones(1).expand(*{shape!r}))
        for take in (memoryview, bytes, bytearray):
            try:
                take(t)
                print("taken")
            except BufferError as e:
                print("refused", "too large for the buffer protocol" in str(e))
        print(memoryview(dlbridge.from_dlpack(torch.ones(1).expand(3))).tobytes() == bytes(torch.ones(3).numpy()))
    """)
    assert out.split("\n")[:4] == ["refused True"] * 3 + ["True"]


def test_buffer_request_without_nd_has_no_ndim_to_trust():
    out = run_child("""
        import ctypes, dlbridge, numpy as np
        class Py_buffer(ctypes.Structure):
            _fields_ = [('buf', ctypes.c_void_p), ('obj', ctypes.c_void_p), ('len', ctypes.c_ssize_t),
                        ('itemsize', ctypes.c_ssize_t), ('readonly', ctypes.c_int), ('ndim', ctypes.c_int),
                        ('format', ctypes.c_char_p), ('shape', ctypes.c_void_p), ('strides', ctypes.c_void_p),
                        ('suboffsets', ctypes.c_void_p), ('internal', ctypes.c_void_p)]
        get = ctypes.pythonapi.PyObject_GetBuffer
        get.argtypes = [ctypes.py_object, ctypes.POINTER(Py_buffer), ctypes.c_int]
        view = ctypes.pythonapi.PyMemoryView_FromBuffer
        view.argtypes = [ctypes.POINTER(Py_buffer)]
        view.restype = ctypes.py_object
        t = dlbridge.from_dlpack(np.arange(6, dtype=np.float32).reshape(2, 3))
        for flags in (0, 4):  # PyBUF_SIMPLE, PyBUF_FORMAT
            b = Py_buffer()
            get(t, ctypes.byref(b), flags)
            m = view(ctypes.byref(b))
            print(b.ndim, b.shape, m.nbytes, m.format)
    """)
    assert out.splitlines()[:2] == ["1 None 24 B", "1 None 24 f"]


def test_a_dunder_dlpack_assigned_after_first_use_is_honoured():
    torch = pytest.importorskip("torch")

    class Later(torch.Tensor):
        pass

    x = torch.arange(4.0).as_subclass(Later)
    assert dlbridge.from_dlpack(x).tolist() == [0.0, 1.0, 2.0, 3.0]

    def refuse(self, **kwargs):
        raise BufferError("Later refuses export")

    Later.__dlpack__ = refuse
    with pytest.raises(BufferError, match="Later refuses"):
        dlbridge.from_dlpack(x)


def test_dtype_equality_agrees_with_its_hash():
    d = dlbridge.DType("float32")
    assert d == "float32" and hash(d) == hash("float32")
    assert d != "float32x1"
    with pytest.raises(ValueError):
        dlbridge.DType("float32x0")
    with pytest.raises(ValueError):
        dlbridge.zeros(2, "int0")


def test_far_future_max_version_gets_the_newest_capsule():
    t = dlbridge.zeros(2)
    capsule = t.__dlpack__(max_version=(2**70, 0))
    assert read_capsule(capsule).version.major == 1
    with pytest.raises(TypeError):
        t.__dlpack__(max_version=(True, 0))


def test_a_tensor_freed_while_an_exception_propagates_keeps_it():
    # The temporary Tensor is freed after __dlpack__ raised; its producer's deleter is a ctypes
    # callback, which would turn the ValueError into a SystemError if it ran with it set.
    with pytest.raises(ValueError, match="stream"):
        dlbridge.from_dlpack(FakeProducer().capsule()).__dlpack__(stream=5)


def test_empty_tensors_pickle_in_band_and_out():
    import pickle

    for protocol in (2, 4, 5):
        for t in (dlbridge.zeros((0,)), dlbridge.zeros((3, 0), "int8"), dlbridge.asarray(b"")):
            u = pickle.loads(pickle.dumps(t, protocol=protocol))
            assert u.shape == t.shape and str(u.dtype) == str(t.dtype)


def test_writable_argument_refuses_a_producers_copy():
    from dlpack_ctypes import IS_COPIED

    p = FakeProducer(values=(1.0,), shape=(1,), dtype=(1, 8, 1))
    p.managed.flags = IS_COPIED
    capsule = p.capsule()
    with pytest.raises(BufferError, match="IS_COPIED"):
        _native._read_then_write(np.zeros(1, np.uint8), capsule)
    del capsule
