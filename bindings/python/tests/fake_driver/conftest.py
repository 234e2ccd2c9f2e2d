"""The CUDA layer against a fake driver (tests/fake-cuda, loaded as `libcuda.so`): what dlbridge asks
of the driver, checked call by call, on machines without a GPU. These modules run only in the child
process that test_fake_driver.py starts with the fake on LD_LIBRARY_PATH; anywhere else they are not
collected, since loading a driver would change what the rest of the suite sees. (tests/conftest.py,
loaded first, puts the shared helpers on sys.path.)"""

import gc
import os

import pytest

if not os.environ.get("DLBRIDGE_FAKE_DRIVER_CHILD"):
    collect_ignore_glob = ["*.py"]

_DRIVER = None
# Events alive between tests: those dlbridge keeps for its staging buffers (see `_warm_up`).
_KEPT_EVENTS = 0


def _warm_up(driver):
    """Host-to-device copies go through pinned staging buffers that dlbridge keeps for the process
    (four of 8 MiB per device, each with the event of its last DMA): all of them are made here,
    before any test counts allocations and events, by one 32 MiB copy to each device."""
    import numpy as np

    import dlbridge

    global _KEPT_EVENTS
    big = np.zeros(8 << 20, dtype=np.float32)
    for device in (0, 1):
        dlbridge.from_dlpack(big, device=(2, device))
    gc.collect()
    driver.run_all()
    _KEPT_EVENTS = driver.settle(driver.live_events)


@pytest.fixture
def driver():
    """The fake, with an empty log; afterwards no context may be left pushed, no event or
    allocation more alive than before (once dlbridge's release thread has freed what waits for the
    GPU), and no op may have run on freed memory. All queued work is completed before the memory
    tests registered is forgotten (and may go away)."""
    global _DRIVER
    if _DRIVER is None:
        from fake_cuda import FakeDriver

        _DRIVER = FakeDriver()
        _warm_up(_DRIVER)
    gc.collect()
    allocations = _DRIVER.settle(_DRIVER.live_allocations)
    uses = _DRIVER.uses_after_free()
    _DRIVER.clear()
    yield _DRIVER
    _DRIVER.strict_pointer_queries(False)
    _DRIVER.sync_delay(0)
    gc.collect()
    _DRIVER.run_all()
    assert _DRIVER.context_depth() == 0, "a context pushed and never popped"
    assert _DRIVER.settle(_DRIVER.live_allocations, allocations) == allocations, "device or pinned memory never freed"
    assert _DRIVER.live_events() == _KEPT_EVENTS, "an event never destroyed"
    assert _DRIVER.uses_after_free() == uses, "work ran on memory after it was freed"
    _DRIVER.forget_registered()
