"""Device ids: DLPack and CUDA array interface imports report the device the memory is on, which
for the CUDA array interface (that has no device field) comes from the pointer's attributes, not
from the current device; every copy dlbridge makes is where it says, by the driver's own answer
(`cuPointerGetAttribute`, asked through ctypes, not through dlbridge). The two-GPU tests skip on a
machine with one (with DLBRIDGE_REQUIRE_GPU=1 they are left out, and the summary says so): on one
GPU no code path for a device other than 0 runs."""

from cuda_support import (CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_HOST, CUDA, CUDA_HOST, device_ordinal, memory_type,
                          require_cuda, stream_handle, torch_cai)

torch = require_cuda()

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import dlbridge  # noqa: E402


@pytest.fixture
def two_gpus():
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs two GPUs, this machine has {torch.cuda.device_count()}")


def test_device_zero():
    x = torch.ones(3, device="cuda:0")
    assert dlbridge.from_dlpack(x).device == (CUDA, 0) == x.__dlpack_device__()
    t = dlbridge.asarray(torch_cai(x, stream=1))
    assert t.device == (CUDA, 0)
    assert memory_type(t.data_ptr) == CU_MEMORYTYPE_DEVICE and device_ordinal(t.data_ptr) == 0


def test_what_dlbridge_allocates_is_where_it_says_by_the_drivers_answer():
    """On one GPU: device copies (host to device, copy=True, a kernel's result) are device memory
    of the ordinal dlbridge reports, pinned copies are page-locked host memory, and imports of
    torch's memory report the ordinal the driver gives for the pointer."""
    import cuda_kernel

    index = torch.cuda.current_device()
    x = torch.arange(16.0, device=f"cuda:{index}")
    made = {
        "host to device": dlbridge.from_dlpack(np.arange(16.0, dtype=np.float32), device=(CUDA, index)),
        "copy=True": dlbridge.from_dlpack(x, copy=True),
        "kernel result": cuda_kernel.scale(x, 2.0),
        "import": dlbridge.from_dlpack(x),
        "array interface import": dlbridge.asarray(torch_cai(x, stream=1)),
    }
    for what, t in made.items():
        assert memory_type(t.data_ptr) == CU_MEMORYTYPE_DEVICE, what
        assert t.device == (CUDA, device_ordinal(t.data_ptr)) == (CUDA, index), what
    pinned = dlbridge.from_dlpack(x, device=(CUDA_HOST, 0))
    assert pinned.device == (CUDA_HOST, 0) and memory_type(pinned.data_ptr) == CU_MEMORYTYPE_HOST
    assert dlbridge.from_dlpack(made["kernel result"], device="cpu").tolist() == (x * 2).cpu().tolist()


@pytest.mark.two_gpus
def test_cuda_array_interface_import_on_device_one(two_gpus):
    x = torch.arange(4.0, device="cuda:1")
    torch.cuda.synchronize(1)
    with torch.cuda.device(0):  # the current device is 0; the memory is on 1
        t = dlbridge.asarray(torch_cai(x, stream=None))
        assert t.device == (CUDA, 1)
        y = torch.from_dlpack(t)
    assert y.device == torch.device("cuda", 1) and y.data_ptr() == x.data_ptr()
    assert dlbridge.from_dlpack(t, device="cpu").tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.two_gpus
def test_dlpack_on_device_one(two_gpus):
    x = torch.arange(4.0, device="cuda:1")
    s = torch.cuda.Stream(device=1)
    with torch.cuda.device(0):
        t = dlbridge.from_dlpack(x, stream=stream_handle(s))
        # s is kept as an event; the interface names the legacy stream, made to wait for it.
        assert t.device == (CUDA, 1) and t.__cuda_array_interface__["stream"] == 1
        y = torch.from_dlpack(t)
    assert y.device == torch.device("cuda", 1) and y.data_ptr() == x.data_ptr()


@pytest.mark.two_gpus
def test_copies_to_device_one(two_gpus):
    a = np.arange(6, dtype=np.float32)
    with torch.cuda.device(0):
        t = dlbridge.from_dlpack(a, device=(CUDA, 1))
    assert t.device == (CUDA, 1) and device_ordinal(t.data_ptr) == 1
    y = torch.from_dlpack(t)
    assert y.device == torch.device("cuda", 1) and y.cpu().tolist() == a.tolist()
    x = torch.arange(6.0, device="cuda:1")
    c = dlbridge.from_dlpack(x, copy=True)
    assert c.device == (CUDA, 1) and c.data_ptr != x.data_ptr() and device_ordinal(c.data_ptr) == 1
    assert dlbridge.from_dlpack(c, device="cpu").tolist() == x.cpu().tolist()
