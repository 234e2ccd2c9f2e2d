"""Shared-memory segments through a process's whole life: fork, spawn, sys.exit, SIGKILL, interpreter
shutdown, copies, running out of descriptors and of /dev/shm. Each test checks what is left in /dev/shm,
what was printed to stderr, and the values on both sides. Anything that can crash or exhaust runs in
a child process."""

import copy
import gc
import os
import pickle
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import dlbridge
from dlbridge import _native, _shared

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX shared memory in /dev/shm (Linux)")

HERE = Path(__file__).parent


# dlb<pid namespace>_<pid>_<random>, in hex: dlbridge's segment names, which cleanup_shared_memory() reads
NAME = re.compile(r"dlb([0-9a-f]+)_([0-9a-f]+)_[0-9a-f]+")


def segments(*pids):
    """Segments in /dev/shm made by dlbridge in these processes (any process: none given). Other
    programs on the machine make segments of their own meanwhile, so only names with a pid count."""
    out = set()
    for name in os.listdir("/dev/shm"):
        match = NAME.fullmatch(name)
        if match and (not pids or int(match.group(2), 16) in pids):
            out.add(name)
    return out


def script(code, *args, timeout=120, **kw):
    """Runs `code` in a fresh interpreter: (CompletedProcess, the segments its pid left behind)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    env.pop("RUST_BACKTRACE", None)
    with subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env, **kw) as child:
        try:
            stdout, stderr = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            raise
    proc = subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)
    return proc, segments(child.pid)


def wait_until(condition, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


# --- only the creator unlinks ------------------------------------------------------------------

FORK_CHILD = """
import gc, os, pickle, sys
import dlbridge, numpy as np
t = dlbridge.empty(4, "float64", shared=True)
np.from_dlpack(t)[:] = 1.5
handle = pickle.dumps(t)
for how in ("frees", "os._exit", "sys.exit", "returns"):
    pid = os.fork()
    if pid == 0:
        u = pickle.loads(handle)
        assert u.data_ptr == t.data_ptr, "the inherited mapping, not a second one"
        np.from_dlpack(u)[0] += 1
        if how == "frees":
            del t, u
            gc.collect()
            os._exit(0)
        if how == "os._exit":
            os._exit(0)
        if how == "sys.exit":
            sys.exit(0)
        raise SystemExit  # through the interpreter's normal exit, atexit handlers included
    os.waitpid(pid, 0)
    print(how, pickle.loads(handle).tolist(), flush=True)
"""


def test_a_forked_child_that_frees_or_exits_leaves_the_parents_segment():
    proc, left = script(FORK_CHILD)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:4] == [
        "frees [2.5, 1.5, 1.5, 1.5]", "os._exit [3.5, 1.5, 1.5, 1.5]", "sys.exit [4.5, 1.5, 1.5, 1.5]",
        "returns [5.5, 1.5, 1.5, 1.5]"], "after each child, the segment still opens, with the children's writes"
    assert proc.stderr == "" and not left


def _child_reads_and_frees(t, out):
    u = copy.copy(t)  # a child's own copy, then the received one freed: nothing unlinks
    out.put((t.tolist(), u.is_shared))
    del t, u
    gc.collect()


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_children_of_every_start_method_never_unlink(method):
    import multiprocessing as mp

    ctx = mp.get_context(method)
    t = dlbridge.empty(3, "int32", shared=True)
    np.from_dlpack(t)[:] = [7, 8, 9]
    out = ctx.Queue()
    worker = ctx.Process(target=_child_reads_and_frees, args=(t, out))
    worker.start()
    assert out.get(timeout=60) == ([7, 8, 9], True)
    worker.join(60)
    assert worker.exitcode == 0
    assert pickle.loads(pickle.dumps(t)).tolist() == [7, 8, 9], "the segment outlived the child"


# --- copies are new memory -----------------------------------------------------------------------

@pytest.mark.parametrize("make", ["empty", "share_memory"])
@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy])
def test_copy_and_deepcopy_of_a_shared_tensor_are_independent(make, how):
    t = dlbridge.empty(4, "float32", shared=True) if make == "empty" else dlbridge.zeros(4).share_memory()
    c = how(t)
    np.from_dlpack(c)[:] = 9.0
    assert t.tolist() == [0.0] * 4 and c.tolist() == [9.0] * 4
    assert c.is_shared and c.data_ptr != t.data_ptr
    np.from_dlpack(t)[0] = 1.0
    assert c.tolist() == [9.0] * 4
    assert how({"a": [t]})["a"][0].tolist() == [1.0, 0.0, 0.0, 0.0]


# --- one mapping per segment per process (F5) --------------------------------------------------

@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_a_segment_unpickled_where_it_is_mapped_is_the_same_memory(protocol):
    t = dlbridge.empty(16, "uint8", shared=True)
    a = pickle.loads(pickle.dumps(t, protocol=protocol))
    b = pickle.loads(pickle.dumps(a, protocol=protocol))
    assert a.data_ptr == b.data_ptr == t.data_ptr
    with pytest.raises(BufferError, match="already borrowed"):
        _native._read_then_write(a, t)
    with pytest.raises(BufferError, match="already borrowed"):
        _native._read_then_write(t, b)


def test_a_handle_that_lies_about_the_size_is_refused():
    t = dlbridge.empty(16, "uint8", shared=True)
    name = t.__reduce_ex__(5)[1][0]
    with pytest.raises(ValueError, match="holds 16 bytes, not 32"):
        _shared._attach(name, 32, "uint8", (32,), "writable", False)
    with pytest.raises(ValueError, match="malformed"):
        _shared._attach("../etc/passwd", 16, "uint8", (16,), "writable", False)


# --- exit: quiet, and nothing left ------------------------------------------------------------

EXITS = {
    "end of script": "",
    "sys.exit": "import sys; sys.exit(0)",
    "exception": "raise RuntimeError('boom')",
    "tensor in a cycle": "cycle = [t]; cycle.append(cycle); del t",
    "numpy view alive": "import numpy as np; view = np.from_dlpack(t)",
    "receiver in the same process": "import pickle; r = pickle.loads(pickle.dumps(t))",
}


@pytest.mark.parametrize("how", EXITS)
def test_a_creator_unlinks_at_exit_quietly(how):
    # the README's example, as a script, then its end
    proc, left = script(f"""
import multiprocessing as mp, dlbridge
t = dlbridge.empty(4, "float32", shared=True)
with mp.get_context("fork").Pool(1) as pool:
    assert pool.apply(dlbridge.Tensor.tolist, (t,)) == [0.0] * 4
kept = dlbridge.share_memory(dlbridge.zeros(2))
{EXITS[how]}
""")
    assert proc.returncode == (1 if how == "exception" else 0)
    stderr = proc.stderr.replace("RuntimeError: boom", "") if how == "exception" else proc.stderr
    assert "Exception ignored" not in stderr and "leaked" not in stderr and "Warning" not in stderr, stderr
    assert not left


KILLED = """
import os, sys, time, dlbridge
t = dlbridge.empty(8, "uint8", shared=True)
print(t.__reduce_ex__(5)[1][0], flush=True)
time.sleep(120)
"""


def _start_creator(**kw):
    env = {**os.environ}
    env.pop("RUST_BACKTRACE", None)
    proc = subprocess.Popen([sys.executable, "-c", KILLED], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, **kw)
    name = proc.stdout.readline().strip()
    assert name in segments(proc.pid), (name, proc.stderr.read() if proc.poll() is not None else "")
    return proc, name


def test_a_killed_creators_segment_is_unlinked_by_the_resource_tracker():
    proc, name = _start_creator()
    proc.send_signal(signal.SIGKILL)
    proc.wait(60)
    assert wait_until(lambda: name not in segments()), f"{name} left in /dev/shm after SIGKILL"
    proc.stderr.close()
    proc.stdout.close()


def test_what_a_killed_creator_and_its_tracker_leave_the_cleanup_call_removes():
    survivor, kept = _start_creator()
    proc, name = _start_creator(start_new_session=True)
    os.killpg(proc.pid, signal.SIGKILL)  # the creator and its resource tracker, as `kill -9 -PGID` does
    proc.wait(60)
    time.sleep(0.5)
    assert name in segments(), "the tracker died too, so the segment is left..."
    assert name in dlbridge.cleanup_shared_memory(), "...and the documented call removes it"
    assert name not in segments() and kept in segments(), "a running creator's segment stays"
    assert name not in dlbridge.cleanup_shared_memory()
    survivor.kill()
    survivor.wait(60)
    for p in (proc, survivor):
        p.stdout.close()
        p.stderr.close()


def test_a_killed_receiver_leaves_the_segment_and_a_late_one_gets_a_clear_error():
    t = dlbridge.empty(4, "uint8", shared=True)
    handle = pickle.dumps(t)
    code = """
import os, pickle, signal, sys
u = pickle.loads(bytes.fromhex(sys.argv[1]))
assert u.tolist() == [0, 0, 0, 0]
os.kill(os.getpid(), signal.SIGKILL)
"""
    proc, left = script(code, handle.hex())
    assert proc.returncode == -signal.SIGKILL and not left
    name = t.__reduce_ex__(5)[1][0]
    assert name in segments(os.getpid()) and pickle.loads(handle).tolist() == [0, 0, 0, 0]
    del t
    gc.collect()
    assert name not in segments(), "the creator unlinked its segment when its last tensor died"
    with pytest.raises(FileNotFoundError, match="no longer exists"):
        pickle.loads(handle)


# --- running out -------------------------------------------------------------------------------

def test_thousands_of_live_shared_tensors_under_the_default_descriptor_limit():
    proc, left = script("""
import os, resource
import dlbridge, numpy as np
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
ts = [dlbridge.empty(4, "int32", shared=True) for _ in range(3000)]
for i, t in enumerate(ts):
    np.from_dlpack(t)[:] = i
assert [t.tolist()[0] for t in ts] == list(range(3000))
print(len(os.listdir("/proc/self/fd")), len({t.__reduce_ex__(5)[1][0] for t in ts}))
""", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    fds, distinct = map(int, proc.stdout.split())
    assert distinct == 3000 and fds < 32, f"{fds} descriptors open for 3000 shared tensors"
    assert proc.stderr == "" and not left


SIZES = """
import os, dlbridge
from dlbridge import _shared
for shape, dtype in [(2**62, "float64"), ((2**31, 2**31, 4), "uint8"), (2**63 - 1, "uint8"), ((2**40, 2**40), "int4")]:
    try:
        dlbridge.empty(shape, dtype, shared=True)
    except (ValueError, MemoryError, OverflowError) as exc:
        print(type(exc).__name__)
    else:
        print("created")
for shape, error in [((-1,), ValueError), ((2.5,), TypeError), ("ab", TypeError)]:
    try:
        dlbridge.empty(shape, "uint8", shared=True)
    except error:
        print(error.__name__)
"""


def test_sizes_are_checked_before_anything_is_created():
    proc, left = script(SIZES)
    assert proc.returncode == 0, proc.stderr
    # As for dlbridge.empty without shared=True: more elements than 64 bits hold is an OverflowError.
    assert proc.stdout.split() == ["MemoryError", "OverflowError", "MemoryError", "OverflowError",
                                   "ValueError", "TypeError", "TypeError"]
    assert proc.stderr == "" and not left


BIGGER_THAN_SHM = """
import os, sys, dlbridge
from dlbridge import _shared
stat = os.statvfs("/dev/shm")
size = max(stat.f_blocks, stat.f_bavail) * stat.f_frsize + (1 << 20)  # just over the free space, and the capacity
if sys.argv[1] == "reservation":
    dlbridge._native._skip_shared_free_space_check(True)  # posix_fallocate alone must refuse
try:
    t = dlbridge.empty(size, "uint8", shared=True)
except MemoryError as exc:
    print("MemoryError:", exc)
else:
    import numpy as np
    np.from_dlpack(t)[-1] = 1  # the old sparse segment: SIGBUS here
    print("created")
"""


def test_a_segment_larger_than_dev_shm_is_refused_not_a_sigbus_later():
    proc, left = script(BIGGER_THAN_SHM, "free space")
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    assert proc.stdout.startswith("MemoryError:"), proc.stdout
    assert proc.stderr == "" and not left


def test_the_reservation_alone_refuses_a_segment_larger_than_dev_shm():
    # With the free-space check skipped (dlbridge._native._skip_shared_free_space_check), posix_fallocate
    # must refuse: a sparse segment would fail later with SIGBUS at the first write past the space.
    proc, left = script(BIGGER_THAN_SHM, "reservation")
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    assert proc.stdout.startswith("MemoryError:"), proc.stdout
    assert proc.stderr == "" and not left


def test_share_memory_of_a_tensor_it_cannot_read_creates_nothing():
    from dlpack_ctypes import FakeProducer

    p = FakeProducer()
    p.tensor.device.device_type = 2  # CUDA
    t = dlbridge.from_dlpack(p.capsule())
    before = segments(os.getpid())
    with pytest.raises((BufferError, TypeError)):
        t.share_memory()
    assert segments(os.getpid()) == before


WORKERS_CREATE = """
import multiprocessing as mp, sys
import dlbridge

kept = []


def work(names):
    t = dlbridge.empty(4, "uint8", shared=True)
    kept.append(t)  # alive when the worker exits
    names.put(t.__reduce_ex__(5)[1][0])


if __name__ == "__main__":
    for method in ("fork", "spawn", "forkserver"):
        ctx = mp.get_context(method)
        names = ctx.Queue()
        p = ctx.Process(target=work, args=(names,))
        p.start()
        print(names.get(timeout=60), flush=True)
        p.join(60)
        assert p.exitcode == 0
"""


def test_a_worker_that_exits_with_live_shared_tensors_unlinks_them(tmp_path):
    (tmp_path / "workers.py").write_text(WORKERS_CREATE)
    proc, left = script(f"import runpy; runpy.run_path({str(tmp_path / 'workers.py')!r}, run_name='__main__')")
    assert proc.returncode == 0, proc.stderr
    names = proc.stdout.split()
    assert len(names) == 3 and not (set(names) & segments()), "each worker unlinked its own segment at exit"
    assert proc.stderr == "", proc.stderr
