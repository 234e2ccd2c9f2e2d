"""examples/cuda_kernel on a GPU: a kernel written in Rust (shipped PTX, loaded with the driver)
launched on torch and CuPy tensors. Values are checked against the framework's own arithmetic;
stream order with a producer kernel that spins (gpu_sleep) before the data is written, so that a
launch that does not wait for it reads the old values, and a reader that does not wait for the
launch reads fresh memory. scripts/gpu-test.sh installs the example's wheel beside dlbridge's."""

import pytest

from cuda_support import require_cuda, skip_or_fail, stream_handle

torch = require_cuda()

try:
    import cuda_kernel
except ImportError as e:
    skip_or_fail(f"examples/cuda_kernel is not installed (scripts/gpu-test.sh build makes its wheel): {e}")

import dlbridge  # noqa: E402

SLEEP = 0.3
N = 1 << 20


@pytest.mark.parametrize("shape", [(7,), (3, 5), (0,), (256 * 4096 + 3,)], ids=["1-d", "2-d", "empty", "grid-stride"])
def test_values_match_torch(shape):
    x = torch.randn(shape, device="cuda")
    r = cuda_kernel.scale(x, 1.7)
    assert isinstance(r, dlbridge.Tensor) and r.device == (2, torch.cuda.current_device())
    y = torch.from_dlpack(r)
    assert y.shape == x.shape and y.dtype == torch.float32
    assert torch.equal(y, x * 1.7), "out-of-place: not torch's own float32 product"
    expected = x * -2.0
    assert cuda_kernel.scale_(x, -2.0) is None
    assert torch.equal(x, expected), "in place"


def test_a_side_stream_producer_and_consumer_are_ordered(gpu_sleep, streams):
    """torch's current stream A carries the data (the exchange table reports it): the kernel is
    queued there after A's slow write, and the result is ready there; a consumer on B waits for it."""
    A, B, _ = streams
    x = torch.zeros(N, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(A):
        gpu_sleep(SLEEP)
        x.fill_(3.0)
        r = cuda_kernel.scale(x, 2.0)
        cuda_kernel.scale_(x, 10.0)
    with torch.cuda.stream(B):
        y = torch.from_dlpack(r).clone()
    B.synchronize()
    assert torch.all(y == 6.0).item(), "the kernel ran before A's write, or B read before the kernel"
    with torch.cuda.stream(A):
        w = x.clone()  # the caller's later work on A
    A.synchronize()
    assert torch.all(w == 30.0).item(), "the in-place kernel did not run on A, in order"


def test_a_consumer_on_the_legacy_stream_waits_for_a_side_stream_result(gpu_sleep, streams):
    A, _, _ = streams
    x = torch.ones(N, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(A):
        gpu_sleep(SLEEP)
        x.fill_(5.0)
        r = cuda_kernel.scale(x, 3.0)
    assert dlbridge.from_dlpack(r, device="cpu").numpy()[-4:].tolist() == [15.0] * 4


def test_cupy_arrays(gpu_sleep, cupy):
    """CuPy has only `__dlpack__`: the legacy stream is made to wait for its current stream, and the
    kernel runs there; a blocking CuPy stream then waits for it in turn."""
    s = cupy.cuda.Stream()  # blocking, CuPy's default
    with s:
        x = cupy.zeros(N, dtype=cupy.float32)
        with torch.cuda.stream(torch.cuda.ExternalStream(s.ptr)):
            gpu_sleep(SLEEP)
        x.fill(4.0)
        r = cuda_kernel.scale(x, 0.25)
        y = cupy.from_dlpack(r).copy()  # on s
        cuda_kernel.scale_(x, 2.0)
        total = float(x.sum())
    s.synchronize()
    assert y.get()[-4:].tolist() == [1.0] * 4 and bool((y == 1.0).all()), "the kernel ran before fill, or s read before it"
    assert total == 8.0 * N, "the in-place kernel did not run before s's sum"


def test_a_result_on_a_named_consumer_stream(streams):
    A, B, _ = streams
    x = torch.arange(16, dtype=torch.float32, device="cuda")
    r = cuda_kernel.scale(x, 2.0)
    cap = r.__dlpack__(stream=stream_handle(B))
    with torch.cuda.stream(B):
        y = torch.from_dlpack(cap).clone()
    B.synchronize()
    assert y.tolist() == [2.0 * i for i in range(16)]


def test_mismatches_are_type_errors_on_the_gpu():
    with pytest.raises(TypeError, match=r"^expected a float32 C-contiguous CUDA tensor, got a torch.Tensor of float64 with shape \(3,\) on cuda:0$"):
        cuda_kernel.scale(torch.zeros(3, dtype=torch.float64, device="cuda"), 2.0)
    with pytest.raises(TypeError, match=r"strided on cuda:0$"):
        cuda_kernel.scale(torch.zeros(8, device="cuda")[::2], 2.0)
