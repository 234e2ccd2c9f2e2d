"""Copies between host and "device", with values checked, and the driver calls they make: each
allocation in its device's context, each copy on the right stream and ready where dlbridge says it
is (a host-to-device copy from pageable memory returns with its DMA still queued), the byte extent
of dense layouts and the elements alone of thin ones (the fake refuses a copy outside known
memory), copies that share no elements, everything freed."""

import gc

import numpy as np
import pytest

import dlbridge
from dlpack_ctypes import READ_ONLY
from fake_cuda import ALLOCS, StreamProducer
from producers import DunderProducer, ready_stream, table_producer

VALUE = 7.0


def c_strides(shape):
    return tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))


def host(t):
    return np.from_dlpack(dlbridge.from_dlpack(t, device="cpu"))


@pytest.mark.parametrize("layout", ["c", "f", "strided", "reversed", "0-d", "empty"])
@pytest.mark.parametrize("dtype", ["float32", "int64", "bool", "complex128", "float16", "uint8"])
def test_host_to_device_and_back(driver, dtype, layout):
    base = (np.arange(24) % 7).astype(dtype).reshape(4, 6)
    a = {"c": base, "f": np.asfortranarray(base), "strided": base[::2, 1::3], "reversed": base[::-1, ::-2],
         "0-d": np.array(base[1, 2]), "empty": base[:0]}[layout]
    before = driver.live_allocations()
    t = dlbridge.from_dlpack(a, device=(2, 0))
    assert t.device == (2, 0) and t.is_copied and t.shape == a.shape and t.strides == c_strides(a.shape)
    log = driver.log()
    assert [r[0] for r in log if r[0] in ("alloc_async", "htod")] == ["alloc_async", "htod"][:1 + (a.size > 0)], log
    assert all(r[1] == 1 for r in log if r[0] in ("alloc_async", "htod")), "from the pool, and copied, on the legacy stream"
    assert not [r for r in log if r[0] in ("sync", "event_sync")], f"a host wait: {log}"
    assert log[0][3] == 0, "allocated with device 0's context current"
    np.testing.assert_array_equal(host(t), a)
    del t
    gc.collect()
    assert driver.live_allocations() == before, "the deleter freed the device memory"
    assert driver.log()[-1][:3:2] == ("free_async", 1) and driver.log()[-1][3] == 0, "freed on the legacy stream, in device 0's context"


def test_a_host_to_device_copy_is_ready_on_the_legacy_stream(driver):
    """M1: from pageable memory the driver's synchronous copy returns once the bytes are staged; the
    DMA lands later, in order on the legacy stream. A consumer on a non-blocking stream must be
    made to wait for it."""
    C = driver.stream()
    t = dlbridge.from_dlpack(np.full(1024, VALUE, dtype=np.float32), device=(2, 0))
    assert driver.peek(t.data_ptr, 4) == [0.0] * 4, "the fake's DMA is still in flight"
    assert ready_stream(t) == 1
    driver.clear()
    t.__dlpack__(stream=C, max_version=(1, 3))
    assert [(r[0], r[2] if r[0] == "record" else r[1]) for r in driver.log() if r[0] in ("record", "wait")] == [("record", 1), ("wait", C)]
    assert driver.read(C, t.data_ptr + 4 * 1020, 4) == [VALUE] * 4, "C read the tail before the DMA landed"


@pytest.mark.parametrize("stream", [None, "C"])
def test_a_host_tensor_exports_to_a_device_when_asked(driver, stream):
    """One answer for `__dlpack__(dl_device=(2, 0))` on a host tensor: a device copy (IS_COPIED),
    ready for the consumer's stream, as `from_dlpack(x, device=(2, 0))` gives (the same in the CPU
    suite, which has no driver to copy with, the GPU suite and the README)."""
    from dlpack_ctypes import IS_COPIED, read_capsule

    C = driver.stream()
    consumer = {None: 1, "C": C}[stream]
    t = dlbridge.from_dlpack(np.arange(6, dtype=np.float32).reshape(2, 3))
    cap = t.__dlpack__(dl_device=(2, 0), max_version=(1, 3), **({"stream": C} if stream else {}))
    managed = read_capsule(cap)
    assert managed.flags & IS_COPIED and managed.dl_tensor.device.device_type == 2
    u = dlbridge.from_dlpack(cap)
    assert u.device == (2, 0) and u.is_copied
    assert driver.read(consumer, u.data_ptr, 6) == list(range(6))
    with pytest.raises(BufferError, match="cannot move .* without copying"):
        t.__dlpack__(dl_device=(2, 0), copy=False)
    # Back to the CPU: a copy needed for CPU access with copy=False is the method reference's ValueError.
    with pytest.raises(ValueError, match="cannot move .* without copying"):
        u.__dlpack__(dl_device=(1, 0), copy=False)


@pytest.mark.parametrize("shape, strides, first, size", [
    ((2, 3), None, 0, 6),
    ((3,), (2,), 0, 5),  # every other element: the extent is 5 elements, not 6
    ((2, 3), (-3, -1), 5, 6),  # reversed both ways: element 0 is the last in memory
    ((2, 2), (1, 3), 0, 5),  # column-major-ish, with a gap
    ((3, 2), (0, 1), 0, 2),  # a broadcast row
])
def test_device_to_host_copies_exactly_the_extent(driver, shape, strides, first, size):
    values = [float(v) for v in range(10, 10 + size)]
    x = DunderProducer(make=lambda: driver.device_fake(values, shape, strides, first))
    t = dlbridge.from_dlpack(x)
    driver.clear()
    h = dlbridge.from_dlpack(t, device="cpu")
    assert h.device == (1, 0) and h.is_copied and h.strides == c_strides(shape)
    st = strides or c_strides(shape)
    expected = np.array([[values[first + i * st[0] + j * st[1]] for j in range(shape[1])] for i in range(shape[0])]
                        if len(shape) == 2 else [values[first + i * st[0]] for i in range(shape[0])], dtype=np.float32)
    np.testing.assert_array_equal(np.from_dlpack(h), expected)
    log = driver.log()
    assert [r[0] for r in log] == ["dtoh", "sync"], log
    assert log[0][2] == 4 * size, "the byte extent, no more"
    assert log[0][1] == 1 and log[1][1] == 1, "on the stream the data is ready on: the legacy default"


def thin_column(driver, rows=1000, cols=1000):
    """`x[:, :1]` of a rows x cols float32 "device" tensor (values i * cols + j)."""
    values = [float(v) for v in range(rows * cols)]
    return DunderProducer(make=lambda: driver.device_fake(values, (rows, 1), (cols, 1))), rows, cols


def test_copies_of_a_thin_view_move_only_its_elements(driver):
    """L1: a column of a 1000 x 1000 tensor is 1000 elements, not a 4 MB extent."""
    x, rows, cols = thin_column(driver)
    column = [[float(i * cols)] for i in range(rows)]
    t = dlbridge.from_dlpack(x)
    for target in ("cpu", (3, 0)):
        driver.clear()
        h = dlbridge.from_dlpack(t, device=target)
        assert h.tolist() == column and h.strides == (1, 1)
        moved = sum(r[2] for r in driver.log() if r[0] in ("copy2d", "dtoh"))
        assert moved == 4 * rows, f"{moved} bytes moved for {4 * rows} bytes of elements"
        allocated = [r[2] for r in driver.log() if r[0] == "alloc_host"]
        assert all(n <= 4 * rows for n in allocated), allocated
    driver.clear()
    c = dlbridge.from_dlpack(t, copy=True)
    assert [r[2] for r in driver.log() if r[0] in ALLOCS] == [4 * rows], "device memory for the elements only"
    assert c.device == (2, 0) and c.is_copied and c.strides == (1, 1) and host(c).tolist() == column


@pytest.mark.parametrize("target", ["device", "pinned"])
def test_a_copy_of_a_broadcast_shares_no_elements(driver, target):
    """L1: copies are writable, so a broadcast (stride 0) is made contiguous in the copy."""
    x = DunderProducer(make=lambda: driver.device_fake([5.0, 6.0], (4, 2), (0, 1)))
    t = dlbridge.from_dlpack(x)
    c = dlbridge.from_dlpack(t, copy=True) if target == "device" else dlbridge.from_dlpack(t, device=(3, 0))
    assert c.strides == (2, 1) and c.is_copied and not c.readonly
    assert host(c).tolist() == [[5.0, 6.0]] * 4


@pytest.mark.parametrize("device", [(3, 0), (13, 0)], ids=["pinned", "managed"])
def test_host_memory_of_cuda_asked_for_on_the_cpu_is_labelled_cpu(driver, device):
    """L2: pinned and managed memory reach the CPU as they are; asked for on the CPU they are
    handed over as CPU memory, zero-copy, as `__dlpack__(dl_device=(1, 0))` does."""
    x = DunderProducer(device=device, make=lambda: driver.device_fake([1.0, 2.0], (2,), device=device))
    h = dlbridge.from_dlpack(x, device="cpu")
    assert h.device == (1, 0) and not h.is_copied and h.tolist() == [1.0, 2.0]
    assert x.calls[-1].get("dl_device") is None, "dlbridge reaches it itself; the producer is not asked to"
    t = dlbridge.from_dlpack(x)
    assert dlbridge.from_dlpack(t, device="cpu").data_ptr == t.data_ptr

    def read_only():
        fake = driver.device_fake([1.0, 2.0], (2,), device=device)
        fake.managed.flags = READ_ONLY
        return fake

    ro = dlbridge.from_dlpack(DunderProducer(device=device, make=read_only), device="cpu")
    assert ro.device == (1, 0) and ro.readonly, "the relabelled tensor keeps the producer's READ_ONLY"


def test_host_copies_are_made_on_the_consumers_stream(driver):
    C = driver.stream()
    x = DunderProducer(make=lambda: driver.device_fake([1.0, 2.0, 3.0, 4.0], (4,)))
    h = dlbridge.from_dlpack(x, device="cpu", stream=C)
    assert x.calls[-1]["stream"] == C and "dl_device" not in x.calls[-1], "dlbridge makes the move itself"
    log = driver.log()
    assert [r[0] for r in log] == ["dtoh", "sync"] and log[0][1] == C and log[1][1] == C, log
    assert np.from_dlpack(h).tolist() == [1.0, 2.0, 3.0, 4.0]


def test_dunder_dlpack_to_host(driver):
    S = driver.stream()
    x = DunderProducer(make=lambda: driver.device_fake([1.0, 2.0, 3.0, 4.0], (2, 2)))
    t = dlbridge.from_dlpack(x, stream=S)
    cap = t.__dlpack__(dl_device=(1, 0), max_version=(1, 3))
    h = dlbridge.from_dlpack(cap)
    assert h.is_copied and h.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert [r[:2] for r in driver.log() if r[0] in ("dtoh", "sync")] == [("dtoh", 1), ("sync", 1)], "after the legacy stream waited"
    with pytest.raises(ValueError, match="cannot move .* tensor from .*"):
        t.__dlpack__(dl_device=(1, 0), max_version=(1, 3), copy=False)


@pytest.mark.parametrize("source", ["host", "device"])
def test_pinned_copies_are_allocated_and_freed_in_a_context(driver, source):
    values = [5.0, 6.0, 7.0, 8.0]
    if source == "host":
        x = np.array(values, dtype=np.float32)
    else:
        x = dlbridge.from_dlpack(DunderProducer(device=(2, 1), make=lambda: driver.device_fake(values, (4,), device=(2, 1))))
    driver.clear()
    p = dlbridge.from_dlpack(x, device=(3, 0))
    assert p.device == (3, 0) and p.is_copied
    assert np.from_dlpack(p).tolist() == values, "pinned memory is host memory: NumPy reads it"
    alloc = [r for r in driver.log() if r[0] == "alloc_host"]
    assert len(alloc) == 1 and driver.retains(alloc[0][3]) >= 1
    if source == "device":
        assert alloc[0][3] == 1, "in the source's own device's context"
    del p
    gc.collect()
    driver.settle(lambda: len([r for r in driver.log() if r[0] == "free_host"]), 1)  # by dlbridge's release thread
    free = [r for r in driver.log() if r[0] == "free_host"]
    assert len(free) == 1 and free[0][3] == alloc[0][3]


def test_copy_true_on_the_device_stays_on_the_device_and_its_stream(driver):
    C = driver.stream()
    x = DunderProducer(make=lambda: driver.device_fake([1.0, 2.0, 3.0, 4.0, 5.0], (3,), (-2,), 4))
    c = dlbridge.from_dlpack(x, copy=True, stream=C)
    assert c.device == (2, 0) and c.is_copied and c.strides == (-2,)
    log = driver.log()
    assert [r[0] for r in log][:2] == ["alloc_async", "dtod"] and log[0][2] == 20 and log[1][1] == C and log[1][2] == 20, log
    assert driver.pending(C) == 1, "queued on C, not waited for"
    assert host(c).tolist() == [5.0, 3.0, 1.0]


def test_device_allocation_failure_is_a_memory_error(driver):
    x = DunderProducer(make=lambda: driver.device_fake([0.0], (1 << 42,)))
    with pytest.raises(MemoryError):
        dlbridge.from_dlpack(x, copy=True)  # 16 TiB of fresh device memory


def test_managed_memory_is_waited_for_by_the_host_before_the_host_reads_it(driver):
    """A kernel on S still writes the managed memory when the tensor is made: every host read
    (zero-copy or not) must see what it wrote."""
    S = driver.stream()
    m = driver.device_array(3, (13, 0))
    x = StreamProducer(driver, m, S, device=(13, 0))
    reads = [np.asarray, lambda t: memoryview(t).tolist(), lambda t: t.tolist(),
             lambda t: dlbridge.from_dlpack(t.__dlpack__(dl_device=(1, 0), max_version=(1, 3))).tolist(),
             np.from_dlpack]  # NumPy passes no stream, then reads on the host
    for value, read in enumerate(reads, start=1):
        driver.fill(S, m.ctypes.data, 3, float(value))
        t = dlbridge.from_dlpack(x, stream=S)
        assert np.asarray(read(t), dtype=np.float32).tolist() == [float(value)] * 3, f"{read} read before the kernel ran"
    driver.fill(S, m.ctypes.data, 3, 9.0)
    driver.clear()
    h = dlbridge.from_dlpack(x, device="cpu", stream=S)
    assert [r[:2] for r in driver.log()] == [("sync", S)] and not h.is_copied, "zero-copy, after the host waited"
    assert h.tolist() == [9.0] * 3


def managed(driver, values=(1.0, 2.0, 3.0)):
    """A producer of CUDA managed memory (device type 13), asked through `__dlpack__`."""
    return DunderProducer(device=(13, 0), make=lambda: driver.device_fake(list(values), (len(values),), device=(13, 0)))


def test_copies_of_managed_memory(driver):
    """On the host when the host is asked for; else managed memory again, copied by the host once
    it has waited, so that the copy is complete for host and device consumers alike."""
    S = driver.stream()
    on_host = dlbridge.from_dlpack(managed(driver), device="cpu", copy=True)
    assert on_host.device == (1, 0) and on_host.is_copied and on_host.tolist() == [1.0, 2.0, 3.0]
    driver.clear()
    again = dlbridge.from_dlpack(managed(driver), copy=True, stream=S)
    assert again.device == (13, 0) and again.is_copied and again.tolist() == [1.0, 2.0, 3.0]
    assert [r[0] for r in driver.log()][-2:] == ["sync", "alloc_managed"], "waited for, then allocated and copied"
    t = dlbridge.from_dlpack(managed(driver), stream=S)
    for kwargs in ({"stream": 1}, {}):  # a CUDA consumer, and one with no stream (NumPy)
        copy = dlbridge.from_dlpack(t.__dlpack__(copy=True, max_version=(1, 3), **kwargs))
        assert copy.device == (13, 0) and copy.tolist() == [1.0, 2.0, 3.0]
    copy = dlbridge.from_dlpack(t.__dlpack__(copy=True, max_version=(1, 3), dl_device=(1, 0)))
    assert copy.device == (1, 0)
    del on_host, again, t, copy


def test_managed_memory_moved_to_a_device_is_waited_for_first(driver):
    S = driver.stream()
    d = dlbridge.from_dlpack(managed(driver), device=(2, 0), stream=S)
    assert d.device == (2, 0) and host(d).tolist() == [1.0, 2.0, 3.0]
    kinds = driver.kinds()
    assert kinds.index("sync") < kinds.index("htod"), kinds


def test_minus_one_still_orders_the_copies_dlbridge_makes(driver):
    P = driver.stream()
    x, _ = table_producer(work_stream=P, make=lambda: driver.device_fake([1.0, 2.0], (2,)))
    h = dlbridge.from_dlpack(x, device="cpu", stream=-1)
    assert h.tolist() == [1.0, 2.0]
    assert [r[:2] for r in driver.log() if r[0] in ("dtoh", "sync")] == [("dtoh", P), ("sync", P)]


def test_an_exported_copy_is_queued_after_the_consumers_wait(driver):
    B, C = driver.stream(), driver.stream()
    x = DunderProducer(make=lambda: driver.device_fake([1.0, 2.0], (2,)))
    t = dlbridge.from_dlpack(x, stream=B)
    driver.clear()
    copy = t.__dlpack__(stream=C, copy=True, max_version=(1, 3))
    log = [(r[0], r[2] if r[0] == "record" else r[1]) for r in driver.log() if r[0] in ("record", "wait", "dtod")]
    assert log == [("wait", C), ("dtod", C), ("record", C)], "the copy runs on C, after C waited for the data's event; its free will wait for it"


def test_a_device_copy_of_data_with_no_pending_work_says_where_it_was_queued(driver):
    """A raw capsule carries no stream; the copy dlbridge queues for it runs on the legacy default
    stream, and a consumer on another stream must be made to wait for that copy."""
    C = driver.stream()
    fake = driver.device_fake([1.0, 2.0], (2,))
    c = dlbridge.from_dlpack(fake.capsule(), copy=True)
    assert ready_stream(c) == 1
    driver.clear()
    c.__dlpack__(stream=C, max_version=(1, 3))
    assert [(r[0], r[2] if r[0] == "record" else r[1]) for r in driver.log() if r[0] in ("record", "wait")] == [("record", 1), ("wait", C)]
    assert driver.read(C, c.data_ptr, 2) == [1.0, 2.0]
