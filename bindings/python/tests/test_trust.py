"""Impostors (attack class 7): each thing dlbridge trusts, forged by plain Python code, is not
trusted (dlbridge-pyo3/src/trust.rs has the table of who is trusted for what, and by what).
Everything that could crash runs in a child process."""

import subprocess
import sys
import textwrap

import pytest

import dlbridge

torch = pytest.importorskip("torch")


def child(code, env=None):
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, env=env)
    return proc.returncode, proc.stdout.strip(), proc.stderr


# A class that copies torch's exchange capsule and answers torch.Tensor from __class__, so that
# isinstance(x, torch.Tensor) holds and torch's C++ caster takes it for a THPVariable (review S1).
IMPOSTOR = """
import numpy as np, torch, dlbridge, scale_inplace
calls = []
class Impostor:
    __dlpack_c_exchange_api__ = {capsule}
    @property
    def __class__(self):
        return {answers}
    def __dlpack__(self, *args, **kwargs):
        calls.append("own __dlpack__")
        return self.array.__dlpack__(*args, **kwargs)
    def __dlpack_device__(self):
        return (1, 0)
    def __init__(self):
        self.array = np.arange(3, dtype=np.float32)
x = Impostor()
"""

# Each route in turn, in one child (a crash ends it: the lines it printed say how far it got).
ROUTES = """
print(dlbridge.from_dlpack(x).tolist(), calls, flush=True); calls.clear()
print(scale_inplace.total(x), calls, flush=True); calls.clear()
scale_inplace.scale(x, 2.0); print(x.array.tolist(), calls, flush=True)
"""
EXPECTED = ["[0.0, 1.0, 2.0] ['own __dlpack__']", "3.0 ['own __dlpack__']", "[0.0, 2.0, 4.0] ['own __dlpack__']"]


def test_a_class_with_torchs_capsule_goes_through_its_own_dlpack():
    # Before: exit status -11 in torch's pybind11 caster, for every route (dlbridge.from_dlpack, a
    # PyTensor and a PyTensorMut argument). NumPy and torch call the object's own __dlpack__; so
    # does dlbridge now: torch's table only for types with the static torch._C.TensorBase in their
    # real MRO.
    rc, out, err = child(IMPOSTOR.format(capsule="torch.Tensor.__dlpack_c_exchange_api__", answers="torch.Tensor") + ROUTES)
    assert (rc, out.splitlines()) == (0, EXPECTED), err


def test_a_class_with_dlbridges_capsule_goes_through_its_own_dlpack():
    # dlbridge's own table takes exact dlbridge.Tensor objects only, whatever __class__ says.
    rc, out, err = child(IMPOSTOR.format(capsule="dlbridge.Tensor.__dlpack_c_exchange_api__", answers="dlbridge.Tensor") + ROUTES)
    assert (rc, out.splitlines()) == (0, EXPECTED), err


def test_a_heap_type_publishing_a_table_is_asked_through_its_dlpack():
    # A table on a class Python code made could have been copied from anywhere: only a static
    # type's table is used, so the class's own __dlpack__ decides (here: read-only).
    code = IMPOSTOR.format(capsule="torch.Tensor.__dlpack_c_exchange_api__", answers="object.__class__.__get__(self)") + """
class ReadOnly(Impostor):
    def __dlpack__(self, *args, **kwargs):
        calls.append("own __dlpack__")
        self.array.flags.writeable = False
        return self.array.__dlpack__(*args, **kwargs)
t = dlbridge.from_dlpack(ReadOnly())
print(t.readonly, calls)
try:
    scale_inplace.scale(ReadOnly(), 2.0)
except BufferError as e:
    print("refused" if "read-only" in str(e) else e)
"""
    rc, out, err = child(code)
    assert rc == 0, err
    assert out.splitlines() == ["True ['own __dlpack__']", "refused"]


# A heap subclass of a static type that publishes a table and defines __dlpack__ (tvm-ffi's test
# wrapper), whose metaclass answers another capsule for the class attribute (review finding 1).
METACLASS_CAPSULE = """
import ctypes
import numpy as np, torch, tvm_ffi, dlbridge
from tvm_ffi.core import DLTensorTestWrapper
calls = []
FROM = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
@FROM
def from_py(obj, out):
    calls.append("from_py_object")
    return -1
class API(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("prev", ctypes.c_void_p),
                ("alloc", ctypes.c_void_p), ("from_py", FROM), ("to_py", ctypes.c_void_p),
                ("fill", ctypes.c_void_p), ("stream", ctypes.c_void_p)]
api = API(1, 3, None, None, from_py, None, None, None)
new_capsule = ctypes.pythonapi.PyCapsule_New
new_capsule.restype = ctypes.py_object
new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
capsules = {"counting": new_capsule(ctypes.addressof(api), b"dlpack_exchange_api", None),
            "torch": torch.Tensor.__dlpack_c_exchange_api__}
class Meta(type):
    @property
    def __dlpack_c_exchange_api__(cls):
        calls.append("metaclass property")
        return capsules[CAPSULE]
class Wrapper(DLTensorTestWrapper, metaclass=Meta):
    @property
    def __class__(self):
        return torch.Tensor
x = Wrapper(tvm_ffi.from_dlpack(np.arange(4, dtype=np.float32)))
print(dlbridge.from_dlpack(x).tolist(), calls)
"""


@pytest.mark.parametrize("capsule", ["counting", "torch"])
def test_a_metaclass_cannot_answer_another_capsule_for_a_static_publisher(capsule):
    # Before: dlbridge read the capsule with an attribute lookup, which the metaclass answers, and
    # handed tvm-ffi's object to the answered table (a counting one was called; torch's reads it
    # as a THPVariable). Now the capsule is read from the static publisher's own dict.
    pytest.importorskip("tvm_ffi")
    rc, out, err = child(f"CAPSULE = {capsule!r}\n" + METACLASS_CAPSULE)
    assert (rc, out) == (0, "[0.0, 1.0, 2.0, 3.0] []"), err


def test_a_table_written_into_a_static_types_dict_from_python_is_not_trusted():
    # gc.get_referents hands Python code a static type's real dict: tvm-ffi's test table and a
    # __dlpack__ written into object's made every plain object a "static publisher's" instance
    # (a segfault in tvm-ffi's table). A static type vouches only for a table its own library made.
    pytest.importorskip("tvm_ffi")
    rc, out, err = child("""
        import gc, tvm_ffi.core as core, dlbridge
        class Plain:
            pass
        real = gc.get_referents(object.__dict__)[0]
        real["__dlpack__"] = lambda self, **kwargs: None
        real["__dlpack_c_exchange_api__"] = core.DLTensorTestWrapper.__dict__["__dlpack_c_exchange_api__"]
        try:
            dlbridge.from_dlpack(Plain())
        except Exception as e:
            print(type(e).__name__)
    """)
    assert (rc, out) == (0, "TypeError"), err


def test_torch_tensors_still_use_torchs_table():
    # The real thing keeps its fast path: torch's __dlpack__ is not called for a plain tensor.
    rc, out, err = child("""
        import torch, dlbridge
        calls = []
        original = torch.Tensor.__dlpack__
        def counting(self, *args, **kwargs):
            calls.append(1)
            return original(self, *args, **kwargs)
        torch.Tensor.__dlpack__ = counting
        x = torch.arange(4, dtype=torch.float32)
        t = dlbridge.from_dlpack(x)
        print(t.data_ptr == x.data_ptr(), t.tolist(), len(calls))
    """)
    assert rc == 0, err
    assert out == "True [0.0, 1.0, 2.0, 3.0] 0"


# A package table of another build in the interpreter's state dict, before the package loads:
# what an older package (ABI 1, a Described without the field that moved) would leave there.
OTHER_PACKAGE = """
import ctypes
api = ctypes.pythonapi
api.PyInterpreterState_Get.restype = ctypes.c_void_p
api.PyInterpreterState_GetDict.restype = ctypes.c_void_p
api.PyInterpreterState_GetDict.argtypes = [ctypes.c_void_p]
interpreter_dict = ctypes.cast(api.PyInterpreterState_GetDict(api.PyInterpreterState_Get()), ctypes.py_object).value
class Table(ctypes.Structure):
    _fields_ = [("abi_major", ctypes.c_uint32), ("size", ctypes.c_uint32), ("adopt", ctypes.c_void_p), ("describe", ctypes.c_void_p)]
table = Table({major}, ctypes.sizeof(Table) + 64)
api.PyCapsule_New.restype = ctypes.py_object
api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
name = ctypes.c_char_p(b"dlbridge.package_tensor_api")
interpreter_dict["dlbridge.package_tensor_api"] = api.PyCapsule_New(ctypes.addressof(table), name, None)
import numpy as np, dlbridge, scale_inplace
t = dlbridge.zeros(4000, "int4").copy()
r = scale_inplace.arange(3)
print(type(r) is dlbridge.Tensor, r.tolist(), scale_inplace.total(dlbridge.asarray(np.ones(5, np.float32))))
"""


@pytest.mark.parametrize("major", [1, 99])
def test_the_package_table_of_another_build_is_not_used(major):
    # The package's table is found in the interpreter's state dict, where only C code puts
    # anything, and only of this ABI major: an extension then returns its own class and reads
    # package tensors through __dlpack__, never through a table of another layout (review S5:
    # an extension read 4,000 bytes of a 2,000-byte tensor).
    rc, out, err = child(OTHER_PACKAGE.format(major=major))
    assert rc == 0, err
    assert out == "False [0.0, 1.0, 2.0] 5.0"


def test_the_package_table_is_not_a_module_attribute():
    # A module attribute is a name Python code rebinds (to another build's capsule, say).
    assert not hasattr(dlbridge._native, "_TENSOR_API")
