"""M6: dlbridge tensors inside CUDA graph capture. Work queued outside the graph is waited for by the
host (a graph cannot wait on an outside event without CU_EVENT_WAIT_EXTERNAL, and would keep
referring to it), so capture stays valid and each replay reads the values; the legacy stream is
never used while a blocking stream captures; what cannot be captured is refused clearly."""

from cuda_support import CUDA, require_cuda, stream_handle

torch = require_cuda()

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import dlbridge  # noqa: E402

N = 1 << 16


def host_tensor_on_the_device():
    """A dlbridge tensor whose data is pending on the legacy stream (a host-to-device copy)."""
    return dlbridge.from_dlpack(np.arange(N, dtype=np.float32), device=(CUDA, 0))


def test_a_capsule_for_the_capturing_stream_replays():
    t = host_tensor_on_the_device()
    g, s = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.graph(g, stream=s):
        y = torch.from_dlpack(t.__dlpack__(stream=stream_handle(s))) * 2
    for _ in range(2):
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(y.cpu(), torch.arange(N, dtype=torch.float32) * 2)


def test_torch_from_dlpack_inside_torch_cuda_graph_replays():
    """The review's case: `torch.from_dlpack(t)` in `torch.cuda.graph`, however torch takes it."""
    t = host_tensor_on_the_device()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = torch.from_dlpack(t) * 3
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y.cpu(), torch.arange(N, dtype=torch.float32) * 3)


def test_a_copy_inside_a_capture_is_part_of_the_graph():
    x = torch.zeros(N, device="cuda")
    g, s = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.graph(g, stream=s):
        x.add_(1)
        c = dlbridge.from_dlpack(x, copy=True, stream=stream_handle(s))
    torch.cuda.synchronize()
    for k in (1, 2):
        g.replay()
        torch.cuda.synchronize()  # the graph's launches are ordered by whoever launches them
        assert torch.all(torch.from_dlpack(c) == k).item(), f"replay {k}: the copy did not follow the add"


def test_data_from_inside_a_capture_is_refused_for_a_stream_outside_it():
    g, s = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    x = torch.zeros(N, device="cuda")
    with torch.cuda.graph(g, stream=s):
        x.add_(1)
        t = dlbridge.from_dlpack(x, stream=stream_handle(s))
        with pytest.raises(BufferError, match="CUDA graph capture"):
            dlbridge.from_dlpack(t, device="cpu")
    g.replay()
    torch.cuda.synchronize()
    assert torch.all(x == 1).item()
