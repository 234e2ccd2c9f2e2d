"""Ordering that a GPU shows and a call log does not (review findings M1, M4, M5):

- M1: a host-to-device copy from pageable memory may return before its DMA lands; the copy is ready
  on the legacy stream, and a reader on a non-blocking stream must be made to wait (statistical:
  the window is the last staged chunk).
- M4: the stream dlbridge tells a writer to use for a dlbridge tensor (the CUDA array interface's
  `stream`, the exchange table's current work stream) is waited for by later exports.
- M5: a consumer's stream is not kept: CuPy destroys its streams when collected, and a new stream
  may get the same handle."""

import ctypes
import gc

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


def test_a_host_to_device_copy_is_ordered_before_a_side_stream_reader(streams):
    _, S, _ = streams
    n, tail = 16 << 20, 1 << 20  # 64 MiB; the last 4 MiB is read
    a = np.empty(n, dtype=np.float32)
    for i in range(40):
        a.fill(i)
        t = dlbridge.from_dlpack(a, device=(CUDA, 0))
        assert t.__cuda_array_interface__["stream"] == 1, "ready on the legacy stream, where the DMA runs"
        cap = t.__dlpack__(stream=stream_handle(S))  # a raw capsule: torch adds no ordering of its own
        with torch.cuda.stream(S):
            z = torch.from_dlpack(cap)[-tail:].clone()
        S.synchronize()
        assert torch.all(z == i).item(), f"round {i}: the side stream read the tail before the DMA landed"


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
