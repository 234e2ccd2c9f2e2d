"""The report's rows, and the data each producer starts from.

Every source is 64-byte aligned at a fixed offset: JAX imports zero-copy only from 64-byte aligned
memory, so a source that landed wherever the allocator put it made `→ jax` cells flip between ✔ and
copy from run to run.
"""

import ctypes
import struct
import sys

import dlbridge

from .libs import Unavailable, need

ALIGN = 64
SHAPE = (3, 4)
VALUES = [i % 5 for i in range(12)]  # small integers: exact in every dtype, so lists compare with ==

ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128") + ML_DTYPES
LAYOUTS = ("C-contiguous", "F-contiguous", "negative strides", "0-d", "zero-size", "broadcast (stride 0)",
           "strided, offset")

CASES = [(f"dtype {d}", {"dtype": d}) for d in DTYPES] + [(f"layout {l}", {"layout": l}) for l in LAYOUTS] + [
    ("read-only source", {"readonly": True}),
    ("from_dlpack(copy=True)", {"copy": True}),
    ("legacy capsule, producer → dlbridge", {"into": "legacy"}),
    ("legacy capsule, dlbridge → consumer", {"out": "legacy"}),
    ("versioned capsule, dlbridge → consumer", {"out": "versioned"}),
]


def dtype_of(case):
    return case.get("dtype", "float32")


def is_plain(case):
    """C-contiguous and writable: the cases that need no NumPy to build."""
    return case.get("layout", "C-contiguous") == "C-contiguous" and not case.get("readonly")


def numpy_source(case):
    """The case as a NumPy array in aligned memory; Unavailable without NumPy (or ml_dtypes)."""
    need("numpy")
    import numpy as np

    name = dtype_of(case)
    if name in ML_DTYPES:
        need("ml_dtypes")
        import ml_dtypes

        dtype = np.dtype(getattr(ml_dtypes, name))
    else:
        dtype = np.dtype(name)
    base = _aligned(SHAPE, dtype)
    base[...] = np.reshape(VALUES, SHAPE)
    a = _NUMPY_LAYOUTS[case.get("layout", "C-contiguous")](np, base)
    if case.get("readonly"):
        a.flags.writeable = False
    return a


def _aligned(shape, dtype, order="C"):
    # Over-allocate and slice: NumPy itself promises only 16-byte alignment.
    import numpy as np

    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + nbytes].view(dtype).reshape(shape, order=order)


def _aligned_copy(a, order="C"):
    out = _aligned(a.shape, a.dtype, order)
    out[...] = a
    return out


_NUMPY_LAYOUTS = {  # layouts that need fresh memory get it aligned too
    "C-contiguous": lambda np, a: a,
    "F-contiguous": lambda np, a: _aligned_copy(a, "F"),
    "negative strides": lambda np, a: a[::-1, ::-1],
    "0-d": lambda np, a: _aligned_copy(a[1, 1]),
    "zero-size": lambda np, a: a[:0],
    "broadcast (stride 0)": lambda np, a: np.broadcast_to(a[:1], a.shape),
    "strided, offset": lambda np, a: a[1:, ::2],
}


def source(case, dlpack=False):
    """The data a producer builds its object from: the NumPy array where NumPy can hold it (and, with
    `dlpack`, export it: NumPy has no DLPack codes for bfloat16 or float8), else, for plain cases, a
    dlbridge tensor filled byte by byte, so that torch and tvm_ffi columns work without NumPy."""
    if not (dlpack and dtype_of(case) in ML_DTYPES and is_plain(case)):
        try:
            return numpy_source(case)
        except Unavailable:
            if not is_plain(case):
                raise
    return dlbridge_source(case)


# The buffer protocol's formats, for read-only tensors over bytes; bfloat16 and float8 have none.
_BUFFER_FORMATS = {"bool": "?", "int8": "b", "int16": "h", "int32": "i", "int64": "q", "uint8": "B", "uint16": "H",
                   "uint32": "I", "uint64": "Q", "float16": "e", "float32": "f", "float64": "d"}
_DLBRIDGE_LAYOUTS = {"C-contiguous": (SHAPE, VALUES), "0-d": ((), VALUES[5:6]), "zero-size": ((0, SHAPE[1]), [])}


def dlbridge_source(case):
    """The case as a tensor dlbridge makes by itself, without NumPy: C-contiguous, 0-d (a[1, 1]) or
    zero-size, writable (zeros, then filled) or read-only (asarray over bytes, for the dtypes the buffer
    protocol names). Unavailable for the rest."""
    layout, name = case.get("layout", "C-contiguous"), dtype_of(case)
    if layout not in _DLBRIDGE_LAYOUTS:
        raise Unavailable(f"dlbridge makes no {layout} tensor by itself")
    shape, values = _DLBRIDGE_LAYOUTS[layout]
    payload = b"".join(_encode(name, v) for v in values)
    if case.get("readonly"):
        if name not in _BUFFER_FORMATS:
            raise Unavailable(f"no buffer format for a read-only {name} tensor over bytes")
        return dlbridge.asarray(memoryview(payload).cast("B").cast(_BUFFER_FORMATS[name], shape))
    t = dlbridge.zeros(shape, name)  # 64-byte aligned, Rust-owned
    if payload:
        ctypes.memmove(t.data_ptr, payload, len(payload))  # bfloat16 and float8 have no buffer format
    return t


def _encode(name, v):
    """One element's bytes, in native order. v is a small integer, so float8 is a lookup."""
    if name == "bool":
        return bytes([v != 0])
    if name.startswith(("int", "uint")):
        return v.to_bytes(dlbridge.DType(name).itemsize, sys.byteorder)
    parts = {
        "float16": [("e", v)], "float32": [("f", v)], "float64": [("d", v)],
        "complex64": [("f", v), ("f", 0)], "complex128": [("d", v), ("d", 0)],
    }.get(name)
    if parts is not None:
        return b"".join(struct.pack("=" + code, x) for code, x in parts)
    little = {
        "bfloat16": struct.pack("<f", v)[2:],  # the high half of a float32
        "float8_e5m2": struct.pack("<e", v)[1:],  # the high byte of a float16
        "float8_e4m3fn": bytes([(0x00, 0x38, 0x40, 0x44, 0x48)[v]]),
    }[name]
    return little if sys.byteorder == "little" else little[::-1]


def expected(case):
    """(shape, values as nested Python lists) that a consumer must show."""
    try:
        a = numpy_source(case)
    except Unavailable:
        if not is_plain(case):
            raise
        flat = [bool(v) for v in VALUES] if dtype_of(case) == "bool" else VALUES
        return SHAPE, [flat[i:i + SHAPE[1]] for i in range(0, len(flat), SHAPE[1])]
    return a.shape, (a.astype("float32") if dtype_of(case) in ML_DTYPES else a).tolist()
