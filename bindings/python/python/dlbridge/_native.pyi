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
DLPACK_VERSION: Tuple[int, int]
"""The DLPack ABI version dlbridge implements, (1, 3)."""

_Device: TypeAlias = Tuple[int, int]
"""(device_type, device_id), as `__dlpack_device__` returns: CPU is (1, 0), CUDA device 0 is (2, 0).
Stub-only: there is no such name at runtime."""

@final
class DType:
    """An element type. `str(dtype)` is the canonical name, and `dtype == "float32"` holds."""

    def __new__(cls, name: str) -> "DType":
        """Parses a canonical name such as "float32", "bfloat16", "float8_e4m3fn" or "float32x4"."""
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
    written through other views unless it is read-only."""

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
        """Element type."""
    @property
    def device(self) -> _Device:
        """Where the memory lives; equal to `__dlpack_device__()`."""
    @property
    def readonly(self) -> bool:
        """Whether the data may not be written: the producer set READ_ONLY, or could not say (a legacy
        capsule). See the README's "Writability"."""
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
        read-only tensor asked for a legacy capsule without copy=True raises BufferError."""
    def __dlpack_device__(self) -> _Device:
        """(device_type, device_id) of the memory."""
    __dlpack_c_exchange_api__: ClassVar[CapsuleType]
    """The DLPack 1.3 C exchange API: a "dlpack_exchange_api" capsule holding a static table shared by
    every tensor."""
    @property
    def __array_interface__(self) -> dict:
        """NumPy's array interface, version 3 (CPU-accessible memory only)."""
    @property
    def __cuda_array_interface__(self) -> dict:
        """The CUDA array interface, version 3 (CUDA memory only)."""
    # The buffer protocol (CPU only). Python shows it as these methods from 3.12 on (PEP 688); they
    # are declared for every version, as typeshed does for bytes, so that type checkers accept a
    # Tensor wherever a buffer is expected (memoryview(t), bytes(t)).
    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __release_buffer__(self, buffer: memoryview, /) -> None: ...
    def tolist(self) -> Any:
        """The elements as nested lists (CPU only)."""
    def copy(self) -> "Tensor":
        """A C-contiguous copy in fresh, 64-byte aligned memory that Rust owns."""
    def numpy(self) -> Any:
        """A NumPy array over this tensor's memory, zero-copy and as writable as the tensor; ml_dtypes
        types (bfloat16, float8, float6, float4, int4, ...) for the dtypes NumPy lacks (TypeError naming
        ml_dtypes when it is not installed). A packed sub-byte tensor is unpacked into a new array."""
    def share_memory(self) -> "Tensor":
        """A tensor with the same values in a shared-memory segment (this one if it already is), which
        pickles as a handle that another process maps."""
    @property
    def is_shared(self) -> bool:
        """Whether the data lives in a shared-memory segment that pickles as a handle."""
    def __reduce_ex__(self, protocol: SupportsIndex, /) -> Tuple[Any, ...]:
        """Pickle support: the bytes out of band with protocol 5, in band before; a handle when shared."""
    def __copy__(self) -> "Tensor":
        """New memory with the same values and writability (a new segment when shared)."""
    def __deepcopy__(self, memo: Any, /) -> "Tensor":
        """As __copy__: a tensor holds no Python objects."""
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
    BufferError for tensors that cannot be imported or unsupported devices."""

def asarray(obj: Any, /, *, copy: Optional[bool] = None) -> Tensor:
    """A tensor from DLPack, the buffer protocol (bytes, bytearray, memoryview, array.array, mmap),
    `__array_interface__` or `__cuda_array_interface__`, zero-copy unless copy=True."""

def empty(shape: Union[int, Sequence[int]], dtype: Union[None, str, DType] = None, *, shared: bool = False) -> Tensor:
    """A CPU tensor whose memory Rust owns (zero-filled), or with shared=True one in a shared-memory
    segment; dtype None means "float32"."""

def _rebuild_tensor(
    payload: Any, dtype: Union[str, DType], shape: Sequence[int], writability: str, padded: bool, origin: Any = None
) -> Tensor: ...

def zeros(shape: Union[int, Sequence[int]], dtype: Union[None, str, DType] = None) -> Tensor:
    """A zero-filled CPU tensor whose memory Rust owns; dtype None means "float32"."""
