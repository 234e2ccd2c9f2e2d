"""Tensor.numpy(): a NumPy array over a tensor's memory, for the dtypes NumPy has and for the ones
only `ml_dtypes` gives NumPy (bfloat16, float8, float6, float4, int4, ...), which NumPy's own
from_dlpack refuses. Zero-copy, read-only when the tensor is; sub-byte values are one per byte in
ml_dtypes, so a packed sub-byte tensor is unpacked into a new array (the one copy this makes)."""

from . import _native

# The DLPack dtypes NumPy lacks and ml_dtypes has, under the same names in both.
ML_DTYPES = frozenset({
    "bfloat16", "float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn", "float8_e4m3fnuz",
    "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn",
    "complex32", "int1", "int2", "int4", "uint1", "uint2", "uint4",
})


class _Raw:
    """Unsigned-integer view of a tensor's bytes, as an array interface; keeps the tensor alive."""

    def __init__(self, t, typestr, itemsize):
        self._tensor = t
        strides = tuple(s * itemsize for s in t.strides)
        self.__array_interface__ = {
            "shape": t.shape, "typestr": typestr, "version": 3, "strides": strides,
            "data": (t.data_ptr if t.size else 0, t.readonly),
        }


def to_numpy(t):
    import numpy as np

    name = str(t.dtype)
    if name not in ML_DTYPES:
        return np.from_dlpack(t)
    # The type the Rust side read from ml_dtypes once and checked (a numpy.generic whose NumPy
    # dtype has this dtype's item size), never `ml_dtypes.<name>` now, which may be rebound.
    target = np.dtype(_native._ml_dtypes_type(t.dtype))
    itemsize = t.dtype.itemsize  # dlbridge's own: the raw view is sized by the tensor, not by the target
    if itemsize is not None:
        if target.itemsize != itemsize:
            raise TypeError(f"ml_dtypes' {name} takes {target.itemsize} bytes, not {itemsize}")
        raw = np.asarray(_Raw(t, f"<u{itemsize}" if itemsize > 1 else "|u1", itemsize))
        return raw.view(target)
    if target.itemsize != 1:
        raise TypeError(f"ml_dtypes' {name} takes {target.itemsize} bytes, not one per value")
    bits = t.dtype.bits
    if t._subbyte_padded:  # one value per byte, as ml_dtypes stores them
        return np.asarray(_Raw(t, "|u1", 1)).view(target)
    # Packed (little bit-endian, as DLPack says): unpack each value into its own byte.
    packed = np.frombuffer(memoryview(t.copy()._bytes()), dtype=np.uint8)
    values = np.unpackbits(packed, bitorder="little")[: t.size * bits].reshape(t.size, bits)
    out = np.packbits(values, axis=1, bitorder="little").reshape(-1)[: t.size]
    return out.view(target).reshape(t.shape)
