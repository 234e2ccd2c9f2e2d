//! How a copy is laid out: a view's byte extent or a gather of its elements,
//! the layout and flags of the copy, and the 2-D copies a gather queues.

use core::ffi::c_uint;

use super::buffers::Memcpy2D;
use super::gather::{self, Gather};
use super::{check, stream_handle, DevicePtr};
use crate::error::Error;
use crate::export::RawLayout;
use crate::managed_abi::ManagedAbi;
use crate::view::TensorView;
use crate::{Device, DeviceType};

pub(super) const CU_MEMORYTYPE_HOST: c_uint = 1;
pub(super) const CU_MEMORYTYPE_DEVICE: c_uint = 2;
/// A gather of more 2-D copies than this copies the byte extent instead.
pub(super) const MAX_GATHER_COPIES: usize = 1024;

/// The byte extent of a view: its lowest byte and length, and element 0's offset in it.
pub(super) fn extent(view: &TensorView<'_>) -> (usize, usize, usize) {
    let range = view.byte_range();
    (range.start, range.len(), (view.as_ptr() as usize).wrapping_sub(range.start))
}

/// Whether the view's extent holds each element once and nothing else: a copy
/// of the extent is then compact, with no shared elements.
pub(super) fn is_dense(view: &TensorView<'_>) -> bool {
    view.is_non_overlapping() && view.byte_range().len() == view.nbytes()
}

/// Bytes per element as stored: the dtype's, or one for padded sub-byte data;
/// `None` for packed sub-byte data, which is only ever copied by its extent.
pub(super) fn element_bytes(view: &TensorView<'_>) -> Option<usize> {
    view.dtype().itemsize().or(view.is_subbyte_padded().then_some(1))
}

/// The gather of a thin view's elements, when it saves more than half the extent.
pub(super) fn thin_gather(view: &TensorView<'_>) -> Option<Gather> {
    let g = gather::plan(view.shape(), view.strides(), element_bytes(view)?, MAX_GATHER_COPIES)?;
    (g.len.saturating_mul(2) < view.byte_range().len()).then_some(g)
}

/// What is staged of `view` by a copy: `gather`'s compact buffer or the byte
/// extent, as (bytes, element strides there, element 0's byte offset there).
pub(super) fn staging(view: &TensorView<'_>, gather: Option<&Gather>) -> (usize, Vec<i64>, usize) {
    match (gather, element_bytes(view)) {
        (Some(g), Some(size)) => (g.len, g.strides.clone(), g.first * size),
        _ => {
            let (_, len, first) = extent(view);
            (len, view.strides().to_vec(), first)
        }
    }
}

pub(super) fn layout_of<'v>(view: &'v TensorView<'_>, device: Device) -> RawLayout<'v> {
    RawLayout { dtype: view.dtype(), device, shape: view.shape(), strides: Some(view.strides()), byte_offset: 0 }
}

/// The flags a copy of `view` carries: IS_SUBBYTE_TYPE_PADDED for padded
/// sub-byte data, which a legacy tensor cannot carry (refused then).
pub(super) fn padded_flags<M: ManagedAbi>(view: &TensorView<'_>) -> Result<u64, Error> {
    if !view.is_subbyte_padded() {
        return Ok(0);
    }
    if !M::VERSIONED {
        return Err(Error::UnsupportedDtype { dtype: view.dtype(), operation: "a legacy tensor, which cannot flag padding," });
    }
    Ok(crate::ffi::DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED)
}

pub(super) fn require_cuda(view: &TensorView<'_>) -> Result<(), Error> {
    match view.device().device_type {
        DeviceType::CUDA | DeviceType::CUDA_MANAGED => Ok(()),
        _ => Err(Error::NotOnCuda { device: view.device() }),
    }
}

/// Queues `g`'s 2-D copies from device memory at `src` (element 0) to `dst`
/// (host memory, or device memory when `to_device`) on `stream`.
///
/// # Safety
/// The source reaches the view's elements (the producer's promise), `dst`
/// holds `g.len` bytes, and `stream` is a live stream of the current context.
pub(super) unsafe fn queue_gather(api: &super::Api, g: &Gather, src: usize, dst: usize, to_device: bool, stream: i64) -> Result<(), Error> {
    for rows in &g.copies {
        let (to_host, to_dev) = (dst.wrapping_add(rows.dst), dst.wrapping_add(rows.dst));
        let copy = Memcpy2D {
            src_x_in_bytes: 0,
            src_y: 0,
            src_memory_type: CU_MEMORYTYPE_DEVICE,
            src_host: core::ptr::null(),
            src_device: src.wrapping_add_signed(rows.src) as DevicePtr,
            src_array: core::ptr::null_mut(),
            src_pitch: rows.src_pitch,
            dst_x_in_bytes: 0,
            dst_y: 0,
            dst_memory_type: if to_device { CU_MEMORYTYPE_DEVICE } else { CU_MEMORYTYPE_HOST },
            dst_host: if to_device { core::ptr::null_mut() } else { core::ptr::with_exposed_provenance_mut(to_host) },
            dst_device: if to_device { to_dev as DevicePtr } else { 0 },
            dst_array: core::ptr::null_mut(),
            dst_pitch: rows.dst_pitch,
            width_in_bytes: rows.width,
            height: rows.height,
        };
        // SAFETY: rows of the view's elements into the caller's buffer, on its stream.
        check("cuMemcpy2DAsync", unsafe { (api.memcpy_2d_async)(&copy, stream_handle(stream)) })?;
    }
    Ok(())
}

/// How a device copy is made.
pub(super) enum DeviceCopy {
    /// The byte extent, the layout kept: dense, or with gaps but no shared elements.
    Extent,
    /// The elements alone, into a compact layout.
    Gather(Gather),
    /// A broadcast, made contiguous on the host.
    ThroughHost,
}

pub(super) fn device_copy(view: &TensorView<'_>) -> DeviceCopy {
    if is_dense(view) {
        return DeviceCopy::Extent;
    }
    if let Some(g) = thin_gather(view).filter(|g| g.distinct) {
        return DeviceCopy::Gather(g);
    }
    if view.is_non_overlapping() {
        return DeviceCopy::Extent;
    }
    // Overlapping elements (a sliding window) get places of their own.
    match element_bytes(view).and_then(|size| gather::plan(view.shape(), view.strides(), size, MAX_GATHER_COPIES)) {
        Some(g) if g.distinct => DeviceCopy::Gather(g),
        _ => DeviceCopy::ThroughHost,
    }
}
