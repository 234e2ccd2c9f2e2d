"""Runs tests/fake_driver in a child process with tests/fake-cuda loaded as `libcuda.so`: the CUDA
layer's driver calls checked one by one, on this GPU-less machine. `./dev py-test` builds the fake
and names it in DLBRIDGE_FAKE_CUDA."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def test_the_cuda_layer_against_a_fake_driver(tmp_path):
    fake = os.environ.get("DLBRIDGE_FAKE_CUDA")
    if not fake:
        pytest.skip("DLBRIDGE_FAKE_CUDA is not set: run through ./dev py-test, which builds tests/fake-cuda")
    assert Path(fake).is_file(), f"DLBRIDGE_FAKE_CUDA names {fake}, which does not exist"
    (tmp_path / "libcuda.so").symlink_to(fake)
    env = {**os.environ, "LD_LIBRARY_PATH": f"{tmp_path}:{os.environ.get('LD_LIBRARY_PATH', '')}",
           "DLBRIDGE_FAKE_DRIVER_CHILD": "1"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / "fake_driver")],
                            capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
    assert " passed" in result.stdout.splitlines()[-1] and "skipped" not in result.stdout.splitlines()[-1], result.stdout[-500:]
