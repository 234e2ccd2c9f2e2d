"""The fake driver's test hooks, on the very `libcuda.so.1` that dlbridge loaded: its log and
counters, memory declared to be a device's, streams tests create, "kernels" and host functions
queued on them, and the calls that make queued work complete (see tests/fake-cuda/src/lib.rs)."""

import ctypes
import os
import subprocess
import sys
import textwrap

import numpy as np

from dlpack_ctypes import FakeProducer
from producers import labelled

HERE = os.path.dirname(os.path.abspath(__file__))


def run_fresh(code, *, hang=None, timeout=60, env=None):
    """Runs `code` in a new Python process with the same fake driver (whose counters start at zero
    there), the fake-driver helpers importable; returns what it printed. `hang` is the failure to
    report if it does not finish within `timeout` seconds (a deadlock, for the tests that set it)."""
    prelude = f"import sys\nsys.path[:0] = {[HERE, os.path.dirname(HERE)]!r}\n"
    try:
        result = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True,
                                text=True, env=env or os.environ, timeout=timeout)
    except subprocess.TimeoutExpired:
        if hang is None:
            raise
        import pytest

        pytest.fail(hang)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


KINDS = {1: "create", 2: "record", 3: "wait", 4: "destroy", 5: "sync", 6: "dtoh", 7: "htod", 8: "dtod",
         9: "alloc", 10: "free", 11: "alloc_host", 12: "free_host", 13: "pointer", 14: "alloc_managed",
         15: "event_sync", 16: "copy2d", 17: "module_load", 18: "get_function", 19: "launch", 20: "module_unload",
         21: "alloc_async", 22: "free_async"}
ALLOCS = ("alloc", "alloc_async")  # device memory, from cuMemAlloc or the pool
FREES = ("free", "free_async")
CU_EVENT_DISABLE_TIMING = 2
MODES = {"global": 0, "thread_local": 1, "relaxed": 2}
HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
MEMORY_KINDS = {2: 0, 3: 1, 13: 2}  # DLPack device type -> the fake's kind of memory
# CUresult codes the tests name.
INVALID_HANDLE, CONTEXT_IS_DESTROYED = 400, 709
CAPTURE_INVALIDATED = 901


class FakeDriver:
    """The fake's hooks, with ranges of host memory declared to be a device's."""

    def __init__(self):
        lib = self.lib = ctypes.CDLL("libcuda.so.1")
        sz, i64, u64 = ctypes.c_size_t, ctypes.c_int64, ctypes.c_uint64
        lib.fake_cuda_log_row.argtypes = [sz, ctypes.POINTER(i64)]
        lib.fake_cuda_log_row.restype = ctypes.c_bool
        lib.fake_cuda_register_kind.argtypes = [sz, sz, i64, ctypes.c_int32]
        lib.fake_cuda_set_strict_pointer_queries.argtypes = [ctypes.c_bool]
        lib.fake_cuda_set_sync_delay_ms.argtypes = [u64]
        lib.fake_cuda_set_unload_delay_ms.argtypes = [u64]
        for name in ("log_len", "live_events", "live_allocations", "live_modules", "context_depth", "stale_handle_uses",
                     "uses_after_free"):
            getattr(lib, f"fake_cuda_{name}").restype = sz
        lib.fake_cuda_set_memory_pools.argtypes = [ctypes.c_bool]
        lib.fake_cuda_set_param_info.argtypes = [ctypes.c_bool]
        lib.fake_cuda_thread_capture_mode.restype = ctypes.c_uint32
        lib.fake_cuda_set_thread_capture_mode.argtypes = [ctypes.c_uint32]
        lib.fake_cuda_stream_create.argtypes = [i64, ctypes.c_bool]
        lib.fake_cuda_stream_create.restype = sz
        lib.fake_cuda_stream_destroy.argtypes = [sz]
        lib.fake_cuda_launch_fill.argtypes = [i64, sz, sz, sz, ctypes.c_float]
        lib.fake_cuda_launch_copy.argtypes = [i64, sz, sz, sz, sz]
        lib.fake_cuda_launch_host_func.argtypes = [i64, sz, HOST_FN, sz]
        lib.fake_cuda_stream_wait_stream.argtypes = [i64, sz, sz]
        lib.fake_cuda_run.argtypes = [i64, sz]
        lib.fake_cuda_pending.argtypes = [i64, sz]
        lib.fake_cuda_pending.restype = u64
        lib.fake_cuda_peek.argtypes = [sz, sz, ctypes.c_void_p]
        lib.fake_cuda_primary_retains.argtypes = [i64]
        lib.fake_cuda_primary_retains.restype = ctypes.c_uint32
        lib.fake_cuda_primary_reset.argtypes = [i64]
        lib.fake_cuda_begin_capture.argtypes = [i64, sz, ctypes.c_uint32]
        lib.fake_cuda_end_capture.argtypes = [i64, sz, ctypes.POINTER(u64)]
        lib.fake_cuda_capture_status.argtypes = [i64, sz]
        lib.fake_cuda_graph_launch.argtypes = [u64, i64, sz]
        self._keep = []

    # --- the log ---------------------------------------------------------------------------------

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

    # --- memory, contexts, counters ----------------------------------------------------------------

    def register(self, address, nbytes, device, kind=0):
        self.lib.fake_cuda_register_kind(address, nbytes, device, kind)

    def forget_registered(self):
        self.lib.fake_cuda_forget_registered()

    def strict_pointer_queries(self, strict):
        """Whether cuPointerGetAttribute needs a current context, as some drivers may."""
        self.lib.fake_cuda_set_strict_pointer_queries(strict)

    def sync_delay(self, ms):
        """Makes each blocking call take `ms` milliseconds."""
        self.lib.fake_cuda_set_sync_delay_ms(ms)

    def unload_delay(self, ms):
        """Makes each module unload take `ms` milliseconds more than other blocking calls."""
        self.lib.fake_cuda_set_unload_delay_ms(ms)

    def live_events(self):
        return self.lib.fake_cuda_live_events()

    def live_allocations(self):
        return self.lib.fake_cuda_live_allocations()

    def live_modules(self):
        return self.lib.fake_cuda_live_modules()

    def uses_after_free(self):
        """How many ops ran on freed memory before it was handed out again."""
        return self.lib.fake_cuda_uses_after_free()

    def memory_pools(self, supported):
        """Whether devices report memory pools; dlbridge reads it once per device and process."""
        self.lib.fake_cuda_set_memory_pools(supported)

    def param_info(self, supported):
        """Whether cuFuncGetParamInfo answers (CUDA 12.4 and later) or not."""
        self.lib.fake_cuda_set_param_info(supported)

    def capture_mode(self):
        """This thread's capture mode, by name."""
        return {v: k for k, v in MODES.items()}[self.lib.fake_cuda_thread_capture_mode()]

    def set_capture_mode(self, mode):
        self.lib.fake_cuda_set_thread_capture_mode(MODES[mode])

    @staticmethod
    def wait_for(condition, timeout=10.0):
        """Waits (without completing any queued work) until `condition()` holds: for what dlbridge's
        release thread does on its own; whether it held."""
        import time

        deadline = time.monotonic() + timeout
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.01)
        return condition()

    def settle(self, live, target=None, timeout=10.0):
        """`live()` (a count of allocations) once it reaches `target`, or stops falling: frees that
        dlbridge's release thread carries out finish after the call that dropped the memory."""
        import time

        deadline, last = time.monotonic() + timeout, live()
        while time.monotonic() < deadline and last != target:
            self.run_all()
            time.sleep(0.02)
            now = live()
            if now == last and target is None:
                time.sleep(0.05)
                if live() == now:
                    return now
            last = now
        return live()

    def context_depth(self):
        return self.lib.fake_cuda_context_depth()

    def retains(self, device):
        """How often `device`'s primary context is retained (a retained context is awake)."""
        return self.lib.fake_cuda_primary_retains(device)

    def reset(self, device):
        """cuDevicePrimaryCtxReset from another library."""
        self.lib.fake_cuda_primary_reset(device)

    def peek(self, address, count):
        """The `count` float32 values at `address` now: a GPU's memory, stale or not."""
        out = np.empty(count, dtype=np.float32)
        self.lib.fake_cuda_peek(address, out.nbytes, out.ctypes.data)
        return out.tolist()

    def device_fake(self, values, shape, strides=None, first=0, device=(2, 0)):
        """A fake tensor on `device` whose buffer (exactly `values`) the driver knows as that device's
        memory (managed for device type 13, pinned for 3); element 0 is `values[first]`."""
        fake = FakeProducer(values=values, shape=shape)
        if strides is not None:
            fake.set_strides(strides)
        base = ctypes.addressof(fake.buffer)
        fake.tensor.data = base + 4 * first
        self.register(base, ctypes.sizeof(fake.buffer), device[1], MEMORY_KINDS.get(device[0], 0))
        return labelled(fake, device)

    def device_array(self, count, device=(2, 0), value=0.0):
        """`count` float32s of "device" memory: a NumPy array the driver knows as `device`'s
        (managed for device type 13, pinned for 3), holding `value` now."""
        a = np.full(count, value, dtype=np.float32)
        self.register(a.ctypes.data, a.nbytes, device[1], MEMORY_KINDS.get(device[0], 0))
        self._keep.append(a)
        return a

    def over(self, array, device=(2, 0)):
        """A fresh fake tensor (for one export) over `array`, labelled `device`."""
        fake = FakeProducer(values=[0.0], shape=array.shape)
        fake.tensor.data = array.ctypes.data
        fake.array = array
        return labelled(fake, device)

    # --- streams and the work on them ------------------------------------------------------------

    def stream(self, non_blocking=True, device=0):
        """A new stream's handle: non-blocking (as torch's pool streams) or blocking."""
        return self.lib.fake_cuda_stream_create(device, non_blocking)

    def destroy_stream(self, handle):
        assert self.lib.fake_cuda_stream_destroy(handle) == 0

    def fill(self, stream, address, count, value, device=0):
        """Queues a kernel on `stream` that writes `count` float32 `value`s at `address`."""
        assert self.lib.fake_cuda_launch_fill(device, stream, address, count, value) == 0

    def read(self, stream, address, count, device=0):
        """What a kernel on `stream` reads at `address` (`count` float32s), once `stream`'s work,
        and only what it waits for, has run."""
        out = np.full(count, -999.0, dtype=np.float32)
        assert self.lib.fake_cuda_launch_copy(device, stream, out.ctypes.data, address, out.nbytes) == 0
        self.run(stream, device)
        return out.tolist()

    def wait_stream(self, consumer, producer, device=0):
        """Makes `consumer` wait for the work queued on `producer` now (a producer's own hand-off)."""
        assert self.lib.fake_cuda_stream_wait_stream(device, consumer, producer) == 0

    def host_func(self, stream, fn, device=0):
        """Queues a Python function on `stream` (cuLaunchHostFunc): it runs on a thread of its own,
        and needs the GIL."""
        callback = HOST_FN(lambda _arg: fn())
        self._keep.append(callback)
        assert self.lib.fake_cuda_launch_host_func(device, stream, callback, 0) == 0

    def run(self, stream, device=0):
        """Completes the work queued on `stream` so far, and what it waits for."""
        assert self.lib.fake_cuda_run(device, stream) == 0

    def run_all(self):
        self.lib.fake_cuda_run_all()

    def pending(self, stream, device=0):
        return self.lib.fake_cuda_pending(device, stream)

    # --- stream capture --------------------------------------------------------------------------

    def begin_capture(self, stream, mode="global", device=0):
        assert self.lib.fake_cuda_begin_capture(device, stream, MODES[mode]) == 0

    def end_capture(self, stream, device=0):
        """The graph, or the CUresult the capture ended with (901 when it was invalidated)."""
        graph = ctypes.c_uint64()
        rc = self.lib.fake_cuda_end_capture(device, stream, ctypes.byref(graph))
        return graph.value if rc == 0 else rc

    def capture_status(self, stream, device=0):
        return {0: "none", 1: "active", 2: "invalidated"}[self.lib.fake_cuda_capture_status(device, stream)]

    def launch_graph(self, graph, stream, device=0):
        return self.lib.fake_cuda_graph_launch(graph, device, stream)


class StreamProducer:
    """A producer whose data is written by work it queued on its own stream, handing the data over
    through `__dlpack__` as the spec says: the consumer's stream (the legacy default when none is
    named) is made to wait for that work, unless the consumer passed -1. Records the keywords of each
    call. `device_raises` makes `__dlpack_device__` raise, as a broken producer's may."""

    def __init__(self, driver, array, stream, device=(2, 0), device_raises=False):
        self.driver, self.array, self.stream, self.device = driver, array, stream, device
        self.device_raises, self.calls = device_raises, []

    def __dlpack_device__(self):
        if self.device_raises:
            raise RuntimeError("this producer cannot say")
        return self.device

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.calls.append({"stream": stream, "dl_device": dl_device, "copy": copy})
        if stream != -1:
            self.driver.wait_stream(1 if stream is None else stream, self.stream, self.device[1])
        return self.driver.over(self.array, self.device).capsule()
