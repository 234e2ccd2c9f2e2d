"""Nothing grows over 100,000 exchanges on CUDA: not torch's device memory, not the process's
resident memory (a leaked capsule, managed tensor, CUDA event or Python object per exchange would
show), not its open file descriptors. And memory that dlbridge allocates (device, pinned, host
copies) is given back."""

import gc
import time

from cuda_support import CUDA, CUDA_HOST, open_fds, require_cuda, rss_bytes, stream_handle

torch = require_cuda()

import numpy as np  # noqa: E402

import dlbridge  # noqa: E402

EXCHANGES = 100_000
WARMUP = 5_000
MiB = 1 << 20


def settle():
    torch.cuda.synchronize()
    for _ in range(3):
        gc.collect()


def exchanges(n, x, ready, consumer):
    """n rounds of: torch -> dlbridge on stream `ready` (through torch's table: dlbridge records an
    event on torch's current stream `consumer` for `ready` to wait on), dlbridge -> torch on
    `consumer` (dlbridge records one more), and dlbridge -> raw capsule -> dlbridge with an explicit
    consumer stream (a third)."""
    r, c = stream_handle(ready), stream_handle(consumer)
    with torch.cuda.stream(consumer):
        for _ in range(n):
            t = dlbridge.from_dlpack(x, stream=r)
            y = torch.from_dlpack(t)
            u = dlbridge.from_dlpack(t.__dlpack__(stream=c, max_version=(1, 3)))
            del t, y, u


def test_no_growth_over_100k_exchanges(streams):
    _, B, C = streams
    x = torch.ones(1024, device="cuda")
    exchanges(WARMUP, x, B, C)
    settle()
    allocated, rss, fds, free = torch.cuda.memory_allocated(), rss_bytes(), open_fds(), torch.cuda.mem_get_info()[0]
    start = time.perf_counter()
    exchanges(EXCHANGES, x, B, C)
    elapsed = time.perf_counter() - start
    settle()
    grown = rss_bytes() - rss
    print(f"{EXCHANGES:,} rounds in {elapsed:.1f} s ({elapsed / EXCHANGES * 1e6:.1f} us each); "
          f"RSS {grown / MiB:+.2f} MiB")
    assert torch.cuda.memory_allocated() == allocated
    assert grown < 8 * MiB, f"RSS grew by {grown / MiB:.1f} MiB ({grown / EXCHANGES:.0f} B per round)"
    assert open_fds() == fds
    assert torch.cuda.mem_get_info()[0] > free - 64 * MiB, "device memory went missing"
    assert torch.all(x == 1).item()


def test_no_growth_over_exchanges_with_cupy(streams, cupy):
    _, B, _ = streams
    x = torch.ones(1024, device="cuda")
    s = cupy.cuda.Stream(non_blocking=True)

    def rounds(n):
        with s:
            for _ in range(n):
                t = dlbridge.from_dlpack(x, stream=stream_handle(B))
                c = cupy.from_dlpack(t)  # CuPy passes its stream: dlbridge records an event
                u = dlbridge.from_dlpack(c)
                del t, c, u

    rounds(WARMUP)
    settle()
    rss, fds = rss_bytes(), open_fds()
    rounds(EXCHANGES // 5)
    settle()
    grown = rss_bytes() - rss
    assert grown < 4 * MiB, f"RSS grew by {grown / MiB:.1f} MiB ({grown / (EXCHANGES // 5):.0f} B per round)"
    assert open_fds() == fds


def test_memory_dlbridge_allocates_is_given_back():
    a = np.ones(4 * MiB, dtype=np.float32)  # 16 MiB
    x = torch.ones(4 * MiB, device="cuda")

    def rounds(n):
        for _ in range(n):
            d = dlbridge.from_dlpack(a, device=(CUDA, 0))  # device memory
            y = torch.from_dlpack(d)
            p = dlbridge.from_dlpack(x, device=(CUDA_HOST, 0))  # pinned
            h = dlbridge.from_dlpack(x, device="cpu")  # pageable host
            c = dlbridge.from_dlpack(x, copy=True)  # device copy
            del d, y, p, h, c

    rounds(3)
    settle()
    free, rss = torch.cuda.mem_get_info()[0], rss_bytes()
    rounds(200)  # 3.2 GB of each kind if nothing were freed
    settle()
    assert torch.cuda.mem_get_info()[0] > free - 64 * MiB, "dlbridge's device allocations were not freed"
    grown = rss_bytes() - rss
    assert grown < 64 * MiB, f"RSS grew by {grown / MiB:.0f} MiB: host or pinned copies were not freed"
