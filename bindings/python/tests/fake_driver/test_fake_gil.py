"""M2: blocking driver calls run without the GIL. With every blocking call of the fake slowed to
0.3 s, another Python thread must keep running during each of dlbridge's blocking operations; and a
host function queued on a stream, which needs the GIL on the driver's thread, must not deadlock a
host wait that depends on it (CuPy's `launch_host_func`, numba's `add_callback`)."""

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


def operations(driver):
    device = lambda: dlbridge.from_dlpack(DunderProducer(make=lambda: driver.device_fake([1.0, 2.0], (2,))))
    S = driver.stream()
    managed = StreamProducer(driver, driver.device_array(2, (13, 0)), S, device=(13, 0))
    copy = [dlbridge.from_dlpack(np.arange(2.0), device=(2, 0))]

    def free():
        del copy[0]
        gc.collect()

    return {
        "device to host": lambda: dlbridge.from_dlpack(device(), device="cpu"),
        "managed memory read on the host": lambda: np.asarray(dlbridge.from_dlpack(managed, stream=S)),
        "host to device": lambda: dlbridge.from_dlpack(np.arange(2.0), device=(2, 0)),
        "pinned allocation": lambda: dlbridge.from_dlpack(np.arange(2.0), device=(3, 0)),
        "free in a deleter": free,
    }


@pytest.mark.parametrize("name", ["device to host", "managed memory read on the host", "host to device",
                                  "pinned allocation", "free in a deleter"])
def test_other_threads_run_while_dlbridge_waits_for_the_gpu(driver, counter, name):
    operation = operations(driver)[name]
    driver.sync_delay(DELAY_MS)
    share = share_of_time_the_counter_ran(counter, operation)
    driver.sync_delay(0)
    assert share > 0.3, f"{name}: another thread ran {share:.0%} of the time: the GIL was held while the driver blocked"


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
