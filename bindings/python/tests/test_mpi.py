"""dlbridge tensors across MPI ranks: real `mpiexec -n 2` and `-n 4` jobs with mpi4py and MPICH,
both from PyPI (requirements/test.txt), over loopback.

Each job is a small script written to tmp_path and launched as `mpiexec ... python -m mpi4py
job.py OUTDIR` (`-m mpi4py` calls MPI_Abort on an uncaught exception, so one failing rank ends
the job instead of leaving the others waiting). Every rank sends its stdout and stderr to
OUTDIR/rank<r>.log and its findings to OUTDIR/rank<r>.json; the assertions are made here, on those
findings. A failed or hung job fails with every rank's log. Against hangs: a per-rank faulthandler
watchdog (each rank dumps its stack to its log), a timeout on the whole job that kills its process
group (mpiexec, Hydra's proxy and the ranks), and jobs designed so that no rank waits for a message
that a refused call never sent.

How mpi4py (4.1) takes a buffer, from its source (src/mpi4py/MPI.src/asbuffer.pxi, asdlpack.pxi,
typemap.pxi), which is what these tests pin down against dlbridge:
- the buffer protocol first; on any exception, `__dlpack__(max_version=(1, 0), copy=False)`, then
  plain `__dlpack__()` on TypeError (a legacy capsule), then `__cuda_array_interface__`;
- the MPI datatype comes from the buffer's struct format: dlbridge's "e" (float16) maps to
  MPIX_C_FLOAT16 and "?" (bool) to MPI_C_BOOL, so no dtype here needs an explicit datatype (the
  explicit `[buf, MPI.X]` form is exercised as well);
- a DLPack dtype without a format (bfloat16, float8) is sent as MPI_BYTE, whole bytes;
- a versioned capsule is read-only when READ_ONLY is set; a legacy capsule is always taken as
  writable (`readonly = 0`), since it cannot say.
"""

import importlib.util
import inspect
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import dlbridge

if importlib.util.find_spec("mpi4py") is None:
    pytest.skip(
        "mpi4py is not installed: requirements/test.txt lists mpi4py and mpich; ./dev installs them",
        allow_module_level=True,
    )

# The mpich wheel puts mpiexec (Hydra) beside the venv's python. If mpi4py is importable but that
# mpiexec is not there, the install is broken: the tests fail (in the fixture below) instead of
# skipping, so that a skip never hides it.
MPIEXEC = Path(sys.executable).parent / "mpiexec"

# Hydra options, so that a job runs the same on a laptop, a CI box with no network, or inside a
# batch allocation:
# - `-launcher fork`: start the ranks as local child processes, never through ssh or srun;
# - `-rmk user -hosts localhost`: take the host list from us, not from a resource manager. Inside a
#   SLURM allocation (SLURM_* variables set) Hydra otherwise picks the slurm launcher and runs
#   `srun`; where there is no srun it printed "execvp error on file srun" and then hung until killed.
# Loopback is enough (ranks on one host talk through shared memory; Hydra's control sockets are
# local); in a network namespace whose only interface, lo, was down, jobs still ran. No HYDRA_*
# variable was needed.
HYDRA_OPTIONS = ["-launcher", "fork", "-rmk", "user", "-hosts", "localhost"]

WATCHDOG_S = 40  # per rank: dump the stack to the rank's log, so a hang names where each rank waits
JOB_TIMEOUT_S = 60  # whole job, after which its process group is killed (the jobs take about 0.5 s)

DTYPES = ["int32", "int64", "uint8", "float16", "float32", "float64", "complex128", "bool"]
SHAPE = (2, 3)


def make(dtype, rank):
    """The NumPy array rank `rank` contributes: small integers, exact in every dtype."""
    base = np.arange(1, 7).reshape(2, 3) + rank
    if dtype == "bool":
        return base % 2 == 0
    if dtype == "complex128":
        return (base + 2j * base).astype(dtype)
    return base.astype(dtype)


def jsonable(x):
    """tolist() output with complex numbers as [real, imag], for JSON."""
    if isinstance(x, list):
        return [jsonable(v) for v in x]
    if isinstance(x, complex):
        return [x.real, x.imag]
    return x


def outcome(fn, *args, **kwargs):
    """Calls fn; returns "ok", or the exception it raised as "Type: message"."""
    try:
        fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - the test asserts on what it was
        return f"{type(e).__name__}: {e}"
    return "ok"


class DLPackOnly:
    """Exposes a tensor through `__dlpack__` and `__dlpack_device__` only (no buffer protocol), and
    records the keywords each `__dlpack__` call got."""

    def __init__(self, t):
        self.t, self.calls = t, []

    def __dlpack__(self, **kwargs):
        self.calls.append(kwargs)
        return self.t.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


class LegacyDLPack:
    """A pre-1.0 producer: `__dlpack__(stream=None)` takes nothing else, so mpi4py's versioned
    request is a TypeError and it asks again for a legacy "dltensor" capsule."""

    def __init__(self, t):
        self.t, self.calls = t, 0

    def __dlpack__(self, stream=None):
        self.calls += 1
        return self.t.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


PRELUDE = """
import ctypes, faulthandler, json, os, sys, threading
OUTDIR = sys.argv[1]
_rank = os.environ.get("PMI_RANK", os.environ.get("PMIX_RANK", "unknown"))
_log = open(os.path.join(OUTDIR, f"rank{_rank}.log"), "w", buffering=1)
os.dup2(_log.fileno(), 1)
os.dup2(_log.fileno(), 2)
faulthandler.enable()
# Not exit=True: the first rank to exit would make Hydra kill the others before they dump theirs.
faulthandler.dump_traceback_later(%(watchdog)d)
# A rank orphaned by an interrupted pytest still ends (mpi4py releases the GIL while it waits).
_reaper = threading.Timer(%(reaper)d, os._exit, (70,))
_reaper.daemon = True
_reaper.start()

from mpi4py import MPI
import numpy as np
import dlbridge

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
R = {"rank": rank, "size": size}

def raw(t):
    return ctypes.string_at(t.data_ptr, t.nbytes)

%(helpers)s

# How a job hands a tensor to mpi4py: as itself (buffer protocol first), or through a wrapper.
WRAP = {"tensor": lambda t: t, "dlpack-only": DLPackOnly, "legacy": LegacyDLPack}
"""

EPILOGUE = """
with open(os.path.join(OUTDIR, f"rank{rank}.json"), "w") as _f:
    json.dump(R, _f)
"""

HELPERS = "\n\n".join(inspect.getsource(f) for f in (make, jsonable, outcome, DLPackOnly, LegacyDLPack))


@pytest.fixture(scope="module")
def mpiexec():
    if not MPIEXEC.exists():
        pytest.fail(
            f"mpi4py is importable but {MPIEXEC} does not exist: the `mpich` wheel from "
            "requirements/test.txt is missing or broken (pip install mpich)"
        )
    return MPIEXEC


def _mpich_segments():
    try:
        return {p.name for p in Path("/dev/shm").glob("mpich_shm_*")}
    except OSError:
        return set()


@pytest.fixture
def run_job(mpiexec, tmp_path):
    """run_job(n, body) -> the n ranks' findings (the dicts they left in R), by rank."""
    counter = iter(range(1000))

    def run(n, body):
        job = tmp_path / f"job{next(counter)}"
        job.mkdir()
        script = job / "job.py"
        prelude = PRELUDE % {"watchdog": WATCHDOG_S, "reaper": JOB_TIMEOUT_S + 30, "helpers": HELPERS}
        script.write_text(prelude + textwrap.dedent(body) + EPILOGUE)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_"))}
        env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
        argv = [str(mpiexec), *HYDRA_OPTIONS, "-n", str(n), sys.executable, "-m", "mpi4py", str(script)]
        argv.append(str(job))
        shm_before = _mpich_segments()
        start = time.monotonic()
        proc = subprocess.Popen(
            argv,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=JOB_TIMEOUT_S)
            verdict = f"exit status {proc.returncode}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # mpiexec, its proxy and the ranks share the group
            out, _ = proc.communicate()
            verdict = f"timed out after {JOB_TIMEOUT_S} s (process group killed)"
        except BaseException:  # KeyboardInterrupt: leave nothing running
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        elapsed = time.monotonic() - start
        results = {}
        for r in range(n):
            path = job / f"rank{r}.json"
            if path.exists():
                results[r] = json.loads(path.read_text())
        if proc.returncode != 0 or len(results) != n:
            # MPICH unlinks its shared-memory segment (2 MiB in /dev/shm) in MPI_Finalize; a job that
            # aborted or was killed leaves it behind. Remove those that appeared during this job.
            for name in _mpich_segments() - shm_before:
                Path("/dev/shm", name).unlink(missing_ok=True)

            def log(r):
                path = job / f"rank{r}.log"
                return path.read_text() if path.exists() else "(no log)"

            ranks = "\n".join(f"--- rank {r} stdout+stderr:\n{log(r)}" for r in range(n))
            pytest.fail(
                f"mpiexec -n {n} job {verdict} after {elapsed:.1f} s; "
                f"ranks that wrote their findings: {sorted(results)}\n"
                f"command: {' '.join(argv)}\n--- mpiexec output:\n{out}\n{ranks}",
                pytrace=False,
            )
        return [results[r] for r in range(n)]

    return run


def expected_values(dtype, n, op):
    arrays = [make(dtype, r) for r in range(n)]
    if op == "lor":
        return jsonable(np.logical_or.reduce(arrays).tolist())
    return jsonable(sum(arrays).astype(dtype).tolist())


def test_mpiexec_runs_mpich_ranks(run_job):
    r0, r1 = run_job(2, 'R["library"] = MPI.Get_library_version(); R["ranks"] = comm.allgather(rank)')
    assert r0["size"] == r1["size"] == 2 and r0["ranks"] == [0, 1]
    assert r0["library"].startswith("MPICH"), r0["library"]


EXCHANGE = """
wrap = WRAP[PATH]
EXPLICIT = {"int32": MPI.INT32_T, "int64": MPI.INT64_T, "uint8": MPI.UINT8_T, "float16": MPI.FLOAT16_T,
            "float32": MPI.FLOAT, "float64": MPI.DOUBLE, "complex128": MPI.C_DOUBLE_COMPLEX,
            "bool": MPI.C_BOOL}
wrappers = []

def w(t):
    x = wrap(t)
    wrappers.append(x)
    return x

for i, dt in enumerate(DTYPES):
    got = R[dt] = {}
    src = dlbridge.asarray(make(dt, rank))  # zero-copy over NumPy memory
    # What mpi4py holds while it uses the object: the tensor (buffer protocol) or a capsule (DLPack).
    got["held"] = type(MPI.buffer(w(src)).obj).__name__

    # Send/Recv, the datatype inferred from the format; then again with an explicit datatype.
    for j, msg in enumerate((lambda b: w(b), lambda b: [w(b), EXPLICIT[dt]])):
        key = ("send-recv", "send-recv explicit")[j]
        if rank == 0:
            comm.Send(msg(src), dest=1, tag=10 * i + j)
        else:
            dst = dlbridge.zeros(SHAPE, dt)  # Rust-owned
            ptr = dst.data_ptr
            comm.Recv(msg(dst), source=0, tag=10 * i + j)
            got[key] = {"values": jsonable(dst.tolist()), "same_ptr": dst.data_ptr == ptr}

    buf = src.copy() if rank == 0 else dlbridge.zeros(SHAPE, dt)
    ptr = buf.data_ptr
    comm.Bcast(w(buf), root=0)
    got["bcast"] = {"values": jsonable(buf.tolist()), "same_ptr": buf.data_ptr == ptr}

    # MPI defines SUM for integers, floats and complex, not for logical types: bool uses LOR.
    op = MPI.LOR if dt == "bool" else MPI.SUM
    dst = dlbridge.zeros(SHAPE, dt)
    ptr = dst.data_ptr
    comm.Allreduce(w(src), w(dst), op=op)
    got["allreduce"] = {"values": jsonable(dst.tolist()), "same_ptr": dst.data_ptr == ptr}

    a = make(dt, rank)
    t = dlbridge.asarray(a)
    comm.Allreduce(MPI.IN_PLACE, w(t), op=op)
    got["in-place"] = {"values": jsonable(t.tolist()), "numpy_sees": jsonable(a.tolist()),
                       "same_ptr": t.data_ptr == a.ctypes.data}

    if dt == "bool":
        try:
            comm.Allreduce(w(src), w(dlbridge.zeros(SHAPE, dt)), op=MPI.SUM)
            got["sum"] = "ok"
        except MPI.Exception as e:
            got["sum"] = {"ERR_OP": e.Get_error_class() == MPI.ERR_OP, "message": str(e)}

# Every wrapper was handed to mpi4py once: what did each __dlpack__ get asked?
R["calls"] = sorted({json.dumps(x.calls) for x in wrappers if not isinstance(x, dlbridge.Tensor)})
"""


@pytest.mark.parametrize("path", ["tensor", "dlpack-only", "legacy"])
def test_send_recv_bcast_allreduce(run_job, path):
    """Every dtype through Send/Recv, Bcast, Allreduce and in-place Allreduce, received straight into
    a dlbridge tensor's memory: as the tensor (buffer protocol), through an object with only
    `__dlpack__`/`__dlpack_device__` (versioned capsule), and through a legacy `__dlpack__(stream)`."""
    r0, r1 = run_job(2, f"PATH = {path!r}\nDTYPES = {DTYPES!r}\nSHAPE = {SHAPE!r}\n" + EXCHANGE)
    for dt in DTYPES:
        op = "lor" if dt == "bool" else "sum"
        own = jsonable(make(dt, 0).tolist())
        assert r0[dt]["held"] == r1[dt]["held"] == ("Tensor" if path == "tensor" else "PyCapsule"), dt
        for key in ("send-recv", "send-recv explicit", "bcast"):
            assert r1[dt][key] == {"values": own, "same_ptr": True}, (dt, key)
        total = expected_values(dt, 2, op)
        for got in (r0[dt], r1[dt]):
            assert got["allreduce"] == {"values": total, "same_ptr": True}, dt
            assert got["in-place"] == {"values": total, "numpy_sees": total, "same_ptr": True}, dt
    # MPICH refuses SUM on MPI_C_BOOL ("MPI_Op operation not defined for this datatype"), on every
    # rank before any communication, so this raises everywhere instead of hanging.
    for got in (r0, r1):
        assert got["bool"]["sum"] != "ok" and got["bool"]["sum"]["ERR_OP"], got["bool"]["sum"]
    # mpi4py asks for a versioned capsule with max_version=(1, 0), copy=False, no stream (CPU); the
    # legacy producer's TypeError on those keywords comes before its body runs, so only the plain
    # retry is counted. Once per use: mpi4py never asks twice for one buffer.
    versioned = '[{"max_version": [1, 0], "copy": false}]'
    expected_calls = {"tensor": [], "dlpack-only": [versioned], "legacy": ["1"]}[path]
    assert r0["calls"] == r1["calls"] == expected_calls


READ_ONLY = """
def legacy_import():
    # A legacy capsule cannot say whether its memory may be written: dlbridge reports such a
    # tensor as read-only (unknown writability is never relayed as writable).
    a = np.arange(6.0)
    return a, dlbridge.from_dlpack(a.__dlpack__())

ro_np = np.arange(6.0) * 10
ro_np.flags.writeable = False
SOURCES = {
    "bytes": dlbridge.asarray(b"immutable!"),
    "numpy": dlbridge.asarray(ro_np),
    "legacy-import": legacy_import()[1],
}
R["readonly"] = {k: t.readonly for k, t in SOURCES.items()}

# Sending from read-only tensors, on tags 1..9: rank 0 posts each send; if a send is refused it
# falls back to sending the same bytes from a writable copy, so rank 1's receive always matches.
sends = [(k, p) for k in SOURCES for p in WRAP]
if rank == 0:
    R["send"], reqs = {}, []
    for tag, (k, p) in enumerate(sends, 1):
        t = SOURCES[k]
        try:
            reqs.append(comm.Isend(WRAP[p](t), dest=1, tag=tag))
            R["send"][f"{k} {p}"] = "ok"
        except Exception as e:
            R["send"][f"{k} {p}"] = f"{type(e).__name__}: {e}"
            reqs.append(comm.Isend(t.copy(), dest=1, tag=tag))
    MPI.Request.Waitall(reqs)
else:
    R["sent"] = {}
    for tag, (k, p) in enumerate(sends, 1):
        t = SOURCES[k]
        dst = dlbridge.zeros(t.shape, str(t.dtype))
        comm.Recv(dst, source=0, tag=tag)
        R["sent"][f"{k} {p}"] = raw(dst) == raw(t)

# Receiving into read-only tensors, on tags 101..: rank 0 sends every message up front
# (non-blocking); rank 1 tries the read-only target first, and only if that is refused receives the
# message into a writable tensor instead. Exactly one receive per message either way: no hang.
recvs = [(k, p, blocking) for k in SOURCES for p in WRAP for blocking in (True, False)]
if rank == 0:
    reqs = []
    for tag, (k, p, _) in enumerate(recvs, 101):
        reqs.append(comm.Isend([np.full(SOURCES[k].nbytes, 7, np.uint8), MPI.BYTE], dest=1, tag=tag))
    MPI.Request.Waitall(reqs)
else:
    R["recv"] = {}
    for tag, (k, p, blocking) in enumerate(recvs, 101):
        base, target = legacy_import() if k == "legacy-import" else (None, SOURCES[k])
        before = raw(target)
        key = f"{k} {p} {'Recv' if blocking else 'Irecv'}"
        try:
            if blocking:
                comm.Recv([WRAP[p](target), MPI.BYTE], source=0, tag=tag)
            else:
                comm.Irecv([WRAP[p](target), MPI.BYTE], source=0, tag=tag).Wait()
            R["recv"][key] = {"outcome": "received", "written": raw(target) != before}
            if base is not None:
                R["recv"][key]["numpy_sees"] = base.view(np.uint8).tolist() == [7] * target.nbytes
        except Exception as e:
            comm.Recv([dlbridge.zeros(target.nbytes, "uint8"), MPI.BYTE], source=0, tag=tag)
            R["recv"][key] = {"outcome": f"{type(e).__name__}: {e}", "written": raw(target) != before}

# Collectives into read-only memory: refused on every rank before MPI is called.
ro = SOURCES["numpy"]
R["allreduce"] = outcome(comm.Allreduce, dlbridge.zeros(6, "float64"), ro)
R["in-place"] = outcome(comm.Allreduce, MPI.IN_PLACE, DLPackOnly(ro))
R["unchanged"] = raw(SOURCES["bytes"]) == b"immutable!" and ro_np.tolist() == [0.0, 10, 20, 30, 40, 50]
"""


def test_read_only(run_job):
    """Read-only tensors can be sent from, and are refused as receive buffers, through every path
    that can tell; and the one path that cannot tell."""
    r0, r1 = run_job(2, READ_ONLY)
    assert r0["readonly"] == {"bytes": True, "numpy": True, "legacy-import": True}

    # Sending: fine as the tensor and through a versioned capsule (READ_ONLY set; a send needs no
    # write). Through a legacy-only wrapper dlbridge refuses the export of a known read-only tensor
    # (a legacy capsule cannot say read-only), so that Isend raises; the legacy import, whose
    # writability is unknown rather than read-only, is still exported legacy (README: Writability).
    legacy_refusal = "BufferError: cannot export a read-only tensor as a legacy DLPack capsule"
    for key, result in r0["send"].items():
        if key in ("bytes legacy", "numpy legacy"):
            assert result.startswith(legacy_refusal), (key, result)
        else:
            assert result == "ok", (key, result)
    assert all(r1["sent"].values()), r1["sent"]

    # Receiving. As the tensor: the buffer protocol refuses PyBUF_WRITABLE, mpi4py falls back to
    # __dlpack__, and raises its own "dlpack: buffer is not writable" for the READ_ONLY flag (that
    # is the error the caller sees, not the buffer protocol's). Through a versioned capsule: the
    # same. Through a legacy-only wrapper: a known read-only tensor refuses the legacy export.
    not_writable = "BufferError: dlpack: buffer is not writable"
    for key, result in r1["recv"].items():
        source, path, _ = key.split()
        if path == "legacy" and source == "legacy-import":
            continue
        expected = legacy_refusal if path == "legacy" else not_writable
        assert result["outcome"].startswith(expected) and not result["written"], (key, result)
    # The exception: a tensor imported from a legacy capsule (writability unknown, so
    # `readonly` is True) re-exported through a legacy-only wrapper. dlbridge still gives the legacy
    # export (the legacy consumer gets what the original producer gave), and mpi4py takes every
    # legacy capsule as writable, so the receive lands in that memory. Here it is a writable NumPy
    # array underneath, which sees the bytes.
    for kind in ("Recv", "Irecv"):
        result = r1["recv"][f"legacy-import legacy {kind}"]
        assert result == {"outcome": "received", "written": True, "numpy_sees": True}, (kind, result)

    for got in (r0, r1):
        assert got["allreduce"].startswith(not_writable), got["allreduce"]
        assert got["in-place"].startswith(not_writable), got["in-place"]
        assert got["unchanged"]


NARROW = """
import ml_dtypes

VALUES = [0.5, -1.0, 2.0, 3.5, -448.0, 0.015625]
R["typed"], R["bytes"], R["held"] = {}, {}, {}
for i, dt in enumerate(("bfloat16", "float8_e4m3fn")):
    bits = np.array(VALUES, dtype=getattr(ml_dtypes, dt)).tobytes()
    if rank == 0:
        t = dlbridge.zeros((2, 3), dt)
        ctypes.memmove(t.data_ptr, bits, len(bits))  # no buffer format for these dtypes: fill by address
        R["held"][dt] = type(MPI.buffer(t).obj).__name__
        comm.send((dt, t.shape), dest=1, tag=3 * i)  # the header: plain tuple, pickled
        comm.Send([t, MPI.BYTE], dest=1, tag=3 * i + 1)  # the raw bytes, datatype explicit
        comm.Send(t, dest=1, tag=3 * i + 2)  # no datatype: mpi4py's DLPack path says bytes itself
    else:
        name, shape = comm.recv(source=0, tag=3 * i)
        nbytes = dlbridge.zeros(shape, name).nbytes
        staging = dlbridge.zeros(nbytes, "uint8")
        comm.Recv([staging, MPI.BYTE], source=0, tag=3 * i + 1)
        rebuilt = dlbridge.zeros(shape, name)  # rebuilt with the dtype the header names
        ctypes.memmove(rebuilt.data_ptr, staging.data_ptr, nbytes)
        decoded = np.frombuffer(raw(rebuilt), getattr(ml_dtypes, dt)).astype(float).tolist()
        R["bytes"][dt] = {"dtype": str(rebuilt.dtype), "shape": list(rebuilt.shape),
                          "bits_equal": raw(rebuilt) == bits, "values": decoded}
        direct = dlbridge.zeros(shape, name)
        ptr = direct.data_ptr
        comm.Recv(direct, source=0, tag=3 * i + 2)
        R["typed"][dt] = {"bits_equal": raw(direct) == bits, "same_ptr": direct.data_ptr == ptr}
R["VALUES"] = VALUES
"""


def test_bfloat16_and_float8_as_bytes(run_job):
    """bfloat16 and float8 have no struct format (dlbridge's buffer protocol refuses them) and MPICH
    5.0 has no bfloat16 datatype (mpi4py's MPI.BFLOAT16_T is DATATYPE_NULL): the bytes travel as
    MPI_BYTE and the receiver rebuilds the tensor with the dtype the sender named."""
    r0, r1 = run_job(2, NARROW)
    for dt in ("bfloat16", "float8_e4m3fn"):
        # The buffer protocol refused, and mpi4py fell back to the DLPack capsule.
        assert r0["held"][dt] == "PyCapsule"
        assert r1["bytes"][dt] == {"dtype": dt, "shape": [2, 3], "bits_equal": True, "values": r1["VALUES"]}
        assert r1["typed"][dt] == {"bits_equal": True, "same_ptr": True}


def _pickle_support():
    try:
        pickle.dumps(dlbridge.zeros(2))
    except TypeError:
        return False
    return True


PICKLED = """
import ml_dtypes
from mpi4py.util import pkl5

def narrow(dtype, values):
    t = dlbridge.zeros(len(values), dtype)
    bits = np.array(values, dtype=getattr(ml_dtypes, dtype)).tobytes()
    ctypes.memmove(t.data_ptr, bits, len(bits))
    return t

ro = np.arange(4.0)
ro.flags.writeable = False
TENSORS = {
    "float32": dlbridge.asarray(np.arange(6, dtype=np.float32).reshape(2, 3)),
    "int64 zeros": dlbridge.zeros(3, "int64"),
    "complex128": dlbridge.asarray(make("complex128", 0)),
    "bool": dlbridge.asarray(make("bool", 0)),
    "empty": dlbridge.zeros((0, 4), "float64"),
    "strided": dlbridge.asarray(np.arange(10.0)[::2]),
    "read-only bytes": dlbridge.asarray(b"bytes"),
    "read-only numpy": dlbridge.asarray(ro),
    "bfloat16": narrow("bfloat16", [1.5, -2.0, 0.25]),
    "float8_e4m3fn": narrow("float8_e4m3fn", [448.0, -0.5, 3.0, 0.125]),
    "legacy import (writability unknown)": dlbridge.from_dlpack(np.arange(3.0).__dlpack__()),
}

def describe(t):
    return {"type": type(t).__name__, "dtype": str(t.dtype), "shape": list(t.shape), "readonly": t.readonly,
            "bytes": (raw(t.copy()) if t.size else b"").hex()}

R["sent"] = {k: describe(t) for k, t in TENSORS.items()}
for how, c in (("in-band", comm), ("pkl5", pkl5.Intracomm(comm))):
    if rank == 0:
        c.send(TENSORS, dest=1)
        comm.Send(np.full((2, 3), 9, np.float32), dest=1)
    else:
        got = c.recv(source=0)
        R[how] = {k: describe(t) for k, t in got.items()}
        # An unpickled writable tensor is writable memory: MPI receives straight into it.
        t = got["float32"]
        ptr = t.data_ptr
        comm.Recv(t, source=0)
        R[how + " recv into"] = {"values": t.tolist(), "same_ptr": t.data_ptr == ptr}
"""


@pytest.mark.skipif(
    not _pickle_support(), reason="dlbridge.Tensor cannot be pickled yet (pickle.dumps raises TypeError)"
)
def test_lowercase_send_recv_pickles_tensors(run_job):
    """`comm.send`/`comm.recv` pickle their objects: dlbridge tensors arrive with dtype, shape, bytes
    and read-only flag; with mpi4py.util.pkl5 the tensors' bytes travel out of band (protocol 5)."""
    r0, r1 = run_job(2, PICKLED)
    assert r1["in-band"] == r0["sent"]
    assert r1["pkl5"] == r0["sent"]
    assert r0["sent"]["read-only bytes"]["readonly"] and not r0["sent"]["float32"]["readonly"]
    assert r0["sent"]["legacy import (writability unknown)"]["readonly"]
    for how in ("in-band", "pkl5"):
        assert r1[how + " recv into"] == {"values": [[9.0] * 3] * 2, "same_ptr": True}, how


SHARED = """
if rank == 0:
    s = dlbridge.empty(4, "float32", shared=True)  # a /dev/shm segment; pickles as a handle
    comm.send(s, dest=1)
    comm.Send(np.arange(100, 104, dtype=np.float32), dest=1)
    comm.barrier()  # rank 1 has received into its mapping
    R["creator sees"] = s.tolist()
else:
    t = comm.recv(source=0)
    R["is_shared"] = t.is_shared
    comm.Recv(t, source=0)  # MPI writes into rank 1's mapping of the segment
    comm.barrier()
"""


@pytest.mark.skipif(
    not (_pickle_support() and hasattr(dlbridge.Tensor, "share_memory")),
    reason="dlbridge has no shared-memory tensors yet (Tensor.share_memory)",
)
def test_shared_memory_tensor_through_send(run_job):
    """Ranks on one host: a shared-memory tensor goes through `comm.send` as a handle, the receiver
    maps the same segment, and what MPI receives there the creator sees."""
    r0, r1 = run_job(2, SHARED)
    assert r1["is_shared"]
    assert r0["creator sees"] == [100.0, 101.0, 102.0, 103.0]


FOUR = """
for dt in ("int32", "float64", "complex128"):
    R[dt] = {}
    for p, wrap in WRAP.items():
        dst = dlbridge.zeros((2, 3), dt)
        ptr = dst.data_ptr
        comm.Allreduce(wrap(dlbridge.asarray(make(dt, rank))), wrap(dst), op=MPI.SUM)
        a = make(dt, rank)
        comm.Allreduce(MPI.IN_PLACE, wrap(dlbridge.asarray(a)), op=MPI.SUM)
        buf = dlbridge.asarray(make(dt, 3)) if rank == 3 else dlbridge.zeros((2, 3), dt)
        comm.Bcast(wrap(buf), root=3)
        R[dt][p] = {"allreduce": jsonable(dst.tolist()), "same_ptr": dst.data_ptr == ptr,
                    "in-place": jsonable(a.tolist()), "bcast": jsonable(buf.tolist())}
"""


def test_four_ranks(run_job):
    results = run_job(4, FOUR)
    for got in results:
        assert got["size"] == 4
        for dt in ("int32", "float64", "complex128"):
            total = expected_values(dt, 4, "sum")
            for p in ("tensor", "dlpack-only", "legacy"):
                assert got[dt][p] == {
                    "allreduce": total,
                    "same_ptr": True,
                    "in-place": total,
                    "bcast": jsonable(make(dt, 3).tolist()),
                }, (got["rank"], dt, p)
