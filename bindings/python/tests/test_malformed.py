"""A catalogue of malformed tensors and hostile producers. Each case must end in the exception the
spec names, with a message that names the problem, and the producer's deleter must run exactly
once. Capsule cases run in a child process, so that a crash is a failure, not a lost test run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent

# name: (setup code run on `p`, a FakeProducer; expected exception; message pattern)
CAPSULE_CASES = {
    "negative ndim": ("p.tensor.ndim = -1", "BufferError", "ndim -1 is out of range"),
    "ndim over the maximum": ("p.tensor.ndim = 65", "BufferError", "ndim 65 is out of range 0..=64"),
    "NULL shape with ndim > 0": ("p.tensor.shape = None", "BufferError", "shape is NULL but ndim is 2"),
    "negative dimension": ("p.shape[1] = -3", "BufferError", r"shape\[1\] is negative: -3"),
    "element count overflows i64": ("p.shape[0] = 2**62; p.shape[1] = 8", "BufferError", "element count .* overflows"),
    "byte extent overflows": ("p.set_strides([2**62, 1])", "BufferError", "overflows the address space"),
    "strides reach below address 0 through byte_offset": (
        "p.tensor.data = 64; p.tensor.byte_offset = 8; p.set_strides([-2**40, 1])", "BufferError",
        "overflows the address space"),
    "byte_offset past the address space": ("p.tensor.byte_offset = 2**64 - 8", "BufferError", "overflows the address space"),
    "unknown dtype code": ("p.tensor.dtype.code = 99", "BufferError", "unknown DLPack dtype code 99"),
    "dtype bits 0": ("p.tensor.dtype.bits = 0", "BufferError", "cannot have 0 bits"),
    "dtype lanes 0": ("p.tensor.dtype.lanes = 0", "BufferError", "has 0 lanes"),
    "bool with 1 bit": ("p.tensor.dtype.code = 6; p.tensor.dtype.bits = 1", "BufferError", r"code 6 cannot have 1 bits \(expected 8\)"),
    "float4 with 8 bits": ("p.tensor.dtype.code = 17; p.tensor.dtype.bits = 8", "BufferError", r"\(expected 4\)"),
    "float6 with 8 bits": ("p.tensor.dtype.code = 15; p.tensor.dtype.bits = 8", "BufferError", r"\(expected 6\)"),
    "versioned capsule with major 0": ("p.managed.version.major = 0", "BufferError", r"version 0\.3 is not supported"),
    "versioned capsule with major 2": ("p.managed.version.major = 2; p.tensor.ndim = -5", "BufferError", r"version 2\.3 is not supported"),
    "NULL data with a non-zero size": ("p.tensor.data = None", "BufferError", "data is NULL but the tensor has 4 elements"),
    "legacy capsule with NULL shape": ("p.tensor.shape = None", "BufferError", "shape is NULL", False),
    "capsule with a wrong name": ("", "ValueError", "is not a DLPack capsule", True, "my_tensor"),
    "capsule already used": ("", "ValueError", "already consumed", True, "used_dltensor_versioned"),
}

RUNNER = r"""
import gc, json, sys
sys.path.insert(0, {here!r})
import dlbridge
from dlpack_ctypes import FakeProducer
p = FakeProducer(versioned={versioned})
{setup}
capsule = p.capsule({name!r})
outcome = {{"error": None, "message": ""}}
try:
    dlbridge.from_dlpack(capsule)
except Exception as exc:
    outcome = {{"error": type(exc).__name__, "message": str(exc)}}
del capsule
gc.collect()
outcome["deleted"] = p.deleted
print(json.dumps(outcome))
"""


def run_case(setup, versioned=True, name=None):
    code = RUNNER.format(here=str(HERE), setup=setup, versioned=versioned, name=name)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"the child process died ({proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", CAPSULE_CASES)
def test_malformed_capsule(case):
    setup, error, pattern, *rest = CAPSULE_CASES[case]
    versioned = rest[0] if rest else True
    name = rest[1] if len(rest) > 1 else None
    outcome = run_case(setup, versioned, name)
    assert outcome["error"] == error, outcome
    import re

    assert re.search(pattern, outcome["message"]), outcome["message"]
    if name:
        # Not an unused DLPack capsule: dlbridge must not take it, and nothing frees it twice.
        assert outcome["deleted"] == 0
    else:
        assert outcome["deleted"] == 1, "the producer's deleter runs exactly once"


def test_null_deleter_is_allowed():
    outcome = run_case("p.managed.deleter = type(p.managed.deleter)()")
    assert outcome["error"] is None and outcome["deleted"] == 0


def test_valid_fake_imports_and_deleter_runs_once_when_tensor_dies():
    outcome = run_case("")
    assert outcome == {"error": None, "message": "", "deleted": 1}


class Producer:
    def __init__(self, dlpack, device=(1, 0)):
        self._dlpack, self._device = dlpack, device

    def __dlpack__(self, **kw):
        return self._dlpack(**kw)

    def __dlpack_device__(self):
        return self._device


def test_dlpack_returning_a_non_capsule():
    import dlbridge

    with pytest.raises(TypeError, match="__dlpack__ returned an int, not a DLPack capsule"):
        dlbridge.from_dlpack(Producer(lambda **kw: 3))


def test_dlpack_raising_propagates_unchanged():
    import dlbridge

    def boom(**kw):
        raise BufferError("producer says no")

    with pytest.raises(BufferError, match="producer says no"):
        dlbridge.from_dlpack(Producer(boom))


def test_dlpack_device_returning_garbage_is_not_trusted():
    """dlbridge reads the device from the capsule, never from __dlpack_device__."""
    import numpy as np

    import dlbridge

    a = np.arange(3.0)
    t = dlbridge.from_dlpack(Producer(a.__dlpack__, device="garbage"))
    assert t.device == (1, 0) and t.data_ptr == a.ctypes.data


def test_unknown_device_in_capsule_is_refused():
    outcome = run_case("p.tensor.device.device_type = 77")
    assert outcome["error"] == "BufferError" and "device type 77" in outcome["message"]
    assert outcome["deleted"] == 1
