"""Ordering that a GPU shows and a call log does not (review findings M1, M4, M5), each made
deterministic by a kernel that spins on the producer's stream (`torch.cuda._sleep`) before the
hand-off, so that a missing wait reads stale memory every time:

- M1: a host-to-device copy is staged and queued on the legacy stream, behind what torch's default
  stream (the legacy stream) still runs; the call returns at once, and a reader on a non-blocking
  stream must be made to wait for the DMA.
- M4: the stream dlbridge tells a writer to use for a dlbridge tensor (the CUDA array interface's
  `stream`, the exchange table's current work stream) is waited for by later exports.
- M5: a consumer's stream is not kept: CuPy destroys its streams when collected, and a new stream
  may get the same handle."""

import ctypes
import gc
import time

from cuda_support import CUDA, require_cuda, stream_handle

torch = require_cuda()

import numpy as np  # noqa: E402

import dlbridge  # noqa: E402
from dlbridge._check import abi  # noqa: E402

SLEEP = 0.5
VALUE = 7.0
N = 1 << 20


def table_export(t):
    api = abi.ExchangeAPI.from_address(abi.capsule_pointer(dlbridge.Tensor.__dlpack_c_exchange_api__))
    out = ctypes.c_void_p()
    assert abi.FROM_PY(api.managed_tensor_from_py_object_no_sync)(t, ctypes.byref(out)) == 0
    managed = abi.DLManagedTensorVersioned.from_address(out.value)
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(managed.deleter)(out.value)


def test_a_host_to_device_copy_returns_at_once_and_is_ordered_before_a_side_stream_reader(gpu_sleep, streams):
    _, S, _ = streams
    a = np.empty(4 << 20, dtype=np.float32)  # 16 MiB
    rng = np.random.default_rng()
    for seconds in (0.002, SLEEP):
        value = float(rng.integers(1, 1 << 20))  # never what the block held before
        a.fill(value)
        torch.cuda.synchronize()
        gpu_sleep(seconds)  # on torch's current stream: the default (legacy) stream
        start = time.perf_counter()
        t = dlbridge.from_dlpack(a, device=(CUDA, 0))
        elapsed = time.perf_counter() - start
        assert t.__cuda_array_interface__["stream"] == 1, "ready on the legacy stream, where the DMA is queued"
        cap = t.__dlpack__(stream=stream_handle(S))  # a raw capsule: torch adds no ordering of its own
        with torch.cuda.stream(S):
            z = torch.from_dlpack(cap).clone()
        S.synchronize()
        assert torch.all(z == value).item(), f"the side stream read before the DMA landed ({seconds} s kernel)"
    assert elapsed < SLEEP / 4, f"from_dlpack(a, device=(2, 0)) took {elapsed:.3f} s: it waited for the legacy stream's kernel"


def test_freed_dlbridge_memory_is_not_reused_before_the_legacy_streams_work_on_it(gpu_sleep):
    """A dlbridge tensor read and written by torch on its default stream (the legacy stream) behind a
    spinning kernel, then dropped: the free is queued on the legacy stream, so a block handed out
    again is written only after that work; the drop itself returns at once."""
    rng = np.random.default_rng()
    value = float(rng.integers(1, 1 << 20))
    t = dlbridge.from_dlpack(np.full(N, value, dtype=np.float32), device=(CUDA, 0))
    y, address = torch.from_dlpack(t), t.data_ptr
    torch.cuda.synchronize()
    gpu_sleep(SLEEP)
    y.mul_(2)  # queued behind the kernel, on the memory about to be dropped
    start = time.perf_counter()
    del y, t
    gc.collect()
    elapsed = time.perf_counter() - start
    fresh = float(rng.integers(1, 1 << 20))
    u = dlbridge.from_dlpack(np.full(N, fresh, dtype=np.float32), device=(CUDA, 0))
    assert u.data_ptr == address, "the pool did not hand the block out again: the test proves nothing"
    assert torch.all(torch.from_dlpack(u) == fresh).item(), "the write queued before the free landed in the reused block"
    assert elapsed < SLEEP / 4, f"dropping the tensor took {elapsed:.3f} s: the free waited on the host"


def test_a_free_does_not_wait_for_unrelated_work_of_other_streams(gpu_sleep, streams):
    """C2: cuMemFree waited for the whole device; dlbridge's frees are queued instead."""
    A, _, _ = streams
    device = dlbridge.from_dlpack(np.ones(N, dtype=np.float32), device=(CUDA, 0))
    pinned = dlbridge.from_dlpack(np.ones(N, dtype=np.float32), device=(3, 0))
    torch.cuda.synchronize()
    with torch.cuda.stream(A):
        gpu_sleep(SLEEP)  # unrelated work, still running while the tensors are dropped
    start = time.perf_counter()
    del device, pinned
    gc.collect()
    elapsed = time.perf_counter() - start
    busy = not A.query()
    A.synchronize()
    assert busy and elapsed < SLEEP / 4, f"dropping took {elapsed:.3f} s while another stream's kernel ran"


def test_work_on_the_stream_dlbridge_reports_is_waited_for_by_later_exports(gpu_sleep, streams):
    A, B, C = streams
    x = torch.zeros(N, device="cuda")
    with torch.cuda.stream(A):
        x.fill_(VALUE)
    t = dlbridge.from_dlpack(x, stream=stream_handle(B))
    table_export(t)  # a table consumer (tvm-ffi) is told: ready on the legacy stream
    assert t.__cuda_array_interface__["stream"] == 1, "a writer is told the legacy stream"
    torch.cuda.synchronize()
    with torch.cuda.stream(torch.cuda.ExternalStream(1)):  # the legacy stream, as an extension would
        gpu_sleep(SLEEP)
        x.fill_(VALUE + 1)
    table_export(t)
    cap = t.__dlpack__(stream=stream_handle(C))
    with torch.cuda.stream(C):
        z = torch.from_dlpack(cap).clone()
    C.synchronize()
    assert torch.all(z == VALUE + 1).item(), "C read before the write on the reported stream"


def test_a_cupy_stream_destroyed_after_the_import_is_not_used(gpu_sleep, cupy):
    x = torch.full((N,), VALUE, device="cuda")
    torch.cuda.synchronize()
    s = cupy.cuda.Stream(non_blocking=True)
    t = dlbridge.from_dlpack(x, stream=s.ptr)
    del s
    gc.collect()
    s2 = cupy.cuda.Stream(non_blocking=True)  # may get the dead stream's handle
    with torch.cuda.stream(torch.cuda.ExternalStream(s2.ptr)):
        gpu_sleep(SLEEP)  # s2 stays busy: a wait on it would show
    C = torch.cuda.Stream()
    cap = t.__dlpack__(stream=stream_handle(C))
    with torch.cuda.stream(C):
        z = torch.from_dlpack(cap).clone()
    C.synchronize()
    assert not s2.done, "C waited for the new stream s2"
    assert torch.all(z == VALUE).item()
    s2.synchronize()
