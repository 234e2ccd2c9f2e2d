"""dlbridge.Tensor in Dask (`distributed`) and Ray, registered by `import dlbridge` in every process
that imports them, and in no other (see `_after_import`): nothing here imports Dask or Ray.

- Dask: `distributed`'s serialization family sends a header (dtype, shape, writability, sub-byte
  padding) and one frame, the tensor's own bytes (no copy on the sending side); `dask.sizeof` counts
  the bytes the tensor's memory spans. The receiver rebuilds the tensor as unpickling does: over the
  received frame without a copy, unless the tensor may be handed to writers (writable or unknown) and
  the frame is read-only, when it is copied once. Dask's tokens hash the tensor's bytes, as NumPy's.
- Ray: a tensor goes into the object store as pickling puts it (its bytes out of band) and comes back
  zero-copy over the store's memory, which Ray hands out read-only: a writable tensor arrives
  read-only, as NumPy's arrays do (`t.copy()` gives writable memory); a read-only one read-only; an
  unknown one (JAX, a legacy capsule) stays unknown, copied once per get, since a read-only tensor
  would be refused by the legacy consumers (JAX, TensorFlow) an unknown one serves.

Both send a tensor as pickling does (a non-contiguous one as its contiguous copy, a CUDA one refused
with TypeError), except a tensor in shared memory: it goes as its bytes, not as a handle to its
segment, since the engines may run the receiver on another machine.
"""

import pickle

from . import _after_import
from ._native import Tensor, _rebuild_tensor


def tensor_bytes(t):
    """(dtype, shape, writability, padded, bytes) of a tensor as pickling sends it: `bytes` is a
    PickleBuffer over its C-contiguous bytes (its own memory, or its contiguous copy if it has
    none), which holds them borrowed for reading while it lives, so that no extension writes them
    while a transport reads them; unpickled over them in this process, a tensor ends that hold."""
    rebuild, args = t.__reduce_ex__(5)  # TypeError for memory the CPU cannot read, as pickling
    if rebuild is _rebuild_tensor:
        payload, dtype, shape, writability, padded = args
        return dtype, shape, writability, padded, payload
    # A shared-memory tensor pickles as a handle, which only this machine can map: send the bytes
    # (a segment's tensor is C-contiguous).
    return str(t.dtype), t.shape, t._writability, t._subbyte_padded, pickle.PickleBuffer(t._bytes())


def nbytes_spanned(t):
    """The bytes from a tensor's first element to the end of its last: its `nbytes` when
    contiguous, less for a broadcast, more for a view with gaps."""
    if t.size == 0:
        return 0
    elements = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.strides))
    if t.dtype.itemsize is not None:
        return elements * t.dtype.itemsize
    if t._subbyte_padded:  # one element per byte
        return elements
    return (elements * t.dtype.bits * t.dtype.lanes + 7) // 8


# --- Dask ------------------------------------------------------------------------------------------


def dask_serialize(t):
    """`distributed`'s serializer: a msgpack header and one frame, the tensor's bytes."""
    dtype, shape, writability, padded, data = tensor_bytes(t)
    return {"dtype": dtype, "shape": tuple(shape), "writability": writability, "padded": padded}, [data]


def dask_deserialize(header, frames):
    """`distributed`'s deserializer: the tensor over the received frame (copied once only if it is
    read-only and the tensor may be handed to writers)."""
    if len(frames) != 1:
        raise ValueError(f"a dlbridge tensor travels as one frame, not {len(frames)}")
    return _rebuild_tensor(frames[0], header["dtype"], header["shape"], header["writability"], header["padded"])


def _register_with_distributed(serialize_module):
    def register():
        serialize_module.dask_serialize.register(Tensor, dask_serialize)
        serialize_module.dask_deserialize.register(Tensor, dask_deserialize)

    # Called by distributed the first time it serializes or deserializes a dlbridge type.
    serialize_module.dask_serialize.register_lazy("dlbridge", register)
    serialize_module.dask_deserialize.register_lazy("dlbridge", register)


def _register_with_dask_sizeof(sizeof_module):
    sizeof_module.sizeof.register_lazy("dlbridge", lambda: sizeof_module.sizeof.register(Tensor, nbytes_spanned))


def _register_with_dask_tokenize(tokenize_module):
    # By content, as NumPy's arrays: the pickle Dask would hash otherwise holds only a shared
    # tensor's segment name, the same key for whatever the segment holds when it is scattered.
    def token(t):
        dtype, shape, writability, padded, data = tensor_bytes(t)
        return "dlbridge.Tensor", dtype, tuple(shape), writability, padded, tokenize_module.hash_buffer_hex(data)

    normalize = tokenize_module.normalize_token
    normalize.register_lazy("dlbridge", lambda: normalize.register(Tensor, token))


# --- Ray -------------------------------------------------------------------------------------------


def to_object_store(t):
    """Ray's serializer: what pickling sends, the bytes as a PickleBuffer so that Ray keeps them
    out of band, in the object store."""
    dtype, shape, writability, padded, data = tensor_bytes(t)
    return data, dtype, tuple(shape), writability, padded


def from_object_store(state):
    """Ray's deserializer: a writable tensor comes back read-only over the store's memory, zero-copy
    (the store's buffers are read-only, and shared by every reader); an unknown one is copied."""
    payload, dtype, shape, writability, padded = state
    if writability == "writable":
        writability = "readonly"
    # Read-only whatever Ray says of its buffer, so that an unknown tensor is never over the store.
    return _rebuild_tensor(memoryview(payload).toreadonly(), dtype, shape, writability, padded)


def _register_with_ray(ray_module):
    from ray.util import register_serializer  # ray is imported: this process uses it

    register_serializer(Tensor, serializer=to_object_store, deserializer=from_object_store)


def install():
    """Registers Tensor with Dask and Ray as soon as (and only if) this process imports them."""
    _after_import.when_imported("dask.sizeof", _register_with_dask_sizeof)
    _after_import.when_imported("dask.tokenize", _register_with_dask_tokenize)
    _after_import.when_imported("distributed.protocol.serialize", _register_with_distributed)
    _after_import.when_imported("ray", _register_with_ray)
