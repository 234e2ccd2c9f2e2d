"""One borrow registry per process (attack class 2): every Rust reference to memory that Python
objects can reach is taken under a borrow that all extensions linking dlbridge-pyo3 share, so a
writable borrow in one excludes readers and writers in another, and dlbridge's own host readers
(copy, tolist, pickling) too. The Rust side of the same rule is dlbridge-pyo3/tests/aliasing.rs."""

import pickle
import subprocess
import sys

import numpy as np
import pytest

import dlbridge
import scale_inplace
from dlbridge import _native


def outcome(action):
    """What `action()` did: "done", or the BufferError it raised."""
    try:
        action()
        return "done"
    except BufferError as err:
        return f"refused: {err}"


def test_the_registry_is_published_once_for_the_process():
    # Under a name of its ABI major: a table of another major, published first, would otherwise
    # leave each extension of this one with a registry of its own.
    assert "_dlbridge_borrows_2" in sys.modules
    assert type(sys.modules["_dlbridge_borrows_2"].api).__name__ == "PyCapsule"


def test_another_extension_cannot_write_what_this_one_reads():
    a = np.zeros(8, np.float32)
    seen, _ = _native._while_borrowed(a, lambda: outcome(lambda: scale_inplace.scale(a, 3.0)))
    assert seen.startswith("refused: cannot borrow this ndarray as writable"), seen
    assert a.tolist() == [0.0] * 8, "nothing was written through the refused borrow"
    scale_inplace.scale(a, 3.0)  # once the reader is gone, the write goes through
    assert _native._live_borrows() == 0


def test_another_extension_cannot_read_what_this_one_writes():
    raw = np.zeros(8, np.uint8)
    floats = raw.view(np.float32)  # the same bytes
    seen, _ = _native._while_borrowed(raw, lambda: outcome(lambda: scale_inplace.total(floats)), writable=True)
    assert seen.startswith("refused: cannot borrow this ndarray as read"), seen
    # Readers in two extensions share.
    assert _native._while_borrowed(raw, lambda: scale_inplace.total(floats))[0] == scale_inplace.total(floats)


@pytest.mark.parametrize("name", ["copy", "tolist", "pickle", "from_dlpack(copy=True)", "np.from_dlpack(copy=True)"])
def test_dlbridge_host_readers_wait_behind_a_writer(name):
    # While an extension holds a tensor writable (and may write it with the GIL released),
    # dlbridge's own host reads of it are refused instead of racing with the writer.
    t = dlbridge.from_dlpack(np.zeros(8, np.uint8))
    read = {
        "copy": t.copy,
        "tolist": t.tolist,
        "pickle": lambda: pickle.dumps(t, protocol=4),
        "from_dlpack(copy=True)": lambda: dlbridge.from_dlpack(t, copy=True),
        "np.from_dlpack(copy=True)": lambda: np.from_dlpack(t, copy=True),
    }[name]
    seen, _ = _native._while_borrowed(t, lambda: outcome(read), writable=True)
    assert seen.startswith("refused: cannot borrow this tensor as read"), seen
    assert t.tolist() == [1] * 8 and read() is not None
    assert _native._live_borrows() == 0


@pytest.mark.parametrize("squatter", ["types.ModuleType('squatter')", "types.SimpleNamespace(api=object())"])
def test_a_registry_name_held_by_anything_else_refuses_every_borrow(squatter):
    # With the name taken before any extension published, each extension once kept a registry of
    # its own: a second extension then wrote bytes the first held as &mut. Borrows are refused
    # instead, saying why, and nothing is written.
    code = (
        f"import sys, types\nsys.modules['_dlbridge_borrows_2'] = {squatter}\n"
        "import numpy as np, dlbridge, scale_inplace\n"
        "from dlbridge import _native\n"
        "x8 = np.zeros(16, np.uint8)\n"
        "for act in (lambda: _native._while_borrowed(x8, lambda: scale_inplace.scale(x8.view(np.float32), 2.0), writable=True),\n"
        "            lambda: scale_inplace.scale(x8.view(np.float32), 2.0), lambda: scale_inplace.total(x8.view(np.float32))):\n"
        "    try:\n        act(); print('done')\n"
        "    except BufferError as e:\n        print('refused' if \"_dlbridge_borrows_2'] holds something\" in str(e) else e)\n"
        "print(x8.tolist() == [0] * 16)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:4] == ["refused", "refused", "refused", "True"], proc.stdout
