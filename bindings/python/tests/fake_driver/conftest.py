"""The CUDA layer against a fake driver (tests/fake-cuda, loaded as `libcuda.so`): what dlbridge asks
of the driver, checked call by call, on machines without a GPU. These modules run only in the child
process that test_fake_driver.py starts with the fake on LD_LIBRARY_PATH; anywhere else they are not
collected, since loading a driver would change what the rest of the suite sees."""

import ctypes
import os

import pytest

from dlpack_ctypes import FakeProducer
from producers import labelled

if not os.environ.get("DLBRIDGE_FAKE_DRIVER_CHILD"):
    collect_ignore_glob = ["*.py"]

KINDS = {1: "create", 2: "record", 3: "wait", 4: "destroy", 5: "sync", 6: "dtoh", 7: "htod", 8: "dtod",
         9: "alloc", 10: "free", 11: "alloc_host", 12: "free_host"}
CU_EVENT_DISABLE_TIMING = 2


class FakeDriver:
    """The fake's introspection functions, on the very library dlbridge loaded."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so")
        self.lib.fake_cuda_log_row.argtypes = [ctypes.c_size_t, ctypes.POINTER(ctypes.c_int64)]
        self.lib.fake_cuda_log_row.restype = ctypes.c_bool
        self.lib.fake_cuda_register.argtypes = [ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int64]
        self.lib.fake_cuda_unregister.argtypes = [ctypes.c_size_t]
        for name in ("log_len", "live_events", "live_allocations", "context_depth"):
            getattr(self.lib, f"fake_cuda_{name}").restype = ctypes.c_size_t

    def log(self):
        """Each call since the last clear: (kind, a, b, device whose context was current)."""
        row = (ctypes.c_int64 * 4)()
        out = []
        for i in range(self.lib.fake_cuda_log_len()):
            self.lib.fake_cuda_log_row(i, row)
            out.append((KINDS[row[0]], row[1], row[2], row[3]))
        return out

    def kinds(self):
        return [row[0] for row in self.log()]

    def clear(self):
        self.lib.fake_cuda_clear_log()

    def register(self, address, nbytes, device):
        self.lib.fake_cuda_register(address, nbytes, device)

    def live_events(self):
        return self.lib.fake_cuda_live_events()

    def live_allocations(self):
        return self.lib.fake_cuda_live_allocations()

    def context_depth(self):
        return self.lib.fake_cuda_context_depth()

    def device_fake(self, values, shape, strides=None, first=0, device=(2, 0)):
        """A fake tensor on `device` whose buffer (exactly `values`) the driver knows as that device's
        memory; element 0 is `values[first]`."""
        fake = FakeProducer(values=values, shape=shape)
        if strides is not None:
            fake.set_strides(strides)
        base = ctypes.addressof(fake.buffer)
        fake.tensor.data = base + 4 * first
        self.register(base, ctypes.sizeof(fake.buffer), device[1])
        return labelled(fake, device)


_DRIVER = None


@pytest.fixture
def driver():
    global _DRIVER
    _DRIVER = _DRIVER or FakeDriver()
    _DRIVER.clear()
    yield _DRIVER
    assert _DRIVER.context_depth() == 0, "a context pushed and never popped"
    assert _DRIVER.live_events() == 0, "an event never destroyed"
