"""Type stubs for dlbridge's native module. Everything here is re-exported by `dlbridge`."""

import sys
from typing import Any, ClassVar, Optional, Sequence, Tuple, SupportsIndex, Union, final

from typing_extensions import TypeAlias

if sys.version_info >= (3, 13):
    from types import CapsuleType
else:
    from typing_extensions import CapsuleType

__all__ = [
    "Tensor",
    "DType",
    "from_dlpack",
    "asarray",
    "empty",
    "zeros",
    "DLPACK_VERSION",
    "__version__",
]

__version__: str
"""The package's version, the same as the Rust crates' (Cargo.toml's `[workspace.package]`).

    >>> import importlib.metadata
    >>> dlbridge.__version__ == importlib.metadata.version("dlbridge")
    True
"""
DLPACK_VERSION: Tuple[int, int]
"""The DLPack ABI version dlbridge implements.

    >>> dlbridge.DLPACK_VERSION
    (1, 3)
"""

_Device: TypeAlias = Tuple[int, int]
"""(device_type, device_id), as `__dlpack_device__` returns: CPU is (1, 0), CUDA device 0 is (2, 0).
Stub-only: there is no such name at runtime."""

@final
class DType:
    """An element type. `str(dtype)` is the canonical name, and a dtype equals its name.

        >>> t = dlbridge.zeros(3, "bfloat16")
        >>> t.dtype
        dlbridge.DType('bfloat16')
        >>> t.dtype == "bfloat16", str(t.dtype)
        (True, 'bfloat16')
        >>> d = t.dtype
        >>> d.code, d.bits, d.lanes, d.itemsize      # kDLBfloat, 16 bits, one lane, 2 bytes
        (4, 16, 1, 2)
    """

    def __new__(cls, name: str) -> "DType":
        """Parses a canonical name such as "float32", "bfloat16", "float8_e4m3fn" or "float32x4";
        ValueError for any other.

            >>> d = dlbridge.DType("float32x4")
            >>> d.code, d.bits, d.lanes, d.itemsize
            (2, 32, 4, 16)
            >>> dlbridge.DType("float4_e2m1fn").itemsize is None
            True
        """
    @property
    def code(self) -> int:
        """The DLPack type code (kDLFloat is 2)."""
    @property
    def bits(self) -> int:
        """Bits of one lane."""
    @property
    def lanes(self) -> int:
        """Lanes per element; 1 for scalars."""
    @property
    def itemsize(self) -> Optional[int]:
        """Bytes per element; None for packed sub-byte types such as float4_e2m1fn."""
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class Tensor:
    """An n-dimensional tensor exchanged through DLPack. Immutable as an object; its data may be
    written through other views unless it is read-only.

    Made by `from_dlpack`, `asarray`, `zeros` and `empty`; taken by any DLPack consumer, the buffer
    protocol and NumPy's array interface.

        >>> import numpy as np
        >>> a = np.arange(6, dtype=np.float32).reshape(2, 3)
        >>> t = dlbridge.from_dlpack(a)
        >>> t
        Tensor(shape=(2, 3), dtype=float32, device=cpu:0)
        >>> t.shape, t.ndim, t.size, t.nbytes, t.strides, t.device, t.readonly, t.is_copied
        ((2, 3), 2, 6, 24, (3, 1), (1, 0), False, False)
        >>> t.dtype, len(t)
        (dlbridge.DType('float32'), 2)
        >>> t.data_ptr == a.ctypes.data
        True
        >>> np.from_dlpack(t)[1]
        array([3., 4., 5.], dtype=float32)
        >>> memoryview(t).tolist() == a.tolist()        # the buffer protocol
        True
    """

    @property
    def shape(self) -> Tuple[int, ...]:
        """Extent of each axis."""
    @property
    def ndim(self) -> int:
        """Number of axes."""
    @property
    def size(self) -> int:
        """Number of elements."""
    @property
    def nbytes(self) -> int:
        """Bytes the elements take when contiguous."""
    @property
    def strides(self) -> Tuple[int, ...]:
        """Stride of each axis, in elements (not bytes); always filled in."""
    @property
    def dtype(self) -> DType:
        """Element type, as a `DType`."""
    @property
    def device(self) -> _Device:
        """Where the memory lives; equal to `__dlpack_device__()`."""
    @property
    def readonly(self) -> bool:
        """Whether the data may not be written: the producer set READ_ONLY, or could not say (a legacy
        capsule). See the README's "Writability".

            >>> dlbridge.asarray(b"abc").readonly, dlbridge.asarray(bytearray(3)).readonly
            (True, False)
        """
    @property
    def is_copied(self) -> bool:
        """Whether the producer copied the data for this tensor (IS_COPIED)."""
    @property
    def data_ptr(self) -> int:
        """Address of element 0, with byte_offset applied."""
    def __dlpack__(
        self,
        *,
        stream: Optional[int] = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[_Device] = None,
        copy: Optional[bool] = None,
    ) -> CapsuleType:
        """Exports a DLPack capsule: legacy "dltensor" when max_version is None or below (1, 0), else
        "dltensor_versioned" at version 1.3. copy=True copies and sets IS_COPIED; copy=False never copies.
        A non-None stream on CPU raises ValueError; an unreachable dl_device raises BufferError; a
        read-only tensor asked for a legacy capsule without copy=True raises BufferError.
        Consumers call it for you (`np.from_dlpack(t)`, `torch.from_dlpack(t)`).

            >>> t = dlbridge.zeros(4)
            >>> t.__dlpack__(max_version=(1, 3))
            <capsule object "dltensor_versioned" at ...>
            >>> dlbridge.from_dlpack(t.__dlpack__()).data_ptr == t.data_ptr
            True
        """
    def __dlpack_device__(self) -> _Device:
        """(device_type, device_id) of the memory: (1, 0) is the CPU, (2, n) CUDA device n.

            >>> dlbridge.zeros(2).__dlpack_device__()
            (1, 0)
        """
    __dlpack_c_exchange_api__: ClassVar[CapsuleType]
    """The DLPack 1.3 C exchange API: a "dlpack_exchange_api" capsule holding a static table shared by
    every tensor, which C consumers (tvm-ffi, torch) call instead of `__dlpack__`.

        >>> dlbridge.Tensor.__dlpack_c_exchange_api__
        <capsule object "dlpack_exchange_api" at ...>
    """
    @property
    def __array_interface__(self) -> dict:
        """NumPy's array interface, version 3 (CPU-accessible memory only).

            >>> t = dlbridge.zeros((2, 3), "int32")
            >>> i = t.__array_interface__
            >>> i["shape"], i["typestr"], i["data"] == (t.data_ptr, False)
            ((2, 3), '<i4', True)
        """
    @property
    def __cuda_array_interface__(self) -> dict:
        """The CUDA array interface, version 3 (CUDA memory only: AttributeError for other memory, so
        that `hasattr` tells consumers which interface to use).

            >>> hasattr(dlbridge.zeros(1), "__cuda_array_interface__")
            False
        """
    # The buffer protocol (CPU only). Python shows it as these methods from 3.12 on (PEP 688); they
    # are declared for every version, as typeshed does for bytes, so that type checkers accept a
    # Tensor wherever a buffer is expected (memoryview(t), bytes(t)).
    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __release_buffer__(self, buffer: memoryview, /) -> None: ...
    def tolist(self) -> Any:
        """The elements as nested lists (CPU only).

            >>> import numpy as np
            >>> dlbridge.from_dlpack(np.arange(6, dtype=np.int16).reshape(2, 3)).tolist()
            [[0, 1, 2], [3, 4, 5]]
        """
    def copy(self) -> "Tensor":
        """A C-contiguous copy in fresh, 64-byte aligned memory that Rust owns.

            >>> import numpy as np
            >>> a = np.arange(6, dtype=np.float64).reshape(2, 3).T     # a transposed view
            >>> c = dlbridge.from_dlpack(a).copy()
            >>> c.strides, c.data_ptr % 64, c.tolist() == a.tolist()
            ((2, 1), 0, True)
        """
    def numpy(self) -> Any:
        """A NumPy array over this tensor's memory, zero-copy and as writable as the tensor; ml_dtypes
        types (bfloat16, float8, float6, float4, int4, ...) for the dtypes NumPy lacks (TypeError naming
        ml_dtypes when it is not installed). A packed sub-byte tensor is unpacked into a new array.

            >>> t = dlbridge.zeros(3, "bfloat16")
            >>> a = t.numpy()
            >>> str(a.dtype), a.ctypes.data == t.data_ptr
            ('bfloat16', True)
        """
    def share_memory(self) -> "Tensor":
        """A tensor with the same values in a shared-memory segment (this one if it already is), which
        pickles as a handle that another process maps.

            >>> import pickle
            >>> s = dlbridge.asarray(bytearray(b"abc")).share_memory()
            >>> s.is_shared, s.tolist()
            (True, [97, 98, 99])
            >>> len(pickle.dumps(s)) < 200     # a handle, not the bytes
            True
        """
    @property
    def is_shared(self) -> bool:
        """Whether the data lives in a shared-memory segment that pickles as a handle.

            >>> dlbridge.zeros(2).is_shared, dlbridge.empty(2, shared=True).is_shared
            (False, True)
        """
    def __reduce_ex__(self, protocol: SupportsIndex, /) -> Tuple[Any, ...]:
        """Pickle support: the bytes out of band with protocol 5, in band before; a handle when shared.

            >>> import pickle
            >>> t = dlbridge.asarray(bytearray(b"abc"))
            >>> buffers = []
            >>> data = pickle.dumps(t, protocol=5, buffer_callback=buffers.append)
            >>> len(buffers), pickle.loads(data, buffers=buffers).tolist()
            (1, [97, 98, 99])
        """
    def __copy__(self) -> "Tensor":
        """New memory with the same values and writability (a new segment when shared).

            >>> import copy
            >>> t = dlbridge.asarray(b"abc")
            >>> c = copy.copy(t)
            >>> c.data_ptr != t.data_ptr, c.tolist(), c.readonly
            (True, [97, 98, 99], True)
        """
    def __deepcopy__(self, memo: Any, /) -> "Tensor":
        """As __copy__: a tensor holds no Python objects.

            >>> import copy
            >>> copy.deepcopy(dlbridge.zeros(2)).tolist()
            [0.0, 0.0]
        """
    def _bytes(self) -> "Tensor": ...
    @property
    def _writability(self) -> str: ...
    @property
    def _subbyte_padded(self) -> bool: ...
    def __len__(self) -> int: ...

def from_dlpack(
    x: Any, /, *, device: Union[None, str, _Device] = None, copy: Optional[bool] = None, stream: Optional[int] = None
) -> Tensor:
    """A tensor from any object with `__dlpack__`, or from a raw "dltensor"/"dltensor_versioned" capsule
    (which is consumed). Asks for max_version=(1, 3) and falls back for older producers.

    device: None (keep), "cpu", or a (device_type, device_id) tuple.
    copy: None copies only if needed; True always gives fresh memory; False never copies and raises
    ValueError when a copy would be needed.
    stream: the consumer's stream for a producer on CUDA or ROCm, passed to its `__dlpack__`; None
    passes the legacy default stream (1 on CUDA, 0 on ROCm). A stream for a CPU tensor is a ValueError.

    Raises TypeError for objects without `__dlpack__`, ValueError for used or foreign capsules,
    BufferError for tensors that cannot be imported or unsupported devices.

        >>> import numpy as np
        >>> a = np.arange(4, dtype=np.int64)
        >>> t = dlbridge.from_dlpack(a)              # zero-copy
        >>> t.data_ptr == a.ctypes.data, t.tolist()
        (True, [0, 1, 2, 3])
        >>> c = dlbridge.from_dlpack(a, copy=True)   # fresh memory, flagged as copied
        >>> c.data_ptr != a.ctypes.data, c.is_copied
        (True, True)
        >>> dlbridge.from_dlpack([1, 2])
        Traceback (most recent call last):
            ...
        TypeError: ...
    """

def asarray(obj: Any, /, *, copy: Optional[bool] = None) -> Tensor:
    """A tensor from DLPack, the buffer protocol (bytes, bytearray, memoryview, array.array, mmap),
    `__array_interface__` or `__cuda_array_interface__`, zero-copy unless copy=True. A `Tensor` is
    returned as it is unless copy=True.

        >>> import array
        >>> t = dlbridge.asarray(array.array("d", [1.5, 2.5]))
        >>> t.dtype, t.shape, t.tolist()
        (dlbridge.DType('float64'), (2,), [1.5, 2.5])
        >>> dlbridge.asarray(b"ab").readonly                  # bytes are immutable
        True
    """

def empty(shape: Union[int, Sequence[int]], dtype: Union[None, str, DType] = None, *, shared: bool = False) -> Tensor:
    """A CPU tensor whose memory Rust owns (zero-filled), or with shared=True one in a shared-memory
    segment; dtype None means "float32".

        >>> t = dlbridge.empty((2, 2), "uint8", shared=True)
        >>> t.is_shared, t.tolist()
        (True, [[0, 0], [0, 0]])
    """

def _rebuild_tensor(
    payload: Any, dtype: Union[str, DType], shape: Sequence[int], writability: str, padded: bool, origin: Any = None
) -> Tensor: ...

def _ml_dtypes_type(dtype: Union[str, DType]) -> type: ...
def _shared_tensor(
    name: Optional[str], size: int, dtype: Union[str, DType], shape: Sequence[int], writability: str, padded: bool,
    fill: Any = None,
) -> Tensor: ...
def _shared_exit_sweep() -> None: ...

def zeros(shape: Union[int, Sequence[int]], dtype: Union[None, str, DType] = None) -> Tensor:
    """A zero-filled CPU tensor whose memory Rust owns, 64-byte aligned; dtype None means "float32".
    MemoryError when the memory cannot be had.

        >>> t = dlbridge.zeros((2, 3), "int32")
        >>> t.tolist(), t.data_ptr % 64
        ([[0, 0, 0], [0, 0, 0]], 0)
        >>> dlbridge.zeros(2).dtype
        dlbridge.DType('float32')
    """
