"""Shared pieces of the GPU suite: the module-level skip, CUDA array interface wrappers, a calibrated
GPU sleep, and small readers that do not depend on the code under test.

Every test module here starts with `torch = require_cuda()`, which skips the whole module (not
each test) when torch is missing or sees no CUDA device, so the folder sits in the normal test tree
and a CPU machine reports it as skipped. With DLBRIDGE_REQUIRE_GPU=1 it fails instead."""

import ctypes
import os

import pytest

# DLPack device types.
CPU, CUDA, CUDA_HOST = 1, 2, 3

# Set by scripts/gpu-test.sh: a GPU machine, where nothing may be skipped.
REQUIRED = os.environ.get("DLBRIDGE_REQUIRE_GPU") == "1"


def skip_or_fail(reason):
    """Skips (the whole module at import time), or fails when DLBRIDGE_REQUIRE_GPU=1."""
    if REQUIRED:
        pytest.fail(f"{reason}, and DLBRIDGE_REQUIRE_GPU=1 forbids skipping", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require_cuda():
    """torch, or a module-level skip when it is missing or has no CUDA device."""
    try:
        import torch
    except ImportError as e:
        skip_or_fail(f"the GPU suite needs torch: {e}")
    if not torch.cuda.is_available():
        skip_or_fail("no CUDA device (torch.cuda.is_available() is False)")
    return torch


def stream_handle(stream):
    """The integer a stream is passed as in `__dlpack__(stream=)` and in the CUDA array interface:
    its cudaStream_t, except that the legacy default stream (handle 0) is 1, as both specs say."""
    handle = int(stream.cuda_stream)
    return 1 if handle == 0 else handle


class CudaArrayInterface:
    """An object with only `__cuda_array_interface__` (v3), so that consumers cannot take a DLPack
    path instead. `keep` holds the memory's owner alive."""

    def __init__(self, keep, **cai):
        self.keep = keep
        cai.setdefault("version", 3)
        self.__cuda_array_interface__ = cai


def torch_cai(x, stream=None, strides=None, data=None, readonly=False):
    """A v3 CUDA array interface over torch tensor `x`, with the given stream entry (torch's own
    interface is version 2, without one). `strides` in bytes; `data` overrides the address."""
    typestr = {
        "torch.float32": "<f4", "torch.float64": "<f8", "torch.int32": "<i4", "torch.int64": "<i8",
        "torch.uint8": "|u1", "torch.float16": "<f2",
    }[str(x.dtype)]
    cai = {
        "shape": tuple(x.shape),
        "typestr": typestr,
        "data": (x.data_ptr() if data is None else data, readonly),
        "strides": strides,
        "stream": stream,
    }
    return CudaArrayInterface(x, **cai)


def only_cai(obj):
    """`obj`'s own CUDA array interface, on an object that offers nothing else."""
    return CudaArrayInterface(obj, **obj.__cuda_array_interface__)


class GpuSleep:
    """`torch.cuda._sleep` in seconds: the spin count for one second is measured once with CUDA
    events, so that a producer kernel is known to be still running for as long as a test needs."""

    def __init__(self, torch):
        self.torch = torch
        torch.cuda.synchronize()
        torch.cuda._sleep(1_000_000)  # load the kernel
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 20_000_000
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        self.cycles_per_second = cycles / (start.elapsed_time(end) / 1000)

    def __call__(self, seconds):
        """Enqueues a kernel that spins for about `seconds` on torch's current stream."""
        self.torch.cuda._sleep(int(self.cycles_per_second * seconds))


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def open_fds():
    return len(os.listdir("/proc/self/fd"))


def read_host_floats(address, count):
    """`count` float32 values read straight from host memory at `address` (pinned memory included),
    without going through dlbridge."""
    return list((ctypes.c_float * count).from_address(address))


# The CUDA driver API, through ctypes, to ask what a pointer is without trusting dlbridge or a peer.
_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_DEVICE = 1, 2
_driver = None


def driver():
    """libcuda, or None where it cannot be loaded."""
    global _driver
    if _driver is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError:
            return None
        lib.cuPointerGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64]
        lib.cuPointerGetAttribute.restype = ctypes.c_int
        _driver = lib
    return _driver


def memory_type(address):
    """CU_MEMORYTYPE_HOST for pinned (page-locked, registered) host memory, CU_MEMORYTYPE_DEVICE for
    device memory, None for memory CUDA does not know (pageable host memory). Call it after torch
    has made its context current on this thread."""
    value = ctypes.c_uint(0)
    rc = driver().cuPointerGetAttribute(ctypes.byref(value), _CU_POINTER_ATTRIBUTE_MEMORY_TYPE, address)
    return value.value if rc == 0 else None


def device_ordinal(address):
    value = ctypes.c_int(-1)
    rc = driver().cuPointerGetAttribute(ctypes.byref(value), _CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, address)
    assert rc == 0, f"cuPointerGetAttribute(DEVICE_ORDINAL) failed with {rc}"
    return value.value
