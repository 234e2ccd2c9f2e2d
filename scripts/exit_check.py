"""Daemon threads that use dlbridge while the interpreter exits: each pattern runs in a fresh child
whose main thread returns while its daemon threads work, which must exit with status 0, print
nothing on stderr and leave no shared-memory segment behind.

    python scripts/exit_check.py [PATTERN ...]      # every pattern that needs no NumPy by default

Used by bindings/python/tests/test_interpreter_exit.py (the dev build) and by scripts/release.sh
(each Python version's wheel in a venv of its own, with nothing else installed)."""

import os
import re
import subprocess
import sys

# What one daemon thread does over and over; `n` counts its iterations.
PATTERNS = {
    "empty-shared": "t = dlbridge.empty(16, 'float32', shared=True); del t",
    "share-memory": "t = dlbridge.zeros(4).share_memory(); del t",
    "exporter-del-sleeps": "t = dlbridge.asarray(Exporter()); del t",
    "dlpack-hand-off": "queue.append(dlbridge.zeros(8).__dlpack__(max_version=(1, 3)))\n"
                       "if queue: dlbridge.from_dlpack(queue.pop()).tolist()",
    "pickle": "t = dlbridge.zeros(8); pickle.loads(pickle.dumps(t, protocol=5)); pickle.loads(pickle.dumps(t, protocol=2))",
    "pickle-shared": "s = dlbridge.empty(8, shared=True); pickle.loads(pickle.dumps(s)).tolist(); del s",
    "copy-tolist": "dlbridge.zeros(64).copy().tolist()",
    "shared-churn": "s = dlbridge.empty(1024, 'uint8', shared=True); c = s.copy(); del s; del c",
    "numpy-exporter": "a = numpy.asarray(Exporter()); del a",
    "numpy-from-dlpack": "t = dlbridge.from_dlpack(numpy.ones(8)); numpy.from_dlpack(t).sum(); del t",
    # The caller's own Python code, run by dlbridge's argument conversions and imports.
    "sleepy-shape": "dlbridge.zeros(Sleepy()); dlbridge.empty((Sleepy(), 2))",
    "sleepy-arguments": "t = dlbridge.zeros(2); t.__reduce_ex__(Sleepy()); dlbridge.empty(2, shared=bool_())\n"
                        "dlbridge.from_dlpack(t, copy=bool_()); dlbridge.asarray(t, copy=bool_())\n"
                        "try: dlbridge.from_dlpack(t, stream=Sleepy())\nexcept ValueError: pass\n"
                        "try: t.__dlpack__(dl_device=(1, Sleepy()))\nexcept BufferError: pass",
    "sleepy-producer": "dlbridge.from_dlpack(SleepyProducer()).tolist()",
    "sleepy-interface": "dlbridge.asarray(Exporter(shape=(Sleepy(),))).tolist()",
    # Only calls that make no tensor and free none, on a tensor the main thread made: a collection
    # their allocations start runs a finalizer that gives the GIL up.
    "collection-in-getters": "Cycle(); made_by_main.tolist(); made_by_main.shape; made_by_main.dtype.itemsize\n"
                             "repr(made_by_main); len(made_by_main); dlbridge.DType('float32') == 'float32'",
    # threading and dlbridge first imported by a thread that then ends (3.11's threading then takes
    # it for the main thread, and glibc gives its pthread_t to the next thread).
    "first-import-in-a-thread": "dlbridge.zeros(Sleepy())",
}
PROLOGUES = {
    "first-import-in-a-thread": (
        "import _thread, time\n"
        "imported = _thread.allocate_lock(); imported.acquire()\n"
        "def first():\n    import threading, dlbridge\n    imported.release()\n"
        "_thread.start_new_thread(first, ()); imported.acquire(); time.sleep(0.05)\n"),
}
NEEDS_NUMPY = {"numpy-exporter", "numpy-from-dlpack"}

CHILD = """{prologue}
import os, pickle, sys, threading, time, ctypes
import dlbridge
{numpy}
made_by_main = dlbridge.zeros((300, 2))
class Cycle:
    # Garbage only a collection frees, whose finalizer gives the GIL up.
    def __init__(self):
        self.me = self
    def __del__(self):
        time.sleep(0.001)
class Exporter:
    # An array-interface exporter whose __del__ gives the GIL up (a finalizer that sleeps).
    def __init__(self, shape=(16,)):
        self.buf = (ctypes.c_ubyte * 16)()
        self.__array_interface__ = {{"data": (ctypes.addressof(self.buf), False), "shape": shape, "typestr": "|u1",
                                     "version": 3}}
    def __del__(self):
        time.sleep(0)
class Sleepy:
    # An int whose __index__ gives the GIL up, as a caller's Python code may.
    def __index__(self):
        time.sleep(0.001)
        return 4
class NumpyModule(type):
    @property
    def __module__(cls):
        time.sleep(0.001)
        return "numpy"
class bool_(metaclass=NumpyModule):
    # Taken for numpy.bool_ by its type's name and module, which PyO3 reads; then converted by __bool__.
    def __bool__(self):
        time.sleep(0.001)
        return False
class SleepyProducer:
    def __dlpack__(self, **kwargs):
        time.sleep(0.001)
        return dlbridge.zeros(4).__dlpack__(**kwargs)
    def __dlpack_device__(self):
        return (1, 0)
queue = []
counts = []
def work():
    n = 0
    counts.append(lambda: n)
    while True:
        {body}
        n += 1
for _ in range({threads}):
    threading.Thread(target=work, daemon=True).start()
time.sleep(0.3)
if os.environ.get("DLBRIDGE_EXIT_CHECK_REPORT"):
    print("iterations", sum(c() for c in counts))
"""


def child_code(pattern, threads=2):
    body = PATTERNS[pattern].replace("\n", "\n        ")
    numpy = "import numpy" if pattern in NEEDS_NUMPY else ""
    return CHILD.format(body=body, threads=threads, numpy=numpy, prologue=PROLOGUES.get(pattern, ""))


def segments_of(pid):
    """The /dev/shm segments that process `pid` created (dlb<pid namespace>_<pid>_<random>)."""
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return []
    mark = re.compile(rf"dlb[0-9a-f]+_{pid:x}_[0-9a-f]+")
    return [n for n in names if mark.fullmatch(n)]


def run_pattern(python, pattern, runs=3, threads=2):
    """Runs `pattern` `runs` times under `python`; the failures, each said in a line."""
    failures = []
    for _ in range(runs):
        proc = subprocess.Popen([python, "-c", child_code(pattern, threads)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            failures.append(f"{pattern}: hung at exit")
            continue
        left = segments_of(proc.pid)
        for name in left:
            os.unlink(os.path.join("/dev/shm", name))
        if proc.returncode != 0 or err or left:
            failures.append(f"{pattern}: exit status {proc.returncode}, segments left {left}, stderr {err[-500:]!r}")
    return failures


def main(argv):
    if argv[:1] == ["--child"]:  # the child itself, for reports (test_interpreter_exit.py)
        exec(child_code(argv[1], int(argv[2])), {"__name__": "__main__"})
        return 0
    patterns = argv or [p for p in PATTERNS if p not in NEEDS_NUMPY]
    failures = [f for p in patterns for f in run_pattern(sys.executable, p)]
    for line in failures:
        print(line, file=sys.stderr)
    print(f"exit check ({sys.version.split()[0]}): {len(patterns)} patterns, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
