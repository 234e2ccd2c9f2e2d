"""The fake driver's introspection functions, on the very `libcuda.so` that dlbridge loaded."""

import ctypes

from dlpack_ctypes import FakeProducer
from producers import labelled

KINDS = {1: "create", 2: "record", 3: "wait", 4: "destroy", 5: "sync", 6: "dtoh", 7: "htod", 8: "dtod",
         9: "alloc", 10: "free", 11: "alloc_host", 12: "free_host", 13: "pointer", 14: "alloc_managed"}
CU_EVENT_DISABLE_TIMING = 2


class FakeDriver:
    """The fake's log and counters, and ranges of host memory declared to be a device's."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so")
        self.lib.fake_cuda_log_row.argtypes = [ctypes.c_size_t, ctypes.POINTER(ctypes.c_int64)]
        self.lib.fake_cuda_log_row.restype = ctypes.c_bool
        self.lib.fake_cuda_register.argtypes = [ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int64]
        self.lib.fake_cuda_set_strict_pointer_queries.argtypes = [ctypes.c_bool]
        for name in ("log_len", "live_events", "live_allocations", "context_depth"):
            getattr(self.lib, f"fake_cuda_{name}").restype = ctypes.c_size_t

    def log(self, pointers=False):
        """Each call since the last clear: (kind, a, b, device whose context was current, or -1).
        Pointer queries (one per CUDA import, to check its device) are left out unless asked for."""
        row = (ctypes.c_int64 * 4)()
        out = []
        for i in range(self.lib.fake_cuda_log_len()):
            self.lib.fake_cuda_log_row(i, row)
            if pointers or KINDS[row[0]] != "pointer":
                out.append((KINDS[row[0]], row[1], row[2], row[3]))
        return out

    def kinds(self):
        return [row[0] for row in self.log()]

    def clear(self):
        self.lib.fake_cuda_clear_log()

    def register(self, address, nbytes, device):
        self.lib.fake_cuda_register(address, nbytes, device)

    def forget_registered(self):
        self.lib.fake_cuda_forget_registered()

    def strict_pointer_queries(self, strict):
        """Whether cuPointerGetAttribute needs a current context, as some drivers may."""
        self.lib.fake_cuda_set_strict_pointer_queries(strict)

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
