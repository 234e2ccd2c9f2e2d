//! Tensors in fresh device memory that dlbridge owns: what a kernel written
//! in Rust returns.

use super::buffers::{DeviceBuffer, Writers};
use super::in_context;
use crate::error::Error;
use crate::export::{export_raw, RawLayout};
use crate::streams::Stream;
use crate::view::TensorView;
use crate::{DataType, Device, DeviceType, OwnedTensor};

/// A C-contiguous tensor of `dtype` and `shape` in fresh memory of CUDA
/// device `device_id`, for kernels queued on `stream` to fill: from the
/// device's memory pool in that stream's order (`cuMemAllocAsync`), or from
/// `cuMemAlloc` where the device has no pools or `stream` is capturing a graph.
/// Use it on `stream`; work on another stream must first wait for `stream`.
///
/// Its contents are unspecified until written, as with `torch.empty`. Once
/// the kernels that fill it are queued, [`Empty::written_on`] gives the
/// tensor, ready on `stream`: its memory is freed when its deleter runs,
/// wherever the tensor went by then, in the legacy default stream's order
/// after the work queued on `stream` up to `written_on` (no host wait). The
/// tensor is writable and not IS_COPIED. Sub-byte types are packed.
///
/// Errors: [`Error::InvalidStream`] for [`Stream::NO_SYNC`] and 0, which are
/// no CUDA streams; [`Error::CudaUnavailable`] without a driver;
/// CUDA_ERROR_OUT_OF_MEMORY (a MemoryError in Python) or
/// CUDA_ERROR_INVALID_DEVICE; a negative or overflowing shape, as
/// [`zeros`](crate::zeros).
pub fn empty(dtype: DataType, shape: &[i64], device_id: i32, stream: Stream) -> Result<Empty, Error> {
    let stream = stream.value();
    if !DeviceType::CUDA.accepts_stream(stream) || stream == -1 {
        return Err(Error::InvalidStream { device: DeviceType::CUDA, stream });
    }
    let bytes = crate::buffer::packed_bytes(dtype, shape)?;
    // SAFETY: a `Stream` is 1, 2 or a handle its maker vouched for (`Stream::from_raw`).
    let buffer = unsafe { DeviceBuffer::new(device_id, bytes, stream) }?;
    let writers = buffer.writers.clone();
    let data = core::ptr::without_provenance_mut(buffer.ptr as usize);
    let layout = RawLayout { dtype, device: Device::cuda(device_id), shape, strides: None, byte_offset: 0 };
    // SAFETY: `bytes` of device memory that the buffer owns and frees, enough
    // for the row-major layout; the host never dereferences it, and nothing
    // else holds it.
    let tensor = unsafe { export_raw(buffer, data, layout, 0) }?;
    Ok(Empty { tensor, writers, device_id })
}

/// Fresh device memory from [`empty`], before its kernels are queued.
#[derive(Debug)]
pub struct Empty {
    tensor: OwnedTensor,
    writers: Writers,
    device_id: i32,
}

impl Empty {
    /// The view of the memory (device memory: never read on the host).
    pub fn view(&self) -> &TensorView<'_> {
        self.tensor.view()
    }

    /// The device address of element 0.
    pub fn device_ptr(&self) -> u64 {
        self.tensor.view().as_ptr() as u64
    }

    /// The device the memory is on.
    pub fn device_id(&self) -> i32 {
        self.device_id
    }

    /// The tensor, once the work that fills it is queued on `stream` (the
    /// stream given to [`empty`], or one ordered after it): its free waits for
    /// the work queued on `stream` so far (an event recorded there now; none
    /// for the legacy stream, which the free is ordered on, nor for a stream
    /// that captures a graph, whose work runs only with the graph). Work queued
    /// later, on any stream, is the tensor holder's to order.
    ///
    /// Errors: [`Error::InvalidStream`] for [`Stream::NO_SYNC`] and 0; the
    /// driver's, from recording the event (the tensor is then dropped, its
    /// memory freed after the legacy stream's work only).
    pub fn written_on(self, stream: Stream) -> Result<OwnedTensor, Error> {
        let stream = stream.value();
        if !DeviceType::CUDA.accepts_stream(stream) || stream == -1 {
            return Err(Error::InvalidStream { device: DeviceType::CUDA, stream });
        }
        in_context(self.device_id, |api| {
            // SAFETY: a `Stream` is 1, 2 or a handle its maker vouched for.
            if let Some(event) = unsafe { super::buffers::writer_event(api, stream) }? {
                self.writers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(event);
            }
            Ok(())
        })?;
        Ok(self.tensor)
    }
}
