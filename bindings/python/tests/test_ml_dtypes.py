"""NumPy's low-precision dtypes from ml_dtypes, both ways through dlbridge, where NumPy's own DLPack
refuses them: zero-copy (checked by pointer) and bit for bit."""

import os
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


def child(code, env=None):
    """Runs `code` in a fresh interpreter (where a fake ml_dtypes, or a crash, stays)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)


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
    out = child(code)
    assert out.returncode == 0, out.stderr
    assert "refused: a bfloat16 tensor needs the ml_dtypes package" in out.stdout and "[1.0, 1.0]" in out.stdout


@pytest.mark.parametrize("name,size", [("float4_e2m1fn", 1), ("float4_e2m1fn", 2), ("float4_e2m1fn", 3), ("float6_e2m3fn", 1), ("int4", 1), ("uint2", 1)])
def test_packed_sub_byte_values_read_right_for_every_length(name, size):
    # One element of a packed tensor is one byte, as a padded one would be: numpy() must go by the
    # flag, not by the byte count (0x21 as one packed float4 is 0.5, its low nibble).
    t = dlbridge.zeros(size, name)
    assert not t._subbyte_padded
    bits = t.dtype.bits
    raw = [(0x21 >> (bits * i % 8)) & ((1 << bits) - 1) for i in range(size)] if bits == 4 else None
    packed = bytes([0x21] * len(memoryview(t._bytes())))
    memoryview(t._bytes())[:] = packed
    values = np.unpackbits(np.frombuffer(packed, np.uint8), bitorder="little")[: size * bits].reshape(size, bits)
    expected = np.packbits(values, axis=1, bitorder="little").reshape(-1)
    a = t.numpy()
    assert a.view(np.uint8).tolist() == expected.tolist()
    if name == "float4_e2m1fn" and size == 1:
        assert a.astype(np.float32).tolist() == [0.5] and raw == [1]


def test_numpy_refuses_device_memory_for_every_dtype():
    # A tensor labelled CUDA (host memory here, device memory on a GPU machine, where NumPy would
    # segfault on the first read): numpy() refuses it like every other host route.
    from dlpack_ctypes import DLDevice, FakeProducer

    for dtype, name in [((4, 16, 1), "bfloat16"), ((2, 32, 1), "float32"), ((10, 8, 1), "float8_e4m3fn")]:
        p = FakeProducer(values=(1.0, 2.0), shape=(2,), dtype=dtype)
        p.tensor.device = DLDevice(2, 0)
        t = dlbridge.from_dlpack(p.capsule())
        assert str(t.dtype) == name and t.device == (2, 0)
        with pytest.raises(BufferError, match="not accessible from the CPU"):
            t.numpy()


def test_an_impostor_ml_dtypes_module_is_not_trusted():
    # Anything may sit in sys.modules["ml_dtypes"]: a fake whose bfloat16 is `str` once made a
    # StringDType array (16-byte structs holding heap pointers) a writable bfloat16 tensor.
    code = (
        "import sys, types, numpy as np\n"
        "fake = types.ModuleType('ml_dtypes'); fake.bfloat16 = str; sys.modules['ml_dtypes'] = fake\n"
        "import dlbridge\n"
        "arr = np.array(['a string long enough to live on the heap %d' % i for i in range(4)], dtype=np.dtypes.StringDType())\n"
        "try:\n    t = dlbridge.from_dlpack(arr); print('imported', t.dtype)\n"
        "except (BufferError, TypeError, ValueError) as e:\n    print('refused')\n"
        "print([len(s) for s in arr.tolist()])\n"
        # The real module, imported later, is trusted once it is there.
        "del sys.modules['ml_dtypes']; import ml_dtypes\n"
        "print(dlbridge.from_dlpack(np.ones(2, ml_dtypes.bfloat16)).dtype)\n"
    )
    out = child(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["refused", "[42, 42, 42, 42]", "bfloat16"]


def test_a_numpy_subclass_posing_as_an_ml_dtypes_type_is_not_trusted():
    # A Python-made numpy.float16 subclass has a 2-byte NumPy dtype, but that dtype is float16's:
    # trusted, it once made numpy() read bfloat16 bits as float16 values, and stayed cached.
    pytest.importorskip("torch")
    code = (
        "import sys, types, numpy as np, torch\n"
        "fake = types.ModuleType('ml_dtypes')\n"
        "class bfloat16(np.float16): pass\n"
        "fake.bfloat16 = bfloat16; sys.modules['ml_dtypes'] = fake\n"
        "import dlbridge\n"
        "t = dlbridge.from_dlpack(torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16))\n"
        "try:\n    print(t.numpy().tolist())\n"
        "except TypeError as e:\n    print('refused')\n"
        "del sys.modules['ml_dtypes']; import ml_dtypes\n"
        "a = t.numpy(); print(a.dtype, [float(v) for v in a])\n"
    )
    out = child(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["refused", "bfloat16 [1.0, 2.0, 3.0]"]


def test_a_module_pointing_names_at_other_ml_dtypes_types_is_not_trusted():
    # Real, registered ml_dtypes types under each other's names (the same item size and kind):
    # trusted, numpy() of a float8_e4m3fn tensor gave float8_e5m2 values, int4 gave uint4's.
    code = (
        "import sys, types, numpy as np\n"
        "import ml_dtypes as real\n"
        "fake = types.ModuleType('ml_dtypes')\n"
        "for n in dir(real): setattr(fake, n, getattr(real, n))\n"
        "fake.float8_e4m3fn, fake.float8_e5m2 = real.float8_e5m2, real.float8_e4m3fn\n"
        "fake.int4, fake.uint4 = real.uint4, real.int4\n"
        "sys.modules['ml_dtypes'] = fake\n"
        "import dlbridge\n"
        "src = np.array([1.5, -2.0, 448.0], dtype=real.float8_e4m3fn)\n"
        "t = dlbridge._rebuild_tensor(bytes(src.view(np.uint8)), 'float8_e4m3fn', (3,), 'readonly', False)\n"
        "try:\n    print(t.numpy().dtype, t.numpy().tolist())\n"
        "except TypeError:\n    print('refused')\n"
        "sys.modules['ml_dtypes'] = real\n"
        "print(t.numpy().dtype, [float(v) for v in t.numpy()])\n"
    )
    out = child(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["refused", "float8_e4m3fn [1.5, -2.0, 448.0]"]


def test_python_run_by_the_ml_dtypes_lookup_cannot_free_what_the_import_reads():
    # The first bfloat16 array makes dlbridge read ml_dtypes' types from sys.modules, which runs
    # Python. A fake module's __getattr__ that changed the array's dtype there freed the descr the
    # import had already read (a crash under PYTHONMALLOC=malloc, else stale bytes). The lookup now
    # runs before any field is read: the array is imported as what it has become.
    code = (
        "import sys, numpy as np, ml_dtypes, dlbridge\n"
        "real = ml_dtypes\n"
        "d = np.dtype(ml_dtypes.bfloat16).newbyteorder('=')\n"
        "a = np.zeros(4, dtype=ml_dtypes.bfloat16).view(d)\n"
        "del d  # the array holds the only reference to its dtype\n"
        "class Fake:\n"
        "    def __getattr__(self, name):\n"
        "        if a.dtype != np.uint16:\n"
        "            a.dtype = np.uint16\n"
        "            junk = [bytes(100) for _ in range(50)]\n"
        "        return getattr(real, name)\n"
        "sys.modules['ml_dtypes'] = Fake()\n"
        "t = dlbridge.from_dlpack(a)\n"
        "print(t.dtype, t.tolist(), t.data_ptr == a.ctypes.data)\n"
        "sys.modules['ml_dtypes'] = real\n"
        "print(dlbridge.from_dlpack(np.ones(2, ml_dtypes.bfloat16)).dtype)\n"
    )
    env = dict(os.environ, PYTHONMALLOC="malloc")
    out = child(code, env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["uint16 [0, 0, 0, 0] True", "bfloat16"]


@pytest.mark.parametrize("writability", ["unknown", "readonly", "writable"])
def test_a_padded_tensor_relayed_by_from_dlpack_stays_padded(writability):
    # A tensor of unknown writability is relayed as a legacy export, whose struct has no flags: the
    # padding must come from the tensor's own view, or the relay reads packed nibbles (wrong values).
    src = np.array([0.5, 1.0, 1.5, 6.0], dtype=ml_dtypes.float4_e2m1fn)
    t = dlbridge._rebuild_tensor(bytearray(src.view(np.uint8).tobytes()), "float4_e2m1fn", (4,), writability, True)
    r = dlbridge.from_dlpack(t)
    assert r._subbyte_padded and r.nbytes == 4
    assert r.numpy().tolist() == src.tolist()
