"""CUDA graph capture (M6), against the fake's capture rules: a capturing stream cannot wait on an
event recorded outside its capture (without CU_EVENT_WAIT_EXTERNAL, and a graph would keep referring
to it), the legacy stream is unusable while a blocking stream captures, and unsafe calls (frees,
host synchronisation) invalidate a global capture. dlbridge waits on the host for work outside the
graph, keeps work inside it inside, refuses clearly what cannot be captured, and never breaks
another library's capture."""

import gc

import numpy as np
import pytest

import dlbridge
from producers import table_producer

VALUES = [1.0, 2.0, 3.0, 4.0]


@pytest.fixture
def capture(driver):
    """Starts a capture on a fresh stream (non-blocking unless asked); ends it afterwards."""
    open_ = []

    def begin(non_blocking=True, mode="global"):
        stream = driver.stream(non_blocking=non_blocking)
        driver.begin_capture(stream, mode)
        open_.append(stream)
        return stream

    yield begin
    for stream in open_:
        if driver.capture_status(stream) != "none":
            driver.end_capture(stream)


def test_data_ready_outside_is_waited_for_by_the_host_and_the_graph_replays(driver, capture):
    """torch.from_dlpack(t) inside torch.cuda.graph: t's data is pending outside the graph (a
    host-to-device DMA on the legacy stream); the capturing stream gets it, the capture stays valid,
    and each replay reads the values."""
    t = dlbridge.from_dlpack(np.array(VALUES, dtype=np.float32), device=(2, 0))
    C = capture()
    t.__dlpack__(stream=C, max_version=(1, 3))
    assert driver.capture_status(C) == "active", "the capture was invalidated"
    assert driver.peek(t.data_ptr, 4) == VALUES, "the host waited for the work outside the graph"
    out = np.zeros(4, dtype=np.float32)
    driver.lib.fake_cuda_launch_copy(0, C, out.ctypes.data, t.data_ptr, 16)  # the graph's kernel
    graph = driver.end_capture(C)
    assert graph > 1000 or graph < 900, f"the capture ended with CUresult {graph}"
    D = driver.stream()
    for _ in range(2):
        out[:] = 0
        assert driver.launch_graph(graph, D) == 0
        driver.run(D)
        assert out.tolist() == VALUES


def test_work_inside_the_capture_stays_inside(driver, capture):
    """A tensor taken inside the capture from the capturing stream (torch's current stream) is
    ready on it; consumers inside the capture wait as usual, and a copy becomes part of the graph.
    While the capture runs, a stream outside it cannot wait for work that only the graph will do:
    a clear error. Afterwards the graph's launches are ordered by whoever launches them."""
    C = capture()
    a = driver.device_array(4)
    driver.fill(C, a.ctypes.data, 4, 5.0)  # captured: runs with the graph
    x, _ = table_producer(work_stream=C, make=lambda: driver.over(a))
    t = dlbridge.from_dlpack(x, stream=C)
    t.__dlpack__(stream=C, max_version=(1, 3))
    c = dlbridge.from_dlpack(t, copy=True, stream=C)
    D = driver.stream()
    with pytest.raises(BufferError, match="CUDA graph capture: the data is written inside a CUDA graph being captured"):
        t.__dlpack__(stream=D, max_version=(1, 3))
    with pytest.raises(BufferError, match="CUDA graph capture"):
        dlbridge.from_dlpack(t, device="cpu")
    assert driver.capture_status(C) == "active"
    graph = driver.end_capture(C)
    assert driver.peek(c.data_ptr, 4) == [0.0] * 4, "nothing ran before the graph"
    assert driver.launch_graph(graph, D) == 0
    driver.run(D)
    assert driver.peek(c.data_ptr, 4) == [5.0] * 4, "the copy replayed after the fill"
    # Once the capture has ended, the graph's launches are ordered by whoever launches them.
    assert dlbridge.from_dlpack(c, device="cpu").tolist() == [5.0] * 4
    t.__dlpack__(stream=D, max_version=(1, 3))


def test_no_legacy_default_for_data_written_inside_a_capture(driver, capture):
    """`from_dlpack(x)` inside the capture names no stream, so the legacy default would have to wait
    for captured work: refused, saying which stream to pass; the capture stays valid."""
    C = capture()
    a = driver.device_array(4)
    x, _ = table_producer(work_stream=C, make=lambda: driver.over(a))
    with pytest.raises(BufferError, match=r"pass the capturing stream \(stream=\)"):
        dlbridge.from_dlpack(x)
    assert driver.capture_status(C) == "active"


def test_the_legacy_stream_during_a_blocking_capture_is_refused_before_it_is_used(driver, capture):
    t = dlbridge.from_dlpack(np.array(VALUES, dtype=np.float32), device=(2, 0))  # ready on the legacy stream
    C = capture(non_blocking=False)
    with pytest.raises(BufferError, match="legacy default stream .1. cannot be used while a blocking stream"):
        t.__dlpack__(stream=C, max_version=(1, 3))
    assert driver.capture_status(C) == "active", "the check itself must not invalidate the capture"


def test_blocking_calls_do_not_invalidate_a_global_capture(driver, capture):
    """Frees and host copies of data outside the graph, while another library captures in global
    mode on this thread: dlbridge relaxes its own thread's capture mode for them."""
    copy = dlbridge.from_dlpack(np.arange(4.0), device=(2, 0))
    t = dlbridge.from_dlpack(np.arange(4.0, dtype=np.float32), device=(2, 0))
    C = capture()
    assert dlbridge.from_dlpack(t, device="cpu").tolist() == [0.0, 1.0, 2.0, 3.0]
    del copy
    gc.collect()
    assert driver.capture_status(C) == "active"


def test_memory_dropped_while_a_blocking_stream_captures_is_freed_after_the_capture(driver, capture):
    """The legacy stream, which frees are queued on, cannot be used while a blocking stream of its
    context captures: the free waits (on dlbridge's release thread) until the capture has ended,
    and the capture stays valid."""
    t = dlbridge.from_dlpack(np.array(VALUES, dtype=np.float32), device=(2, 0))
    p = dlbridge.from_dlpack(np.array(VALUES, dtype=np.float32), device=(3, 0))
    before = driver.live_allocations()
    C = capture(non_blocking=False)
    del t, p
    gc.collect()
    assert driver.capture_status(C) == "active", "the frees must not touch the legacy stream during the capture"
    assert driver.live_allocations() == before, "nothing freed during the capture"
    assert not [r for r in driver.log() if r[0] in ("free_async", "free_host")]
    graph = driver.end_capture(C)
    assert graph > 1000 or graph < 900, f"the capture ended with CUresult {graph}"
    assert driver.settle(lambda: driver.live_allocations(), before - 2) == before - 2, "freed once the capture ended"
