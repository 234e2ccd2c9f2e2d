"""Stream hand-off against the fake driver's timeline: a producer's kernel writes VALUE on its stream
P and stays queued until something makes it run; a consumer reads on its own non-blocking stream C.
Only the waits dlbridge (or the producer) queued make C's read run P's kernel first, so a missing or
misplaced wait reads the zeros that were there before, as on a GPU. Beside the values: no host
synchronisation, events without timing and in the device's context, nothing for -1, no growth."""

import ctypes
import threading

import pytest

import dlbridge
from dlbridge._check import abi
from fake_cuda import CU_EVENT_DISABLE_TIMING, StreamProducer
from producers import ready_stream, table_producer

VALUE = 7.0
N = 4


def busy(driver, stream, device=(2, 0), value=VALUE):
    """`N` float32s of device memory, zero now, that a kernel queued on `stream` fills with `value`."""
    a = driver.device_array(N, device)
    driver.fill(stream, a.ctypes.data, N, value, device[1])
    return a


def no_host_sync(log):
    assert not [r for r in log if r[0] in ("sync", "event_sync")], f"a host synchronisation: {log}"


def our_table():
    return abi.ExchangeAPI.from_address(abi.capsule_pointer(dlbridge.Tensor.__dlpack_c_exchange_api__))


def table_export(t):
    """Exports `t` through our exchange table's owning no_sync function and deletes the export."""
    out = ctypes.c_void_p()
    assert abi.FROM_PY(our_table().managed_tensor_from_py_object_no_sync)(t, ctypes.byref(out)) == 0
    managed = abi.DLManagedTensorVersioned.from_address(out.value)
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(managed.deleter)(out.value)


@pytest.mark.parametrize("device_id", [0, 1])
def test_a_table_import_makes_the_consumers_stream_wait_for_the_producers(driver, device_id):
    P, C = driver.stream(device=device_id), driver.stream(device=device_id)
    a = busy(driver, P, (2, device_id))
    x, calls = table_producer(device=(2, device_id), work_stream=P, make=lambda: driver.over(a, (2, device_id)))
    t = dlbridge.from_dlpack(x, stream=C)
    assert calls["dunder"] == [] and calls["stream_queries"] == [(2, device_id)]
    log = driver.log()
    no_host_sync(log)
    creates = [r for r in log if r[0] == "create"]
    assert creates and all(r[2] & CU_EVENT_DISABLE_TIMING and r[3] == device_id for r in creates), log
    assert driver.pending(P, device_id) == 1, "the producer's kernel still runs: nothing waited on the host"
    assert driver.read(C, t.data_ptr, N, device_id) == [VALUE] * N, "C read before the producer's kernel ran"
    a2 = busy(driver, P, (2, device_id), 8.0)
    x2, _ = table_producer(device=(2, device_id), work_stream=P, make=lambda: driver.over(a2, (2, device_id)))
    t2 = dlbridge.from_dlpack(x2)  # no stream named: the legacy default stream waits for P
    assert driver.read(1, t2.data_ptr, N, device_id) == [8.0] * N


def test_nothing_is_ordered_for_the_same_stream_or_minus_one(driver):
    P = driver.stream()
    a = busy(driver, P)
    x, _ = table_producer(work_stream=P, make=lambda: driver.over(a))
    dlbridge.from_dlpack(x, stream=P)
    dlbridge.from_dlpack(x, stream=-1)
    assert not [r for r in driver.log() if r[0] in ("wait", "sync", "event_sync")]
    y, _ = table_producer(work_stream=0, make=lambda: driver.over(a))
    driver.clear()
    assert ready_stream(dlbridge.from_dlpack(y)) == 1
    assert driver.log() == [], "NULL is the legacy default stream, which is dlbridge's: no event, no handle"


def test_a_dunder_dlpack_producer_orders_its_own_work(driver):
    P, C = driver.stream(), driver.stream()
    x = StreamProducer(driver, busy(driver, P), P)
    t = dlbridge.from_dlpack(x, stream=C)
    assert x.calls[-1]["stream"] == C
    assert not [r for r in driver.log() if r[0] == "wait"], "dlbridge adds no wait of its own"
    assert driver.read(C, t.data_ptr, N) == [VALUE] * N


def test_export_orders_the_consumer_after_the_data(driver):
    P, B, C = driver.stream(), driver.stream(), driver.stream()
    a = busy(driver, P)
    x, _ = table_producer(work_stream=P, make=lambda: driver.over(a))
    t = dlbridge.from_dlpack(x, stream=B)
    driver.clear()
    t.__dlpack__(stream=C, max_version=(1, 3))
    log = driver.log()
    no_host_sync(log)
    assert [r[:2] for r in log] == [("wait", C)], "one wait, on the event recorded when t was made"
    assert driver.read(C, t.data_ptr, N) == [VALUE] * N
    driver.clear()
    t.__dlpack__(stream=-1)
    assert driver.log() == []
    t.__dlpack__()  # None: the legacy default stream, as the spec says a producer must assume
    assert [r[:2] for r in driver.log()][:1] == [("wait", 1)]
    assert [r[0] for r in driver.log()] == ["wait", "destroy"], "the legacy stream carries the data from then on"
    driver.clear()
    t.__dlpack__(stream=C, max_version=(1, 3))
    assert [(r[0], r[2] if r[0] == "record" else r[1]) for r in driver.log() if r[0] in ("record", "wait")] == [("record", 1), ("wait", C)]


def test_our_no_sync_exports_leave_later_work_on_the_reported_stream_ordered(driver):
    """M4: the exchange table says the data is ready on the legacy default stream; an extension
    given the tensor writes it on the stream it is told (`ready_stream()`); the next table export and
    the next `__dlpack__(stream=C)` must be ordered after that write too."""
    from dlbridge import _native

    P, B, C = driver.stream(), driver.stream(), driver.stream()
    a = busy(driver, P)
    x, _ = table_producer(work_stream=P, make=lambda: driver.over(a))
    t = dlbridge.from_dlpack(x, stream=B)
    table_export(t)
    assert driver.read(1, t.data_ptr, N) == [VALUE] * N
    s = _native._argument_ready_stream(t, writable=True)
    driver.fill(s, t.data_ptr, N, 9.0)  # the extension's kernel, on the stream it was given
    table_export(t)
    assert driver.read(1, t.data_ptr, N) == [9.0] * N, "a table consumer on the reported stream read before the write"
    driver.fill(s, t.data_ptr, N, 10.0)
    t.__dlpack__(stream=C, max_version=(1, 3))
    assert driver.read(C, t.data_ptr, N) == [10.0] * N, "__dlpack__(stream=C) did not wait for the write"
    no_host_sync(driver.log())


def test_an_idle_tensor_lent_to_an_extension_keeps_its_later_work_ordered(driver):
    """A dlbridge tensor with no pending work, taken by an extension that names no stream: it is told
    the legacy default stream, and the tensor keeps that stream as its data's, so its next export
    waits for the extension's write there (before, it said no stream and stayed idle, and a
    consumer on another stream could read before the write)."""
    from dlbridge import _native

    P, C = driver.stream(), driver.stream()
    x, _ = table_producer(work_stream=P, make=lambda: driver.over(busy(driver, P)))
    t = dlbridge.from_dlpack(x, stream=-1)  # -1: no pending work is kept
    s = _native._argument_ready_stream(t, writable=True)
    assert s == 1
    driver.fill(s, t.data_ptr, N, 9.0)  # the extension's kernel, on the stream it was given
    t.__dlpack__(stream=C, max_version=(1, 3))
    assert driver.read(C, t.data_ptr, N) == [9.0] * N, "__dlpack__(stream=C) did not wait for the write"
    no_host_sync(driver.log())


@pytest.mark.parametrize("reused", [False, True], ids=["destroyed", "destroyed and handed out again"])
def test_a_stream_the_caller_named_is_not_kept(driver, reused):
    """M5: a consumer's stream is valid for the call that names it (CuPy and numba destroy theirs
    when collected). Later exports neither fail on the dead handle nor wait on a new stream that
    got the same handle."""
    P, S, C = driver.stream(), driver.stream(), driver.stream()
    a = busy(driver, P)
    x, _ = table_producer(work_stream=P, make=lambda: driver.over(a))
    t = dlbridge.from_dlpack(x, stream=S)
    driver.destroy_stream(S)
    if reused:
        assert driver.stream() == S, "the fake hands out the dead handle again"
    driver.clear()
    t.__dlpack__(stream=C, max_version=(1, 3))
    assert not [r for r in driver.log() if S in (r[1], r[2]) and r[0] in ("record", "wait", "sync")], driver.log()
    assert driver.read(C, t.data_ptr, N) == [VALUE] * N
    assert dlbridge.from_dlpack(t, device="cpu").tolist() == [VALUE] * N


def test_the_per_thread_stream_is_another_stream_in_each_thread(driver):
    """L4: stream 2 named in thread A and in thread B are two streams; data made ready on A's must
    be waited for by B's."""
    a = driver.device_array(N)
    x, _ = table_producer(work_stream=2, make=lambda: driver.over(a))
    made = {}

    def in_thread_a():
        driver.fill(2, a.ctypes.data, N, VALUE)  # the producer's kernel, on A's per-thread stream
        made["t"] = dlbridge.from_dlpack(x, stream=2)

    thread = threading.Thread(target=in_thread_a)
    thread.start()
    thread.join()
    t = made.pop("t")
    t.__dlpack__(stream=2, max_version=(1, 3))  # B's per-thread stream (this thread's)
    assert driver.read(2, t.data_ptr, N) == [VALUE] * N, "B's per-thread stream read before A's kernel ran"


def test_a_producer_whose_dlpack_device_raises_is_taken_as_ready_on_the_legacy_stream(driver):
    """L7: asked with no stream, a producer orders its work before the legacy default stream; the
    data is then pending there, not free of pending work."""
    P, C = driver.stream(), driver.stream()
    x = StreamProducer(driver, busy(driver, P), P, device_raises=True)
    t = dlbridge.from_dlpack(x)
    assert x.calls[-1]["stream"] is None
    assert ready_stream(t) == 1
    t.__dlpack__(stream=C, max_version=(1, 3))
    assert driver.read(C, t.data_ptr, N) == [VALUE] * N


def test_cuda_array_interface_stream_is_waited_for(driver):
    P = driver.stream(device=1)
    a = busy(driver, P, (2, 1))

    class Cai:
        __cuda_array_interface__ = {"shape": (N,), "typestr": "<f4", "data": (a.ctypes.data, False),
                                    "version": 3, "stream": P}

    t = dlbridge.asarray(Cai())
    assert t.device == (2, 1), "the device comes from the pointer, not from a default of 0"
    assert ready_stream(t) == 1
    no_host_sync(driver.log())
    assert driver.read(1, t.data_ptr, N, device=1) == [VALUE] * N
    assert dlbridge.from_dlpack(t, device="cpu").tolist() == [VALUE] * N


def test_no_growth_over_many_exchanges(driver):
    P, B, C = driver.stream(), driver.stream(), driver.stream()
    a = driver.device_array(2)
    x, _ = table_producer(work_stream=P, make=lambda: driver.over(a))
    allocations, events = driver.live_allocations(), driver.live_events()
    for i in range(20_000):
        t = dlbridge.from_dlpack(x, stream=B)
        t.__dlpack__(stream=C, max_version=(1, 3))
        if i % 5000 == 0:
            driver.clear()
    del t
    assert driver.live_events() == events and driver.context_depth() == 0
    assert driver.live_allocations() == allocations


def test_extension_arguments_stay_on_the_producers_stream_unless_asked(driver):
    """PyTensor and PyTensorMut: by default the data stays where the producer has it (the header's
    rule: launch on the producer's current stream), and extract_on_stream orders the extension's
    own stream after it. A dlbridge tensor hands its event over, once."""
    from dlbridge import _native

    P, B, C = driver.stream(), driver.stream(), driver.stream()
    x, _ = table_producer(work_stream=P, make=lambda: driver.over(busy(driver, P)))
    for writable in (False, True):
        driver.clear()
        assert _native._argument_ready_stream(x, writable=writable) == P
        assert driver.log() == []
        assert _native._argument_ready_stream(x, C, writable=writable) == C
        assert [r[0] for r in driver.log()] == ["create", "record", "wait", "destroy"]
    ours = dlbridge.from_dlpack(x, stream=B)
    driver.clear()
    assert _native._argument_ready_stream(ours, C) == C
    assert [r[:2] for r in driver.log()] == [("wait", C)], "one wait on the tensor's event, no new event"
    assert _native._argument_ready_stream(ours) == 1, "a dlbridge tensor is launched on from the legacy stream"


@pytest.mark.parametrize("garbage", [2**64 - 1, 2**64 - 2, 2**63])
def test_a_work_stream_that_is_no_pointer_falls_back_to_dunder_dlpack(driver, garbage):
    from dlbridge import _native

    C = driver.stream()
    x, calls = table_producer(work_stream=garbage, make=lambda: driver.over(driver.device_array(1)))
    t = dlbridge.from_dlpack(x, stream=C)
    assert calls["dunder"] == [C] and ready_stream(t) == 1
    assert _native._argument_ready_stream(x) == 1, "the owned path, through __dlpack__ with the legacy default"


@pytest.mark.parametrize("writable", [False, True])
def test_managed_memory_extracted_with_no_ordering_is_refused(driver, writable):
    """Safe Rust may read a managed-memory argument on the host. Extracted on stream -1 (no
    ordering), it used to be handed over while the producer's kernel was still writing it; now it is
    refused. Extracted without a stream, the host waits for the producer's stream first."""
    from dlbridge import _native

    P = driver.stream()
    managed = (13, 0)

    def producer():
        a = driver.device_array(N, managed)
        driver.fill(P, a.ctypes.data, N, VALUE)
        return table_producer(device=managed, work_stream=P, make=lambda: driver.over(a, managed))[0], a

    x, _ = producer()
    with pytest.raises(ValueError, match="managed memory"):
        _native._argument_ready_stream(x, -1, writable=writable)
    x, a = producer()
    _native._argument_ready_stream(x, writable=writable)
    assert driver.pending(P) == 0 and a.tolist() == [VALUE] * N, "the host waited for the producer's kernel"
