"""Streams through the C exchange API, both ways, without a GPU.

As consumer: a producer whose table hands out "CUDA" tensors (host memory labelled CUDA, which
dlbridge carries without touching) and reports a current work stream. dlbridge must take the data as
ready on that stream, order a stream the caller names after it, and go through `__dlpack__` when
the producer cannot name its stream or the tensor is on ROCm. As producer: dlbridge's table reports
CUDA's legacy default stream, and its no_sync exports first make that stream wait for pending work.

Where an order is needed on this CPU machine, the missing driver is the expected answer: the test
proves an event was asked for, and the GPU suite proves it is the right one."""

import ctypes

import pytest

import dlbridge
from dlbridge._check import abi
from dlpack_ctypes import FakeProducer
from markers import no_driver
from producers import DunderProducer, labelled, ready_stream, table_producer

def test_a_table_import_asks_the_producers_work_stream():
    x, calls = table_producer(work_stream=0)
    t = dlbridge.from_dlpack(x, stream=1)  # the producer's own stream: nothing to order
    assert calls["table"] == 1 and calls["dunder"] == [], "the table was used, not __dlpack__"
    assert calls["stream_queries"] == [(2, 0)]
    assert ready_stream(t) == 1


@no_driver
def test_data_kept_ready_on_a_stream_other_than_the_legacy_default_needs_the_driver():
    """No handle is kept past the call that names it: an event is recorded there, which needs the driver."""
    x, calls = table_producer(work_stream=0x5000)
    with pytest.raises(BufferError, match="CUDA is not available"):
        dlbridge.from_dlpack(x, stream=0x5000)  # the producer's own stream: nothing to order, but kept
    assert calls["table"] == 1 and calls["dunder"] == [], "the table was used, not __dlpack__"


def test_minus_one_orders_nothing_and_keeps_no_stream():
    x, calls = table_producer(work_stream=0x5000)
    t = dlbridge.from_dlpack(x, stream=-1)
    assert calls["table"] == 1 and calls["stream_queries"] == [(2, 0)]
    assert ready_stream(t) is None, "the caller took ordering on itself; the producer's stream may not outlive t"


def test_a_null_work_stream_on_cuda_is_the_legacy_default():
    x, _ = table_producer(work_stream=0)
    assert ready_stream(dlbridge.from_dlpack(x)) == 1, "ready on 1, which is dlbridge's default: no order"
    assert ready_stream(dlbridge.from_dlpack(x, stream=1)) == 1


@no_driver
def test_another_stream_is_made_to_wait_which_needs_the_driver():
    x, calls = table_producer(work_stream=0x5000)
    with pytest.raises(BufferError, match="CUDA is not available"):
        dlbridge.from_dlpack(x, stream=9)
    with pytest.raises(BufferError, match="CUDA is not available"):
        dlbridge.from_dlpack(x)  # the legacy default stream must wait for 0x5000
    assert calls["dunder"] == [], "the order is made here, not by asking __dlpack__ again"


def test_invalid_streams_are_refused_on_the_table_path_too():
    x, calls = table_producer()
    with pytest.raises(ValueError, match="stream 0"):
        dlbridge.from_dlpack(x, stream=0)
    assert calls["table"] == 1 and calls["dunder"] == []


def test_a_table_without_current_work_stream_falls_back_to_dunder_dlpack():
    x, calls = table_producer(has_stream_function=False)
    t = dlbridge.from_dlpack(x, stream=1)
    assert calls["dunder"] == [1]
    assert ready_stream(t) == 1


def test_rocm_tensors_go_through_dunder_dlpack():
    x, calls = table_producer(device=(10, 0))
    dlbridge.from_dlpack(x)
    assert calls["dunder"] == [0], "ROCm's default stream, passed to the producer, which orders its own work"


def test_cpu_tensors_from_a_table_ask_no_stream():
    x, calls = table_producer(device=(1, 0))
    t = dlbridge.from_dlpack(x)
    assert calls["table"] == 1 and calls["stream_queries"] == []
    assert t.device == (1, 0)


# --- dlbridge as producer ------------------------------------------------------------------------

def our_table():
    capsule = dlbridge.Tensor.__dlpack_c_exchange_api__
    return abi.ExchangeAPI.from_address(abi.capsule_pointer(capsule))


@pytest.mark.parametrize("device, expected", [((2, 0), 1), ((13, 1), 1), ((1, 0), None), ((10, 0), None), ((3, 0), None)])
def test_our_current_work_stream(device, expected):
    out = ctypes.c_void_p()
    assert abi.STREAM(our_table().current_work_stream)(*device, ctypes.byref(out)) == 0
    assert out.value == expected


def cuda_tensor_ready_on(stream):
    """A dlbridge tensor whose data is ready on `stream` (0: the legacy default), made with no driver."""
    x, _ = table_producer(work_stream=stream)
    return dlbridge.from_dlpack(x, stream=stream or 1)


def test_our_no_sync_export_of_data_on_the_default_stream_needs_no_order():
    t = cuda_tensor_ready_on(0)  # ready on the legacy default stream
    out = ctypes.c_void_p()
    assert abi.FROM_PY(our_table().managed_tensor_from_py_object_no_sync)(t, ctypes.byref(out)) == 0
    managed = abi.DLManagedTensorVersioned.from_address(out.value)
    assert managed.dl_tensor.device.device_type == 2
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(managed.deleter)(out.value)


@no_driver
def test_our_no_sync_exports_order_the_default_stream_after_pending_work():
    """Pending work elsewhere than the legacy default stream is kept as an event, which needs the
    driver already when the tensor is made (tests/fake_driver checks the exports' ordering)."""
    with pytest.raises(BufferError, match="CUDA is not available"):
        cuda_tensor_ready_on(0x5000)


def test_dunder_dlpack_with_minus_one_leaves_no_ready_stream():
    t = dlbridge.from_dlpack(DunderProducer(), stream=-1)
    assert ready_stream(t) is None, "the producer was told not to synchronise: nothing is known, nothing to wait for"
    t.__dlpack__(stream=5)  # so no event is asked for, and no driver needed


class KeywordlessProducer:
    """A CUDA producer from before the stream keyword: it orders its work before the legacy default
    stream, which is what a producer asked with no stream assumes."""

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self):
        return labelled(FakeProducer(versioned=False), (2, 0)).capsule()


def test_a_producer_asked_without_keywords_is_ready_on_the_legacy_default():
    assert ready_stream(dlbridge.from_dlpack(KeywordlessProducer())) == 1


@no_driver
def test_a_producer_asked_without_keywords_is_ordered_before_the_callers_stream():
    with pytest.raises(BufferError, match="CUDA is not available"):
        dlbridge.from_dlpack(KeywordlessProducer(), stream=7)  # 7 must wait for the legacy default stream


def test_a_table_that_succeeds_with_an_exception_set_falls_back_and_frees_its_export():
    """The API says 0 means success with no exception; a table breaking that is not trusted: its
    export is deleted once, the stray exception cleared, and `__dlpack__` asked instead."""
    from dlbridge import _native
    import numpy as np

    capsule, deleted = _native._contract_breaking_table()
    _native._trust_table_for_tests(capsule)
    source = np.arange(3.0)

    class Broken:
        __dlpack_c_exchange_api__ = capsule

        def __dlpack__(self, **kwargs):
            return source.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return (1, 0)

    t = dlbridge.from_dlpack(Broken())
    assert t.tolist() == [0.0, 1.0, 2.0], "__dlpack__'s tensor, not the table's"
    assert _native._contract_breaking_table()[1] == deleted + 1, "the table's export deleted exactly once"
