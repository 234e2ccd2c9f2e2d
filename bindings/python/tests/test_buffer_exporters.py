"""dlbridge.asarray driven by generated buffer exporters: ctypes arrays and scalars of every shape
and element type, and memoryview casts. Each batch runs in a child process, so that a crash (the
NULL-strides ctypes crash found from outside) is a failing test, not a lost run."""

import json
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

CTYPES = {
    "c_bool": "bool", "c_int8": "int8", "c_uint8": "uint8", "c_int16": "int16", "c_uint16": "uint16",
    "c_int32": "int32", "c_uint32": "uint32", "c_int64": "int64", "c_uint64": "uint64",
    "c_float": "float32", "c_double": "float64",
}
CASTS = {"b": "int8", "B": "uint8", "h": "int16", "H": "uint16", "i": "int32", "I": "uint32",
         "q": "int64", "Q": "uint64", "f": "float32", "d": "float64", "?": "bool"}

CHILD = r"""
import ctypes, json, math, struct, sys
import dlbridge

def nested(values, shape):
    if not shape:
        return values[0]
    step = math.prod(shape[1:])
    return [nested(values[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]

def value(dtype, i):
    if dtype == "bool":
        return bool(i % 2)
    return float(i % 5) if dtype.startswith("float") else i % 5

results = []
for kind, code, shape, dtype in json.loads(sys.argv[1]):
    n = math.prod(shape)
    values = [value(dtype, i) for i in range(n)]
    if kind == "ctypes":
        ctype = getattr(ctypes, code)
        if shape:
            array_type = ctype
            for extent in reversed(shape):
                array_type = array_type * extent
            obj = array_type()
            flat = (ctype * n).from_buffer(obj) if n else []
            for i, v in enumerate(values):
                flat[i] = v
        else:
            obj = ctype(values[0])
    else:
        raw = bytearray(n * struct.calcsize(code))
        flat = memoryview(raw).cast(code)
        for i, v in enumerate(values):
            flat[i] = v
        obj = memoryview(raw).cast(code, shape)
    t = dlbridge.asarray(obj)
    results.append([list(t.shape), str(t.dtype), t.tolist(), nested(values, list(shape)) if n else None])
print(json.dumps(results))
"""


@st.composite
def exporter(draw):
    kind = draw(st.sampled_from(["ctypes", "cast"]))
    ndim = draw(st.integers(0, 3))
    # memoryview refuses to cast to a shape with a zero extent.
    shape = [draw(st.integers(1 if kind == "cast" else 0, 4)) for _ in range(ndim)]
    if kind == "ctypes":
        code = draw(st.sampled_from(sorted(CTYPES)))
        return [kind, code, shape, CTYPES[code]]
    code = draw(st.sampled_from(sorted(CASTS)))
    return [kind, code, shape, CASTS[code]]


@settings(max_examples=12, deadline=None)
@given(st.lists(exporter(), min_size=1, max_size=25))
def test_generated_buffer_exporters(batch):
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(batch)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"child died ({proc.returncode}) on {batch}: {proc.stderr[-2000:]}"
    for (kind, code, shape, dtype), (got_shape, got_dtype, got, want) in zip(batch, json.loads(proc.stdout)):
        assert got_shape == shape, (kind, code, shape)
        assert got_dtype == dtype, (kind, code)
        if want is not None:
            assert got == want, (kind, code, shape)
