"""Copies between host and "device", with values checked, and the driver calls they make: each
allocation in its device's context, each copy on the consumer's stream, the exact byte extent of
strided and reversed layouts (the fake refuses a copy outside known memory), everything freed."""

import gc

import numpy as np
import pytest

import dlbridge
from producers import DunderProducer, table_producer


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
    kinds = driver.kinds()
    assert kinds == ["alloc", "htod"] or (a.size == 0 and kinds == ["alloc"]), kinds
    assert driver.log()[0][3] == 0, "allocated with device 0's context current"
    np.testing.assert_array_equal(host(t), a)
    del t
    gc.collect()
    assert driver.live_allocations() == before, "the deleter freed the device memory"
    assert driver.log()[-1][0] == "free" and driver.log()[-1][3] == 0, "freed in device 0's context"


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


def test_host_copies_are_made_on_the_consumers_stream(driver):
    x = DunderProducer(make=lambda: driver.device_fake([1.0, 2.0, 3.0, 4.0], (4,)))
    h = dlbridge.from_dlpack(x, device="cpu", stream=9)
    assert x.calls[-1]["stream"] == 9
    log = driver.log()
    assert [r[0] for r in log] == ["dtoh", "sync"] and log[0][1] == 9 and log[1][1] == 9, log
    assert np.from_dlpack(h).tolist() == [1.0, 2.0, 3.0, 4.0]


def test_dunder_dlpack_to_host(driver):
    x = DunderProducer(make=lambda: driver.device_fake([1.0, 2.0, 3.0, 4.0], (2, 2)))
    t = dlbridge.from_dlpack(x, stream=7)
    cap = t.__dlpack__(dl_device=(1, 0), max_version=(1, 3))
    h = dlbridge.from_dlpack(cap)
    assert h.is_copied and h.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert [r[:2] for r in driver.log() if r[0] in ("dtoh", "sync")] == [("dtoh", 7), ("sync", 7)]
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
    assert len(alloc) == 1 and alloc[0][3] == (0 if source == "host" else 1)
    del p
    gc.collect()
    free = [r for r in driver.log() if r[0] == "free_host"]
    assert len(free) == 1 and free[0][3] == alloc[0][3]


def test_copy_true_on_the_device_stays_on_the_device_and_its_stream(driver):
    x = DunderProducer(make=lambda: driver.device_fake([1.0, 2.0, 3.0, 4.0, 5.0], (3,), (-2,), 4))
    c = dlbridge.from_dlpack(x, copy=True, stream=9)
    assert c.device == (2, 0) and c.is_copied and c.strides == (-2,)
    log = driver.log()
    assert [r[0] for r in log] == ["alloc", "dtod"] and log[1][1] == 9 and log[1][2] == 20, log
    assert c.__cuda_array_interface__["stream"] == 9, "the copy is ready on the stream it was queued on"
    assert host(c).tolist() == [5.0, 3.0, 1.0]


def test_device_allocation_failure_is_a_memory_error(driver):
    x = DunderProducer(make=lambda: driver.device_fake([0.0], (1 << 42,)))
    with pytest.raises(MemoryError):
        dlbridge.from_dlpack(x, copy=True)  # 16 TiB of fresh device memory


def managed(driver, values=(1.0, 2.0, 3.0)):
    """A producer of CUDA managed memory (device type 13), asked through `__dlpack__`."""
    return DunderProducer(device=(13, 0), make=lambda: driver.device_fake(list(values), (len(values),), device=(13, 0)))


def test_managed_memory_is_waited_for_by_the_host_before_the_host_reads_it(driver):
    t = dlbridge.from_dlpack(managed(driver), stream=9)  # ready on 9: a kernel may still be writing
    for read in (np.asarray, memoryview, lambda t: t.tolist(), lambda t: t.__dlpack__(dl_device=(1, 0), max_version=(1, 3)),
                 np.from_dlpack):  # NumPy passes no stream, then reads on the host
        driver.clear()
        read(t)
        assert ("sync", 9) in [r[:2] for r in driver.log()], f"{read} read managed memory without waiting for stream 9"
    driver.clear()
    h = dlbridge.from_dlpack(managed(driver), device="cpu", stream=9)
    assert [r[:2] for r in driver.log()] == [("sync", 9)] and not h.is_copied, "zero-copy, after the host waited"


def test_copies_of_managed_memory(driver):
    """On the host when the host is asked for; else managed memory again, copied by the host once
    it has waited, so that the copy is complete for host and device consumers alike."""
    on_host = dlbridge.from_dlpack(managed(driver), device="cpu", copy=True)
    assert on_host.device == (1, 0) and on_host.is_copied and on_host.tolist() == [1.0, 2.0, 3.0]
    driver.clear()
    again = dlbridge.from_dlpack(managed(driver), copy=True, stream=9)
    assert again.device == (13, 0) and again.is_copied and again.tolist() == [1.0, 2.0, 3.0]
    assert [r[0] for r in driver.log()][-2:] == ["sync", "alloc_managed"], "waited for, then allocated and copied"
    t = dlbridge.from_dlpack(managed(driver), stream=9)
    for kwargs in ({"stream": 1}, {}):  # a CUDA consumer, and one with no stream (NumPy)
        copy = dlbridge.from_dlpack(t.__dlpack__(copy=True, max_version=(1, 3), **kwargs))
        assert copy.device == (13, 0) and copy.tolist() == [1.0, 2.0, 3.0]
    copy = dlbridge.from_dlpack(t.__dlpack__(copy=True, max_version=(1, 3), dl_device=(1, 0)))
    assert copy.device == (1, 0)
    del on_host, again, t, copy


def test_managed_memory_moved_to_a_device_is_waited_for_first(driver):
    d = dlbridge.from_dlpack(managed(driver), device=(2, 0), stream=9)
    assert d.device == (2, 0) and host(d).tolist() == [1.0, 2.0, 3.0]
    kinds = driver.kinds()
    assert kinds.index("sync") < kinds.index("htod"), kinds


def test_minus_one_still_orders_the_copies_dlbridge_makes(driver):
    x, _ = table_producer(work_stream=0x5000, make=lambda: driver.device_fake([1.0, 2.0], (2,)))
    h = dlbridge.from_dlpack(x, device="cpu", stream=-1)
    assert h.tolist() == [1.0, 2.0]
    assert [r[:2] for r in driver.log() if r[0] in ("dtoh", "sync")] == [("dtoh", 0x5000), ("sync", 0x5000)]


def test_an_exported_copy_is_queued_after_the_consumers_wait(driver):
    x = DunderProducer(make=lambda: driver.device_fake([1.0, 2.0], (2,)))
    t = dlbridge.from_dlpack(x, stream=9)
    driver.clear()
    t.__dlpack__(stream=11, copy=True, max_version=(1, 3))
    stream_of = {"record": 2, "wait": 1, "dtod": 1}  # where each call's stream is in its log row
    log = [(r[0], r[stream_of[r[0]]]) for r in driver.log() if r[0] in stream_of]
    assert log == [("record", 9), ("wait", 11), ("dtod", 11)], "the copy runs on 11, after 11 waited for 9"


def test_a_device_copy_of_data_with_no_pending_work_says_where_it_was_queued(driver):
    """A raw capsule carries no stream; the copy dlbridge queues for it runs on the legacy default
    stream, and a consumer on another stream must be made to wait for that copy."""
    fake = driver.device_fake([1.0, 2.0], (2,))
    c = dlbridge.from_dlpack(fake.capsule(), copy=True)
    assert c.__cuda_array_interface__["stream"] == 1
    driver.clear()
    c.__dlpack__(stream=11, max_version=(1, 3))
    assert [(r[0], r[2] if r[0] == "record" else r[1]) for r in driver.log() if r[0] in ("record", "wait")] == [("record", 1), ("wait", 11)]
