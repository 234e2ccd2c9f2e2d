"""M2: blocking driver calls run without the GIL. With every blocking call of the fake slowed to
0.3 s, another Python thread must keep running during each of dlbridge's blocking operations (the
driver's start-up and the first retain of a context too, in a fresh process); a host function queued
on a stream, which needs the GIL on the driver's thread, must not deadlock a host wait that depends
on it (CuPy's `launch_host_func`, numba's `add_callback`); and the hook that releases the GIL must
leave alone a thread that does not hold it (a Rust thread of an extension)."""

import gc
import textwrap
import threading
import time

import numpy as np
import pytest

import dlbridge
from fake_cuda import StreamProducer, run_fresh
from producers import DunderProducer

DELAY_MS = 300


class Counter(threading.Thread):
    """Counts as fast as Python can, until stopped."""

    def __init__(self):
        super().__init__(daemon=True)
        self.count, self.stopped = 0, False

    def run(self):
        while not self.stopped:
            self.count += 1


@pytest.fixture
def counter():
    c = Counter()
    c.start()
    time.sleep(0.05)
    start = c.count
    time.sleep(0.2)  # the main thread sleeps without the GIL: the counter's full speed
    c.rate = (c.count - start) / 0.2
    yield c
    c.stopped = True
    c.join()


def share_of_time_the_counter_ran(counter, operation):
    before, start = counter.count, time.monotonic()
    operation()
    elapsed = time.monotonic() - start
    assert elapsed >= DELAY_MS / 1000 * 0.9, f"the operation took {elapsed:.3f} s: it made no blocking call"
    return (counter.count - before) / (counter.rate * elapsed)


def operations(driver, counter):
    device = lambda: dlbridge.from_dlpack(DunderProducer(make=lambda: driver.device_fake([1.0, 2.0], (2,))))
    S = driver.stream()
    managed = StreamProducer(driver, driver.device_array(2, (13, 0)), S, device=(13, 0))
    # Larger than the staging buffers (4 x 8 MiB): the copy waits for the DMA of its first pieces.
    large = np.ones(40 << 18, dtype=np.float32)
    return {
        "device to host": lambda: dlbridge.from_dlpack(device(), device="cpu"),
        "managed memory read on the host": lambda: np.asarray(dlbridge.from_dlpack(managed, stream=S)),
        "host to device larger than the staging buffers": lambda: dlbridge.from_dlpack(large, device=(2, 0)),
        "pinned allocation": lambda: dlbridge.from_dlpack(np.arange(2.0), device=(3, 0)),
    }


@pytest.mark.parametrize("name", ["device to host", "managed memory read on the host",
                                  "host to device larger than the staging buffers", "pinned allocation"])
def test_other_threads_run_while_dlbridge_waits_for_the_gpu(driver, counter, name):
    operation = operations(driver, counter)[name]
    driver.sync_delay(DELAY_MS)
    share = share_of_time_the_counter_ran(counter, operation)
    driver.sync_delay(0)
    assert share > 0.3, f"{name}: another thread ran {share:.0%} of the time: the GIL was held while the driver blocked"


def test_the_host_wait_for_a_capturing_consumer_lets_other_threads_run(driver, counter):
    """M14: a consumer stream that captures a graph cannot wait for an event recorded outside it, so
    the host waits for it; without the GIL, as any blocking call."""
    t = dlbridge.from_dlpack(np.arange(4.0, dtype=np.float32), device=(2, 0))  # pending on the legacy stream
    C = driver.stream()
    driver.begin_capture(C, "global")
    try:
        driver.sync_delay(DELAY_MS)
        share = share_of_time_the_counter_ran(counter, lambda: t.__dlpack__(stream=C, max_version=(1, 3)))
        driver.sync_delay(0)
        assert [r[0] for r in driver.log() if r[0] == "event_sync"] == ["event_sync"]
        assert driver.capture_status(C) == "active"
    finally:
        driver.end_capture(C)
    assert share > 0.3, f"another thread ran {share:.0%} of the time: the GIL was held during the host wait"


def test_a_host_wait_behind_a_host_function_that_needs_the_gil_does_not_deadlock():
    """In a child process with a deadline: a host function (Python, on the driver's thread) is
    queued on S before the tensor's data; the host copy waits for it."""
    code = textwrap.dedent("""
        import dlbridge
        from fake_cuda import FakeDriver, StreamProducer
        driver = FakeDriver()
        S = driver.stream()
        ran = []
        a = driver.device_array(2)
        driver.fill(S, a.ctypes.data, 2, 4.0)
        driver.host_func(S, lambda: ran.append(True))
        t = dlbridge.from_dlpack(StreamProducer(driver, a, S), stream=S)
        assert dlbridge.from_dlpack(t, device="cpu").tolist() == [4.0, 4.0]
        assert ran == [True]
        print("done")
    """)
    assert "done" in run_fresh(code, hang="deadlock: dlbridge waited for the stream with the GIL held, which the host function needs")


def test_the_driver_starts_and_a_context_is_retained_without_the_gil():
    """C5: loading the driver (cuInit, 1 s here) and the first retain of a device's primary context
    (creating it, 1 s here) happen once per process; other threads run during each. Each is timed
    alone: an import whose pointer query needs no context starts the driver, then a hand-off
    between streams retains the context and makes no other blocking call."""
    code = textwrap.dedent("""
        import threading, time
        counter = {"n": 0, "stop": False}
        def count():
            while not counter["stop"]:
                counter["n"] += 1
        threading.Thread(target=count, daemon=True).start()
        time.sleep(0.1)
        start_n = counter["n"]
        time.sleep(0.3)
        rate = (counter["n"] - start_n) / 0.3
        def share(operation):
            before, start = counter["n"], time.monotonic()
            operation()
            elapsed = time.monotonic() - start
            assert elapsed > 0.9, f"{elapsed:.2f} s: the slow call did not happen here"
            return (counter["n"] - before) / (rate * elapsed)
        import dlbridge
        from fake_cuda import FakeDriver
        from producers import DunderProducer, table_producer
        driver = FakeDriver()  # loads the library (ctypes), without cuInit
        x = DunderProducer(make=lambda: driver.device_fake([1.0, 2.0], (2,)))
        starting = share(lambda: dlbridge.from_dlpack(x))
        P, C = driver.stream(), driver.stream()
        y, _ = table_producer(work_stream=P, make=lambda: driver.device_fake([1.0, 2.0], (2,)))
        driver.sync_delay(1000)  # creating the context
        retaining = share(lambda: dlbridge.from_dlpack(y, stream=C))
        driver.sync_delay(0)
        counter["stop"] = True
        assert driver.retains(0) >= 1
        print("shares", round(starting, 2), round(retaining, 2))
    """)
    import os
    import re

    out = run_fresh(code, env={**os.environ, "FAKE_CUDA_INIT_DELAY_MS": "1000"})
    starting, retaining = map(float, re.search(r"shares (\S+) (\S+)", out).groups())
    assert starting > 0.5, f"another thread ran {starting:.0%} of the time while the driver started"
    assert retaining > 0.5, f"another thread ran {retaining:.0%} of the time while the context was created"


def test_a_thread_without_the_gil_runs_blocking_calls_as_they_are():
    """M7: a Rust thread that never held the GIL copies to the host (a blocking call, through the
    hook that releases the GIL where it is held): detaching there would abort the interpreter."""
    code = textwrap.dedent("""
        import dlbridge
        from dlbridge import _native
        from fake_cuda import FakeDriver
        driver = FakeDriver()
        t = driver.device_fake([1.0, 2.0, 3.0], (3,))
        assert _native._cuda_to_host_on_rust_thread(t.capsule()) == [1.0, 2.0, 3.0]
        print("done")
    """)
    assert "done" in run_fresh(code)


# A daemon thread in a blocking copy (the GIL given up, 200 ms) while the main thread returns and
# finalization runs a slow finalizer: the thread takes the GIL back during finalization.
EXIT_IN_A_BLOCKING_CALL = """
import builtins, ctypes, os, threading, time
import dlbridge
ctypes.CDLL("libcuda.so.1").fake_cuda_set_sync_delay_ms(200)
d = dlbridge.from_dlpack(dlbridge.zeros(64), device=(2, 0))
def work():
    while True:
        os.write(1, b"copy ")
        dlbridge.from_dlpack(d, device="cpu").tolist()
        os.write(1, b"copied ")
class SlowFinalizer:
    def __del__(self):
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            pass
        os.write(1, b"finalized")
builtins.slow_finalizer = SlowFinalizer()  # torn down late in finalization
threading.Thread(target=work, daemon=True).start()
time.sleep(0.3)
"""


def test_a_daemon_thread_in_a_blocking_driver_call_when_the_interpreter_exits():
    # CPython 3.10 to 3.13 end a daemon thread that takes the GIL back during finalization with
    # pthread_exit: the thread must park (PyO3's detach does), not unwind dlbridge's frames, which
    # aborted elsewhere ("FATAL: exception not rethrown").
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", EXIT_IN_A_BLOCKING_CALL], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stderr) == (0, ""), (proc.returncode, proc.stderr[-2000:])
    # Not vacuous: the thread was in a copy when the main thread returned, and finalization
    # outlasted the copy's blocking call.
    assert proc.stdout.endswith("copy finalized"), proc.stdout
