"""Beyond one process: pickle (out of band with protocol 5), shared memory between processes, and
what is left in /dev/shm afterwards."""

import gc
import multiprocessing as mp
import os
import pickle
import signal
import time

import numpy as np
import pytest

import dlbridge
from dlpack_ctypes import FakeProducer
from test_shared_memory import segments as shared_memory_segments

DTYPES = ["bool", "int8", "uint16", "int32", "int64", "float16", "bfloat16", "float32", "float64", "complex64",
          "complex128", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu", "float6_e2m3fn", "float4_e2m1fn"]


def segments():
    """This process's segments (other processes on the machine may be making theirs)."""
    return shared_memory_segments(os.getpid())


@pytest.fixture(autouse=True)
def no_segment_left_behind():
    before = segments()
    yield
    gc.collect()
    assert segments() <= before, f"left in /dev/shm: {segments() - before}"


def filled(dtype, shape=(2, 3)):
    t = dlbridge.zeros(shape, dtype)
    raw = memoryview(t._bytes())
    for i in range(len(raw)):
        raw[i] = (i * 37 + 5) % 256 if dtype != "bool" else i % 2
    return t


def raw_bytes(t):
    return bytes(memoryview(t._bytes()))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_every_dtype_survives_every_protocol(dtype, protocol):
    t = filled(dtype)
    u = pickle.loads(pickle.dumps(t, protocol=protocol))
    assert (str(u.dtype), u.shape, u.readonly, raw_bytes(u)) == (dtype, t.shape, False, raw_bytes(t))


def test_protocol_5_hands_the_bytes_out_of_band():
    t = filled("float32", (256, 256))
    buffers = []
    data = pickle.dumps(t, protocol=5, buffer_callback=buffers.append)
    assert len(data) < 200 and len(buffers) == 1 and buffers[0].raw().nbytes == t.nbytes
    u = pickle.loads(data, buffers=buffers)
    assert u.data_ptr == t.data_ptr, "no copy when the buffer comes back"
    # A transport that delivers its own writable bytes: still no copy, and writable.
    received = bytearray(buffers[0].raw())
    v = pickle.loads(data, buffers=[received])
    assert not v.readonly and raw_bytes(v) == raw_bytes(t)


def test_layouts_and_writability_survive():
    a = np.arange(24.0).reshape(4, 6)
    for view in (a[::-1], a[:, ::2], a.T, np.broadcast_to(a[:1], (3, 6)), a[:0], np.array(7.0)):
        t = dlbridge.from_dlpack(view)
        u = pickle.loads(pickle.dumps(t, protocol=5))
        assert u.tolist() == view.tolist() and u.shape == view.shape
    ro = dlbridge.asarray(b"abcd")
    for protocol in (2, 5):
        assert pickle.loads(pickle.dumps(ro, protocol=protocol)).readonly
    p = FakeProducer(versioned=False)
    capsule = p.capsule()
    unknown = dlbridge.from_dlpack(capsule)
    for protocol in range(6):
        again = pickle.loads(pickle.dumps(unknown, protocol=protocol))
        assert again._writability == "unknown" and again.readonly


def test_cuda_tensor_is_refused_clearly():
    p = FakeProducer()
    p.tensor.device.device_type = 2
    capsule = p.capsule()
    t = dlbridge.from_dlpack(capsule)
    with pytest.raises(TypeError, match="cannot pickle a tensor on cuda"):
        pickle.dumps(t)


@pytest.mark.parametrize("args, pattern", [
    ((b"abc", "float32", (1,), "writable", False), "holds 3 bytes"),
    ((b"abcd", "nope", (1,), "writable", False), "unknown dtype name"),
    ((b"abcd", "float32", (-1,), "writable", False), "negative"),
    ((b"abcd", "float32", (2**62, 2**62), "writable", False), "overflows"),
    ((b"abcd", "float32", (1,), "bogus", False), "writability"),
])
def test_malformed_payloads_are_value_errors(args, pattern):
    with pytest.raises(ValueError, match=pattern):
        dlbridge._rebuild_tensor(*args)


def _child_writes(t, value, done):
    np.from_dlpack(t)[...] = value
    done.put(dlbridge.from_dlpack(t).tolist())


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_shared_tensor_crosses_processes_without_copies(method):
    ctx = mp.get_context(method)
    t = dlbridge.empty((2, 3), "float64", shared=True)
    assert t.is_shared and len(pickle.dumps(t, protocol=5)) < 300, "a handle, not the bytes"
    done = ctx.Queue()
    worker = ctx.Process(target=_child_writes, args=(t, 4.5, done))
    worker.start()
    assert done.get(timeout=60) == [[4.5] * 3] * 2
    worker.join(60)
    assert t.tolist() == [[4.5] * 3] * 2, "the child wrote into the same memory"


def test_share_memory_keeps_values_and_writability():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    s = dlbridge.from_dlpack(a[:, ::-1]).share_memory()
    assert s.is_shared and s.tolist() == a[:, ::-1].tolist() and not s.readonly
    assert s.share_memory() is s
    ro = dlbridge.asarray(b"abcd").share_memory()
    assert ro.readonly and pickle.loads(pickle.dumps(ro)).readonly


def _child_sleeps(t, ready):
    ready.put(t.tolist())
    time.sleep(60)


def test_killed_worker_leaves_nothing_and_late_receiver_gets_a_clear_error():
    ctx = mp.get_context("spawn")
    t = dlbridge.empty(4, "uint8", shared=True)
    ready = ctx.Queue()
    worker = ctx.Process(target=_child_sleeps, args=(t, ready))
    worker.start()
    assert ready.get(timeout=60) == [0, 0, 0, 0]
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(60)
    handle = pickle.dumps(t)
    name = t.__reduce_ex__(5)[1][0]
    assert name in segments()
    del t
    gc.collect()
    assert name not in segments(), "the creator unlinked its segment when its tensor died"
    with pytest.raises(FileNotFoundError, match="no longer exists"):
        pickle.loads(handle)


def _child_sum(t):
    return float(np.from_dlpack(t).sum())


def test_pool_with_pickle_5_and_in_band():
    t = dlbridge.from_dlpack(np.arange(1000, dtype=np.float32))
    with mp.get_context("spawn").Pool(1) as pool:
        assert pool.apply(_child_sum, (t,)) == float(np.arange(1000).sum())
        assert pool.apply(_child_sum, (t.share_memory(),)) == float(np.arange(1000).sum())
