"""Frees and host-to-device copies that never wait on the host where nothing needs it, against the
fake's documented rules: `cuMemFree`/`cuMemFreeHost` free at once, `cuMemFreeAsync` when its stream
reaches it, and a freed block goes to the next allocation that fits (as a pool reuses memory).

Each free test drops memory that GPU work still uses, lets the legacy stream (which dlbridge frees
on) reach the free, has the block handed out again and written, then runs the rest: a free ordered
too early shows as the new owner's bytes overwritten, or as work counted on freed memory (which the
`driver` fixture checks after every test)."""

import gc
import textwrap
import time

import numpy as np
import pytest

import dlbridge
from fake_cuda import run_fresh

DELAY_MS = 1000  # each blocking call of the fake, while a drop is timed: far above any scheduling noise


def host(t):
    return np.from_dlpack(dlbridge.from_dlpack(t, device="cpu"))


def host_waits(driver):
    return [r for r in driver.log() if r[0] in ("sync", "event_sync")]


def test_a_copy_on_another_stream_is_freed_after_it_ran_without_a_host_wait(driver):
    n = 4097  # a size no other freed block has: the pool's reuse is then predictable
    t = dlbridge.from_dlpack(np.full(n, 7.0, dtype=np.float32), device=(2, 0))
    C = driver.stream()
    c = dlbridge.from_dlpack(t, copy=True, stream=C)  # queued on C, which is non-blocking
    address = c.data_ptr
    driver.clear()
    gc.collect()
    driver.sync_delay(DELAY_MS)
    start = time.monotonic()
    del c  # the last reference: the deleter runs here
    elapsed = time.monotonic() - start
    driver.sync_delay(0)
    log = driver.log()
    assert not host_waits(driver) and elapsed < DELAY_MS / 1000 / 2, f"the free waited on the host: {log}"
    assert [(k, a) for k, a, _, _ in log if k in ("wait", "free_async")] == [("wait", 1), ("free_async", address)], (
        f"the legacy stream waits for the copy's event, then frees: {log}")
    assert driver.pending(C) >= 1, "the copy has not run yet"
    driver.run(1)  # the legacy stream reaches the free, after the copy on C
    reused = dlbridge.from_dlpack(np.full(n, 5.0, dtype=np.float32), device=(2, 0))
    assert reused.data_ptr == address, "the pool hands the block out again"
    driver.run(1)
    driver.run(C)
    assert (host(reused) == 5.0).all(), "the copy on C wrote the block after it was freed and reused"


def test_memory_read_on_a_blocking_stream_is_freed_after_that_read(driver):
    """The legacy stream, which the free is queued on, waits for every blocking stream's work."""
    n = 4099
    t = dlbridge.from_dlpack(np.full(n, 3.0, dtype=np.float32), device=(2, 0))
    B = driver.stream(non_blocking=False)
    t.__dlpack__(stream=B, max_version=(1, 3))
    out = np.zeros(n, dtype=np.float32)
    address = t.data_ptr
    assert driver.lib.fake_cuda_launch_copy(0, B, out.ctypes.data, address, out.nbytes) == 0  # a consumer's read on B
    del t
    gc.collect()
    driver.run(1)
    reused = dlbridge.from_dlpack(np.full(n, 9.0, dtype=np.float32), device=(2, 0))
    assert reused.data_ptr == address
    driver.run_all()
    assert (out == 3.0).all(), "B's read saw the reused block"
    assert (host(reused) == 9.0).all()


def test_pinned_memory_is_freed_after_the_legacy_streams_work_on_the_release_thread(driver):
    n = 4103
    p = dlbridge.from_dlpack(np.full(n, 3.0, dtype=np.float32), device=(3, 0))
    address = p.data_ptr
    out = driver.device_array(n)
    # A consumer's DMA from the pinned memory, queued on the legacy stream (torch's .cuda(non_blocking=True)).
    assert driver.lib.fake_cuda_launch_copy(0, 1, out.ctypes.data, address, out.nbytes) == 0
    driver.clear()
    gc.collect()
    driver.sync_delay(DELAY_MS)
    start = time.monotonic()
    del p  # the last reference: the deleter runs here
    elapsed = time.monotonic() - start
    assert elapsed < DELAY_MS / 1000 / 2, f"the deleter waited {elapsed:.2f} s for the free"
    # Nothing here completes queued work: only the release thread's wait for its fence runs the DMA.
    assert driver.wait_for(lambda: [r[0] for r in driver.log()].count("free_host") == 1), driver.log()
    driver.sync_delay(0)
    assert driver.pending(1) == 0, "freed before the DMA on the legacy stream ran"
    assert [r[0] for r in driver.log() if r[0] in ("record", "event_sync", "free_host")] == ["record", "event_sync", "free_host"], (
        "a fence on the legacy stream, waited for by the release thread, then the free")
    q = dlbridge.from_dlpack(np.full(n, 9.0, dtype=np.float32), device=(3, 0))
    assert q.data_ptr == address, "the pinned block is handed out again"
    driver.run_all()
    assert (out == 3.0).all(), "the DMA read the pinned memory after it was freed and reused"


def test_without_memory_pools_frees_wait_for_a_fence_on_the_release_thread():
    """A device without memory pools (older drivers, some virtual GPUs): `cuMemAlloc`, and the free
    waits for a fence on the legacy stream on dlbridge's release thread, never on the caller's."""
    code = textwrap.dedent("""
        import gc, time
        import numpy as np
        import dlbridge
        from fake_cuda import FakeDriver
        driver = FakeDriver()
        driver.memory_pools(False)
        n = 4097
        t = dlbridge.from_dlpack(np.full(n, 7.0, dtype=np.float32), device=(2, 0))
        C = driver.stream()
        c = dlbridge.from_dlpack(t, copy=True, stream=C)
        address = c.data_ptr
        kinds = driver.kinds()
        assert "alloc" in kinds and "alloc_async" not in kinds, kinds
        driver.clear()
        gc.collect()
        driver.sync_delay(1000)
        start = time.monotonic()
        del c  # the last reference: the deleter runs here
        assert time.monotonic() - start < 0.5, "the deleter waited"
        # Nothing here completes queued work: only the release thread's wait for its fence runs the copy.
        assert driver.wait_for(lambda: driver.kinds().count("free") == 1), driver.log()
        driver.sync_delay(0)
        assert driver.pending(C) == 0, (driver.log(), "freed before the copy on C ran")
        reused = dlbridge.from_dlpack(np.full(n, 5.0, dtype=np.float32), device=(2, 0))
        assert reused.data_ptr == address
        driver.run_all()
        assert (np.from_dlpack(dlbridge.from_dlpack(reused, device="cpu")) == 5.0).all()
        assert driver.lib.fake_cuda_uses_after_free() == 0
        print("done")
    """)
    assert "done" in run_fresh(code)


def test_a_host_to_device_copy_waits_for_nothing_queued_before_it(driver):
    """C3: the synchronous copy from pageable memory first waited for the legacy stream (torch's
    default stream); the staged copy is queued behind that work and returns at once."""
    busy = driver.device_array(4)
    driver.fill(1, busy.ctypes.data, 4, 1.0)  # work still queued on the legacy stream
    driver.clear()
    t = dlbridge.from_dlpack(np.full(4, 2.0, dtype=np.float32), device=(2, 0))
    assert not host_waits(driver), driver.log()
    assert driver.pending(1) >= 2, "the earlier work and the copy are both still queued"
    assert driver.peek(busy.ctypes.data, 4) == [0.0] * 4
    assert host(t).tolist() == [2.0] * 4


def test_a_copy_larger_than_the_staging_buffers_waits_only_to_reuse_one(driver):
    """40 MiB through 4 staging buffers of 8 MiB: the fifth piece waits for the first piece's DMA,
    and no other; every element lands, with distinct values per piece."""
    a = np.arange(40 << 18, dtype=np.float32)
    C = driver.stream()
    driver.clear()
    t = dlbridge.from_dlpack(a, device=(2, 0))
    assert len(host_waits(driver)) == 1, driver.log()
    t.__dlpack__(stream=C, max_version=(1, 3))
    out = np.zeros_like(a)
    assert driver.lib.fake_cuda_launch_copy(0, C, out.ctypes.data, t.data_ptr, out.nbytes) == 0
    driver.run(C)
    np.testing.assert_array_equal(out, a)


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_blocking_calls_leave_this_threads_capture_mode_as_they_found_it(driver, mode):
    """M11a, M18: dlbridge relaxes its thread's capture mode around calls a capture forbids, and puts
    back the mode it found; another library's later calls on this thread depend on it."""
    t = dlbridge.from_dlpack(np.arange(4.0, dtype=np.float32), device=(2, 0))
    driver.set_capture_mode(mode)
    try:
        assert host(t).tolist() == [0.0, 1.0, 2.0, 3.0]
        assert driver.capture_mode() == mode, "after a host copy"
        p = dlbridge.from_dlpack(np.arange(2.0), device=(3, 0))
        assert driver.capture_mode() == mode, "after a pinned allocation"
        del p, t
        gc.collect()
        assert driver.capture_mode() == mode, "after the frees"
    finally:
        driver.set_capture_mode("global")


def test_a_stream_may_wait_for_an_event_of_another_device(driver):
    """As on a driver: cuStreamWaitEvent takes a stream of another device than the current context's."""
    import ctypes

    lib, ctx, event = driver.lib, ctypes.c_size_t(), ctypes.c_int64()
    assert lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert lib.cuCtxPushCurrent_v2(ctx) == 0
    try:
        assert lib.cuEventCreate(ctypes.byref(event), 2) == 0
        assert lib.cuEventRecord(event, ctypes.c_size_t(1)) == 0
        S1 = driver.stream(device=1)
        assert lib.cuStreamWaitEvent(ctypes.c_size_t(S1), event, 0) == 0
        assert lib.cuEventDestroy_v2(event) == 0
    finally:
        assert lib.cuCtxPopCurrent_v2(None) == 0
        assert lib.cuDevicePrimaryCtxRelease_v2(0) == 0
