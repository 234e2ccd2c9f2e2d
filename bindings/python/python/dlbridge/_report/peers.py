"""One small adapter per library: how it makes a case's object, takes in a dlbridge tensor, and
shows its values, data pointer and writability. Modules are imported inside the methods, so a
missing library costs nothing until its column runs (and it runs only if libs.probe found it).

The report's columns are PEERS; the conformance checker (dlbridge._check) uses the same adapters,
plus dlbridge itself and consumer-only libraries (CHECKABLE), to make arrays and to consume them."""

import dlbridge

from .cases import ML_DTYPES, dlbridge_source, source
from .libs import Unavailable, found


class Peer:
    name = ""
    producer = True  # makes arrays of its own
    consumer = True  # has a from_dlpack to put in a column
    in_subprocess = False  # can abort the process on a bad case: probed one case per child
    copies_unaligned = False  # copies sources not 64-byte aligned instead of sharing them

    def make(self, case):
        """The producer's own object holding the case's data."""
        raise NotImplementedError

    def consume(self, t):
        """The consumer's object for any DLPack producer `t`."""
        raise NotImplementedError

    def to_list(self, obj):
        """The values as nested Python lists, read through the library's own API."""
        raise NotImplementedError

    def data_ptr(self, obj):
        """Address of element 0, to tell zero-copy from copy; None if it cannot be known."""
        return dlbridge.from_dlpack(obj).data_ptr

    def writable(self, obj):
        """True, False, or None when the library does not say."""
        return None

    def special_arrays(self):
        """[(label, object)]: arrays peculiar to the library that its exports must treat alike on
        every path (the checker compares its C exchange API with __dlpack__ on them)."""
        return []


def _numpy_list(a):
    # ml_dtypes scalars compare fine, but float32 keeps 'wrong values' messages readable
    return (a.astype("float32") if a.dtype.name in ML_DTYPES else a).tolist()


class NumPy(Peer):
    name = "numpy"

    def make(self, case):
        import numpy as np

        a = source(case)
        if not isinstance(a, np.ndarray):
            raise Unavailable("no ml_dtypes")  # NumPy alone has no bfloat16 or float8
        return a

    def consume(self, t):
        import numpy as np

        # A dlbridge tensor becomes NumPy through its bridge, which gives ml_dtypes arrays for the
        # dtypes NumPy's own from_dlpack refuses (bfloat16, float8); the same array otherwise.
        if isinstance(t, dlbridge.Tensor):
            return t.numpy()
        return np.from_dlpack(t)

    def to_list(self, obj):
        return _numpy_list(obj)

    def data_ptr(self, obj):
        return obj.__array_interface__["data"][0]

    def writable(self, obj):
        return bool(obj.flags.writeable)


class Torch(Peer):
    name = "torch"

    def make(self, case):
        import torch

        return torch.from_dlpack(source(case, dlpack=True))

    def consume(self, t):
        import torch

        return torch.from_dlpack(t)

    def to_list(self, obj):
        return obj.tolist()

    def data_ptr(self, obj):
        return obj.data_ptr()

    def writable(self, obj):
        return True  # torch has no read-only tensors

    def special_arrays(self):
        import torch

        z = torch.tensor([1 + 2j, 3 - 1j])
        # __dlpack__ refuses all three: DLPack has no conjugate or negative bit, nor autograd
        return [("torch.tensor([1+2j, 3-1j]).conj()", z.conj()),
                ("torch.tensor([1+2j, 3-1j]).conj().imag (negative bit)", z.conj().imag),
                ("torch.ones(3, requires_grad=True)", torch.ones(3, requires_grad=True))]


class Jax(Peer):
    name = "jax"
    copies_unaligned = True

    def make(self, case):
        import jax.numpy as jnp

        return jnp.asarray(source(case))

    def consume(self, t):
        import jax.numpy as jnp

        return jnp.from_dlpack(t)

    def to_list(self, obj):
        import numpy as np

        return _numpy_list(np.asarray(obj))

    def data_ptr(self, obj):
        return obj.unsafe_buffer_pointer()

    def writable(self, obj):
        return False  # JAX arrays are immutable


class TvmFfi(Peer):
    name = "tvm_ffi"

    def make(self, case):
        import tvm_ffi

        return tvm_ffi.from_dlpack(source(case, dlpack=True))

    def consume(self, t):
        import tvm_ffi

        return tvm_ffi.from_dlpack(t)

    def to_list(self, obj):
        # tvm_ffi has no element access of its own: read through NumPy, or torch for the dtypes
        # NumPy cannot import (and where NumPy is missing)
        try:
            ml_dtype = str(obj.dtype) in ML_DTYPES
        except Exception:  # tvm_ffi cannot name complex dtypes, which NumPy reads fine
            ml_dtype = False
        readers = ["torch"] if ml_dtype else ["numpy", "torch"]
        for reader in (PEERS[name] for name in readers if found(name)):
            return reader.to_list(reader.consume(obj))
        raise Unavailable(f"no {' or '.join(readers)} to read tvm_ffi values")

    def data_ptr(self, obj):
        return obj.data_ptr()

    def writable(self, obj):
        return True


class TensorFlow(Peer):
    name = "tensorflow"
    in_subprocess = True  # aborts on misaligned data

    def make(self, case):
        import tensorflow as tf

        return tf.constant(source(case))

    def consume(self, t):
        import tensorflow as tf

        return tf.experimental.dlpack.from_dlpack(t.__dlpack__())

    def to_list(self, obj):
        return _numpy_list(obj.numpy())

    def data_ptr(self, obj):
        import tensorflow as tf

        return dlbridge.from_dlpack(tf.experimental.dlpack.to_dlpack(obj)).data_ptr

    def writable(self, obj):
        return False  # tf.Tensor is immutable


class CuPy(Peer):
    name = "cupy"

    def make(self, case):
        import cupy

        return cupy.asarray(source(case))

    def consume(self, t):
        import cupy

        return cupy.from_dlpack(t)

    def to_list(self, obj):
        return _numpy_list(obj.get())

    def data_ptr(self, obj):
        return obj.data.ptr

    def writable(self, obj):
        return True


class PyArrow(Peer):
    # Producer only, and every case is 0-d or 2-d; listed so the report says so rather than skip it.
    name = "pyarrow"
    consumer = False

    def make(self, case):
        raise Unavailable("pyarrow arrays are 1-d")

    def writable(self, obj):
        return False


class Dlbridge(Peer):
    # Not a report column (every report path goes through dlbridge), but checked like any library.
    name = "dlbridge"

    def make(self, case):
        try:
            return dlbridge_source(case)  # its own arrays, which need no NumPy
        except Unavailable:
            return dlbridge.from_dlpack(source(case, dlpack=True))

    def consume(self, t):
        return dlbridge.from_dlpack(t)

    def to_list(self, obj):
        return obj.tolist()

    def data_ptr(self, obj):
        return obj.data_ptr

    def writable(self, obj):
        return not obj.readonly


class Mpi4py(Peer):
    # A consumer only: MPI buffers take DLPack producers (after the buffer protocol).
    name = "mpi4py"
    producer = False

    def make(self, case):
        raise Unavailable("mpi4py makes no arrays")

    def consume(self, t):
        from mpi4py import MPI

        return MPI.buffer(t)

    def data_ptr(self, obj):
        return obj.address

    def writable(self, obj):
        return not obj.readonly


PEERS = {peer.name: peer for peer in (NumPy(), Torch(), Jax(), TvmFfi(), TensorFlow(), CuPy(), PyArrow())}
CHECKABLE = {**PEERS, "dlbridge": Dlbridge(), "mpi4py": Mpi4py()}
