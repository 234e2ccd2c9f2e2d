"""Tensors an extension returns are instances of the dlbridge package's one Tensor class when the
package is installed (handed over through its table in the interpreter's state dict), with their memory,
writability and values; without the package they are the extension's own class, which works
everywhere DLPack does, and what needs the package says so."""

import pickle
import subprocess
import sys

import numpy as np
import pytest

import dlbridge
import scale_inplace


def test_a_returned_tensor_is_a_dlbridge_tensor():
    r = scale_inplace.arange(4)
    assert type(r) is dlbridge.Tensor and isinstance(r, dlbridge.Tensor)
    assert pickle.loads(pickle.dumps(r)).tolist() == [0.0, 1.0, 2.0, 3.0]
    assert not r.readonly
    assert type(scale_inplace.row_sums(np.ones((2, 2), np.float32))) is dlbridge.Tensor


def test_memory_and_writability_survive_the_handover():
    a = np.arange(4, dtype=np.float32)
    t = scale_inplace.as_tensor(a)
    assert type(t) is dlbridge.Tensor and t.data_ptr == a.ctypes.data and t._writability == "writable"
    ro = np.arange(4, dtype=np.float32)
    ro.flags.writeable = False
    t = scale_inplace.as_tensor(ro)
    assert t._writability == "readonly" and t.data_ptr == ro.ctypes.data
    with pytest.raises(BufferError):
        scale_inplace.scale(t, 2.0)
    jnp = pytest.importorskip("jax.numpy")
    t = scale_inplace.as_tensor(jnp.arange(4, dtype=jnp.float32))
    assert t._writability == "unknown" and t.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_without_the_package_the_extensions_own_class_works_and_pickling_says_why():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'dlbridge' or name.startswith('dlbridge.'): raise ImportError('blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import pickle, numpy as np, torch, scale_inplace\n"
        "r = scale_inplace.arange(3)\n"
        "print(type(r).__name__, type(r).__module__)\n"
        "print(np.from_dlpack(r).tolist(), torch.from_dlpack(r).tolist(), memoryview(r).tolist())\n"
        "try:\n    pickle.dumps(r)\nexcept ImportError as e:\n    print('refused:', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "Tensor dlbridge"
    assert lines[1] == "[0.0, 1.0, 2.0] [0.0, 1.0, 2.0] [0.0, 1.0, 2.0]"
    assert lines[2].startswith("refused: pickling needs the dlbridge Python package, which is not installed (pip install dlbridge)")
