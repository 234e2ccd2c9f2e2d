"""Zero-copy on CUDA: torch <-> dlbridge <-> CuPy <-> JAX, each hop checked by the data pointer and
by a write through one side that the other side sees."""

from cuda_support import CUDA, require_cuda

torch = require_cuda()

import gc  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import dlbridge  # noqa: E402


def jax_pointer(a):
    return a.unsafe_buffer_pointer()


def test_torch_to_dlbridge_to_torch():
    x = torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4)
    t = dlbridge.from_dlpack(x)
    assert t.device == (CUDA, x.device.index)
    assert t.data_ptr == x.data_ptr() and t.shape == (3, 4) and t.strides == (4, 1)
    assert str(t.dtype) == "float32" and not t.readonly and not t.is_copied
    y = torch.from_dlpack(t)
    assert y.device == x.device and y.data_ptr() == x.data_ptr()
    y[2, 3] = -1
    assert x[2, 3].item() == -1
    x[0, 0] = 5
    assert y[0, 0].item() == 5


def test_torch_layouts_keep_their_strides_and_offset():
    base = torch.arange(20.0, device="cuda").reshape(4, 5)
    for name, x in {"transposed": base.T, "offset": base[1:, 1:], "strided": base[:, ::2]}.items():
        t = dlbridge.from_dlpack(x)
        assert t.data_ptr == x.data_ptr(), name
        assert t.strides == tuple(x.stride()) and t.shape == tuple(x.shape), name
        back = torch.from_dlpack(t)
        assert back.data_ptr() == x.data_ptr() and torch.equal(back, x), name


def test_torch_to_dlbridge_to_cupy_and_back(cupy):
    x = torch.zeros(16, dtype=torch.float32, device="cuda")
    t = dlbridge.from_dlpack(x)
    c = cupy.from_dlpack(t)
    assert c.data.ptr == x.data_ptr() and c.shape == (16,)
    c[3] = 42
    cupy.cuda.runtime.deviceSynchronize()
    assert x[3].item() == 42
    x[4] = 7
    torch.cuda.synchronize()
    assert float(c[4]) == 7
    # CuPy -> dlbridge -> torch
    u = dlbridge.from_dlpack(c)
    assert u.data_ptr == x.data_ptr() and u.device == t.device
    assert torch.from_dlpack(u).data_ptr() == x.data_ptr()


def test_cupy_to_dlbridge_to_torch(cupy):
    c = cupy.arange(10, dtype=cupy.float64)
    t = dlbridge.from_dlpack(c)
    assert t.data_ptr == c.data.ptr and t.device == (CUDA, c.device.id)
    y = torch.from_dlpack(t)
    assert y.data_ptr() == c.data.ptr
    y[1] = -3
    torch.cuda.synchronize()
    assert float(c[1]) == -3
    c[2] = 9
    cupy.cuda.runtime.deviceSynchronize()
    assert y[2].item() == 9


def test_torch_to_dlbridge_to_jax(jax):
    x = torch.arange(8, dtype=torch.float32, device="cuda")
    t = dlbridge.from_dlpack(x)
    j = jax.dlpack.from_dlpack(t)
    assert jax_pointer(j) == x.data_ptr()
    assert j.shape == (8,) and str(j.dtype) == "float32"
    # JAX never writes an array; a write through torch is seen by its next read of the memory.
    x[5] = 50
    torch.cuda.synchronize()
    assert np.asarray(j).tolist() == [0, 1, 2, 3, 4, 50, 6, 7]


def test_jax_to_dlbridge_to_torch(jax):
    import jax.numpy as jnp

    j = jnp.arange(6, dtype=jnp.float32) * 2
    j.block_until_ready()
    t = dlbridge.from_dlpack(j)
    assert t.device[0] == CUDA and t.data_ptr == jax_pointer(j)
    assert dlbridge.from_dlpack(t, device="cpu").tolist() == [0, 2, 4, 6, 8, 10]
    if not t.readonly:  # JAX may export its immutable arrays read-only; torch then takes none
        assert torch.from_dlpack(t).data_ptr() == jax_pointer(j)


def test_cupy_to_dlbridge_to_jax(cupy, jax):
    c = cupy.arange(5, dtype=cupy.int32)
    t = dlbridge.from_dlpack(c)
    j = jax.dlpack.from_dlpack(t)
    assert jax_pointer(j) == c.data.ptr == t.data_ptr
    assert np.asarray(j).tolist() == [0, 1, 2, 3, 4]


def owned(a):
    """A CUDA tensor whose memory dlbridge allocated, holding a copy of `a`."""
    t = dlbridge.from_dlpack(a, device=(CUDA, 0))
    assert t.device == (CUDA, 0) and t.shape == a.shape and not t.readonly
    return t


A = np.arange(12, dtype=np.float32).reshape(3, 4)


def test_dlbridge_owned_cuda_memory_to_torch():
    t = owned(A)
    y = torch.from_dlpack(t)
    assert y.device == torch.device("cuda", 0) and y.data_ptr() == t.data_ptr
    assert y.cpu().numpy().tolist() == A.tolist()
    y[0, 0] = 100
    u = torch.from_dlpack(t)  # a second consumer of the same memory sees the write
    assert u.data_ptr() == t.data_ptr and u[0, 0].item() == 100
    # The memory outlives the dlbridge tensor while a consumer holds it.
    del t, u
    gc.collect()
    torch.zeros(12, device="cuda")
    assert y.sum().item() == A.sum() + 100


def test_dlbridge_owned_cuda_memory_to_cupy(cupy):
    t = owned(A)
    c = cupy.from_dlpack(t)
    assert c.data.ptr == t.data_ptr and cupy.asnumpy(c).tolist() == A.tolist()
    y = torch.from_dlpack(t)
    c[0, 0] = 100
    cupy.cuda.runtime.deviceSynchronize()
    assert y[0, 0].item() == 100
    del t, y
    gc.collect()
    assert float(c.sum()) == A.sum() + 100


def test_dlbridge_owned_cuda_memory_to_jax(jax):
    t = owned(A)
    j = jax.dlpack.from_dlpack(t)
    assert jax_pointer(j) == t.data_ptr
    assert np.asarray(j).tolist() == A.tolist()
    del t
    gc.collect()
    assert float(j.sum()) == A.sum()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int8", "uint8", "int64", "complex64", "bool"])
def test_dtypes_round_trip_on_the_device(dtype):
    x = (torch.arange(6, device="cuda") % 2 == 0) if dtype == "bool" else torch.arange(6, device="cuda").to(getattr(torch, dtype))
    t = dlbridge.from_dlpack(x)
    assert str(t.dtype) == dtype and t.data_ptr == x.data_ptr()
    y = torch.from_dlpack(t)
    assert y.dtype == x.dtype and torch.equal(y, x)
