"""Stream hand-off, checked call by call against the fake driver: an event recorded on the stream
the data is ready on and waited for by the consumer's stream, in the device's context, created
without timing and destroyed at once; no host synchronisation; nothing at all for -1 or for the
same stream; no growth over many exchanges."""

import ctypes

import numpy as np
import pytest

import dlbridge
from fake_cuda import CU_EVENT_DISABLE_TIMING
from dlbridge._check import abi
from producers import DunderProducer, ready_stream, table_producer


def hand_off(log):
    """The (ready, consumer, device) of each event hand-off in `log`, checking that each is one
    fresh untimed event, recorded, waited on, destroyed, and that nothing waits on the host."""
    assert not [r for r in log if r[0] == "sync"], "a host synchronisation"
    out = []
    for i in range(0, len(log), 4):
        create, record, wait, destroy = log[i:i + 4]
        event = create[1]
        assert (create[0], record[0], wait[0], destroy[0]) == ("create", "record", "wait", "destroy"), log
        assert create[2] & CU_EVENT_DISABLE_TIMING, "events are created without timing"
        assert record[1] == event and wait[2] == event and destroy[1] == event
        assert create[3] == record[3] == wait[3]
        out.append((record[2], wait[1], record[3]))
    return out


@pytest.mark.parametrize("device_id", [0, 1])
def test_a_table_import_makes_the_consumers_stream_wait_for_the_producers(driver, device_id):
    x, calls = table_producer(device=(2, device_id), work_stream=0x5000,
                              make=lambda: driver.device_fake([1.0, 2.0], (2,), device=(2, device_id)))
    t = dlbridge.from_dlpack(x, stream=9)
    assert calls["dunder"] == [] and calls["stream_queries"] == [(2, device_id)]
    assert hand_off([r for r in driver.log() if r[0] in ("create", "record", "wait", "destroy", "sync")]) == [(0x5000, 9, device_id)]
    assert ready_stream(t) == 9
    driver.clear()
    dlbridge.from_dlpack(x)
    assert hand_off(driver.log()) == [(0x5000, 1, device_id)], "no stream named: the legacy default waits"


def test_nothing_is_ordered_for_the_same_stream_or_minus_one(driver):
    x, _ = table_producer(work_stream=0x5000, make=lambda: driver.device_fake([1.0], (1,)))
    dlbridge.from_dlpack(x, stream=0x5000)
    dlbridge.from_dlpack(x, stream=-1)
    y, _ = table_producer(work_stream=0, make=lambda: driver.device_fake([1.0], (1,)))
    assert ready_stream(dlbridge.from_dlpack(y)) == 1
    assert driver.log() == []


def test_a_dunder_dlpack_producer_orders_its_own_work(driver):
    x = DunderProducer(make=lambda: driver.device_fake([1.0], (1,)))
    t = dlbridge.from_dlpack(x, stream=9)
    assert x.calls[-1]["stream"] == 9 and ready_stream(t) == 9
    assert driver.log() == [], "dlbridge adds no event of its own"


def test_export_orders_the_consumer_after_the_ready_stream(driver):
    x, _ = table_producer(work_stream=9, make=lambda: driver.device_fake([1.0, 2.0], (2,)))
    t = dlbridge.from_dlpack(x, stream=9)
    driver.clear()
    t.__dlpack__(stream=11, max_version=(1, 3))
    assert hand_off(driver.log()) == [(9, 11, 0)]
    driver.clear()
    t.__dlpack__(stream=9)
    t.__dlpack__(stream=-1)
    assert driver.log() == []
    t.__dlpack__()  # None: the legacy default stream, as the spec says a producer must assume
    assert hand_off(driver.log()) == [(9, 1, 0)]


def test_our_no_sync_exports_order_the_stream_our_table_reports_once(driver):
    x, _ = table_producer(work_stream=9, make=lambda: driver.device_fake([1.0, 2.0], (2,)))
    t = dlbridge.from_dlpack(x, stream=9)
    driver.clear()
    api = abi.ExchangeAPI.from_address(abi.capsule_pointer(dlbridge.Tensor.__dlpack_c_exchange_api__))
    for _ in range(3):
        out = ctypes.c_void_p()
        assert abi.FROM_PY(api.managed_tensor_from_py_object_no_sync)(t, ctypes.byref(out)) == 0
        managed = abi.DLManagedTensorVersioned.from_address(out.value)
        ctypes.CFUNCTYPE(None, ctypes.c_void_p)(managed.deleter)(out.value)
        assert abi.DLTENSOR_FROM_PY(api.dltensor_from_py_object_no_sync)(t, ctypes.byref(abi.DLTensor())) == 0
    assert hand_off(driver.log()) == [(9, 1, 0)], "the legacy default stream waits once, not per export"


def test_cuda_array_interface_stream_is_waited_for(driver):
    values = np.arange(4, dtype=np.float32)
    driver.register(values.ctypes.data, values.nbytes, 1)

    class Cai:
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (values.ctypes.data, False),
                                    "version": 3, "stream": 7}

    t = dlbridge.asarray(Cai())
    assert t.device == (2, 1), "the device comes from the pointer, not from a default of 0"
    assert ready_stream(t) == 1
    assert hand_off([r for r in driver.log() if r[0] != "sync"]) == [(7, 1, 1)]
    assert np.from_dlpack(dlbridge.from_dlpack(t, device="cpu")).tolist() == [0.0, 1.0, 2.0, 3.0]


def test_no_growth_over_many_exchanges(driver):
    x, _ = table_producer(work_stream=0x5000, make=lambda: driver.device_fake([1.0, 2.0], (2,)))
    allocations = driver.live_allocations()
    for i in range(20_000):
        t = dlbridge.from_dlpack(x, stream=9)
        t.__dlpack__(stream=11, max_version=(1, 3))
        if i % 5000 == 0:
            driver.clear()
    assert driver.live_events() == 0 and driver.context_depth() == 0
    assert driver.live_allocations() == allocations


def test_extension_arguments_stay_on_the_producers_stream_unless_asked(driver):
    """PyTensor and PyTensorMut: by default the data stays where the producer has it (the header's
    rule: launch on the producer's current stream), and extract_on_stream orders the extension's
    own stream after it."""
    from dlbridge import _native

    x, _ = table_producer(work_stream=0x5000, make=lambda: driver.device_fake([1.0, 2.0], (2,)))
    for writable in (False, True):
        driver.clear()
        assert _native._argument_ready_stream(x, writable=writable) == 0x5000
        assert driver.log() == []
        assert _native._argument_ready_stream(x, 9, writable=writable) == 9
        assert hand_off(driver.log()) == [(0x5000, 9, 0)]
    ours = dlbridge.from_dlpack(x, stream=9)
    driver.clear()
    assert _native._argument_ready_stream(ours) == 9, "a dlbridge tensor is borrowed as it is"
    assert _native._argument_ready_stream(ours, 11) == 11
    assert hand_off(driver.log()) == [(9, 11, 0)], "one event, not two through the legacy stream"


@pytest.mark.parametrize("garbage", [2**64 - 1, 2**64 - 2, 2**63])
def test_a_work_stream_that_is_no_pointer_falls_back_to_dunder_dlpack(driver, garbage):
    from dlbridge import _native

    x, calls = table_producer(work_stream=garbage, make=lambda: driver.device_fake([1.0], (1,)))
    t = dlbridge.from_dlpack(x, stream=9)
    assert calls["dunder"] == [9] and ready_stream(t) == 9
    assert _native._argument_ready_stream(x) == 1, "the owned path, through __dlpack__ with the legacy default"
