"""dlbridge: DLPack tensors between NumPy, PyTorch, JAX, tvm-ffi and Rust, without copying.

    >>> import numpy as np, dlbridge
    >>> t = dlbridge.from_dlpack(np.arange(6, dtype=np.float32).reshape(2, 3))
    >>> t.shape, str(t.dtype), t.device
    ((2, 3), 'float32', (1, 0))
    >>> np.from_dlpack(t).sum()
    np.float32(15.0)
"""

from ._native import DLPACK_VERSION, DType, Tensor, __version__, _rebuild_tensor, asarray, empty, from_dlpack, zeros
from ._shared import cleanup_shared_memory, share_memory
from . import _engines

_engines.install()  # Tensor's serializers for Dask and Ray, registered when (if) they are imported

__all__ = [
    "DLPACK_VERSION",
    "DType",
    "Tensor",
    "__version__",
    "asarray",
    "cleanup_shared_memory",
    "empty",
    "from_dlpack",
    "share_memory",
    "zeros",
]
