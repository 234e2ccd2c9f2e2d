"""Fixtures of the GPU suite. Nothing here imports a GPU library at import time: on a machine
without CUDA every module in this folder skips itself (see cuda_support.require_cuda), and these
fixtures are never reached."""

import os
import sys
from pathlib import Path

import pytest

# cuda_support here, and dlpack_ctypes one folder up (whose conftest adds it too, when it is loaded).
sys.path.insert(0, str(Path(__file__).parent.parent))
sys.path.insert(0, str(Path(__file__).parent))

# JAX takes 75% of the GPU's memory on first use unless told otherwise, which would starve torch and
# CuPy in this same process. The CUDA array interface consumers are left at their default, which
# is to synchronise on the producer's `stream` entry; the tests rely on that.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("CUPY_CUDA_ARRAY_INTERFACE_SYNC", "1")
os.environ.setdefault("NUMBA_CUDA_ARRAY_INTERFACE_SYNC", "1")


@pytest.fixture(scope="session")
def torch():
    from cuda_support import require_cuda

    return require_cuda()


@pytest.fixture(scope="session")
def cupy():
    cp = pytest.importorskip("cupy")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("CuPy sees no CUDA device")
    except Exception as e:  # CUDARuntimeError, or a missing library
        pytest.skip(f"CuPy cannot use the GPU: {e}")
    return cp


@pytest.fixture(scope="session")
def jax():
    jax = pytest.importorskip("jax")
    try:
        jax.devices("gpu")
    except RuntimeError as e:
        pytest.skip(f"JAX has no GPU backend: {e}")
    return jax


@pytest.fixture(scope="session")
def numba_cuda():
    pytest.importorskip("numba")
    try:
        from numba import cuda
    except ImportError as e:
        pytest.skip(f"numba.cuda (numba-cuda) is not installed: {e}")
    if not cuda.is_available():
        pytest.skip("numba.cuda sees no CUDA device")
    return cuda


@pytest.fixture(scope="session")
def gpu_sleep(torch):
    from cuda_support import GpuSleep

    return GpuSleep(torch)


@pytest.fixture
def streams(torch):
    """Three fresh side streams (torch's pool streams are non-blocking: they do not wait for the
    legacy default stream, so only explicit synchronisation orders them)."""
    torch.cuda.synchronize()
    yield torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.synchronize()
