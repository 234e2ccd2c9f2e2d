"""Rust reading and writing with the GIL released, beside every other route to the same memory
(attack classes 2 and 10). Threads run gil_released.fill (an exclusive borrow, writing with the GIL
released) and gil_released.checksum (a shared one), scale_inplace (another extension), and
dlbridge's own host reads: copy, tolist, pickling with every protocol, share_memory and
from_dlpack(copy=True). The registry's promise, checked by values: a reader never sees bytes change
under it, a writer never sees another's, and every host read sees one writer's bytes whole (the
writers fill the tensor with one value). Refusals (BufferError) are counted: both must happen."""

import os
import pickle
import threading
import time
from collections import Counter

import numpy as np
import pytest

import dlbridge
import gil_released
import scale_inplace

SECONDS = float(os.environ.get("DLBRIDGE_PARALLEL_SECONDS", "3"))
N = 4096


def uniform(data):
    """Whether every byte is the same (one writer's fill, not a mix of two)."""
    view = memoryview(bytes(data))
    return len(set(view)) <= 1


def routes(t, a):
    """Each route to the memory: a name and a function that returns whether what it saw is whole."""
    def host(read):
        return lambda: uniform(read())

    def float_total():
        # The sum of uniform float32 values, as scale_inplace reads them.
        total = scale_inplace.total(a.view(np.float32))
        value = np.frombuffer(bytes([a[0]] * 4), np.float32)[0]
        return total == sum(float(value) for _ in range(N // 4)) or not uniform(a)

    yield "fill", lambda: gil_released.fill(t, int(time.perf_counter_ns() % 200) + 1, 200)
    yield "checksum", lambda: gil_released.checksum(t, 200)[1]
    yield "scale_inplace.scale", lambda: scale_inplace.scale(a.view(np.float32), 1.0) or True
    yield "scale_inplace.total", float_total
    yield "copy", host(lambda: t.copy()._bytes())
    yield "tolist", lambda: len(set(t.tolist())) <= 1
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        yield f"pickle {protocol}", host(lambda p=protocol: pickle.loads(pickle.dumps(t, protocol=p))._bytes())
    yield "pickle 5 out of band", lambda: uniform(bytes(unpickle(*out_of_band(t))._bytes()))
    yield "share_memory", host(lambda: t.share_memory()._bytes())
    yield "from_dlpack(copy=True)", host(lambda: dlbridge.from_dlpack(t, copy=True)._bytes())


def out_of_band(t):
    buffers = []
    data = pickle.dumps(t, protocol=5, buffer_callback=buffers.append)
    return data, buffers


def unpickle(data, buffers):
    return pickle.loads(data, buffers=buffers)


def test_rust_with_the_gil_released_beside_every_other_route():
    a = np.zeros(N, np.uint8)
    t = dlbridge.from_dlpack(a)
    table = list(routes(t, a))
    done, refused, broken, errors = Counter(), Counter(), Counter(), []
    stop = time.monotonic() + SECONDS
    lock = threading.Lock()

    def run(name, route):
        while time.monotonic() < stop:
            # A pause without the GIL and without a borrow: a thread that took its next borrow
            # as soon as it had the GIL back would starve the others.
            time.sleep(0.0002)
            try:
                whole = route()
            except BufferError:
                with lock:
                    refused[name] += 1
                continue
            except Exception as exc:  # anything else fails the test (a thread's own exception would not)
                errors.append(f"{name}: {exc!r}")
                return
            with lock:
                done[name] += 1
                if not whole:
                    broken[name] += 1

    threads = [threading.Thread(target=run, args=entry) for entry in table for _ in range(2 if entry[0] in ("fill", "checksum") else 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print("\ngranted:", dict(done), "\nrefused:", dict(refused))
    assert not errors, errors
    assert not broken, f"bytes changed under a borrow: {dict(broken)} (granted {dict(done)})"
    assert done["fill"] > 0 and done["checksum"] > 0, dict(done)
    assert refused["fill"] + refused["checksum"] > 0, "the threads never met: nothing was refused"
    for name, _ in table:
        assert done[name] > 0, f"{name} never got its borrow"


def test_a_detached_writer_keeps_python_threads_running():
    # With the GIL released, another Python thread runs while fill holds the bytes.
    t = dlbridge.zeros(16, "uint8")
    ticks = []
    worker = threading.Thread(target=lambda: gil_released.fill(t, 7, 300_000))
    worker.start()
    while worker.is_alive():
        ticks.append(1)
        time.sleep(0.001)
    worker.join()
    assert t.tolist() == [7] * 16 and len(ticks) > 10
