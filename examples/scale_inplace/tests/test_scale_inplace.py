"""The example extension, called on NumPy and torch objects: its writes are seen in the caller's
own object."""

import numpy as np
import pytest
import torch

import scale_inplace


def test_scales_numpy_array_in_place():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    scale_inplace.scale(a, 2.0)
    assert a.tolist() == [[0, 2, 4], [6, 8, 10]]
    v = a[:, ::-2]  # negative strides, a view into `a`
    scale_inplace.scale(v, 10.0)
    assert a.tolist() == [[0, 2, 40], [60, 8, 100]]


def test_scales_torch_tensor_in_place():
    x = torch.ones(3, 4)
    scale_inplace.scale(x, 3.0)
    assert torch.equal(x, torch.full((3, 4), 3.0))
    scale_inplace.scale(x.T, 0.5)
    assert torch.equal(x, torch.full((3, 4), 1.5))


def test_refusals():
    with pytest.raises(TypeError, match="expected dtype float32"):
        scale_inplace.scale(np.ones(3), 2.0)
    ro = np.ones(3, dtype=np.float32)
    ro.flags.writeable = False
    with pytest.raises(BufferError, match="read-only"):
        scale_inplace.scale(ro, 2.0)
    with pytest.raises(BufferError, match="overlap"):
        aliased = np.lib.stride_tricks.as_strided(np.ones(1, dtype=np.float32), shape=(4,), strides=(0,))
        scale_inplace.scale(aliased, 2.0)
    with pytest.raises(TypeError, match="cannot make a tensor"):
        scale_inplace.scale("not a tensor", 2.0)


def test_reads_and_returns():
    assert scale_inplace.total(torch.arange(5, dtype=torch.float32)) == 10.0
    assert scale_inplace.total(np.ones((2, 2), dtype=np.float32)[::-1]) == 4.0
    t = scale_inplace.arange(4)
    assert np.from_dlpack(t).tolist() == [0, 1, 2, 3]
    assert torch.from_dlpack(t).sum().item() == 6
