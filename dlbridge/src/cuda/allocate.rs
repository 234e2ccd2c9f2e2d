//! Tensors in fresh device memory that dlbridge owns: what a kernel written
//! in Rust returns.

use super::buffers::DeviceBuffer;
use crate::error::Error;
use crate::export::{export_raw, RawLayout};
use crate::{DataType, Device, OwnedTensor};

/// A C-contiguous tensor of `dtype` and `shape` in fresh memory of CUDA
/// device `device_id` (`cuMemAlloc`), freed (`cuMemFree`, in that device's
/// context) when its deleter runs, wherever the tensor went by then.
///
/// Its contents are unspecified until written, as with `torch.empty`: write
/// every element (a kernel on some stream) before handing it on, and hand it
/// on as ready on that stream. The memory may be used on any stream of the
/// device at once. The tensor is writable and not IS_COPIED. Sub-byte types
/// are packed.
///
/// Errors: [`Error::CudaUnavailable`] without a driver; `cuMemAlloc`'s
/// CUDA_ERROR_OUT_OF_MEMORY (a MemoryError in Python) or
/// CUDA_ERROR_INVALID_DEVICE; a negative or overflowing shape, as
/// [`zeros`](crate::zeros).
pub fn empty(dtype: DataType, shape: &[i64], device_id: i32) -> Result<OwnedTensor, Error> {
    let bytes = crate::buffer::packed_bytes(dtype, shape)?;
    let buffer = DeviceBuffer::new(device_id, bytes)?;
    let data = core::ptr::without_provenance_mut(buffer.ptr as usize);
    let layout = RawLayout { dtype, device: Device::cuda(device_id), shape, strides: None, byte_offset: 0 };
    // SAFETY: `bytes` of device memory that the buffer owns and frees, enough
    // for the row-major layout; the host never dereferences it, and nothing
    // else holds it.
    unsafe { export_raw(buffer, data, layout, 0) }
}
