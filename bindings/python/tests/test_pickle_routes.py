"""Every route a tensor takes out of and back into a process, times every writability: pickle protocols
0-5 in band, protocol 5 out of band (buffers handed back as they were, as bytes, as a bytearray), shared
memory (share_memory(), a handle unpickled here and in another process), copy.copy and copy.deepcopy.
Unknown stays unknown, read-only stays read-only, writable stays writable; values survive; copies are
new memory. And pickling under a memory cap raises MemoryError, never a panic."""

import copy
import multiprocessing as mp
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dlbridge
from dlpack_ctypes import FakeProducer


def writable_tensor():
    torch = pytest.importorskip("torch")
    return dlbridge.from_dlpack(torch.arange(6, dtype=torch.float32).reshape(2, 3))


def readonly_tensor():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    a.flags.writeable = False
    return dlbridge.from_dlpack(a)


def unknown_from_jax():
    jnp = pytest.importorskip("jax.numpy")
    return dlbridge.from_dlpack(jnp.arange(6, dtype=jnp.float32).reshape(2, 3))


_KEEP = []


def unknown_from_a_legacy_capsule():
    p = FakeProducer(values=(0.0, 1.0, 2.0, 3.0, 4.0, 5.0), shape=(2, 3), versioned=False)
    _KEEP.append(p)
    return dlbridge.from_dlpack(p.capsule())


SOURCES = {"writable": writable_tensor, "readonly": readonly_tensor, "unknown (jax)": unknown_from_jax,
           "unknown (legacy capsule)": unknown_from_a_legacy_capsule}


def out_of_band(transport):
    def route(t):
        buffers = []
        data = pickle.dumps(t, protocol=5, buffer_callback=buffers.append)
        assert len(buffers) == 1 and len(data) < 300, "the bytes went out of band"
        return pickle.loads(data, buffers=[transport(b) for b in buffers])

    return route


def handle_round_trip(shared):
    _KEEP.append(shared)  # the creator's tensor outlives the unpickle, or the segment is gone
    return pickle.loads(pickle.dumps(shared, protocol=5))


ROUTES = {
    **{f"pickle {p}": (lambda p: lambda t: pickle.loads(pickle.dumps(t, protocol=p)))(p) for p in range(6)},
    "pickle 5, buffers as given": out_of_band(lambda b: b),
    "pickle 5, buffers as bytes": out_of_band(lambda b: b.raw().tobytes()),
    "pickle 5, buffers as bytearray": out_of_band(lambda b: bytearray(b.raw())),
    "share_memory()": lambda t: t.share_memory(),
    "share_memory(), handle unpickled": lambda t: handle_round_trip(t.share_memory()),
    "copy.copy": copy.copy,
    "copy.deepcopy": copy.deepcopy,
    "copy.copy of a shared tensor": lambda t: copy.copy(t.share_memory()),
    "copy.deepcopy of a shared tensor": lambda t: copy.deepcopy(t.share_memory()),
}
COPIES = {name for name in ROUTES if "copy" in name or "share_memory" in name or "bytes" in name}


def writes_allowed(t):
    """What each export route says about writes into t."""
    readonly = np.from_dlpack(t).flags.writeable is False
    try:
        t.__dlpack__()  # a legacy capsule: refused only for read-only tensors
        legacy = True
    except BufferError:
        legacy = False
    return {"readonly": t.readonly, "numpy view read-only": readonly, "legacy export": legacy,
            "memoryview read-only": memoryview(t).readonly}


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("source", SOURCES)
def test_every_route_keeps_the_writability_and_the_values(source, route):
    t = SOURCES[source]()
    u = ROUTES[route](t)
    assert (u._writability, str(u.dtype), u.shape, u.tolist()) == (t._writability, str(t.dtype), t.shape, t.tolist())
    assert writes_allowed(u) == writes_allowed(t)
    if route in COPIES:
        assert u.data_ptr != t.data_ptr, "a copy, in new memory"
    if source.startswith("unknown"):
        jnp = pytest.importorskip("jax.numpy")
        assert jnp.from_dlpack(u).tolist() == t.tolist(), "a legacy consumer still takes it"


def test_the_three_writabilities_arrive_in_another_process():
    tensors = [SOURCES[s]() for s in ("writable", "readonly", "unknown (legacy capsule)")]
    sent = [t for t in tensors] + [t.share_memory() for t in tensors]
    with mp.get_context("spawn").Pool(1) as pool:
        got = pool.map(_writability_and_values, sent)
    want = [(t._writability, t.tolist()) for t in tensors] * 2
    assert got == want


def _writability_and_values(t):
    return t._writability, t.tolist()


def test_a_writable_tensor_out_of_band_is_not_copied():
    t = writable_tensor()
    assert ROUTES["pickle 5, buffers as given"](t).data_ptr == t.data_ptr
    assert not ROUTES["pickle 5, buffers as bytearray"](t).readonly


# --- under a memory cap: MemoryError, never a panic ----------------------------------------------

CAPPED = """
import copy, pickle, re, resource, sys
import numpy as np
import dlbridge
n = 256 << 20
t = dlbridge.zeros(n, "uint8")
strided = dlbridge.from_dlpack(np.zeros(2 * n, dtype=np.uint8)[::2])
payload = bytes(n)
vm = int(re.search(r"VmSize:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + (160 << 20), resource.getrlimit(resource.RLIMIT_AS)[1]))
cases = [(f"pickle {p}", lambda p=p: pickle.dumps(t, protocol=p)) for p in range(6)]
cases += [("pickle 5, non-contiguous", lambda: pickle.dumps(strided, protocol=5, buffer_callback=list().append)),
          ("copy.copy", lambda: copy.copy(t)), ("copy.deepcopy", lambda: copy.deepcopy(strided)),
          ("rebuild writable over bytes", lambda: dlbridge._rebuild_tensor(payload, "uint8", (n,), "writable", False)),
          ("rebuild unknown over bytes", lambda: dlbridge._rebuild_tensor(payload, "uint8", (n,), "unknown", False))]
for name, case in cases:
    try:
        case()
        print(name, "fits")
    except BaseException as exc:  # a PanicException is a BaseException
        print(name, type(exc).__module__, type(exc).__name__)
"""


def test_pickling_and_copying_under_a_memory_cap_raise_memory_error():
    env = {k: v for k, v in os.environ.items() if k != "RUST_BACKTRACE"}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(CAPPED)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 11 and "PanicException" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert all(line.endswith("builtins MemoryError") for line in lines), proc.stdout
