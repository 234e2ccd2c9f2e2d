"""Thread stress (attack class 10): each test runs at once in 8 threads (pytest-run-parallel, as
NumPy runs its own suite), many iterations each, and checks every value it sees. With the GIL they
interleave at every bytecode boundary and wherever dlbridge or an extension releases the GIL; on a
free-threaded interpreter they run truly at once, against the registry's mutex, the type caches'
atomic reads and the shared-memory table's lock. Only NumPy, dlbridge and the example extensions
are needed, so that the file runs unchanged under a free-threaded interpreter
(DLBRIDGE_PYTHON=python3.14t ./dev test bindings/python/tests/test_thread_stress.py)."""

import copy
import pickle
import queue
import threading

import numpy as np
import pytest

import dlbridge
import gil_released
import scale_inplace

THREADS = pytest.mark.force_parallel_threads(8)
ITERATIONS = pytest.mark.iterations(100)
# Capsules made in one thread and consumed in another (shared by the threads of one test).
hand_offs = queue.Queue()
# One read-only array every thread reads at once.
SHARED = np.arange(4096, dtype=np.float32)
SHARED.flags.writeable = False


@THREADS
@ITERATIONS
def test_imports_from_every_producer_keep_values_and_memory():
    mine = np.arange(64, dtype=np.float64) * threading.get_ident() % 97
    for producer in (mine, SHARED, dlbridge.asarray(bytearray(b"\x01\x02\x03")), dlbridge.from_dlpack(mine)):
        t = dlbridge.from_dlpack(producer)
        assert np.array_equal(np.from_dlpack(t), np.asarray(producer))
    assert dlbridge.from_dlpack(mine).data_ptr == mine.ctypes.data
    assert dlbridge.from_dlpack(SHARED).readonly


@THREADS
@ITERATIONS
def test_capsules_handed_from_thread_to_thread():
    value = threading.get_ident() % 251
    hand_offs.put((value, dlbridge.zeros(32, "uint8").__dlpack__(max_version=(1, 3))))
    hand_offs.put((value, np.full(32, value, np.uint8).__dlpack__()))
    for _ in range(2):
        _, capsule = hand_offs.get(timeout=30)
        got = dlbridge.from_dlpack(capsule).tolist()
        assert len(set(got)) == 1 and len(got) == 32
        with pytest.raises(ValueError, match="already consumed"):
            dlbridge.from_dlpack(capsule)


@THREADS
@ITERATIONS
def test_extension_arguments_read_shared_and_write_their_own():
    assert scale_inplace.total(SHARED) == float(SHARED.astype(np.float64).sum())
    mine = np.ones(256, np.float32)
    scale_inplace.scale(mine, 3.0)
    assert mine.tolist() == [3.0] * 256
    with pytest.raises(BufferError, match="read-only"):
        scale_inplace.scale(SHARED, 2.0)
    t = dlbridge.from_dlpack(mine.view(np.uint8))
    assert gil_released.fill(t, 5, 50) and gil_released.checksum(t, 50) == (5 * 1024, True)


@THREADS
@ITERATIONS
def test_pickles_of_every_protocol_round_trip():
    t = dlbridge.from_dlpack(np.arange(16, dtype=np.int32) + threading.get_ident() % 1000)
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        u = pickle.loads(pickle.dumps(t, protocol=protocol))
        assert u.tolist() == t.tolist() and u._writability == "writable"
    buffers = []
    u = pickle.loads(pickle.dumps(t, protocol=5, buffer_callback=buffers.append), buffers=buffers)
    assert u.data_ptr == t.data_ptr


@THREADS
@ITERATIONS
def test_shared_memory_made_attached_and_freed():
    value = threading.get_ident() % 200 + 1
    s = dlbridge.empty(64, "uint8", shared=True)
    np.from_dlpack(s)[:] = value
    again = pickle.loads(pickle.dumps(s))  # the same segment, mapped once in this process
    assert again.data_ptr == s.data_ptr and again.tolist() == [value] * 64
    copied = copy.copy(s)  # a new segment
    assert copied.is_shared and copied.data_ptr != s.data_ptr and copied.tolist() == [value] * 64
    shared = dlbridge.from_dlpack(np.full(8, value, np.uint8)).share_memory()
    assert shared.tolist() == [value] * 8
    del s, again, copied, shared


@THREADS
@ITERATIONS
def test_host_reads_and_copies():
    t = dlbridge.from_dlpack(SHARED)
    assert t.copy().tolist() == SHARED.tolist()
    assert t.tolist()[:3] == [0.0, 1.0, 2.0]
    assert dlbridge.from_dlpack(t, copy=True).data_ptr != t.data_ptr
