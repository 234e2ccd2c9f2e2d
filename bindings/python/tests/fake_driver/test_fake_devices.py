"""True device ids against the fake driver: from the pointer for array-interface imports and for
copies dlbridge makes, and a DLPack producer whose pointer lives elsewhere than it claims refused."""

import numpy as np
import pytest

import dlbridge
from producers import DunderProducer


def test_copies_land_on_the_device_asked_for(driver):
    t = dlbridge.from_dlpack(np.arange(3.0), device=(2, 1))
    assert t.device == (2, 1)
    alloc = [r for r in driver.log() if r[0] == "alloc"]
    assert len(alloc) == 1 and alloc[0][3] == 1, "allocated with device 1's context current"
    c = dlbridge.from_dlpack(t, copy=True)
    assert c.device == (2, 1)


def test_a_producer_that_mislabels_its_device_is_refused(driver):
    x = DunderProducer(device=(2, 0), make=lambda: driver.device_fake([1.0], (1,), device=(2, 1)))
    with pytest.raises(BufferError, match="says its tensor is on cuda:0, but its memory is on cuda:1"):
        dlbridge.from_dlpack(x)


def test_memory_the_driver_does_not_know_keeps_the_producers_word(driver):
    from dlpack_ctypes import FakeProducer
    from producers import labelled

    x = DunderProducer(device=(2, 1), make=lambda: labelled(FakeProducer(), (2, 1)))
    assert dlbridge.from_dlpack(x).device == (2, 1)


def test_a_device_that_does_not_exist(driver):
    with pytest.raises(BufferError, match="cuDeviceGet failed with CUresult 101"):
        dlbridge.from_dlpack(np.arange(3.0), device=(2, 7))


def test_pointer_queries_create_no_context(driver):
    x = DunderProducer(device=(2, 1), make=lambda: driver.device_fake([1.0], (1,), device=(2, 1)))
    assert dlbridge.from_dlpack(x).device == (2, 1)
    queries = [r for r in driver.log(pointers=True) if r[0] == "pointer"]
    assert len(queries) == 1 and queries[0][2] == 1 and queries[0][3] == -1, queries


def test_a_driver_that_wants_a_context_for_pointer_queries_gets_the_claimed_devices(driver):
    driver.strict_pointer_queries(True)
    x = DunderProducer(device=(2, 1), make=lambda: driver.device_fake([1.0], (1,), device=(2, 1)))
    assert dlbridge.from_dlpack(x).device == (2, 1)
    queries = [r for r in driver.log(pointers=True) if r[0] == "pointer"]
    assert len(queries) == 1 and queries[0][3] == 1, "asked again in cuda:1's context, not cuda:0's"
    y = DunderProducer(device=(2, 0), make=lambda: driver.device_fake([1.0], (1,), device=(2, 1)))
    with pytest.raises(BufferError, match="its memory is on cuda:1"):
        dlbridge.from_dlpack(y)
