"""Running out (attack class 3): every allocation whose size a caller or a foreign producer
controls fails with MemoryError (or OverflowError / ValueError for sizes no machine has), never a
panic, an abort or a hang. Each case runs in a child whose address space is capped
(RLIMIT_AS) just above what it already uses."""

import os
import subprocess
import sys

import pytest

PRELUDE = """
import resource, pickle, numpy as np, dlbridge
def in_use():
    for line in open('/proc/self/status'):
        if line.startswith('VmSize:'):
            return int(line.split()[1]) * 1024
def cap(extra):
    resource.setrlimit(resource.RLIMIT_AS, (in_use() + extra, resource.RLIM_INFINITY))
def attempt(what):
    try:
        what()
        return 'ok'
    except BaseException as err:  # a PanicException is a BaseException: it must show here
        return type(err).__name__
"""

MiB = 1 << 20


def run_capped(code, backtrace=False):
    env = dict(os.environ, RUST_BACKTRACE="1" if backtrace else "0")
    proc = subprocess.run([sys.executable, "-c", PRELUDE + code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, f"child died with {proc.returncode}: {proc.stderr[-3000:]}"
    assert "panicked" not in proc.stderr and "PanicException" not in proc.stdout, proc.stderr[-3000:]
    return proc.stdout.split()


@pytest.mark.parametrize("backtrace", [False, True], ids=["plain", "RUST_BACKTRACE=1"])
def test_tolist_under_a_memory_cap_raises_memory_error(backtrace):
    # 8 Mi float64 elements: the tensor takes 64 MiB, its list ~256 MiB of Python floats.
    out = run_capped(f"""
t = dlbridge.from_dlpack(np.ones(8 << 20))
cap({64 * MiB})
print(attempt(t.tolist), attempt(lambda: t.tolist()), attempt(lambda: dlbridge.zeros((2, 2)).tolist()))
""", backtrace)
    assert out == ["MemoryError", "MemoryError", "ok"]


@pytest.mark.parametrize(
    "operation",
    [
        "t.copy()",
        "dlbridge.from_dlpack(t, copy=True)",
        "dlbridge.from_dlpack(a, copy=True)",
        "dlbridge.asarray(a, copy=True)",
        "np.from_dlpack(t, copy=True)",
        "dlbridge.zeros(64 << 20, 'float64')",
        "dlbridge.empty((8192, 8192), 'float64')",
        "t.numpy().copy()",
    ],
)
def test_copies_and_allocations_under_a_memory_cap(operation):
    out = run_capped(f"""
a = np.ones(32 << 20, np.float32)   # 128 MiB
t = dlbridge.from_dlpack(a)
cap({64 * MiB})
print(attempt(lambda: {operation}), attempt(lambda: dlbridge.zeros(4).tolist()))
""")
    assert out == ["MemoryError", "ok"]


@pytest.mark.parametrize("size", [2**31, 2**62, 2**63 - 1, 2**63, 2**64])
@pytest.mark.parametrize("maker", ["zeros", "empty"])
def test_sizes_no_machine_has_are_refused_cleanly(maker, size):
    out = run_capped(f"""
cap({256 * MiB})
print(attempt(lambda: dlbridge.{maker}(({size},), 'float64')), attempt(lambda: dlbridge.{maker}(({size}, {size}), 'uint8')))
""")
    assert all(kind in {"MemoryError", "OverflowError", "ValueError"} for kind in out), out
