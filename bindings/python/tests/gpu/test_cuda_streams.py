"""Streams on a real GPU. A producer kernel is kept running on stream A (`torch.cuda._sleep`, then a
fill, on a side stream); the tensor is taken through dlbridge for a consumer on another stream, and
the consumer must read the final values. The streams are torch pool streams, which are
non-blocking: nothing orders them but the events the exchange records, so a missing wait reads
the zeros that were there before the fill.

The exchange itself must not wait on the host: each call returns while the producer kernel is
still running, in a small fraction of the kernel's time. Every scenario runs twice, first with a
tiny sleep (which loads kernels and warms caches) and then with the real one."""

import time
from contextlib import contextmanager

from cuda_support import CUDA, only_cai, require_cuda, stream_handle, torch_cai

torch = require_cuda()

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import dlbridge  # noqa: E402

SLEEP = 0.5  # seconds the producer kernel runs in the measured round
FAST = SLEEP / 10  # an exchange call must return well within this
ROUNDS = (0.002, SLEEP)
VALUE = 7.0
N = 1 << 20


@contextmanager
def producer_busy(gpu_sleep, stream, x, seconds):
    """Zeroes x, then on `stream`, which is torch's current stream inside the block, enqueues a
    kernel that spins for `seconds` and a fill of x with VALUE. Inside the block torch's current
    stream is the producer's: its `__dlpack__` records its event there, and its exchange table's
    `current_work_stream` reports it."""
    torch.cuda.synchronize()
    x.zero_()
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        gpu_sleep(seconds)
        x.fill_(VALUE)
        yield


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


def all_equal(values, expected=VALUE):
    return bool(np.all(np.asarray(values) == expected))


@pytest.fixture
def x():
    return torch.zeros(N, dtype=torch.float32, device="cuda")


def test_from_dlpack_on_another_stream_returns_at_once_and_reads_final_values(gpu_sleep, streams, x):
    A, B, _ = streams
    for seconds in ROUNDS:
        with producer_busy(gpu_sleep, A, x, seconds):
            t, elapsed = timed(dlbridge.from_dlpack, x, stream=stream_handle(B))
        assert t.data_ptr == x.data_ptr() and not t.is_copied
        with torch.cuda.stream(B):
            z = torch.from_dlpack(t).clone()  # read on B, the stream t is ready on
        busy = not A.query()
        B.synchronize()
        assert torch.all(z == VALUE).item(), f"stream B read before the producer finished ({seconds} s)"
    assert busy, "the producer kernel had finished: the exchange waited on the host"
    assert elapsed < FAST, f"from_dlpack took {elapsed * 1e3:.1f} ms against a {SLEEP * 1e3:.0f} ms kernel"


def test_export_makes_the_consumer_stream_wait_for_the_ready_stream(gpu_sleep, streams, x):
    A, B, C = streams
    for seconds in ROUNDS:
        with producer_busy(gpu_sleep, A, x, seconds):
            t = dlbridge.from_dlpack(x, stream=stream_handle(B))  # B waits for A (torch's event)
        # C waits for B through dlbridge's event; a legacy capsule, so torch adds no sync of its own.
        cap, elapsed = timed(t.__dlpack__, stream=stream_handle(C))
        with torch.cuda.stream(C):
            z = torch.from_dlpack(cap).clone()
        busy = not A.query()
        start = time.perf_counter()
        C.synchronize()
        waited = time.perf_counter() - start
        assert torch.all(z == VALUE).item(), f"stream C read before the producer finished ({seconds} s)"
    assert busy and elapsed < FAST, "Tensor.__dlpack__(stream=C) synchronised on the host"
    assert waited > SLEEP / 4, "stream C did not wait for the producer on the GPU"


def test_torch_is_taken_through_its_exchange_table_and_its_current_stream(gpu_sleep, streams, x, monkeypatch):
    """torch's C table, not its `__dlpack__`: the data is ready on torch's current stream (A, inside
    the block), and dlbridge makes B wait for it with an event of its own."""
    A, B, _ = streams

    def python_path_forbidden(self, *args, **kwargs):
        raise AssertionError("torch's Python __dlpack__ was called")

    monkeypatch.setattr(torch.Tensor, "__dlpack__", python_path_forbidden)
    for seconds in ROUNDS:
        with producer_busy(gpu_sleep, A, x, seconds):
            t, elapsed = timed(dlbridge.from_dlpack, x, stream=stream_handle(B))
            unordered = dlbridge.from_dlpack(x, stream=-1)
        # B is kept as an event; the interface names the legacy stream, made to wait for it.
        assert t.__cuda_array_interface__["stream"] == 1
        assert unordered.__cuda_array_interface__["stream"] is None, "-1: nothing ordered, no stream kept"
        with torch.cuda.stream(B):
            z = x.clone()  # on B, straight from torch: only dlbridge's event orders B after A
        busy = not A.query()
        B.synchronize()
        assert torch.all(z == VALUE).item(), f"stream B read before the producer finished ({seconds} s)"
    assert busy and elapsed < FAST, "the table import synchronised on the host"


def test_our_no_sync_exports_leave_data_ready_on_the_stream_our_table_reports(gpu_sleep, streams, x):
    """dlbridge's table says its current work stream is the legacy default one; a consumer that
    takes a tensor through the no_sync export and launches there must read the final values."""
    import ctypes

    from dlbridge._check import abi

    A, B, _ = streams
    api = abi.ExchangeAPI.from_address(abi.capsule_pointer(dlbridge.Tensor.__dlpack_c_exchange_api__))
    for seconds in ROUNDS:
        with producer_busy(gpu_sleep, A, x, seconds):
            t = dlbridge.from_dlpack(x, stream=stream_handle(B))  # ready on B, which waits for A
        out, stream = ctypes.c_void_p(), ctypes.c_void_p()
        assert abi.STREAM(api.current_work_stream)(CUDA, x.device.index, ctypes.byref(stream)) == 0
        assert stream.value == 1, "the legacy default stream"
        (_, elapsed) = timed(abi.FROM_PY(api.managed_tensor_from_py_object_no_sync), t, ctypes.byref(out))
        managed = abi.DLManagedTensorVersioned.from_address(out.value)
        assert managed.dl_tensor.data == x.data_ptr()
        with torch.cuda.stream(torch.cuda.default_stream()):
            z = x.clone()  # on the legacy default stream, which pool streams do not otherwise wait for
        busy = not A.query()
        torch.cuda.synchronize()
        ctypes.CFUNCTYPE(None, ctypes.c_void_p)(managed.deleter)(out.value)
        assert torch.all(z == VALUE).item(), f"the legacy default stream read too early ({seconds} s)"
    assert busy and elapsed < FAST, "the no_sync export synchronised on the host"


def test_tvm_ffi_takes_our_cuda_tensor_zero_copy(streams, x, tvm_ffi):
    _, B, _ = streams
    x.fill_(VALUE)
    t = dlbridge.from_dlpack(x, stream=stream_handle(B))
    v = tvm_ffi.from_dlpack(t)
    assert torch.from_dlpack(v).data_ptr() == x.data_ptr()
    torch.cuda.synchronize()
    assert torch.all(torch.from_dlpack(v) == VALUE).item()


def test_stream_minus_one_adds_no_wait(gpu_sleep, streams, x):
    A, B, C = streams
    for seconds in ROUNDS:
        with producer_busy(gpu_sleep, A, x, seconds):
            t = dlbridge.from_dlpack(x, stream=stream_handle(B))
        cap = t.__dlpack__(stream=-1)
        with torch.cuda.stream(C):
            torch.from_dlpack(cap).clone()  # some work on C over the memory
        C.synchronize()
        busy = not A.query()  # C finished while A still runs: nothing made C wait
        torch.cuda.synchronize()
        assert torch.all(x == VALUE).item()
    assert busy, "stream=-1 still made the consumer's stream wait for the producer"


def test_no_stream_means_the_legacy_default_stream(gpu_sleep, streams, x):
    A, _, _ = streams
    for seconds in ROUNDS:
        with producer_busy(gpu_sleep, A, x, seconds):
            # torch's table reports A; dlbridge makes the legacy default stream wait for it.
            t, elapsed = timed(dlbridge.from_dlpack, x)
        assert t.__cuda_array_interface__["stream"] == 1
        z = torch.from_dlpack(t).clone()  # on the legacy default stream
        busy = not A.query()
        torch.cuda.default_stream().synchronize()
        assert torch.all(z == VALUE).item()
    assert busy and elapsed < FAST


def test_stream_zero_is_refused_for_cuda(x):
    with pytest.raises(ValueError):
        dlbridge.from_dlpack(x, stream=0)
    t = dlbridge.from_dlpack(x)
    with pytest.raises(ValueError):
        t.__dlpack__(stream=0)


def test_cupy_consumer_on_its_own_stream(gpu_sleep, streams, x, cupy):
    A, B, _ = streams
    C = cupy.cuda.Stream(non_blocking=True)
    for seconds in ROUNDS:
        with producer_busy(gpu_sleep, A, x, seconds):
            t = dlbridge.from_dlpack(x, stream=stream_handle(B))
        with C:
            c = cupy.from_dlpack(t)  # CuPy passes stream=C; dlbridge makes C wait for B
            copy = c.copy()
        assert c.data.ptr == x.data_ptr()
        busy = not A.query()
        C.synchronize()
        assert all_equal(cupy.asnumpy(copy))
    assert busy, "taking the tensor into CuPy synchronised on the host"


class Recorded:
    """A dlbridge tensor that records the keywords its consumer passes to `__dlpack__`."""

    def __init__(self, t):
        self.t, self.calls = t, []

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()

    def __dlpack__(self, **kwargs):
        self.calls.append(kwargs)
        return self.t.__dlpack__(**kwargs)


def test_jax_consumer_names_its_stream_and_reads_final_values(gpu_sleep, streams, x, jax):
    """JAX may synchronise by itself, so the values alone prove little: the test also checks that
    JAX named a stream of its own (an integer other than -1), which dlbridge then orders after the
    data's event as for any consumer (the torch and CuPy tests show that ordering on the GPU)."""
    A, B, _ = streams
    for seconds in ROUNDS:
        with producer_busy(gpu_sleep, A, x, seconds):
            t = Recorded(dlbridge.from_dlpack(x, stream=stream_handle(B)))
        j = jax.dlpack.from_dlpack(t)
        assert all_equal(np.asarray(j))
        stream = t.calls[-1].get("stream")
        print(f"JAX {jax.__version__} passed __dlpack__ {t.calls[-1]}")
        assert isinstance(stream, int) and stream not in (-1, 0), f"JAX passed stream={stream!r}"


# The CUDA array interface's `stream` entry, both ways.


def test_cuda_array_interface_export_names_the_ready_stream(streams, x):
    """The data is ready on B when t is made; B is not kept (it may be gone when the interface is
    read), so the interface names the legacy stream, made to wait for B's work."""
    _, B, _ = streams
    t = dlbridge.from_dlpack(x, stream=stream_handle(B))
    cai = t.__cuda_array_interface__
    assert cai["version"] == 3 and cai["stream"] == 1
    assert cai["data"] == (x.data_ptr(), False) and cai["shape"] == (N,) and cai["typestr"] == "<f4"
    assert cai.get("strides") in (None, (4,))


def test_cupy_takes_the_cuda_array_interface_stream(gpu_sleep, streams, x, cupy):
    """CuPy synchronises on the interface's stream; were it wrong, CuPy's read on the legacy
    default stream (which does not wait for non-blocking streams) would see zeros."""
    A, B, _ = streams
    for seconds in ROUNDS:
        with producer_busy(gpu_sleep, A, x, seconds):
            t = dlbridge.from_dlpack(x, stream=stream_handle(B))
        c = cupy.asarray(only_cai(t))
        assert c.data.ptr == x.data_ptr()
        assert all_equal(cupy.asnumpy(c))


def test_numba_takes_the_cuda_array_interface_stream(gpu_sleep, streams, x, numba_cuda):
    A, B, _ = streams
    for seconds in ROUNDS:
        with producer_busy(gpu_sleep, A, x, seconds):
            t = dlbridge.from_dlpack(x, stream=stream_handle(B))
        d = numba_cuda.as_cuda_array(only_cai(t))
        assert d.__cuda_array_interface__["data"][0] == x.data_ptr()
        assert all_equal(d.copy_to_host())


def test_cuda_array_interface_import_waits_for_its_stream_on_the_gpu(gpu_sleep, streams, x):
    """A hand-made v3 interface over a tensor that a kernel on A is still filling, with stream A:
    asarray makes the legacy default stream wait for A and returns at once, and a consumer on C
    that takes the tensor reads the final values."""
    A, _, C = streams
    for seconds in ROUNDS:
        with producer_busy(gpu_sleep, A, x, seconds):
            t, elapsed = timed(dlbridge.asarray, torch_cai(x, stream=stream_handle(A)))
        assert t.data_ptr == x.data_ptr() and t.device == (CUDA, x.device.index)
        assert t.__cuda_array_interface__["stream"] == 1
        cap = t.__dlpack__(stream=stream_handle(C))
        with torch.cuda.stream(C):
            z = torch.from_dlpack(cap).clone()
        busy = not A.query()
        C.synchronize()
        assert torch.all(z == VALUE).item()
    assert busy and elapsed < FAST, "asarray of a CUDA array interface synchronised on the host"


def test_cupy_cuda_array_interface_import(cupy):
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        c = cupy.arange(10, dtype=cupy.float32)
        wrapped = only_cai(c)  # CuPy names its current stream, s, unless told not to
    cai = wrapped.__cuda_array_interface__
    t = dlbridge.asarray(wrapped)
    assert t.data_ptr == c.data.ptr and t.shape == (10,) and t.device == (CUDA, c.device.id)
    assert cai.get("stream") == s.ptr, f"CuPy names its current stream: {cai}"
    assert t.__cuda_array_interface__["stream"] == 1, "the legacy default stream, made to wait for s"
    assert dlbridge.from_dlpack(t, device="cpu").tolist() == list(range(10))


def test_numba_cuda_array_interface_import(numba_cuda):
    s = numba_cuda.stream()
    d = numba_cuda.to_device(np.arange(8, dtype=np.float64), stream=s)
    cai = d.__cuda_array_interface__
    t = dlbridge.asarray(only_cai(d))
    assert t.data_ptr == cai["data"][0] and t.shape == (8,) and str(t.dtype) == "float64"
    assert cai.get("stream") is not None, f"numba names the array's stream: {cai}"
    assert t.__cuda_array_interface__["stream"] == 1, "the legacy default stream, made to wait for s"
    y = torch.from_dlpack(t)
    assert y.data_ptr() == cai["data"][0]
    assert y.cpu().tolist() == list(range(8))
    # A write through numba is seen by torch.
    d[2:3].copy_to_device(np.array([-1.0]), stream=s)
    s.synchronize()
    assert y[2].item() == -1
