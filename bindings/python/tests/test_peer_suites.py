"""Peers' own DLPack tests, run with dlbridge in the middle: whatever a peer's suite checks of
`from_dlpack(x, device=, copy=)` must hold when dlbridge imports x (as consumer) and the peer then
imports dlbridge's tensor (dlbridge as producer).

NumPy ships its suite in its wheel (`numpy/_core/tests/test_dlpack.py`): it runs here in a child
pytest, once as it is and once with a conftest that routes `np.from_dlpack` through dlbridge, and
both runs must report the same passes. PyTorch's suite (test/test_dlpack.py) is not shipped; its
CPU cases that go through `from_dlpack` are restated below."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.utils.dlpack as torch_dlpack
from torch.testing import make_tensor

import dlbridge

NUMPY_RELAY = '''
import atexit, os
import numpy as np
import dlbridge

_numpy_from_dlpack = np.from_dlpack
_relayed = [0]


def from_dlpack_through_dlbridge(x, /, *, device=None, copy=None):
    _relayed[0] += 1
    return _numpy_from_dlpack(dlbridge.from_dlpack(x, device=device, copy=copy))


np.from_dlpack = from_dlpack_through_dlbridge
atexit.register(lambda: open(os.environ["RELAY_COUNT_FILE"], "w").write(str(_relayed[0])))
'''


def run_suite(folder, count_file):
    env = {**os.environ, "RELAY_COUNT_FILE": str(count_file)}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", str(folder)],
                            capture_output=True, text=True, env=env, timeout=600)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|error|errors|skipped|xfailed|xpassed)", summary)}
    return result, counts


def test_numpys_own_dlpack_suite_passes_with_dlbridge_in_the_middle(tmp_path):
    suite = Path(np.__file__).parent / "_core" / "tests" / "test_dlpack.py"
    assert suite.exists(), f"NumPy {np.__version__} no longer ships {suite}"
    plain, relayed = tmp_path / "plain", tmp_path / "relayed"
    for folder in (plain, relayed):
        folder.mkdir()
        (folder / "test_dlpack.py").write_text(suite.read_text())
    (relayed / "conftest.py").write_text(NUMPY_RELAY)

    base, base_counts = run_suite(plain, tmp_path / "unused")
    assert base.returncode == 0, "NumPy's suite fails without dlbridge:\n" + base.stdout[-3000:]
    through, counts = run_suite(relayed, tmp_path / "count")
    assert through.returncode == 0, "NumPy's suite fails with dlbridge in the middle:\n" + through.stdout[-5000:]
    assert counts == base_counts and counts.get("passed", 0) > 50, (counts, base_counts)
    assert int((tmp_path / "count").read_text()) > 50, "the relay was not used"


@pytest.fixture
def torch_through_dlbridge(monkeypatch):
    """torch.from_dlpack and torch.utils.dlpack.from_dlpack, routed through dlbridge."""
    torch_from_dlpack = torch.from_dlpack

    def relay(x, *, device=None, copy=None):
        return torch_from_dlpack(dlbridge.from_dlpack(x, device=None if device is None else str(device), copy=copy))

    monkeypatch.setattr(torch, "from_dlpack", relay)
    monkeypatch.setattr(torch_dlpack, "from_dlpack", relay)
    return relay


TORCH_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
                torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128]


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_torch_suite_conversions(torch_through_dlbridge, dtype):
    x = make_tensor((5,), dtype=dtype, device="cpu")
    for z in (torch_dlpack.from_dlpack(torch_dlpack.to_dlpack(x)), torch.from_dlpack(x)):
        assert z.dtype == x.dtype and torch.equal(z, x)
    grid = make_tensor((25,), dtype=dtype, device="cpu").reshape(5, 5)
    for y in (grid[0], grid[:, 0], grid[1, :], grid[1], grid.t()):
        z = torch.from_dlpack(y)
        assert torch.equal(z, y) and z.stride() == y.stride() and z.data_ptr() == y.data_ptr()


def test_torch_suite_shared_storage_strides_and_versions(torch_through_dlbridge):
    x = make_tensor((5,), dtype=torch.float64, device="cpu")
    z = torch_dlpack.from_dlpack(torch_dlpack.to_dlpack(x))
    z[0] = z[0] + 20.0
    assert torch.equal(z, x), "a legacy capsule's memory is still shared and writable on the far side"
    y = torch.rand(16)[::3][:1]
    assert torch_dlpack.from_dlpack(y).stride() == (3,), "strides are kept, not normalised"
    for kwargs in ({}, {"max_version": (0, 8)}, {"max_version": (1, 0)}, {"max_version": (2, 0)}):
        inp = make_tensor((5,), dtype=torch.float32, device="cpu")
        assert torch.equal(torch.from_dlpack(inp.__dlpack__(**kwargs)), inp)
    t = make_tensor((5,), dtype=torch.float32, device="cpu")
    assert torch_dlpack.from_dlpack(t.numpy()).data_ptr() == t.data_ptr()


def test_torch_suite_copy_rules_on_cpu(torch_through_dlbridge):
    inp = torch.arange(5.0)
    for device, copy in ((None, None), (None, False), ("cpu", None), ("cpu", False), (None, True), ("cpu", True)):
        out = torch.from_dlpack(inp, device=device, copy=copy)
        assert torch.equal(out, inp) and out.device == inp.device
        assert (out.data_ptr() == inp.data_ptr()) == (copy is not True), (device, copy)


def test_torch_suite_refusals_keep_torchs_words(torch_through_dlbridge):
    with pytest.raises(BufferError, match=".* types are not supported by dlpack"):
        torch_dlpack.from_dlpack(torch.quantize_per_tensor(torch.randn(()), 0.1, 10, torch.qint8))
    with pytest.raises(BufferError, match="strided"):
        torch_dlpack.from_dlpack(torch.sparse_coo_tensor([[0]], [1], size=(1,)))
    with pytest.raises(BufferError, match="require gradient"):
        torch_dlpack.from_dlpack(torch.zeros(3, requires_grad=True))
    with pytest.raises(BufferError, match="conjugate bit"):
        torch_dlpack.from_dlpack(torch.conj(torch.tensor([-1 + 1j, 3 - 3j])))
