"""JAX <-> dlbridge. JAX exports legacy capsules only, and imports zero-copy only from 64-byte
aligned buffers, which dlbridge's own allocations are."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dlbridge


def test_jax_to_dlbridge_zero_copy():
    j = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
    t = dlbridge.from_dlpack(j)
    assert t.data_ptr == j.unsafe_buffer_pointer()
    assert t.tolist() == np.asarray(j).tolist()
    assert t.readonly, "a legacy capsule cannot say it is writable: unknown is relayed as read-only"


@pytest.mark.parametrize("dtype", ["bool", "int8", "int32", "uint8", "float16", "bfloat16", "float32", "complex64"])
def test_jax_dtypes(dtype):
    j = jnp.ones((2, 2), dtype=dtype)
    t = dlbridge.from_dlpack(j)
    assert t.dtype == dtype


def test_dlbridge_to_jax_zero_copy_for_aligned_memory():
    z = dlbridge.zeros((4, 4), "float32")
    n = np.from_dlpack(z)
    n[:] = np.arange(16, dtype=np.float32).reshape(4, 4)
    j = jnp.from_dlpack(z)
    assert j.unsafe_buffer_pointer() == z.data_ptr
    np.testing.assert_array_equal(np.asarray(j), n)


def test_jax_round_trip_and_copy():
    j = jnp.arange(6.0)
    t = dlbridge.from_dlpack(j)
    back = jnp.from_dlpack(t)
    np.testing.assert_array_equal(np.asarray(back), np.asarray(j))
    c = dlbridge.from_dlpack(j, copy=True)
    assert c.data_ptr != j.unsafe_buffer_pointer() and c.data_ptr % 64 == 0
    assert jnp.from_dlpack(c).unsafe_buffer_pointer() == c.data_ptr


def test_jax_consumer_of_copies_of_strided_data():
    """JAX refuses non-compact strides; a copy() is compact and aligned, so JAX takes it zero-copy."""
    t = dlbridge.from_dlpack(np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2])
    c = t.copy()
    j = jnp.from_dlpack(c)
    assert j.unsafe_buffer_pointer() == c.data_ptr
    assert np.asarray(j).tolist() == t.tolist()
