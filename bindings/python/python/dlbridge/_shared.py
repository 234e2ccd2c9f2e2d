"""Tensors in shared memory, for handing tensors to other processes on one machine without copies.

`share_memory(t)` (or `t.share_memory()`) copies a tensor into a new POSIX shared-memory segment
once, and `empty(shape, dtype, shared=True)` makes one there directly. Pickling such a tensor sends
a handle (the segment's name, dtype, shape, writability), and the process that unpickles it maps
the same memory: zero-copy, and writes are seen on both sides.

What holds (torch.multiprocessing's file_system strategy and Python's resource tracker solve the
same problems; the choices below follow them):
- Only the creating process (by pid) unlinks a segment: when its last tensor over the segment is
  freed, or at exit, quietly (an atexit handler; a finalizer of multiprocessing's for its worker
  processes, which leave through os._exit). Forked children and receivers never unlink.
- If the creator is killed, Python's resource tracker (a separate process, told of each segment at
  creation and of each unlink) unlinks what it left. If the tracker was killed too,
  `cleanup_shared_memory()` unlinks the segments of creators that no longer run: names carry the
  creator's pid and pid namespace.
- Mappings already open elsewhere stay valid after an unlink (POSIX); a process that unpickles a
  handle after it gets FileNotFoundError naming the segment.
- A process maps each segment once: a handle unpickled where the segment is already mapped (by its
  creator, an earlier unpickle, or inherited across fork) reuses that mapping, so the borrow
  registry, which compares addresses, sees two tensors of one segment overlap.
- A mapping holds no file descriptor: the segment's is closed once mapped (mmap through libc;
  Python's mmap.mmap keeps a duplicate before 3.13), so thousands of tensors fit under the usual
  limit of 1024.
- Sizes are checked before anything is created, and the space is reserved at creation
  (posix_fallocate, as torch does): a segment larger than /dev/shm's free space is refused with
  MemoryError, not a SIGBUS at the first write past it. Any failure unlinks what was created.
"""

import atexit
import ctypes
import errno
import mmap
import operator
import os
import re
import secrets
import sys
import threading
import weakref

import _posixshmem

from . import _native

SHM_DIR = "/dev/shm"  # where Linux keeps POSIX shared memory; listed by cleanup_shared_memory()
_TRACKED = "shared_memory"  # the resource tracker's name for what it unlinks with shm_unlink


def _namespace():
    """The pid namespace's inode, so that a cleanup never judges pids it cannot see."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


_NAME = re.compile(r"dlb([0-9a-f]+)_([0-9a-f]+)_[0-9a-f]+")  # dlb<pid namespace>_<pid>_<random>, all hex


def _new_name():
    return f"dlb{_namespace():x}_{os.getpid():x}_{secrets.token_hex(4)}"


# --- memory maps without a descriptor --------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_mmap = getattr(_libc, "mmap64", _libc.mmap)
_mmap.restype, _mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                                  ctypes.c_int, ctypes.c_int64]
_munmap = _libc.munmap
_munmap.restype, _munmap.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


def _map(fd, length):
    """Bytes over `length` bytes of the segment open as `fd`, unmapped when the last reference to
    them (a tensor's buffer included) is gone; the caller may close `fd` at once."""
    address = _mmap(None, length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    if address in (None, _MAP_FAILED):
        code = ctypes.get_errno()
        raise (MemoryError if code == errno.ENOMEM else OSError)(code, f"mmap of {length} bytes: {os.strerror(code)}")
    data = (ctypes.c_ubyte * length).from_address(address)
    weakref.finalize(data, _munmap, address, length).atexit = False  # never under a live tensor
    return data


# --- segments ----------------------------------------------------------------------------------


class Segment:
    """One mapped segment; a tensor over it keeps it alive, and it pickles that tensor as a handle."""

    def __init__(self, name, size, data, creator_pid):
        self.name, self.size, self.data, self.creator_pid = name, size, data, creator_pid

    @classmethod
    def create(cls, size):
        _check_size(size)
        name = _new_name()
        fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        try:
            try:
                _track(name)
            except BaseException:
                _posixshmem.shm_unlink("/" + name)
                raise
            _created[name] = True
            _unlink_at_exit_of_this_process()
            try:
                _reserve(fd, max(size, 1))
                data = _map(fd, max(size, 1))
            except BaseException:
                _unlink(name)
                raise
        finally:
            os.close(fd)
        segment = cls(name, size, (ctypes.c_ubyte * size).from_buffer(data), os.getpid())
        _mapped[name] = segment
        return segment

    @classmethod
    def attach(cls, name, size):
        if not isinstance(name, str) or not _NAME.fullmatch(name) or not isinstance(size, int) or size < 0:
            raise ValueError(f"malformed dlbridge shared-memory handle: segment {name!r} of {size!r} bytes")
        with _lock:
            segment = _mapped.get(name)
            if segment is not None:
                if segment.size != size:
                    raise ValueError(f"malformed dlbridge shared-memory handle: segment {name!r} holds "
                                     f"{segment.size} bytes, not {size}")
                return segment
            try:
                fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
            except FileNotFoundError:
                raise FileNotFoundError(
                    f"shared tensor segment {name!r} no longer exists: the process that created it freed its "
                    "tensor (or exited) before this process unpickled the handle"
                ) from None
            try:
                actual = os.fstat(fd).st_size
                if actual < max(size, 1):
                    raise ValueError(f"malformed dlbridge shared-memory handle: segment {name!r} holds {actual} "
                                     f"bytes, not {size}")
                data = _map(fd, max(size, 1))
            finally:
                os.close(fd)
            segment = cls(name, size, (ctypes.c_ubyte * size).from_buffer(data), None)
            _mapped[name] = segment
            return segment

    def tensor(self, dtype, shape, writability, padded):
        return _native._rebuild_tensor(self.data, dtype, shape, writability, padded, self)

    def tensor_reduce(self, dtype, shape, writability, padded):
        """How Tensor.__reduce_ex__ pickles a tensor over this segment: a handle, no bytes."""
        return _attach, (self.name, self.size, dtype, tuple(shape), writability, padded)

    def __del__(self, _getpid=os.getpid):
        # The last tensor over the segment is gone (its mapping goes with the bytes' last reference).
        if self.creator_pid == _getpid():
            try:
                _unlink(self.name)
            except Exception:  # this module is torn down at exit: its atexit handler unlinked already
                pass


def _attach(name, size, dtype, shape, writability, padded):
    return Segment.attach(name, size).tensor(dtype, shape, writability, padded)


_lock = threading.Lock()
_mapped = weakref.WeakValueDictionary()  # name -> the live Segment: one mapping per segment per process
_created = {}  # names this process created and has not unlinked yet


def _after_fork_in_child():
    global _lock
    _lock = threading.Lock()
    _created.clear()  # the parent's to unlink, not ours; inherited mappings stay in _mapped


os.register_at_fork(after_in_child=_after_fork_in_child)


def _check_size(size):
    if size > sys.maxsize:
        raise MemoryError(f"a shared tensor of {size} bytes does not fit in this process's address space")
    try:
        stat = os.statvfs(SHM_DIR)
    except OSError:
        return  # no /dev/shm to ask (not Linux): the reservation below still refuses
    free = stat.f_bavail * stat.f_frsize
    if size > free:
        raise MemoryError(f"a shared tensor of {size} bytes does not fit in {SHM_DIR}, which has {free} bytes free")


def _reserve(fd, size):
    """Gives the segment its pages now: without them writes past the free space are a SIGBUS."""
    try:
        os.posix_fallocate(fd, 0, size)
    except AttributeError:  # no posix_fallocate (macOS): a sparse segment
        os.ftruncate(fd, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.ENOMEM):
            raise MemoryError(f"cannot reserve {size} bytes of shared memory: {exc.strerror}") from None
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        os.ftruncate(fd, size)


def _track(name):
    """Tells Python's resource tracker, which unlinks the segment if this process dies first."""
    from multiprocessing import resource_tracker

    resource_tracker.register("/" + name, _TRACKED)


def _unlink(name):
    """Unlinks a segment this process created, once, and tells the tracker; never raises."""
    if _created.pop(name, None) is None:
        return  # unlinked already (at exit, or by its last tensor), or another process's
    try:
        _posixshmem.shm_unlink("/" + name)
    except OSError:
        pass
    try:
        from multiprocessing import resource_tracker

        resource_tracker.unregister("/" + name, _TRACKED)
    except Exception:  # the tracker is gone (killed, or the interpreter is shutting down)
        pass


@atexit.register
def _unlink_at_exit():
    for name in list(_created):
        _unlink(name)


_exit_covered = [None]  # the pid whose exit _unlink_at_exit_of_this_process covers


def _unlink_at_exit_of_this_process():
    """atexit covers an ordinary exit; multiprocessing's workers leave through os._exit after running
    its finalizers, so one of those covers them (registered in the process that creates)."""
    if _exit_covered[0] == os.getpid():
        return
    _exit_covered[0] = os.getpid()
    from multiprocessing import util

    util.Finalize(None, _unlink_at_exit, exitpriority=0)


def cleanup_shared_memory():
    """Unlinks the shared-memory segments left in /dev/shm by dlbridge processes that no longer run
    (killed together with their resource tracker); returns their names. Segments of running
    processes, and of processes in other pid namespaces, are left alone.

        >>> t = dlbridge.empty(4, shared=True)
        >>> removed = dlbridge.cleanup_shared_memory()   # this process runs: its segment stays
        >>> t.tolist()
        [0.0, 0.0, 0.0, 0.0]
    """
    try:
        entries = os.listdir(SHM_DIR)
    except OSError:
        return []
    removed = []
    namespace = _namespace()
    for entry in entries:
        match = _NAME.fullmatch(entry)
        if not match or int(match.group(1), 16) != namespace or _running(int(match.group(2), 16)):
            continue
        try:
            _posixshmem.shm_unlink("/" + entry)
        except FileNotFoundError:
            continue
        removed.append(entry)
    return removed


def _running(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


# --- the public functions ----------------------------------------------------------------------


def empty(shape, dtype=None):
    """A zero-filled tensor in a new shared-memory segment (float32 by default)."""
    dtype = _native.DType("float32" if dtype is None else str(dtype))
    shape = _shape_tuple(shape)
    return Segment.create(_nbytes(shape, dtype)).tensor(str(dtype), shape, "writable", False)


def share_memory(t):
    """A tensor with `t`'s values, dtype, shape and writability in a new shared-memory segment, which
    pickles as a handle that another process maps (`Tensor.share_memory` is the same, but returns a
    shared tensor as it is).

        >>> t = dlbridge.asarray(bytearray(b"abc"))
        >>> s = dlbridge.share_memory(t)
        >>> s.is_shared, s.tolist(), s.data_ptr != t.data_ptr
        (True, [97, 98, 99], True)
    """
    source = t if t.strides == _row_major(t.shape) else t.copy()
    data = memoryview(source._bytes())  # refused (device memory) before anything is created
    segment = Segment.create(source.nbytes)
    if source.nbytes:
        memoryview(segment.data).cast("B")[:] = data
    # A sub-byte tensor that takes a byte per element is padded.
    padded = t.dtype.itemsize is None and t.size > 1 and t.nbytes == t.size
    return segment.tensor(str(t.dtype), t.shape, t._writability, padded)


def _shape_tuple(shape):
    if isinstance(shape, (tuple, list)):
        return tuple(operator.index(n) for n in shape)
    return (operator.index(shape),)


def _nbytes(shape, dtype):
    count = 1
    for extent in shape:
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
