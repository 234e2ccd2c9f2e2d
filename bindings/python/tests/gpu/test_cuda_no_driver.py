"""The other side of the GPU suite: on a machine without a CUDA driver, every operation that needs
one raises a clear BufferError or RuntimeError naming the missing driver, while carrying CUDA
tensors without touching them still works. Skipped wherever libcuda loads."""

import pytest

from cuda_support import CPU, CUDA, CUDA_HOST, driver

if driver() is not None:
    pytest.skip("a CUDA driver is installed here", allow_module_level=True)

np = pytest.importorskip("numpy")

import dlbridge  # noqa: E402
from dlpack_ctypes import FakeProducer  # noqa: E402

MISSING = r"(?i)driver|libcuda"


class FakeCuda:
    """A producer that claims CUDA memory (a host buffer; nothing dereferences it)."""

    def __init__(self):
        self.fakes = []

    def __dlpack_device__(self):
        return (CUDA, 0)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if dl_device not in (None, (CUDA, 0)) or copy:
            raise BufferError("this fake cannot copy")
        fake = FakeProducer(versioned=max_version is not None)
        fake.tensor.device.device_type, fake.tensor.device.device_id = CUDA, 0
        self.fakes.append(fake)
        return fake.capsule()


def cuda_tensor():
    return dlbridge.from_dlpack(FakeCuda())


def test_carrying_needs_no_driver():
    t = cuda_tensor()
    assert t.device == (CUDA, 0)
    assert dlbridge.from_dlpack(t.__dlpack__(stream=-1, max_version=(1, 3))).device == (CUDA, 0)


@pytest.mark.parametrize(
    "operation",
    [
        lambda: dlbridge.from_dlpack(np.arange(3.0), device=(CUDA, 0)),
        lambda: dlbridge.from_dlpack(np.arange(3.0), device=(CUDA_HOST, 0)),
    ],
    ids=["host to device", "host to pinned"],
)
def test_copies_to_cuda_name_the_missing_driver(operation):
    with pytest.raises((BufferError, RuntimeError), match=MISSING):
        operation()


# When the operation fails, the foreign tensor it was given is released while the BufferError is
# already set, and this fake's deleter is a ctypes callback (a CuPy or numba owner's finalizer would
# be Python code too): dlbridge keeps the exception in flight intact around it, so the BufferError,
# not a SystemError, reaches the caller.
@pytest.mark.parametrize(
    "operation",
    [
        lambda: dlbridge.from_dlpack(cuda_tensor(), device="cpu"),
        lambda: cuda_tensor().__dlpack__(dl_device=(CPU, 0), max_version=(1, 3)),
        lambda: dlbridge.from_dlpack(cuda_tensor(), copy=True),
        lambda: cuda_tensor().__dlpack__(stream=2, max_version=(1, 3)),
    ],
    ids=["device to host", "export to host", "device copy", "wait on another stream"],
)
def test_operations_on_cuda_tensors_name_the_missing_driver(operation):
    with pytest.raises((BufferError, RuntimeError), match=MISSING):
        operation()
