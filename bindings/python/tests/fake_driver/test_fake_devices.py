"""True device ids against the fake driver: from the pointer for array-interface imports and for
copies dlbridge makes, and a DLPack producer whose pointer lives elsewhere than it claims refused."""

import textwrap

import numpy as np
import pytest

import dlbridge
from fake_cuda import run_fresh
from producers import DunderProducer


def test_copies_land_on_the_device_asked_for(driver):
    t = dlbridge.from_dlpack(np.arange(3.0), device=(2, 1))
    assert t.device == (2, 1)
    alloc = [r for r in driver.log() if r[0] in ("alloc", "alloc_async")]
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


def fresh(code):
    """Runs `code` in a new process with the same fake driver, NumPy, dlbridge and the driver's
    library (`lib`) at hand."""
    prelude = "import ctypes, numpy as np, dlbridge\nlib = ctypes.CDLL('libcuda.so.1')\n"
    return run_fresh(prelude + textwrap.dedent(code), timeout=120)


def test_no_other_devices_context_is_woken():
    """L5: a process that uses device 1 only never retains device 0's context: not for pinned
    copies of host data, not for pointer queries of a driver that wants a context."""
    fresh("""
        d = dlbridge.from_dlpack(np.arange(4.0), device=(2, 1))
        p = dlbridge.from_dlpack(np.arange(4.0), device=(3, 0))
        assert p.tolist() == [0.0, 1.0, 2.0, 3.0]
        lib.fake_cuda_set_strict_pointer_queries(True)

        class Cai:
            __cuda_array_interface__ = {"shape": (4,), "typestr": "<f8", "data": (d.data_ptr, False), "version": 3}

        assert dlbridge.asarray(Cai()).device == (2, 1)
        del p
        assert lib.fake_cuda_primary_retains(0) == 0, "device 0's context was woken"
        assert lib.fake_cuda_primary_retains(1) == 1, "retained once for the process"
    """)


@pytest.mark.parametrize("kind, device", [(0, (2, 1)), (1, (3, 0)), (2, (13, 1))], ids=["device", "pinned", "managed"])
def test_cuda_array_interface_pointers_are_labelled_by_what_the_driver_says(driver, kind, device):
    values = np.arange(4, dtype=np.float32)
    driver.register(values.ctypes.data, values.nbytes, 1, kind)

    class Cai:
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (values.ctypes.data, False), "version": 3}

    assert dlbridge.asarray(Cai()).device == device


def test_a_cuda_array_interface_pointer_the_driver_does_not_know_is_refused(driver):
    """L5: not silently labelled cuda:0."""
    values = np.arange(4, dtype=np.float32)  # pageable host memory: no CUDA memory

    class Cai:
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (values.ctypes.data, False), "version": 3}

    with pytest.raises(BufferError, match="does not know as CUDA memory"):
        dlbridge.asarray(Cai())


def test_a_pinned_cuda_array_interface_with_a_stream_is_waited_for_by_the_host(driver):
    """Pinned memory has no streams in DLPack: the host waits for the interface's stream."""
    S = driver.stream(device=1)
    values = np.zeros(4, dtype=np.float32)
    driver.register(values.ctypes.data, values.nbytes, 1, 1)
    driver.fill(S, values.ctypes.data, 4, 3.0, device=1)

    class Cai:
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (values.ctypes.data, False), "version": 3, "stream": S}

    t = dlbridge.asarray(Cai())
    assert t.device == (3, 0) and t.__dlpack_device__() == (3, 0)
    assert np.asarray(t).tolist() == [3.0] * 4


def test_a_context_another_library_reset_is_retained_again():
    """A primary context reset (cuDevicePrimaryCtxReset) destroys what it held; the next call that
    meets it fails with CUDA_ERROR_CONTEXT_IS_DESTROYED, says so, and the one after works again."""
    fresh("""
        import gc
        t = dlbridge.from_dlpack(np.arange(3.0), device=(2, 0))
        lib.fake_cuda_primary_reset(0)
        try:
            dlbridge.from_dlpack(np.arange(3.0), device=(2, 0))
        except BufferError as e:
            assert "709 (CUDA_ERROR_CONTEXT_IS_DESTROYED)" in str(e), e
        else:
            raise AssertionError("no error after the reset")
        del t  # its memory went with the context: freeing it fails quietly
        gc.collect()
        u = dlbridge.from_dlpack(np.arange(3.0), device=(2, 0))
        assert dlbridge.from_dlpack(u, device="cpu").tolist() == [0.0, 1.0, 2.0]
    """)
