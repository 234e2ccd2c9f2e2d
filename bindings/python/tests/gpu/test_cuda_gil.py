"""M2: dlbridge waits for the GPU without the GIL. Another Python thread keeps running while a host
copy waits behind a half-second kernel, and a CuPy host function (Python, run by the driver on a
thread of its own, which needs the GIL) queued before the data does not deadlock the host copy."""

import os
import subprocess
import sys
import textwrap
import threading
import time

from cuda_support import require_cuda, stream_handle

torch = require_cuda()

import pytest  # noqa: E402

import dlbridge  # noqa: E402

SLEEP = 0.5


def test_another_thread_runs_while_a_host_copy_waits_for_the_gpu(gpu_sleep, streams):
    A, _, _ = streams
    count, stop = [0], [False]

    def counter():
        while not stop[0]:
            count[0] += 1

    thread = threading.Thread(target=counter, daemon=True)
    thread.start()
    time.sleep(0.05)
    before = count[0]
    time.sleep(0.2)
    rate = (count[0] - before) / 0.2
    x = torch.zeros(1 << 20, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(A):
        gpu_sleep(SLEEP)
        x.fill_(1.0)
        t = dlbridge.from_dlpack(x, stream=stream_handle(A))
    before, start = count[0], time.monotonic()
    h = dlbridge.from_dlpack(t, device="cpu")
    elapsed = time.monotonic() - start
    stop[0] = True
    thread.join()
    assert elapsed > SLEEP / 2, f"the copy took {elapsed:.3f} s: it did not wait for the kernel"
    share = (count[0] - before) / (rate * elapsed)
    assert share > 0.3, f"the other thread ran {share:.0%} of the time: the GIL was held while waiting"
    assert h.tolist()[:3] == [1.0, 1.0, 1.0]


def test_a_cupy_host_function_before_the_data_does_not_deadlock(cupy):
    code = textwrap.dedent("""
        import cupy, dlbridge
        spin = cupy.RawKernel(r'''
        extern "C" __global__ void spin(long long cycles) {
            long long start = clock64();
            while (clock64() - start < cycles) {}
        }''', "spin")
        s = cupy.cuda.Stream(non_blocking=True)
        ran = []
        with s:
            a = cupy.ones(1 << 20, dtype=cupy.float32)
            spin((1,), (1,), (cupy.int64(500_000_000),))
            s.launch_host_func(lambda _: ran.append(True), None)
            t = dlbridge.from_dlpack(a, stream=s.ptr)
        h = dlbridge.from_dlpack(t, device="cpu")
        assert ran == [True] and h.tolist()[:2] == [1.0, 1.0]
        print("done")
    """)
    try:
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("deadlock: dlbridge waited for the stream with the GIL held, which CuPy's host function needs")
    assert result.returncode == 0 and "done" in result.stdout, result.stdout + result.stderr
