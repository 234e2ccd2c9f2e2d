"""numpy() of dtypes only ml_dtypes gives NumPy (review S4): the view's type comes from what the Rust
side read from ml_dtypes once and checked, its size from dlbridge's own dtype, never from a module
attribute read at call time. No torch here, so that ./dev valgrind runs it (its default set)."""

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("rebind", [
    "ml_dtypes.bfloat16 = np.float64",
    "sys.modules['ml_dtypes'] = types.SimpleNamespace(bfloat16=np.float64)",
])
@pytest.mark.parametrize("read_first", [True, False], ids=["read before", "rebound before"])
def test_a_rebound_ml_dtypes_attribute_never_sizes_numpy_views(rebind, read_first):
    # numpy() once sized its raw view by ml_dtypes.<name>'s item size at call time: an 8-byte
    # bfloat16 tensor came back as a 32-byte float64 array, and a write landed past the block
    # (review S4, valgrind). The type now comes from what the Rust side read and checked once
    # (a numpy.generic with this dtype's item size), the view's size from dlbridge's own dtype.
    code = (
        "import sys, types, numpy as np, ml_dtypes, dlbridge\n"
        "t = dlbridge.zeros((4,), dtype='bfloat16')\n"
        + ("t.numpy()\n" if read_first else "")
        + rebind + "\n"
        "try:\n"
        "    a = t.numpy()\n"
        "    a[:] = 1.0\n"
        "    print(a.dtype, a.nbytes, t.tolist() == [1.0] * 4)\n"
        "except TypeError as e:\n"
        "    print('TypeError', e)\n"
    )
    env = dict(os.environ, PYTHONMALLOC="malloc")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    if read_first:
        assert proc.stdout.strip() == "bfloat16 8 True"
    else:
        assert proc.stdout.startswith("TypeError a bfloat16 tensor needs the ml_dtypes package"), proc.stdout
