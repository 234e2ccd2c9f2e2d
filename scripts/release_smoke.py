"""What an installed dlbridge must do with nothing else installed: python release_smoke.py VERSION.

scripts/release.sh runs it on the sdist's install in a bare venv, and on the aarch64 wheel under
qemu-user. No NumPy: the package depends on nothing."""

import copy
import pickle
import subprocess
import sys

import dlbridge

version = sys.argv[1]
assert dlbridge.__version__ == version, (dlbridge.__version__, version)
# The `testing` feature's hooks (one trusts any exchange table) stay out of what users install.
hooks = [name for name in dir(dlbridge._native) if name.startswith("_") and not name.startswith("__") and callable(getattr(dlbridge._native, name))]
assert "_trust_table_for_tests" not in hooks and "_live_borrows" not in hooks, hooks
t = dlbridge.zeros((2, 3), "int32")
assert t.tolist() == [[0, 0, 0], [0, 0, 0]] and t.data_ptr % 64 == 0
assert dlbridge.from_dlpack(t).data_ptr == t.data_ptr
assert dlbridge.from_dlpack(t.__dlpack__(max_version=(1, 3))).data_ptr == t.data_ptr
b = dlbridge.asarray(bytearray(b"\x01\x02\x03\x04"))
assert (b.shape, str(b.dtype), b.readonly) == ((4,), "uint8", False) and bytes(memoryview(b)) == b"\x01\x02\x03\x04"
assert dlbridge.asarray(b"ab").readonly
assert pickle.loads(pickle.dumps(b, protocol=5)).tolist() == [1, 2, 3, 4]
assert copy.deepcopy(b).tolist() == [1, 2, 3, 4]
assert dlbridge.DType("bfloat16").itemsize == 2 and dlbridge.zeros(3, "float8_e4m3fn").nbytes == 3

# Shared memory registers with Python's resource tracker, a child process of this interpreter.
# Under qemu-user without binfmt_misc, the kernel cannot start an aarch64 interpreter: say so.
try:
    spawns = subprocess.run([sys.executable, "-c", "pass"], timeout=120).returncode == 0
except OSError:
    spawns = False
if spawns:
    s = dlbridge.empty(4, "float64", shared=True)
    assert s.is_shared and pickle.loads(pickle.dumps(s)).data_ptr == s.data_ptr
else:
    print("shared memory NOT checked: this interpreter cannot start itself (emulated without binfmt_misc)")
try:
    dlbridge.from_dlpack(object())
except TypeError:
    pass
else:
    raise AssertionError("from_dlpack(object()) did not raise TypeError")
print(f"dlbridge {dlbridge.__version__} from {dlbridge.__file__} imports and works")
