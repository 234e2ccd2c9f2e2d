"""Memory is freed exactly once whoever drops the last reference, on whatever thread, whenever:
leak checks over many round trips, threads, a thread that never held the GIL, and interpreter exit."""

import gc
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

import dlbridge
from dlbridge import _native


def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def round_trips(make, back, n):
    for _ in range(n):
        x = make()
        y = back(dlbridge.from_dlpack(x))
        assert y.shape[0] == 4


@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_200k_round_trips_do_not_leak(library):
    source = np.ones((4, 4), dtype=np.float32) if library == "numpy" else torch.ones((4, 4))
    back = np.from_dlpack if library == "numpy" else torch.from_dlpack
    round_trips(lambda: source, back, 5_000)  # warm-up: allocator pools, caches
    gc.collect()
    before = rss_mb()
    round_trips(lambda: source, back, 200_000)
    gc.collect()
    growth = rss_mb() - before
    assert growth < 20, f"RSS grew {growth:.1f} MB over 200k {library} round trips"


def test_8_threads_x_5000_round_trips():
    errors = []

    def work(seed):
        try:
            for i in range(5_000):
                a = np.full((3, 5), seed * 10_000 + i, dtype=np.int64)
                t = dlbridge.from_dlpack(a if i % 2 else torch.from_numpy(a))
                b = np.from_dlpack(t)
                assert b.ctypes.data == a.ctypes.data
                assert int(b[2, 4]) == seed * 10_000 + i
                c = dlbridge.from_dlpack(t.__dlpack__(max_version=(1, 0)))
                assert c.tolist()[0][0] == seed * 10_000 + i
        except Exception as exc:  # reported below, with the thread's seed
            errors.append((seed, repr(exc)))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_last_reference_dropped_on_a_thread_that_never_held_the_gil():
    for make in (lambda: np.arange(1000.0), lambda: torch.arange(1000.0), lambda: dlbridge.zeros(1000)):
        for _ in range(100):
            _native._drop_on_rust_thread(make())
    a = np.arange(10.0)
    import weakref

    class Owned(np.ndarray):
        pass

    o = a.view(Owned)
    ref = weakref.ref(o)
    _native._drop_on_rust_thread(o)
    del o
    gc.collect()
    assert ref() is None, "the deleter run on the Rust thread released the source"


def test_deleters_at_interpreter_exit():
    """Tensors, capsules and exports alive at exit are freed (or, once the interpreter is gone,
    deliberately leaked) without a crash."""
    code = r"""
import atexit, numpy as np, torch, dlbridge
keep = []
a = np.arange(100.0)
t = dlbridge.from_dlpack(a)
keep += [t, t.__dlpack__(), t.__dlpack__(max_version=(1, 0)), np.from_dlpack(t), torch.from_dlpack(t)]
keep.append(dlbridge.from_dlpack(torch.arange(10.0)))
atexit.register(lambda: keep.append(dlbridge.from_dlpack(np.ones(3))))
import builtins
builtins._dlbridge_keep = keep  # lives until the very end of finalisation
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_export_blocks_are_freed_with_the_gil_by_the_allocator_that_made_them():
    """`__dlpack__` exports live in blocks from Python's allocator, which needs the GIL. Under
    PYTHONMALLOC=debug a free without the GIL, or by another allocator, is a fatal error: the blocks
    are dropped here on a thread that never held the GIL, by NumPy and torch as consumers, from
    threads, and at exit."""
    code = r"""
import threading, numpy as np, torch, dlbridge
from dlbridge import _native
t = dlbridge.from_dlpack(np.arange(12.0).reshape(3, 4))
for _ in range(200):
    _native._drop_on_rust_thread(t.__dlpack__())
    _native._drop_on_rust_thread(t.__dlpack__(max_version=(1, 0)))
    _native._drop_on_rust_thread(t)
    assert np.from_dlpack(t)[2, 3] == 11.0 and torch.from_dlpack(t)[2, 3] == 11.0
def work():
    for _ in range(2000):
        np.from_dlpack(t); t.__dlpack__(max_version=(1, 0))
threads = [threading.Thread(target=work) for _ in range(4)]
for th in threads: th.start()
for th in threads: th.join()
import builtins
builtins._dlbridge_keep = [t.__dlpack__(), np.from_dlpack(t), torch.from_dlpack(t)]
print("ok")
"""
    env = dict(os.environ, PYTHONMALLOC="debug")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "ok"


def test_the_gil_check_answers_for_the_calling_thread_only():
    """Blocking driver calls detach from Python only on a thread that holds the GIL; detaching on
    one that does not is fatal (or hands another thread's GIL away). Before 3.12 the current thread
    state is the GIL holder's, whichever thread asks, so a check that reads only it said yes on a
    Rust thread running while Python held the GIL."""
    from dlbridge import _native

    here, elsewhere = _native._holds_gil_here_and_elsewhere()
    assert (here, elsewhere) == (True, False)
