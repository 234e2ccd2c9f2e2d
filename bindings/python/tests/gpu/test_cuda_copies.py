"""Every copy direction dlbridge offers for CUDA, with the values checked, over contiguous, strided,
offset, negative-strided, 0-d and empty layouts:

- device -> host: `from_dlpack(x, device="cpu")`, and `Tensor.__dlpack__(dl_device=(1, 0))`, which
  hands out a host copy flagged IS_COPIED (copy=False then raises ValueError);
- device -> device: `copy=True` gives fresh device memory;
- host -> device: `from_dlpack(a, device=(2, 0))`, memory dlbridge owns and every peer takes as is;
- host or device -> pinned host memory: `device=(3, 0)` (kDLCUDAHost), and pinned -> device."""

import ctypes
import gc

from cuda_support import (
    CPU, CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_HOST, CUDA, CUDA_HOST, memory_type, read_host_floats, require_cuda,
    torch_cai,
)

torch = require_cuda()

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import dlbridge  # noqa: E402
from dlpack_ctypes import IS_COPIED, capsule_name, read_capsule  # noqa: E402


def base():
    x = torch.arange(24, dtype=torch.float32, device="cuda").reshape(4, 6)
    torch.cuda.synchronize()
    return x


def negative_strides():
    """Rows and columns reversed, through a CUDA array interface (torch has no negative strides)."""
    x = base()
    t = dlbridge.asarray(torch_cai(x, data=x[3, 5].data_ptr(), strides=(-24, -4), stream=1))
    assert t.strides == (-6, -1)
    return t, x.flip(0, 1)


LAYOUTS = {
    "contiguous": lambda: (base(),) * 2,
    "transposed": lambda: (base().T,) * 2,
    "offset and step": lambda: (base()[1:, ::2],) * 2,
    "negative strides": negative_strides,
    "0-d": lambda: (base()[1, 2],) * 2,
    "empty": lambda: (base()[:0],) * 2,
}


@pytest.fixture(params=list(LAYOUTS))
def source(request):
    """(a CUDA tensor to copy from, torch or dlbridge; the values it holds, as a NumPy array)."""
    src, view = LAYOUTS[request.param]()
    return src, view.cpu().numpy()


def ptr(src):
    return src.data_ptr() if isinstance(src, torch.Tensor) else src.data_ptr


def c_strides(shape):
    """C-contiguous strides in elements."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def host_values(t):
    """The values of a host dlbridge tensor, read through NumPy's array interface."""
    return np.asarray(t)


def test_device_to_host(source):
    src, expected = source
    for device in ("cpu", (CPU, 0)):
        h = dlbridge.from_dlpack(src, device=device)
        assert h.device == (CPU, 0) and h.shape == expected.shape
        np.testing.assert_array_equal(host_values(h), expected)
        assert h.tolist() == expected.tolist()
        assert expected.size == 0 or (h.data_ptr != ptr(src) and memory_type(h.data_ptr) != CU_MEMORYTYPE_DEVICE)
    with pytest.raises(ValueError, match="cannot move .* tensor from .*"):  # the words torch's own suite expects
        dlbridge.from_dlpack(src, device="cpu", copy=False)


def test_export_to_host_is_a_flagged_copy(source):
    src, expected = source
    t = dlbridge.from_dlpack(src)
    assert t.device[0] == CUDA
    cap = t.__dlpack__(dl_device=(CPU, 0), max_version=(1, 3))
    assert capsule_name(cap) == "dltensor_versioned"
    managed = read_capsule(cap)
    assert managed.flags & IS_COPIED
    assert (managed.dl_tensor.device.device_type, managed.dl_tensor.device.device_id) == (CPU, 0)
    h = dlbridge.from_dlpack(cap)
    assert h.device == (CPU, 0) and h.is_copied and h.shape == expected.shape
    assert h.tolist() == expected.tolist()
    with pytest.raises(ValueError, match="cannot move .* tensor from .*"):
        t.__dlpack__(dl_device=(CPU, 0), max_version=(1, 3), copy=False)
    h = dlbridge.from_dlpack(t.__dlpack__(dl_device=(CPU, 0), max_version=(1, 3), copy=True))
    assert h.is_copied and h.tolist() == expected.tolist()


def test_host_consumers_ask_for_a_host_copy(source):
    """NumPy's `from_dlpack(t, device="cpu")` asks for dl_device=(1, 0), a host copy from dlbridge;
    torch's imports on the device and copies itself."""
    src, expected = source
    t = dlbridge.from_dlpack(src)
    np.testing.assert_array_equal(np.from_dlpack(t, device="cpu"), expected)
    if all(s >= 0 for s in t.strides):  # torch refuses negative strides
        y = torch.from_dlpack(t, device="cpu")
        assert y.device.type == "cpu"
        np.testing.assert_array_equal(y.numpy(), expected)


def test_device_to_device_copy(source):
    src, expected = source
    c = dlbridge.from_dlpack(src, copy=True)
    assert c.device == (CUDA, 0) and c.shape == expected.shape
    assert expected.size == 0 or (c.data_ptr != ptr(src) and memory_type(c.data_ptr) == CU_MEMORYTYPE_DEVICE)
    assert dlbridge.from_dlpack(c, device="cpu").tolist() == expected.tolist()
    # Fresh memory: a write to the source is not seen in the copy (torch sources, which torch writes).
    if isinstance(src, torch.Tensor) and expected.size:
        src.fill_(-1)
        torch.cuda.synchronize()
        assert dlbridge.from_dlpack(c, device="cpu").tolist() == expected.tolist()


def test_export_copy_on_the_device(source):
    src, expected = source
    t = dlbridge.from_dlpack(src)
    cap = t.__dlpack__(copy=True, max_version=(1, 3))
    managed = read_capsule(cap)
    assert managed.flags & IS_COPIED and managed.dl_tensor.device.device_type == CUDA
    u = dlbridge.from_dlpack(cap)
    assert u.is_copied and u.device == t.device
    assert expected.size == 0 or u.data_ptr != t.data_ptr
    assert dlbridge.from_dlpack(u, device="cpu").tolist() == expected.tolist()


def test_no_copy_when_already_there(source):
    src, expected = source
    for copy in (None, False):
        t = dlbridge.from_dlpack(src, device=(CUDA, 0), copy=copy)
        assert t.data_ptr == ptr(src) and not t.is_copied


HOST_LAYOUTS = {
    "contiguous": lambda a: a,
    "transposed": lambda a: a.T,
    "offset and step": lambda a: a[1:, ::2],
    "negative strides": lambda a: a[::-1, ::-2],
    "0-d": lambda a: np.array(a[1, 2]),  # a[1, 2] alone is a NumPy scalar, which has no __dlpack__
    "empty": lambda a: a[:0],
}


@pytest.fixture(params=list(HOST_LAYOUTS))
def host_source(request):
    return HOST_LAYOUTS[request.param](np.arange(24, dtype=np.float32).reshape(4, 6))


def test_host_to_device(host_source):
    a = host_source
    t = dlbridge.from_dlpack(a, device=(CUDA, 0))
    assert t.device == (CUDA, 0) and t.shape == a.shape and not t.readonly
    assert a.size == 0 or memory_type(t.data_ptr) == CU_MEMORYTYPE_DEVICE
    assert dlbridge.from_dlpack(t, device="cpu").tolist() == a.tolist()
    if all(s >= 0 for s in t.strides):  # torch refuses negative strides
        y = torch.from_dlpack(t)
        assert y.device == torch.device("cuda", 0) and (y.data_ptr() == t.data_ptr or not a.size)
        np.testing.assert_array_equal(y.cpu().numpy(), a)
    with pytest.raises(ValueError):
        dlbridge.from_dlpack(a, device=(CUDA, 0), copy=False)


def test_host_export_to_the_device(host_source):
    """The other way round: a host dlbridge tensor asked for dl_device=(2, 0) gives a device copy,
    as `from_dlpack(a, device=(2, 0))` does (the one answer of both suites and the README)."""
    a = host_source
    t = dlbridge.from_dlpack(a)
    cap = t.__dlpack__(dl_device=(CUDA, 0), max_version=(1, 3))
    managed = read_capsule(cap)
    assert managed.flags & IS_COPIED and managed.dl_tensor.device.device_type == CUDA
    u = dlbridge.from_dlpack(cap)
    assert u.device == (CUDA, 0) and u.is_copied
    assert dlbridge.from_dlpack(u, device="cpu").tolist() == a.tolist()
    if all(s >= 0 for s in u.strides):
        np.testing.assert_array_equal(torch.from_dlpack(u).cpu().numpy(), a)


def test_host_to_pinned(host_source):
    a = host_source
    p = dlbridge.from_dlpack(a, device=(CUDA_HOST, 0))
    assert p.device == (CUDA_HOST, 0) and p.shape == a.shape
    assert a.size == 0 or memory_type(p.data_ptr) == CU_MEMORYTYPE_HOST
    contiguous = dlbridge.from_dlpack(p, device="cpu")
    assert contiguous.device == (CPU, 0) and contiguous.tolist() == a.tolist()
    # Pinned memory is host memory: the CPU reads it in place.
    dense = a.size and p.strides == c_strides(p.shape)
    assert not dense or read_host_floats(p.data_ptr, a.size) == a.ravel().tolist()


def test_device_to_pinned_and_back(source):
    src, expected = source
    p = dlbridge.from_dlpack(src, device=(CUDA_HOST, 0))
    assert p.device == (CUDA_HOST, 0) and p.shape == expected.shape
    assert expected.size == 0 or memory_type(p.data_ptr) == CU_MEMORYTYPE_HOST
    assert dlbridge.from_dlpack(p, device="cpu").tolist() == expected.tolist()
    d = dlbridge.from_dlpack(p, device=(CUDA, 0))
    assert d.device == (CUDA, 0) and dlbridge.from_dlpack(d, device="cpu").tolist() == expected.tolist()


def test_pinned_memory_is_read_by_the_cpu_in_place():
    a = np.arange(8, dtype=np.float32)
    p = dlbridge.from_dlpack(a, device=(CUDA_HOST, 0))
    assert p.strides == (1,) and memory_type(p.data_ptr) == CU_MEMORYTYPE_HOST
    assert read_host_floats(p.data_ptr, 8) == a.tolist()
    ctypes_view = (ctypes.c_float * 8).from_address(p.data_ptr)
    ctypes_view[0] = 42
    assert dlbridge.from_dlpack(p, device="cpu").tolist()[0] == 42
    assert dlbridge.from_dlpack(p, device=(CUDA, 0), copy=True).__dlpack_device__() == (CUDA, 0)


def test_torch_takes_pinned_memory_in_place_or_refuses_it_cleanly():
    p = dlbridge.from_dlpack(np.arange(8, dtype=np.float32), device=(CUDA_HOST, 0))
    try:
        y = torch.from_dlpack(p)
        print(f"torch {torch.__version__} takes kDLCUDAHost tensors, as {y.device}")
    except (RuntimeError, BufferError) as e:  # a torch that does not take kDLCUDAHost tensors
        print(f"torch {torch.__version__} refuses kDLCUDAHost tensors: {e}")
        assert "3" in str(e) or "device" in str(e).lower(), e
        y = torch.from_dlpack(dlbridge.from_dlpack(p, device="cpu"))  # asked for on the CPU: kDLCPU
    assert y.device.type == "cpu" and y.data_ptr() == p.data_ptr
    y[0] = 42
    assert read_host_floats(p.data_ptr, 1) == [42.0]


def test_copies_outlive_their_source():
    x = base()
    h = dlbridge.from_dlpack(x, device="cpu")
    c = dlbridge.from_dlpack(x, copy=True)
    p = dlbridge.from_dlpack(x, device=(CUDA_HOST, 0))
    expected = x.cpu().tolist()
    del x
    gc.collect()
    torch.cuda.empty_cache()
    torch.zeros(24, device="cuda")  # reuse the freed block, if the copy still pointed at it
    for t in (h, c, p):
        assert dlbridge.from_dlpack(t, device="cpu").tolist() == expected


def test_managed_memory_is_read_on_the_host_and_copied_to_where_it_is_asked(cupy):
    """Managed memory (CuPy's `malloc_managed`, handed over by its address alone, so that the driver
    says what it is: kDLCUDAManaged, 13) is readable from the host once the GPU work on it is done,
    which dlbridge waits for; a copy dlbridge makes is managed memory again, or host memory when the
    caller asks for the CPU."""
    from cuda_support import CudaArrayInterface

    memory = cupy.cuda.malloc_managed(6 * 4)
    c = cupy.ndarray((6,), dtype=cupy.float32, memptr=memory)
    c[...] = cupy.arange(6, dtype=cupy.float32) * 2
    stream = cupy.cuda.get_current_stream().ptr or 1  # CuPy's null stream is the legacy one
    t = dlbridge.asarray(CudaArrayInterface(c, shape=(6,), typestr="<f4", data=(c.data.ptr, False), stream=stream))
    assert t.device == (13, c.device.id), "labelled by the driver"
    assert np.asarray(t).tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0], "read on the host, zero-copy"
    h = dlbridge.from_dlpack(t, device="cpu", copy=True)
    assert h.device == (CPU, 0) and h.is_copied and h.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    z = dlbridge.from_dlpack(t, device="cpu")
    assert z.device == (CPU, 0) and z.data_ptr == c.data.ptr and not z.is_copied, "relabelled, zero-copy"
    d = dlbridge.from_dlpack(t, copy=True)
    assert d.device == (13, c.device.id) and d.is_copied and d.data_ptr != c.data.ptr
    assert np.asarray(d).tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert cupy.asnumpy(cupy.from_dlpack(d) * 1).tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0], "a kernel reads it too"


def test_a_copy_of_a_thin_view_takes_memory_for_its_elements_only():
    """L1: a column of a 256 MiB tensor is copied as its 32 KiB of elements, not its extent."""
    big = torch.arange(8192 * 8192, dtype=torch.float32, device="cuda").reshape(8192, 8192)
    column = big[:, :1]
    expected = column.cpu().tolist()
    torch.cuda.synchronize()
    free = torch.cuda.mem_get_info()[0]
    c = dlbridge.from_dlpack(column, copy=True)
    torch.cuda.synchronize()
    taken = free - torch.cuda.mem_get_info()[0]
    assert taken <= 4 << 20, f"{taken / 2**20:.0f} MiB of device memory for a 32 KiB copy"
    assert c.strides == (1, 1) and dlbridge.from_dlpack(c, device="cpu").tolist() == expected
    for target in ("cpu", (CUDA_HOST, 0)):
        assert dlbridge.from_dlpack(column, device=target).tolist() == expected


def test_a_copy_of_a_broadcast_shares_no_elements():
    """L1: a copy is writable, so a broadcast is made contiguous: a write reaches one element."""
    c = dlbridge.from_dlpack(torch.ones(1, device="cuda").expand(8), copy=True)
    assert c.strides == (1,) and not c.readonly
    y = torch.from_dlpack(c)
    y[0] = 5
    assert y.cpu().tolist() == [5.0] + [1.0] * 7
