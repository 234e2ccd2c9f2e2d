"""Tensors in shared memory, for handing tensors to other processes on one machine without copies.

`share_memory(t)` (or `t.share_memory()`) copies a tensor into a new POSIX shared-memory segment
once, and `empty(shape, dtype, shared=True)` makes one there directly. Pickling such a tensor sends
a handle (the segment's name, dtype, shape, writability), and the process that unpickles it maps
the same memory: zero-copy, and writes are seen on both sides.

The segments themselves live in Rust (dlbridge-pyo3's tensor/shared/): making, mapping, unmapping
and unlinking them runs no Python code, so a daemon thread that frees a shared tensor while the
interpreter exits cannot be ended halfway. This module holds what is Python's: the resource
tracker's notices, the exit hooks, and cleanup_shared_memory().

What holds (torch.multiprocessing's file_system strategy and Python's resource tracker solve the
same problems; the choices below follow them):
- Only the creating process (by pid) unlinks a segment: when its last tensor over the segment is
  freed, or at exit, quietly (an atexit handler; a finalizer of multiprocessing's for its worker
  processes, which leave through os._exit; and, for segments made after those ran, the end of
  interpreter finalization). Forked children and receivers never unlink.
- If the creator is killed, Python's resource tracker (a separate process, told of each segment at
  creation and of each unlink) unlinks what it left. If the tracker was killed too,
  `cleanup_shared_memory()` unlinks the segments of creators that no longer run: names carry the
  creator's pid and pid namespace.
- Mappings already open elsewhere stay valid after an unlink (POSIX); a process that unpickles a
  handle after it gets FileNotFoundError naming the segment.
- A process maps each segment once: a handle unpickled where the segment is already mapped (by its
  creator, an earlier unpickle, or inherited across fork) reuses that mapping, so the borrow
  registry, which compares addresses, sees two tensors of one segment overlap.
- A mapping holds no file descriptor: the segment's is closed once mapped, so thousands of tensors
  fit under the usual limit of 1024.
- Sizes are checked before anything is created, and the space is reserved at creation
  (posix_fallocate, as torch does): a segment larger than /dev/shm's free space is refused with
  MemoryError, not a SIGBUS at the first write past it. Any failure unlinks what was created.
"""

import atexit
import os
import re

from . import _native

SHM_DIR = "/dev/shm"  # where Linux keeps POSIX shared memory; listed by cleanup_shared_memory()
_TRACKED = "shared_memory"  # the resource tracker's name for what it unlinks with shm_unlink
_NAME = re.compile(r"dlb([0-9a-f]+)_([0-9a-f]+)_[0-9a-f]+")  # dlb<pid namespace>_<pid>_<random>, all hex


# --- what the Rust side calls ------------------------------------------------------------------


def _track(name):
    """Tells Python's resource tracker of a new segment, which it unlinks if this process dies first
    (called by the Rust side, once per segment made before the exit sweep)."""
    from multiprocessing import resource_tracker

    _sweep_at_exit_of_this_process()
    resource_tracker.register("/" + name, _TRACKED)


def _untrack(name):
    """Tells the tracker a segment this process made was unlinked; never raises."""
    try:
        from multiprocessing import resource_tracker

        resource_tracker.unregister("/" + name, _TRACKED)
    except Exception:  # the tracker is gone (killed, or the interpreter is shutting down)
        pass


atexit.register(_native._shared_exit_sweep)
_exit_covered = [None]  # the pid whose exit _sweep_at_exit_of_this_process covers


def _sweep_at_exit_of_this_process():
    """atexit covers an ordinary exit; multiprocessing's workers leave through os._exit after running
    its finalizers, so one of those covers them (registered in the process that creates)."""
    if _exit_covered[0] == os.getpid():
        return
    _exit_covered[0] = os.getpid()
    from multiprocessing import util

    util.Finalize(None, _native._shared_exit_sweep, exitpriority=0)


def _attach(name, size, dtype, shape, writability, padded):
    """Unpickles a shared tensor's handle: the same segment, mapped once per process."""
    return _native._shared_tensor(name, size, dtype, shape, writability, padded)


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
            os.unlink(os.path.join(SHM_DIR, entry))
        except FileNotFoundError:
            continue
        removed.append(entry)
    return removed


def _namespace():
    """The pid namespace's inode, so that a cleanup never judges pids it cannot see."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


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
    return _native.empty(shape, dtype, shared=True)


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
    # A shared borrow of the bytes while they are copied (refused while an extension writes them);
    # device memory is refused here, before anything is created.
    data = memoryview(source._bytes())
    # A sub-byte tensor that takes a byte per element is padded.
    padded = t.dtype.itemsize is None and t.size > 1 and t.nbytes == t.size
    return _native._shared_tensor(None, source.nbytes, str(t.dtype), tuple(t.shape), t._writability, padded, data)


def _row_major(shape):
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= max(extent, 1)
    return tuple(reversed(strides))
