"""Fixtures of the GPU suite. Nothing here imports a GPU library at import time: on a machine
without CUDA every module in this folder skips itself (see cuda_support.require_cuda), and these
fixtures are never reached.

With DLBRIDGE_REQUIRE_GPU=1 (scripts/gpu-test.sh sets it) nothing may skip: `require_cuda` and the
library fixtures fail instead, and any other skip is reported as a failure, so that a machine
missing torch, CuPy or a GPU cannot pass the suite by skipping it. Tests that need two GPUs are
left out (deselected, and said so) on a machine with one, and the no-driver module on any GPU machine."""

import os
import sys
from pathlib import Path

import pytest

# cuda_support here, and dlpack_ctypes one folder up (whose conftest adds it too, when it is loaded).
sys.path.insert(0, str(Path(__file__).parent.parent))
sys.path.insert(0, str(Path(__file__).parent))

from cuda_support import REQUIRED, skip_or_fail  # noqa: E402

# JAX takes 75% of the GPU's memory on first use unless told otherwise, which would starve torch and
# CuPy in this same process. The CUDA array interface consumers are left at their default, which
# is to synchronise on the producer's `stream` entry; the tests rely on that.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("CUPY_CUDA_ARRAY_INTERFACE_SYNC", "1")
os.environ.setdefault("NUMBA_CUDA_ARRAY_INTERFACE_SYNC", "1")


# The no-driver module is for machines without CUDA; on a GPU machine it has nothing to test.
collect_ignore = ["test_cuda_no_driver.py"] if REQUIRED else []


def pytest_configure(config):
    config.addinivalue_line("markers", "two_gpus: needs two CUDA devices (left out on a machine with one)")


def pytest_collection_modifyitems(config, items):
    two = [item for item in items if item.get_closest_marker("two_gpus")]
    if not two or not REQUIRED:
        return
    import torch

    if torch.cuda.device_count() >= 2:
        return
    config.hook.pytest_deselected(items=two)
    items[:] = [item for item in items if item not in two]
    config._dlbridge_left_out = f"{len(two)} two-GPU tests left out: this machine has {torch.cuda.device_count()} GPU"


def pytest_terminal_summary(terminalreporter, config):
    if REQUIRED:
        terminalreporter.write_line("DLBRIDGE_REQUIRE_GPU=1: test_cuda_no_driver.py (machines without a driver) left out")
    if getattr(config, "_dlbridge_left_out", None):
        terminalreporter.write_line(config._dlbridge_left_out)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if REQUIRED and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped, but DLBRIDGE_REQUIRE_GPU=1 forbids skips: {reason}"


@pytest.fixture(scope="session")
def torch():
    from cuda_support import require_cuda

    return require_cuda()


@pytest.fixture(scope="session")
def cupy():
    try:
        import cupy as cp
    except ImportError as e:
        skip_or_fail(f"CuPy is not installed: {e}")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            skip_or_fail("CuPy sees no CUDA device")
    except Exception as e:  # CUDARuntimeError, or a missing library
        skip_or_fail(f"CuPy cannot use the GPU: {e}")
    return cp


@pytest.fixture(scope="session")
def jax():
    try:
        import jax
    except ImportError as e:
        skip_or_fail(f"JAX is not installed: {e}")
    try:
        jax.devices("gpu")
    except RuntimeError as e:
        skip_or_fail(f"JAX has no GPU backend: {e}")
    return jax


@pytest.fixture(scope="session")
def numba_cuda():
    try:
        from numba import cuda
    except ImportError as e:
        skip_or_fail(f"numba.cuda (numba-cuda) is not installed: {e}")
    if not cuda.is_available():
        skip_or_fail("numba.cuda sees no CUDA device")
    return cuda


@pytest.fixture(scope="session")
def tvm_ffi():
    try:
        import tvm_ffi
    except ImportError as e:
        skip_or_fail(f"tvm_ffi is not installed (scripts/gpu-test.sh installs it from dist-gpu/extras): {e}")
    return tvm_ffi


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
