"""NumPy's low-precision dtypes from ml_dtypes, both ways through dlbridge, where NumPy's own DLPack
refuses them: zero-copy (checked by pointer) and bit for bit."""

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
import torch

import dlbridge

# name -> (DLPack dtype name, padded sub-byte)
TYPES = {
    "bfloat16": False, "float8_e3m4": False, "float8_e4m3": False, "float8_e4m3b11fnuz": False,
    "float8_e4m3fn": False, "float8_e4m3fnuz": False, "float8_e5m2": False, "float8_e5m2fnuz": False,
    "float8_e8m0fnu": False, "float6_e2m3fn": True, "float6_e3m2fn": True, "float4_e2m1fn": True,
    "complex32": False, "int2": True, "int4": True, "uint2": True, "uint4": True,
}
TORCH = {"bfloat16": torch.bfloat16, "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
         "float8_e4m3fnuz": torch.float8_e4m3fnuz, "float8_e5m2fnuz": torch.float8_e5m2fnuz,
         "float8_e8m0fnu": torch.float8_e8m0fnu}


def sample(name):
    dtype = np.dtype(getattr(ml_dtypes, name))
    values = np.array([1.0, 0.5, 2.0, 1.5, 0.25, 1.0], dtype=np.float32)
    if name.startswith(("int", "uint")):
        values = np.array([1, 0, 1, 1, 0, 1], dtype=np.float32)
    if name == "complex32":
        return (values + 1j * values).astype(dtype).reshape(2, 3)
    return values.astype(dtype).reshape(2, 3)


@pytest.mark.parametrize("name", TYPES)
def test_numpy_ml_dtypes_round_trip_zero_copy(name):
    a = sample(name)
    t = dlbridge.from_dlpack(a)
    assert str(t.dtype) == name and t.shape == (2, 3)
    assert t.data_ptr == a.ctypes.data, "zero-copy"
    assert t.nbytes == a.nbytes if TYPES[name] else True, "sub-byte values are padded, one per byte"
    back = t.numpy()
    assert back.dtype == a.dtype and back.tobytes() == a.tobytes()
    assert back.__array_interface__["data"][0] == a.ctypes.data
    assert dlbridge.asarray(a).data_ptr == a.ctypes.data
    a.flags.writeable = False
    assert dlbridge.from_dlpack(a).readonly and not dlbridge.from_dlpack(a).numpy().flags.writeable


@pytest.mark.parametrize("name", sorted(TORCH))
def test_torch_and_numpy_meet_through_dlbridge(name):
    a = sample(name)
    x = torch.from_dlpack(dlbridge.from_dlpack(a))  # NumPy -> dlbridge -> torch
    assert x.dtype == TORCH[name] and x.data_ptr() == a.ctypes.data
    assert x.view(torch.uint8 if x.element_size() == 1 else torch.int16).numpy().tobytes() == a.tobytes()
    back = dlbridge.from_dlpack(x).numpy()  # torch -> dlbridge -> NumPy
    assert back.dtype == a.dtype and back.tobytes() == a.tobytes() and back.ctypes.data == x.data_ptr()
    with pytest.raises((BufferError, RuntimeError)):
        np.from_dlpack(x)  # what NumPy does alone


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_jax_takes_numpy_ml_dtypes_through_dlbridge(name):
    jnp = pytest.importorskip("jax.numpy")
    a = sample(name)
    j = jnp.from_dlpack(dlbridge.from_dlpack(a))
    assert str(j.dtype) == name and np.asarray(j).tobytes() == a.tobytes()
    back = dlbridge.from_dlpack(j).numpy()
    assert back.dtype == a.dtype and back.tobytes() == a.tobytes()


def test_packed_sub_byte_tensor_is_unpacked_into_one_value_per_byte():
    t = dlbridge.zeros(5, "float4_e2m1fn")  # packed: 3 bytes
    memoryview(t._bytes())[:] = bytes([0x21, 0x43, 0x05])
    a = t.numpy()
    assert a.dtype == np.dtype(ml_dtypes.float4_e2m1fn)
    assert a.view(np.uint8).tolist() == [1, 2, 3, 4, 5]


def test_without_ml_dtypes_the_error_names_it():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'ml_dtypes': raise ImportError('blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import torch, dlbridge\n"
        "t = dlbridge.from_dlpack(torch.ones(2, dtype=torch.bfloat16))\n"
        "try:\n    t.numpy()\nexcept TypeError as e:\n    print('refused:', e)\n"
        "print(dlbridge.from_dlpack(torch.ones(2)).numpy().tolist())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "refused: a bfloat16 tensor needs the ml_dtypes package" in out.stdout and "[1.0, 1.0]" in out.stdout
