"""The DLPack ABI in ctypes: reading the capsules a library hands out (without consuming them), and
building managed tensors of any shape, flag or defect whose deleter calls are counted.

Nothing here imports dlbridge's native module: the checker must be able to judge dlbridge itself."""

import ctypes
import sysconfig
import threading
from dataclasses import dataclass
from typing import Optional

api = ctypes.pythonapi
for _name, _res, _args in [
    ("PyCapsule_GetName", ctypes.c_char_p, [ctypes.py_object]),
    ("PyCapsule_GetPointer", ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]),
    ("PyCapsule_IsValid", ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]),
    ("PyCapsule_SetName", ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]),
    ("PyCapsule_New", ctypes.py_object, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]),
]:
    _fn = getattr(api, _name, None)
    if _fn is not None:
        _fn.restype, _fn.argtypes = _res, _args

READ_ONLY, IS_COPIED, IS_SUBBYTE_TYPE_PADDED = 1, 2, 4
LEGACY, VERSIONED = "dltensor", "dltensor_versioned"
CPU_LIKE = {1, 3, 11, 13}  # CPU, CUDA host, ROCm host, CUDA managed: readable from Python
_NAMES: dict = {}  # capsule names must outlive their capsules: one buffer per name, for the process


def static_name(name):
    return _NAMES.setdefault(name, ctypes.create_string_buffer(name.encode()))


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


class ExchangeHeader(ctypes.Structure):
    pass


ExchangeHeader._fields_ = [("version", DLPackVersion), ("prev_api", ctypes.POINTER(ExchangeHeader))]
EXCHANGE_FUNCTIONS = ("managed_tensor_allocator", "managed_tensor_from_py_object_no_sync",
                      "managed_tensor_to_py_object_no_sync", "dltensor_from_py_object_no_sync", "current_work_stream")


class ExchangeAPI(ctypes.Structure):
    _fields_ = [("header", ExchangeHeader)] + [(n, ctypes.c_void_p) for n in EXCHANGE_FUNCTIONS]


# The exchange API's function types. Those that touch Python objects run with the GIL held
# (PYFUNCTYPE, which also raises the Python exception they set); the others may run without it.
SET_ERROR = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p)
ALLOCATOR = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(DLTensor), ctypes.POINTER(ctypes.c_void_p),
                             ctypes.c_void_p, SET_ERROR)
FROM_PY = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(ctypes.c_void_p))
TO_PY = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p))
DLTENSOR_FROM_PY = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(DLTensor))
STREAM = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p))


def capsule_name(obj):
    """The name of a PyCapsule, None for a nameless one; raises TypeError for anything else."""
    if type(obj).__name__ != "PyCapsule":
        raise TypeError(f"not a PyCapsule: {type(obj).__name__}")
    raw = api.PyCapsule_GetName(obj)
    return None if raw is None else raw.decode()


def capsule_pointer(capsule):
    name = capsule_name(capsule)
    return api.PyCapsule_GetPointer(capsule, None if name is None else name.encode())


@dataclass
class Snapshot:
    """Every field of one managed tensor, copied out (pointers as integers, arrays as lists)."""

    name: Optional[str]
    address: int
    versioned: bool
    version: Optional[tuple]
    flags: Optional[int]
    data: int
    byte_offset: int
    device: tuple
    ndim: int
    dtype: tuple
    shape: Optional[list]
    strides: Optional[list]
    deleter: int

    @property
    def start(self):
        return self.data + self.byte_offset

    def describe(self):
        kind = str(self.name)
        if self.versioned:
            kind += f" v{self.version[0]}.{self.version[1]} flags={self.flags}"
        return f"{kind} shape={self.shape} strides={self.strides} dtype={self.dtype} device={self.device}"


def snapshot_address(address, versioned, name=None, max_ndim=64):
    """Reads the managed tensor at `address`. Shape and strides are read only for 0 <= ndim <= max_ndim."""
    cls = DLManagedTensorVersioned if versioned else DLManagedTensor
    m = cls.from_address(address)
    t = m.dl_tensor
    n = t.ndim
    arrays = [None, None]
    if 0 <= n <= max_ndim:
        arrays = [[p[i] for i in range(n)] if p else None for p in (t.shape, t.strides)]
    deleter = ctypes.c_void_p.from_address(address + cls.deleter.offset).value or 0
    return Snapshot(name, address, versioned, (m.version.major, m.version.minor) if versioned else None,
                    int(m.flags) if versioned else None, t.data or 0, int(t.byte_offset),
                    (t.device.device_type, t.device.device_id), n, (t.dtype.code, t.dtype.bits, t.dtype.lanes),
                    arrays[0], arrays[1], deleter)


def snapshot(capsule):
    """A Snapshot of an unused DLPack capsule; ValueError for any other name."""
    name = capsule_name(capsule)
    if name not in (LEGACY, VERSIONED):
        raise ValueError(f"capsule is named {name!r}, not 'dltensor' or 'dltensor_versioned'")
    return snapshot_address(capsule_pointer(capsule), name == VERSIONED, name)


def itemsize(dtype):
    code, bits, lanes = dtype
    return (bits * lanes + 7) // 8


def row_major(shape):
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return strides[::-1]


def element_bytes(start, shape, strides, size):
    """Every element's bytes, in row-major order; strides in elements (None: row-major)."""
    strides = row_major(shape) if strides is None else strides
    out = []
    index = [0] * len(shape)
    count = 1
    for n in shape:
        count *= n
    for _ in range(count):
        offset = sum(i * s for i, s in zip(index, strides)) * size
        out.append(ctypes.string_at(start + offset, size))
        for axis in reversed(range(len(shape))):
            index[axis] += 1
            if index[axis] < shape[axis]:
                break
            index[axis] = 0
    return out


def values_of(snap):
    """The elements of a CPU-readable snapshot as bytes, row-major; None where memory is not readable."""
    if snap.device[0] not in CPU_LIKE or snap.ndim < 0 or (snap.shape is None and snap.ndim):
        return None
    shape = snap.shape or []
    if any(n < 0 for n in shape) or (not snap.data and all(shape)):
        return None
    return element_bytes(snap.start, shape, snap.strides, itemsize(snap.dtype))


class PyBuffer(ctypes.Structure):
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.POINTER(ctypes.c_ssize_t)),
                ("strides", ctypes.POINTER(ctypes.c_ssize_t)), ("suboffsets", ctypes.c_void_p),
                ("internal", ctypes.c_void_p)]


_get_buffer = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(PyBuffer), ctypes.c_int)(
    ("PyObject_GetBuffer", api))
_release_buffer = ctypes.PYFUNCTYPE(None, ctypes.POINTER(PyBuffer))(("PyBuffer_Release", api))
PyBUF_RECORDS_RO = 0x0010 | 0x0008 | 0x0004  # strides, nd, format


def buffer_layout(obj):
    """(address, shape, byte strides, itemsize, readonly, element bytes) through the buffer protocol."""
    view = PyBuffer()
    _get_buffer(obj, ctypes.byref(view), PyBUF_RECORDS_RO)
    try:
        shape = [view.shape[i] for i in range(view.ndim)] if view.shape else [view.len // max(view.itemsize, 1)]
        strides = [view.strides[i] for i in range(view.ndim)] if view.strides else None
        size = view.itemsize
        whole = strides is not None and all(s % size == 0 for s in strides)
        elem = [s // size for s in strides] if whole else None
        data = element_bytes(view.buf, shape, elem, size) if view.buf and (strides is None or whole) else []
        return view.buf or 0, shape, strides, size, bool(view.readonly), data
    finally:
        _release_buffer(ctypes.byref(view))


# --- building managed tensors -----------------------------------------------------------------

# The deleter we hand to consumers must work even when a consumer calls it with a Python exception
# set (a ctypes callback would then lose that exception, or crash). Py_IncRef is a C function that
# adds one to the first machine word of its argument: the version of a versioned struct, the data
# pointer of a legacy one, which no consumer may read once it has called the deleter. So the word's
# growth counts the calls. Where that does not hold (free-threaded builds), a ctypes callback counts.
_INCREF = ctypes.cast(api.Py_IncRef, ctypes.c_void_p).value
_C_COUNTER = not sysconfig.get_config_var("Py_GIL_DISABLED")


def _incref_counts(word):
    """Whether Py_IncRef adds exactly one to a word with this value (immortality checks may skip it)."""
    probe = ctypes.c_int64(word)
    DELETER(_INCREF)(ctypes.addressof(probe))
    return probe.value == word + 1


def _destructor(versioned):
    """The capsule destructor a C producer would write: calls the deleter while the name is unused."""
    name = (VERSIONED if versioned else LEGACY).encode()
    cls = DLManagedTensorVersioned if versioned else DLManagedTensor
    is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", api))
    get = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_GetPointer", api))

    # Raw pointers: the capsule is being freed and must not be touched as a Python object.
    @ctypes.PYFUNCTYPE(None, ctypes.c_void_p)
    def destructor(capsule):
        if is_valid(capsule, name):
            managed = cls.from_address(get(capsule, name))
            if managed.deleter:
                managed.deleter(ctypes.addressof(managed))

    return destructor


DESTRUCTORS = {True: _destructor(True), False: _destructor(False)}


class Managed:
    """A managed tensor over aligned ctypes memory, with every field settable, in capsules whose
    destructor calls the deleter as a C producer's would. `deleted` counts deleter calls.

    Memory starts at a 64-byte aligned `base` (JAX shares only aligned memory). `payload` is copied
    to base + payload_at (default: data_at + byte_offset); the tensor's data pointer is base + data_at."""

    ALIGN = 64

    def __init__(self, payload, shape, dtype=(2, 32, 1), strides=None, versioned=True, version=(1, 3), flags=0,
                 byte_offset=0, data_at=0, payload_at=None):
        payload_at = data_at + byte_offset if payload_at is None else payload_at
        size = max(payload_at + len(payload), data_at + byte_offset) + 2 * self.ALIGN
        self._raw = ctypes.create_string_buffer(size)
        raw = ctypes.addressof(self._raw)
        self.base = raw + (-raw % self.ALIGN)
        ctypes.memmove(self.base + payload_at, payload, len(payload))
        self.extent = (self.base, raw + size)
        self.versioned = versioned
        self.managed = (DLManagedTensorVersioned if versioned else DLManagedTensor)()
        self.address = ctypes.addressof(self.managed)
        self._shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        self._strides = None
        t = self.managed.dl_tensor
        t.data, t.device, t.ndim, t.dtype = self.base + data_at, DLDevice(1, 0), len(shape), DLDataType(*dtype)
        t.shape, t.byte_offset = self._shape, byte_offset
        if strides is not None:
            self.set_strides(strides)
        if versioned:
            self.managed.version, self.managed.flags = DLPackVersion(*version), flags
        self._python_deleter = DELETER(self._count)
        self._calls = 0
        # A consumer may free on any thread: counted under a lock (without a GIL, `+=` loses updates).
        self._calls_lock = threading.Lock()
        self._baseline = None
        self.capsules = []

    @property
    def tensor(self):
        return self.managed.dl_tensor

    def set_strides(self, strides):
        self._strides = (ctypes.c_int64 * max(len(strides), 1))(*strides)
        self.tensor.strides = self._strides

    def _count(self, _address):
        with self._calls_lock:
            self._calls += 1

    def _word(self):
        return ctypes.c_int64.from_address(self.address).value

    def arm(self):
        """Installs the counting deleter; call after the last field is set."""
        self._baseline = self._word()
        if _C_COUNTER and _incref_counts(self._baseline):
            self.managed.deleter = DELETER(_INCREF)
        else:
            self.managed.deleter = self._python_deleter
        return self

    @property
    def deleted(self):
        word_calls = self._word() - self._baseline if self._baseline is not None and self._uses_word() else 0
        return self._calls + word_calls

    def _uses_word(self):
        return ctypes.cast(self.managed.deleter, ctypes.c_void_p).value == _INCREF

    def capsule(self, name=None):
        if self._baseline is None:
            self.arm()
        name = name or (VERSIONED if self.versioned else LEGACY)
        capsule = api.PyCapsule_New(self.address, ctypes.addressof(static_name(name)),
                                    ctypes.cast(DESTRUCTORS[self.versioned], ctypes.c_void_p))
        self.capsules.append(capsule)
        return capsule

    def shares(self, address):
        return address is not None and self.extent[0] <= address < self.extent[1]

    def drop(self):
        """Lets go of the capsules: those still unused free the tensor through their destructor."""
        self.capsules.clear()

    def __del__(self):
        # An unused capsule's destructor reads this struct: it must go before the struct does
        self.drop()
