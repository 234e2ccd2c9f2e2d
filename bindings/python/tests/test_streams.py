"""The consumer side of the spec's stream rules, with producers that record what they are asked:
a producer on a device with streams gets an explicit stream (the caller's, or the legacy default),
checked per device; a CPU producer gets none. No GPU is needed: these producers hand out capsules
that claim CUDA or ROCm memory, which dlbridge carries without touching it."""

import numpy as np
import pytest

import dlbridge
from markers import no_driver
from dlpack_ctypes import FakeProducer


class Recorder:
    """A producer on `device` that records the keywords of each `__dlpack__` call."""

    def __init__(self, device, accepts=("stream", "max_version", "dl_device", "copy")):
        self.device, self.accepts, self.calls, self.fakes = device, accepts, [], []

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, **kwargs):
        unknown = set(kwargs) - set(self.accepts)
        if unknown:
            raise TypeError(f"unexpected keyword {sorted(unknown)[0]}")
        self.calls.append(kwargs)
        fake = FakeProducer(versioned=kwargs.get("max_version") is not None)
        fake.tensor.device.device_type, fake.tensor.device.device_id = self.device
        self.fakes.append(fake)
        return fake.capsule()


def test_cuda_producer_gets_the_legacy_default_stream():
    p = Recorder((2, 0))
    t = dlbridge.from_dlpack(p)
    assert t.device == (2, 0)
    assert p.calls == [{"max_version": (1, 3), "stream": 1}]


def test_the_callers_stream_is_passed_as_given():
    p = Recorder((2, 1))
    for stream in (7, -1, 2):  # -1: the consumer asks for no synchronisation
        try:
            dlbridge.from_dlpack(p, stream=stream)
        except BufferError as e:  # keeping the data ready on 7 or 2 takes an event, so a driver
            assert stream != -1 and "CUDA" in str(e), e
    assert [c["stream"] for c in p.calls] == [7, -1, 2]


@pytest.mark.parametrize("device, stream", [((2, 0), 0), ((2, 0), -2), ((10, 0), 1), ((10, 0), 2), ((1, 0), 3)])
def test_invalid_streams_are_value_errors_before_the_producer_is_asked(device, stream):
    p = Recorder(device)
    with pytest.raises(ValueError):
        dlbridge.from_dlpack(p, stream=stream)
    assert p.calls == []


def test_rocm_default_is_zero():
    p = Recorder((10, 0))
    dlbridge.from_dlpack(p)
    assert p.calls[0]["stream"] == 0


def test_cpu_producers_get_no_stream():
    p = Recorder((1, 0))
    dlbridge.from_dlpack(p)
    assert p.calls == [{"max_version": (1, 3)}]


def test_a_legacy_producer_still_gets_its_stream():
    p = Recorder((2, 0), accepts=("stream",))
    dlbridge.from_dlpack(p)
    assert p.calls == [{"stream": 1}]


def test_a_producer_without_dlpack_device_is_asked_without_a_stream():
    a = np.arange(3.0)

    class NoDevice:
        def __dlpack__(self, **kwargs):
            assert "stream" not in kwargs
            return a.__dlpack__(**kwargs)

    assert dlbridge.from_dlpack(NoDevice()).tolist() == [0.0, 1.0, 2.0]


def test_a_cpu_dl_device_is_asked_for_without_a_stream():
    """The spec: with dl_device on the CPU, stream must be None. dlbridge asks a producer for the
    CPU only when it cannot make the move itself (ROCm memory, here)."""
    p = Recorder((10, 0))
    with pytest.raises(BufferError):
        dlbridge.from_dlpack(p, device="cpu")  # this fake hands ROCm memory back regardless
    assert p.calls[0] == {"max_version": (1, 3), "dl_device": (1, 0)}


def test_cpu_fast_paths_refuse_a_stream_too():
    a = np.arange(3.0)
    assert dlbridge.from_dlpack(a).tolist() == [0.0, 1.0, 2.0]
    for source in (a, dlbridge.from_dlpack(a), Recorder((1, 0))):
        with pytest.raises(ValueError, match="no streams"):
            dlbridge.from_dlpack(source, stream=5)


# --- without a CUDA driver (this suite's machines): the hand-off is decided, and refused clearly --


def cuda_tensor(stream=None):
    p = Recorder((2, 0))
    t = dlbridge.from_dlpack(p) if stream is None else dlbridge.from_dlpack(p, stream=stream)
    return t, p


def test_a_cuda_tensor_remembers_the_stream_its_data_is_ready_on():
    t, _ = cuda_tensor()
    assert t.__cuda_array_interface__["stream"] == 1
    # Same stream, or -1: nothing to wait for, so no driver is needed.
    t.__dlpack__(stream=1)
    t.__dlpack__(stream=-1, max_version=(1, 3))
    with pytest.raises(ValueError, match="stream 0 is not valid"):
        t.__dlpack__(stream=0)


@no_driver
def test_no_stream_handle_is_kept_past_the_call_that_names_it():
    """Data ready on a stream other than the legacy default is kept as an event dlbridge records
    (CuPy and numba destroy their streams; 2 is another stream in each thread), which needs the
    driver (tests/fake_driver checks the rest)."""
    with pytest.raises(BufferError, match="CUDA is not available"):
        cuda_tensor(stream=9)
    with pytest.raises(BufferError, match="CUDA is not available"):
        cuda_tensor(stream=2)
    assert cuda_tensor(stream=-1)[0].__cuda_array_interface__["stream"] is None


@no_driver
def test_stream_hand_off_and_copies_name_the_missing_driver():
    t, _ = cuda_tensor()
    with pytest.raises(BufferError, match="CUDA is not available: the CUDA driver library"):
        t.__dlpack__(stream=5)  # data ready on 1, consumer on 5: an event is needed
    with pytest.raises(BufferError, match="CUDA is not available"):
        t.__dlpack__(dl_device=(1, 0))
    with pytest.raises(ValueError, match="cannot move .* tensor from .*copy=False"):
        t.__dlpack__(dl_device=(1, 0), copy=False)
    with pytest.raises(BufferError, match="CUDA is not available"):
        dlbridge.from_dlpack(Recorder((2, 0)), device="cpu")
    with pytest.raises(ValueError, match="cannot move .* tensor from .*copy=False"):
        dlbridge.from_dlpack(Recorder((2, 0)), device="cpu", copy=False)
    with pytest.raises(BufferError, match="CUDA is not available"):
        dlbridge.from_dlpack(np.arange(3.0), device=(2, 0))
    with pytest.raises(BufferError, match="CUDA is not available"):
        dlbridge.from_dlpack(np.arange(3.0), device=(3, 0))
    with pytest.raises(BufferError, match="CUDA is not available"):
        dlbridge.from_dlpack(Recorder((2, 0)), copy=True)


class Cai:
    def __init__(self, stream):
        self.__cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (0x10000, False), "version": 3, "strides": None, "stream": stream}


def test_cuda_array_interface_stream_entry_is_honoured_and_zero_refused():
    t = dlbridge.asarray(Cai(1))  # ready on the legacy default stream, which is dlbridge's: no order needed
    assert t.device[0] == 2 and t.__cuda_array_interface__["stream"] == 1
    assert dlbridge.asarray(Cai(None)).__cuda_array_interface__["stream"] is None
    with pytest.raises(ValueError, match="stream 0"):
        dlbridge.asarray(Cai(0))
    with pytest.raises(ValueError, match="stream -1 is not a stream"):
        dlbridge.asarray(Cai(-1))


@no_driver
def test_cuda_array_interface_on_another_stream_is_waited_for():
    with pytest.raises(BufferError, match="CUDA is not available"):
        dlbridge.asarray(Cai(7))  # the legacy default stream must wait for stream 7


def test_odd_stream_values_on_export_get_the_right_exception():
    t, _ = cuda_tensor()
    with pytest.raises(ValueError, match="not valid"):
        t.__dlpack__(stream=2**63)  # an int, but no stream
    with pytest.raises(TypeError, match="got '1'"):
        t.__dlpack__(stream="1")
    with pytest.raises(TypeError):
        t.__dlpack__(stream=1.0)
