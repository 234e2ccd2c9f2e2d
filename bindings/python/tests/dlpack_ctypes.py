"""The DLPack ABI in ctypes, for reading the capsules real libraries hand out and for building
malformed ones that no real library produces."""

import ctypes

pythonapi = ctypes.pythonapi
pythonapi.PyCapsule_GetName.restype = ctypes.c_char_p
pythonapi.PyCapsule_GetName.argtypes = [ctypes.py_object]
pythonapi.PyCapsule_GetPointer.restype = ctypes.c_void_p
pythonapi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
pythonapi.PyCapsule_IsValid.restype = ctypes.c_int
pythonapi.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
pythonapi.PyCapsule_New.restype = ctypes.py_object
pythonapi.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]

# Capsule names live as long as the process, as the spec requires.
_NAMES = {}

READ_ONLY = 1 << 0
IS_COPIED = 1 << 1


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", DELETER),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


def capsule_name(capsule):
    return pythonapi.PyCapsule_GetName(capsule).decode()


def read_capsule(capsule):
    """The managed struct inside an unused capsule, as a ctypes object (a view, not a copy)."""
    name = capsule_name(capsule)
    ptr = pythonapi.PyCapsule_GetPointer(capsule, name.encode())
    cls = DLManagedTensorVersioned if name == "dltensor_versioned" else DLManagedTensor
    return cls.from_address(ptr)


def shape_and_strides(tensor):
    n = tensor.ndim
    shape = None if not tensor.shape else [tensor.shape[i] for i in range(n)]
    strides = None if not tensor.strides else [tensor.strides[i] for i in range(n)]
    return shape, strides


class FakeProducer:
    """A hand-built managed tensor over a ctypes buffer, in a capsule whose destructor calls the
    deleter, as a C producer would. `deleted` counts deleter calls.

    Every field can be broken before `capsule()` is called, to make the malformed tensors that no
    real library sends."""

    # Keeps the capsule destructor alive for the whole process.
    _destructors = {}

    def __init__(self, values=(1.0, 2.0, 3.0, 4.0), shape=(2, 2), versioned=True, dtype=(2, 32, 1)):
        self.buffer = (ctypes.c_float * max(len(values), 1))(*values)
        self.shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        self.strides = None
        self.deleted = 0
        self.versioned = versioned
        self._deleter = DELETER(self._delete)
        cls = DLManagedTensorVersioned if versioned else DLManagedTensor
        self.managed = cls()
        if versioned:
            self.managed.version = DLPackVersion(1, 3)
        self.managed.deleter = self._deleter
        t = self.managed.dl_tensor
        t.data = ctypes.cast(self.buffer, ctypes.c_void_p)
        t.device = DLDevice(1, 0)
        t.ndim = len(shape)
        t.dtype = DLDataType(*dtype)
        t.shape = self.shape
        t.strides = None
        t.byte_offset = 0

    @property
    def tensor(self):
        return self.managed.dl_tensor

    def set_strides(self, strides):
        self.strides = (ctypes.c_int64 * max(len(strides), 1))(*strides)
        self.tensor.strides = self.strides

    def _delete(self, _ptr):
        self.deleted += 1

    def capsule(self, name=None):
        name = name or ("dltensor_versioned" if self.versioned else "dltensor")
        # The destructor frees the tensor only while the capsule has the standard unused name.
        key = self.versioned
        if key not in FakeProducer._destructors:
            FakeProducer._destructors[key] = _make_destructor(self.versioned)
        destructor = FakeProducer._destructors[key]
        # A capsule keeps a pointer to its name, so the name must outlive it.
        encoded = _NAMES.setdefault(name, ctypes.create_string_buffer(name.encode()))
        return pythonapi.PyCapsule_New(
            ctypes.addressof(self.managed), ctypes.addressof(encoded), ctypes.cast(destructor, ctypes.c_void_p)
        )


# Raw-pointer variants for use inside a capsule destructor: the capsule is being freed, so it must
# not be handled as a Python object (ctypes would take and drop a reference to it).
_is_valid_raw = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", pythonapi))
_get_pointer_raw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_GetPointer", pythonapi))


def _make_destructor(versioned):
    cls = DLManagedTensorVersioned if versioned else DLManagedTensor
    name = "dltensor_versioned" if versioned else "dltensor"

    @ctypes.PYFUNCTYPE(None, ctypes.c_void_p)
    def destructor(capsule):
        if _is_valid_raw(capsule, name.encode()):
            managed = cls.from_address(_get_pointer_raw(capsule, name.encode()))
            if managed.deleter:
                managed.deleter(ctypes.addressof(managed))

    return destructor
