"""The example on a machine without a GPU: what it refuses, and its PTX. Its launches are tested
under the fake driver (bindings/python/tests/fake_driver/test_fake_kernels.py) and on a GPU
(bindings/python/tests/gpu/test_cuda_kernel.py)."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bindings" / "python" / "tests"))

import cuda_kernel  # noqa: E402
from producers import labelled  # noqa: E402
from dlpack_ctypes import FakeProducer  # noqa: E402

PTX = Path(__file__).resolve().parents[1] / "kernels" / "scale.ptx"


@pytest.mark.parametrize("call", ["scale", "scale_"])
@pytest.mark.parametrize("x, message", [
    (np.ones(3, dtype=np.float32), "a numpy.ndarray of float32 with shape (3,) on cpu:0"),
    (torch.ones(2, 2, dtype=torch.float64), "a torch.Tensor of float64 with shape (2, 2) on cpu:0"),
], ids=["numpy", "torch"])
def test_cpu_tensors_are_refused_with_what_was_expected(call, x, message):
    with pytest.raises(TypeError) as info:
        getattr(cuda_kernel, call)(x, 2.0)
    assert str(info.value) == f"expected a float32 C-contiguous CUDA tensor, got {message}"
    assert info.value.__notes__ == ["while processing 'x'"], "PyO3 names the argument"


def test_without_a_driver_the_call_says_so():
    if _has_driver():
        pytest.skip("this machine has a CUDA driver: the GPU suite covers it")
    # Kept in a variable: the test helper's capsule destructor, Python code, must not run while the
    # call's exception is set (C producers' destructors save it; a ctypes callback cannot).
    capsule = labelled(FakeProducer(), (2, 0)).capsule()
    with pytest.raises(BufferError, match="CUDA is not available"):
        cuda_kernel.scale(capsule, 2.0)


def _has_driver():
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def _ptxas():
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "backends" / "nvidia" / "bin" / "ptxas"
    return path if path.is_file() else None


def test_the_shipped_ptx_assembles_for_the_gpus_it_is_meant_for(tmp_path):
    """ptxas (shipped with Triton, which torch installs) checks every instruction against the
    declared `.version`: the one check of the kernel's PTX short of a GPU."""
    ptxas = _ptxas()
    if ptxas is None:
        pytest.skip("no ptxas: Triton is not installed")
    for arch in ("sm_75", "sm_90"):
        out = subprocess.run([str(ptxas), f"-arch={arch}", str(PTX), "-o", str(tmp_path / f"{arch}.cubin")],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr


def test_the_ptx_loads_on_drivers_from_cuda_11():
    text = PTX.read_text()
    assert re.search(r"^\.version 7\.0$", text, re.M), "an ISA newer than 7.0 needs a newer driver than the README says"
    assert re.search(r"^\.visible \.entry scale_f32\($", text, re.M)
