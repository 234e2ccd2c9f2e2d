"""PyTorch <-> dlbridge: zero-copy both ways, bfloat16 and float8 (checked against ml_dtypes'
encodings), read-only, layouts torch accepts, and torch's consumer keyword ladder."""

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
import torch

import dlbridge
from dlpack_ctypes import READ_ONLY, capsule_name, read_capsule


def test_torch_to_dlbridge_to_torch_zero_copy():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    t = dlbridge.from_dlpack(x)
    assert t.data_ptr == x.data_ptr() and t.shape == (3, 4) and t.strides == (4, 1)
    y = torch.from_dlpack(t)
    assert y.data_ptr() == x.data_ptr()
    y[2, 3] = -1
    assert x[2, 3] == -1
    x[0, 0] = 5
    assert t.tolist()[0][0] == 5


def test_dlbridge_owned_memory_to_torch():
    z = dlbridge.zeros((4,), "int32")
    y = torch.from_dlpack(z)
    y += 3
    assert z.tolist() == [3, 3, 3, 3]
    assert y.data_ptr() == z.data_ptr


def test_torch_layouts():
    base = torch.arange(20.0).reshape(4, 5)
    for name, x in {
        "transposed": base.T,
        "offset": base[1:, 1:],
        "strided": base[:, ::2],
        "expand (zero strides)": base[:1].expand(3, 5),
        "0-d": base[1, 1],
        "zero-size": base[:0],
    }.items():
        t = dlbridge.from_dlpack(x)
        assert t.shape == tuple(x.shape), name
        assert t.tolist() == x.tolist(), name
        back = torch.from_dlpack(t)
        assert torch.equal(back, x), name
        if x.numel():
            assert back.data_ptr() == x.data_ptr(), name


FLOAT8 = {
    torch.float8_e4m3fn: ml_dtypes.float8_e4m3fn,
    torch.float8_e5m2: ml_dtypes.float8_e5m2,
    torch.float8_e4m3fnuz: ml_dtypes.float8_e4m3fnuz,
    torch.float8_e5m2fnuz: ml_dtypes.float8_e5m2fnuz,
    torch.float8_e8m0fnu: ml_dtypes.float8_e8m0fnu,
    torch.bfloat16: ml_dtypes.bfloat16,
}


@pytest.mark.parametrize("torch_dtype", FLOAT8, ids=str)
def test_bfloat16_and_float8_through_torch_match_ml_dtypes(torch_dtype):
    ml = FLOAT8[torch_dtype]
    values = [0.5, 1.0, 2.0, 4.0]
    x = torch.tensor(values).to(torch_dtype)
    t = dlbridge.from_dlpack(x)
    assert str(t.dtype) == np.dtype(ml).name, "our canonical name is ml_dtypes' name"
    assert t.dtype.bits == 8 * np.dtype(ml).itemsize
    back = torch.from_dlpack(t)
    assert back.dtype == torch_dtype and back.data_ptr() == x.data_ptr()
    raw = back.view(torch.uint8 if back.element_size() == 1 else torch.int16).numpy().tobytes()
    assert raw == np.array(values, dtype=ml).tobytes(), "the bits are ml_dtypes' encoding of the same values"


def test_bool_and_complex_through_torch():
    for x in (torch.tensor([True, False, True]), torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)):
        t = dlbridge.from_dlpack(x)
        assert t.tolist() == x.tolist()
        assert torch.equal(torch.from_dlpack(t), x)


def test_read_only_from_torch_wrapper_and_to_torch():
    from torch.utils.dlpack import ReadOnlyTensorWrapper

    x = torch.arange(4.0)
    t = dlbridge.from_dlpack(ReadOnlyTensorWrapper(x))
    assert t.readonly and t.data_ptr == x.data_ptr()
    assert read_capsule(t.__dlpack__(max_version=(1, 0))).flags & READ_ONLY
    with pytest.raises(BufferError, match="read-only"):
        t.__dlpack__()


def test_torch_consumer_passes_versioned_request_and_copy():
    a = np.arange(6.0)
    t = dlbridge.from_dlpack(a)
    y = torch.from_dlpack(t)
    assert y.data_ptr() == a.ctypes.data
    c = torch.from_dlpack(t, copy=True)
    assert c.data_ptr() != a.ctypes.data and torch.equal(c, torch.from_numpy(a))


def test_torch_capsule_versions():
    x = torch.ones(2)
    t = dlbridge.from_dlpack(x.__dlpack__())
    assert t.data_ptr == x.data_ptr()
    cap = x.__dlpack__(max_version=(1, 3))
    assert capsule_name(cap) == "dltensor_versioned"
    assert dlbridge.from_dlpack(cap).data_ptr == x.data_ptr()


def test_requires_grad_tensor_is_refused_as_torch_refuses_it():
    """torch's Python __dlpack__ refuses tensors that require grad (BufferError); its C exchange
    API does not check, so dlbridge makes the same check before using it."""
    x = torch.ones(2, requires_grad=True)
    with pytest.raises(BufferError, match="require gradient") as direct:
        x.__dlpack__()
    with pytest.raises(BufferError, match="require gradient") as relayed:
        dlbridge.from_dlpack(x)
    assert str(relayed.value) == str(direct.value)


def test_negative_strides_into_torch_do_not_crash_the_process():
    """torch's consumer rejects negative strides; older releases aborted the process, so this runs
    in a subprocess. dlbridge exports them faithfully; copy() gives torch a layout it accepts."""
    code = (
        "import numpy as np, torch, dlbridge\n"
        "t = dlbridge.from_dlpack(np.arange(6.0).reshape(2, 3)[::-1])\n"
        "try:\n    torch.from_dlpack(t)\nexcept RuntimeError as e:\n    print('refused', e)\n"
        "print(torch.from_dlpack(t.copy()).tolist())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "[[3.0, 4.0, 5.0], [0.0, 1.0, 2.0]]" in out.stdout
