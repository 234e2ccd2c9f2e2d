"""Tensors in shared memory, for handing tensors to other processes on one machine without copies.

`share_memory(t)` (or `t.share_memory()`) copies a tensor into a new POSIX shared-memory segment
once, and `empty(shape, dtype, shared=True)` makes one there directly. Pickling such a tensor sends
a handle (the segment's name, dtype, shape, writability), and the process that unpickles it maps
the same memory: zero-copy, and writes are seen on both sides.

Lifetime of a segment:
- the process that creates it owns it and unlinks it when its last tensor over the segment is freed,
  or when it exits; multiprocessing's resource tracker unlinks it even if that process is killed;
- mappings already open in other processes stay valid after the unlink (POSIX semantics);
- a process that unpickles a handle after the unlink gets FileNotFoundError naming the segment,
  so keep the creator's tensor alive until the receivers have theirs;
- receivers never unlink, so a killed worker leaves nothing in /dev/shm.

Segments are created with `multiprocessing.shared_memory.SharedMemory`. Receivers map them without
registering with the resource tracker (Python < 3.13 registers every attach, and its tracker then
unlinks the creator's segment when the receiver exits: bpo-38119; 3.13 added `track=False`).
"""

import mmap
import os
import sys
from multiprocessing import shared_memory

from . import _native


class Segment:
    """One mapped segment; a tensor over it keeps it alive, and it pickles that tensor as a handle."""

    def __init__(self, name, size, buf, closer, creator):
        self.name, self.size, self.buf = name, size, buf
        self._closer, self._creator = closer, creator

    @classmethod
    def create(cls, size):
        shm = shared_memory.SharedMemory(create=True, size=max(size, 1))

        def close():
            shm.close()
            shm.unlink()

        return cls(shm.name, size, shm.buf, close, creator=True)

    @classmethod
    def attach(cls, name, size):
        try:
            if sys.version_info >= (3, 13):
                shm = shared_memory.SharedMemory(name=name, track=False)
                return cls(name, size, shm.buf, shm.close, creator=False)
            import _posixshmem

            fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"shared tensor segment {name!r} no longer exists: the process that created it freed its "
                "tensor (or exited) before this process unpickled the handle"
            ) from None
        try:
            mapping = mmap.mmap(fd, max(size, 1))
        finally:
            os.close(fd)
        buf = memoryview(mapping)

        def close():
            buf.release()
            mapping.close()

        return cls(name, size, buf, close, creator=False)

    def tensor(self, dtype, shape, writability, padded):
        return _native._rebuild_tensor(self.buf[: self.size], dtype, shape, writability, padded, self)

    def tensor_reduce(self, dtype, shape, writability, padded):
        """How Tensor.__reduce_ex__ pickles a tensor over this segment: a handle, no bytes."""
        return _attach, (self.name, self.size, dtype, tuple(shape), writability, padded)

    def __del__(self):
        # The tensor that kept this segment alive has released its buffer first.
        closer, self._closer = self._closer, None
        if closer is not None:
            try:
                self.buf = None
                closer()
            except Exception:
                pass  # at interpreter exit; the resource tracker unlinks what the creator left


def _attach(name, size, dtype, shape, writability, padded):
    return Segment.attach(name, size).tensor(dtype, shape, writability, padded)


def empty(shape, dtype=None):
    """A zero-filled tensor in a new shared-memory segment (float32 by default)."""
    dtype = _native.DType("float32" if dtype is None else str(dtype))
    shape = _shape_tuple(shape)
    return Segment.create(_nbytes(shape, dtype)).tensor(str(dtype), shape, "writable", False)


def share_memory(t):
    """A tensor with `t`'s values in a new shared-memory segment, with `t`'s writability."""
    source = t if t.strides == _row_major(t.shape) else t.copy()
    segment = Segment.create(source.nbytes)
    if source.nbytes:
        segment.buf[: source.nbytes] = memoryview(source._bytes())
    # A sub-byte tensor that takes a byte per element is padded.
    padded = t.dtype.itemsize is None and t.size > 1 and t.nbytes == t.size
    return segment.tensor(str(t.dtype), t.shape, t._writability, padded)


def _shape_tuple(shape):
    return (shape,) if isinstance(shape, int) else tuple(shape)


def _nbytes(shape, dtype):
    count = 1
    for extent in _shape_tuple(shape):
        if extent < 0:
            raise ValueError(f"negative extent in shape {shape}")
        count *= extent
    itemsize = dtype.itemsize
    if itemsize is None:
        return (count * dtype.bits * dtype.lanes + 7) // 8
    return count * itemsize


def _row_major(shape):
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= max(extent, 1)
    return tuple(reversed(strides))
