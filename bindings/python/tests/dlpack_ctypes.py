"""The DLPack ABI in ctypes for the tests: the package's own definitions (dlbridge._check.abi, which
the conformance checker uses), and FakeProducer, a managed tensor of float values whose every field
a test can break, in capsules whose destructor calls the deleter as a C producer's would."""

import ctypes

from dlbridge._check.abi import (  # noqa: F401 (re-exported for the tests)
    DELETER,
    IS_COPIED,
    READ_ONLY,
    DLDataType,
    DLDevice,
    DLManagedTensor,
    DLManagedTensorVersioned,
    DLPackVersion,
    DLTensor,
    Managed,
    capsule_name,
)
from dlbridge._check.abi import api as pythonapi  # noqa: F401


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


class FakeProducer(Managed):
    """The package's `Managed` tensor over float32 `values`, with its deleter installed at once
    (so a test may replace it, or break any field, before taking a capsule). `buffer` is the values as a ctypes array;
    `shape` and `strides` are the arrays the tensor points at."""

    def __init__(self, values=(1.0, 2.0, 3.0, 4.0), shape=(2, 2), versioned=True, dtype=(2, 32, 1)):
        payload = bytes((ctypes.c_float * max(len(values), 1))(*values))
        super().__init__(payload, shape, dtype=dtype, versioned=versioned)
        self.buffer = (ctypes.c_float * max(len(values), 1)).from_address(self.base)
        # The Python counting deleter, installed now: a test may then replace it (NULL) or break
        # any field, the version included, before taking a capsule.
        self.managed.deleter = self._python_deleter
        self._baseline = self._word()

    @property
    def shape(self):
        return self._shape

    @property
    def strides(self):
        return self._strides

    def capsule(self, name=None):
        """A new capsule that only the caller holds: it is freed (and its destructor runs) when the
        caller drops it, as a C producer's would be."""
        capsule = super().capsule(name)
        self.capsules.remove(capsule)
        return capsule
