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


# The interpreter's state dict, which C code reaches and Python code does not (ctypes aside).
INTERPRETER_DICT = """
import ctypes
_api = ctypes.pythonapi
_api.PyInterpreterState_Get.restype = ctypes.c_void_p
_api.PyInterpreterState_GetDict.restype = ctypes.c_void_p
_api.PyInterpreterState_GetDict.argtypes = [ctypes.c_void_p]
interpreter_dict = ctypes.cast(_api.PyInterpreterState_GetDict(_api.PyInterpreterState_Get()), ctypes.py_object).value
"""


def test_the_registry_is_published_once_where_only_c_code_reaches():
    namespace = {}
    exec(INTERPRETER_DICT, namespace)
    assert type(namespace["interpreter_dict"]["dlbridge.borrow_registry"]).__name__ == "PyCapsule"


# What each case does before dlbridge and scale_inplace import, then three attempts: a write in
# scale_inplace while dlbridge's test hook holds the bytes writable, a write, and a read.
REGISTRY_CHILD = """
{before}
import numpy as np, dlbridge
{between}
import scale_inplace
from dlbridge import _native
x8 = np.zeros(16, np.uint8)
for act in (lambda: _native._while_borrowed(x8, lambda: scale_inplace.scale(x8.view(np.float32), 2.0), writable=True)[0],
            lambda: scale_inplace.scale(x8.view(np.float32), 2.0), lambda: scale_inplace.total(x8.view(np.float32))):
    try:
        result = act()
        print("refused (conflict)" if isinstance(result, BaseException) else "done")
    except BufferError as e:
        print(e)
print(x8.tolist() == [0] * 16)
"""


def registry_child(before="", between=""):
    code = REGISTRY_CHILD.format(before=before, between=between)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("\n")[:4]


@pytest.mark.parametrize("squat", [
    pytest.param("", id="nothing"),
    pytest.param("import sys, types\nfor n in ('_dlbridge_borrows_2', '_dlbridge_borrows'): sys.modules[n] = types.ModuleType(n)",
                 id="sys.modules names taken first"),
    pytest.param("import sys, types\nsys.modules['_dlbridge_borrows_2'] = types.SimpleNamespace(api=object())", id="a namespace"),
])
@pytest.mark.parametrize("between", [
    pytest.param("", id="untouched"),
    pytest.param("import sys\nfor n in [n for n in sys.modules if 'borrow' in n]: del sys.modules[n]", id="deleted between"),
])
def test_one_registry_whatever_python_code_does_to_sys_modules(squat, between):
    # Each extension once found the registry in sys.modules at its first borrow: a name deleted
    # between two extensions' first borrows gave two registries that never saw each other, and a
    # live &[f32] changed under its reader (review S2). The registry is found where Python code
    # cannot reach now: the two extensions see each other's borrows whatever sys.modules holds.
    seen = registry_child(before=squat, between=between)
    assert seen[0].startswith("cannot borrow this ndarray as writable"), seen
    assert seen[1:] == ["done", "done", "False"], seen


def test_a_registry_of_another_major_refuses_every_borrow_loudly():
    # A build whose registry speaks another ABI major cannot see this one's borrows: refused,
    # saying why, and never replaced by a second registry.
    before = INTERPRETER_DICT + (
        "class Table(ctypes.Structure):\n"
        "    _fields_ = [('abi_major', ctypes.c_uint32), ('size', ctypes.c_uint32)] + [(f, ctypes.c_void_p) for f in 'abc']\n"
        "table = Table(99, ctypes.sizeof(Table))\n"
        "_api.PyCapsule_New.restype = ctypes.py_object\n"
        "_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]\n"
        "name = ctypes.c_char_p(b'dlbridge.borrow_registry')\n"
        "interpreter_dict['dlbridge.borrow_registry'] = _api.PyCapsule_New(ctypes.addressof(table), name, None)\n"
    )
    seen = registry_child(before=before)
    for line in seen[:3]:
        assert "cannot borrow tensors here: another extension in this process published a borrow registry of ABI 99" in line, seen
    assert seen[3] == "True", "nothing was written"


def test_a_table_published_by_an_older_build_refuses_every_borrow():
    # Builds before ABI 3 published their registry in sys.modules: one loaded first keeps a
    # registry this build cannot see, so this build refuses (and leaves markers that make such a
    # build loaded later refuse its own).
    before = INTERPRETER_DICT + (
        "import sys, types\n"
        "_api.PyCapsule_New.restype = ctypes.py_object\n"
        "_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]\n"
        "name = ctypes.c_char_p(b'_dlbridge_borrows_2.api')\n"
        "old = types.ModuleType('_dlbridge_borrows_2')\n"
        "old.api = _api.PyCapsule_New(ctypes.addressof(ctypes.c_int(0)), name, None)\n"
        "sys.modules['_dlbridge_borrows_2'] = old\n"
    )
    seen = registry_child(before=before)
    for line in seen[:3]:
        assert "an extension built with an older dlbridge-pyo3 keeps a registry of its own" in line, seen


def test_markers_make_older_builds_refuse():
    proc = subprocess.run([sys.executable, "-c", "import sys, dlbridge, numpy as np, scale_inplace\n"
                           "scale_inplace.total(np.ones(2, np.float32))\n"
                           "print([hasattr(sys.modules[n], 'api') for n in ('_dlbridge_borrows_2', '_dlbridge_borrows')])"],
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "[False, False]", proc.stdout + proc.stderr


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


HOST_READERS = ["copy", "tolist", "pickle 2", "pickle 4", "pickle 5", "pickle 5 out of band", "copy.copy", "copy.deepcopy",
                "share_memory()", "_bytes()", "from_dlpack(copy=True)", "np.from_dlpack(copy=True)"]


@pytest.mark.parametrize("name", HOST_READERS)
def test_dlbridge_host_readers_wait_behind_a_writer(name):
    # While an extension holds a tensor writable (and may write it with the GIL released),
    # dlbridge's own host reads of it are refused instead of racing with the writer. Pickle
    # protocol 5 and share_memory() read it without a borrow before (probes, finding 2).
    import copy
    t = dlbridge.from_dlpack(np.zeros(8, np.uint8))
    read = {
        "copy": t.copy,
        "tolist": t.tolist,
        "pickle 2": lambda: pickle.dumps(t, protocol=2),
        "pickle 4": lambda: pickle.dumps(t, protocol=4),
        "pickle 5": lambda: pickle.dumps(t, protocol=5),
        "pickle 5 out of band": lambda: pickle.dumps(t, protocol=5, buffer_callback=list().append),
        "copy.copy": lambda: copy.copy(t),
        "copy.deepcopy": lambda: copy.deepcopy(t),
        "share_memory()": t.share_memory,
        "_bytes()": t._bytes,
        "from_dlpack(copy=True)": lambda: dlbridge.from_dlpack(t, copy=True),
        "np.from_dlpack(copy=True)": lambda: np.from_dlpack(t, copy=True),
    }[name]
    seen, _ = _native._while_borrowed(t, lambda: outcome(read), writable=True)
    assert seen.startswith("refused: cannot borrow this tensor as read"), seen
    assert t.tolist() == [1] * 8 and read() is not None
    assert _native._live_borrows() == 0


def test_out_of_band_bytes_keep_writers_out_while_a_transport_holds_them():
    # A transport reads out-of-band buffers after pickle.dumps returns: the tensor's bytes stay
    # borrowed for reading until the last buffer goes, so no extension writes them meanwhile.
    a = np.zeros(4, np.float32)
    t = dlbridge.from_dlpack(a)
    buffers = []
    pickle.dumps(t, protocol=5, buffer_callback=buffers.append)
    with pytest.raises(BufferError, match="cannot borrow this ndarray as writable"):
        scale_inplace.scale(a, 2.0)
    assert scale_inplace.total(a) == 0.0, "readers share"
    buffers.clear()
    scale_inplace.scale(a, 2.0)
    assert _native._live_borrows() == 0


@pytest.mark.parametrize("wrap", [
    pytest.param(lambda b: b, id="PickleBuffer"),
    pytest.param(lambda b: memoryview(b), id="memoryview"),
    pytest.param(lambda b: memoryview(memoryview(b).cast("B"))[0:], id="sliced memoryview (distributed's frames)"),
])
def test_a_tensor_unpickled_in_process_over_the_same_bytes_can_be_written(wrap):
    # Unpickled here from its out-of-band buffers, the tensor reads and writes the same bytes
    # under borrows of its own: the payload's hold on them ends.
    a = np.ones(4, np.float32)
    buffers = []
    data = pickle.dumps(dlbridge.from_dlpack(a), protocol=5, buffer_callback=buffers.append)
    u = pickle.loads(data, buffers=[wrap(b) for b in buffers])
    assert u.data_ptr == a.ctypes.data
    scale_inplace.scale(u, 3.0)
    assert a.tolist() == [3.0] * 4
    del u, buffers
    assert _native._live_borrows() == 0
