"""Allocation that touches nothing it need not (#34): zeros and empty are O(1) in the size, their
memory taken from the kernel's lazily zeroed pages (as NumPy's calloc gets them), so a 4 GiB tensor
costs resident memory only as it is written. In child processes, so that one test's pages do not
count in another's."""

import subprocess
import sys
import textwrap

import pytest

RESIDENT = """
import dlbridge, numpy as np
def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
before = resident()
t = dlbridge.{make}(2**30, "float32")   # 4 GiB
grown = resident() - before
a = np.from_dlpack(t)
a[0], a[-1] = 1.0, 2.0                  # two pages written
written = resident() - before
print(grown >> 20, written >> 20, float(a[0]), float(a[2**29]), float(a[-1]), t.data_ptr % (2 << 20))
"""


@pytest.mark.parametrize("make", ["zeros", "empty"])
def test_four_gib_take_resident_memory_only_as_written(make):
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(RESIDENT.format(make=make))], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    grown, written, first, middle, last, offset = proc.stdout.split()
    assert int(grown) < 64 and int(written) < 64, f"{make}(4 GiB) took {grown} MiB at once, {written} MiB once written"
    assert (first, middle, last, offset) == ("1.0", "0.0", "2.0", "0")
