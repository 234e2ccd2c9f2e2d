"""The candle example extension, called from NumPy and torch: candle tensors arrive without a copy
and read-only; any framework's tensor is read into candle (one copy)."""

import gc

import numpy as np
import pytest
import torch

import candle_tensor

EXPECTED = np.arange(6).reshape(2, 3)


def test_candle_tensor_reaches_numpy_and_torch_without_copy():
    t = candle_tensor.arange(2, 3)
    assert t.readonly and t.shape == (2, 3) and str(t.dtype) == "float32"
    a = np.from_dlpack(t)
    x = torch.from_dlpack(t)
    assert a.dtype == np.float32 and a.tolist() == EXPECTED.tolist()
    assert x.dtype == torch.float32 and x.tolist() == EXPECTED.tolist()
    # All three are candle's own memory.
    assert a.ctypes.data == x.data_ptr() == t.data_ptr
    assert not a.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        a[0, 0] = 1.0


def test_strides_travel_with_the_memory():
    t = candle_tensor.arange(2, 3, transpose=True)
    a = np.from_dlpack(t)
    assert a.shape == (3, 2) and a.strides == (4, 12)
    assert a.tolist() == EXPECTED.T.tolist()
    x = torch.from_dlpack(t)
    assert x.stride() == (1, 3) and x.data_ptr() == a.ctypes.data
    assert x.tolist() == EXPECTED.T.tolist()


@pytest.mark.parametrize(
    "name, torch_dtype",
    [
        ("uint8", torch.uint8),
        ("uint32", torch.uint32),
        ("int16", torch.int16),
        ("int32", torch.int32),
        ("int64", torch.int64),
        ("float16", torch.float16),
        ("bfloat16", torch.bfloat16),
        ("float32", torch.float32),
        ("float64", torch.float64),
        ("float8_e4m3fn", torch.float8_e4m3fn),
    ],
)
def test_every_candle_dtype_reaches_torch(name, torch_dtype):
    t = candle_tensor.arange(2, 3, name)
    assert str(t.dtype) == name
    x = torch.from_dlpack(t)
    assert x.dtype == torch_dtype and x.data_ptr() == t.data_ptr
    assert x.to(torch.float64).tolist() == EXPECTED.tolist()
    if name not in ("bfloat16", "float8_e4m3fn"):  # NumPy has neither
        a = np.from_dlpack(t)
        assert a.tolist() == EXPECTED.tolist() and not a.flags.writeable


def test_the_export_outlives_the_python_tensor():
    a = np.from_dlpack(candle_tensor.arange(3, 4, "float64"))
    gc.collect()
    assert a.sum() == sum(range(12))
    del a
    gc.collect()


def test_refusals():
    with pytest.raises(BufferError, match="candle does not support dtype bool"):
        candle_tensor.arange(2, 2, "bool")
    with pytest.raises(ValueError, match="unknown dtype name"):
        candle_tensor.arange(2, 2, "float7")
    with pytest.raises(BufferError, match="candle does not support dtype bool"):
        candle_tensor.candle_sum(torch.tensor([True, False]))
    with pytest.raises(BufferError, match="candle does not support dtype complex64"):
        candle_tensor.candle_sum(np.ones(2, dtype=np.complex64))


def test_candle_reads_any_framework_tensor():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert candle_tensor.candle_sum(x) == 66.0
    assert candle_tensor.candle_sum(x.T) == 66.0
    assert candle_tensor.candle_sum(x[:, ::2]) == float(x[:, ::2].sum())
    assert candle_tensor.candle_sum(torch.ones(5, dtype=torch.bfloat16)) == 5.0
    a = np.arange(10, dtype=np.int64)
    assert candle_tensor.candle_sum(a[::-3]) == float(a[::-3].sum())
    assert candle_tensor.candle_sum(np.broadcast_to(np.float16(2.0), (4, 4))) == 32.0
    assert candle_tensor.candle_sum(np.zeros((0, 3), dtype=np.uint8)) == 0.0
    assert candle_tensor.candle_describe(torch.zeros(2, 3, dtype=torch.bfloat16)) == ([2, 3], "bf16")
    assert candle_tensor.candle_describe(np.zeros((4,), dtype=np.uint32)) == ([4], "u32")


def test_round_trip_through_candle():
    a = np.arange(6, dtype=np.float64).reshape(2, 3)[:, ::-1]
    out = np.from_dlpack(candle_tensor.candle_double(a))
    assert out.tolist() == (2 * a).tolist()
    assert out.ctypes.data != a.ctypes.data and not out.flags.writeable
    y = torch.from_dlpack(candle_tensor.candle_double(torch.full((2, 2), 1.5)))
    assert y.tolist() == [[3.0, 3.0], [3.0, 3.0]]
