"""M3: what dlbridge asks a producer for when the caller names a device. A move dlbridge can make
itself (CUDA to the host, host to CUDA or to pinned memory) is not asked of the producer, which the
spec allows to refuse it with BufferError; and a CPU `dl_device` is never sent with a stream."""

import numpy as np
import pytest

import dlbridge
from producers import DunderProducer


class HostProducer:
    """A host producer that follows the spec to the letter: BufferError for any device but the
    CPU, ValueError for any stream (the CPU has none)."""

    def __init__(self, array):
        self.array, self.calls = array, []

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.calls.append({"stream": stream, "dl_device": dl_device, "copy": copy})
        if stream is not None:
            raise ValueError("stream must be None on the CPU")
        if dl_device not in (None, (1, 0)):
            raise BufferError(f"cannot export to {dl_device}")
        return self.array.__dlpack__(max_version=max_version, copy=copy)


class Forward:
    """Hands `__dlpack__` and `__dlpack_device__` on to another object as they come."""

    def __init__(self, inner):
        self.inner = inner

    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()

    def __dlpack__(self, **kwargs):
        return self.inner.__dlpack__(**kwargs)


@pytest.mark.parametrize("device", [(2, 0), (2, 1), (3, 0)])
def test_a_host_producer_that_cannot_move_its_data_is_moved_by_dlbridge(driver, device):
    x = HostProducer(np.arange(4, dtype=np.float32))
    t = dlbridge.from_dlpack(x, device=device)
    assert t.device == device and t.is_copied
    assert x.calls == [{"stream": None, "dl_device": None, "copy": None}]
    assert dlbridge.from_dlpack(t, device="cpu").tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_dlbridge_tensor_behind_dunder_dlpack_is_moved_to_the_cpu(driver):
    t = dlbridge.from_dlpack(DunderProducer(make=lambda: driver.device_fake([1.0, 2.0], (2,))))
    assert dlbridge.from_dlpack(Forward(t), device="cpu").tolist() == [1.0, 2.0]
    assert dlbridge.from_dlpack(Forward(t), device="cpu", copy=True).tolist() == [1.0, 2.0]


def test_a_device_copy_is_not_asked_twice(driver):
    """`device="cpu", copy=True` of a CUDA producer: dlbridge's move is the copy; the producer is
    not asked for one of its own first."""
    x = DunderProducer(make=lambda: driver.device_fake([1.0, 2.0], (2,)))
    assert dlbridge.from_dlpack(x, device="cpu", copy=True).tolist() == [1.0, 2.0]
    assert x.calls[-1] == {"max_version": (1, 3), "stream": 1}
