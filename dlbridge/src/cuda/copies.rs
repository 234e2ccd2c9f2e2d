//! Copies with the driver, into fresh device memory, page-locked host memory
//! (see `buffers.rs`) or ordinary host memory. Each copy is queued on the
//! stream the source's data is ready on.
//!
//! A copy moves the source's byte extent when that is compact (one copy, the
//! layout kept); a thin view is gathered element by element instead
//! ([`gather`](super::gather)), and a copy is never left with elements that
//! share memory (a broadcast is made contiguous), since copies are writable.

use core::ffi::c_void;

use super::buffers::{DeviceBuffer, PinnedBuffer};
use super::copy_plan::{device_copy, DeviceCopy, extent, is_dense, layout_of, padded_flags, queue_gather, require_cuda, staging, thin_gather};
use super::{awake_device, capturing, check, host_side, in_context, queue_on, stream_handle, wait_on_host, DevicePtr, LEGACY};
use crate::error::Error;
use crate::export::{export_raw, RawLayout};
use crate::ffi::DLManagedTensorVersioned;
use crate::managed_abi::ManagedAbi;
use crate::owned::Owned;
use crate::view::TensorView;
use crate::{Device, DeviceType};

/// A host copy of a CUDA tensor whose data is ready on stream `ready` (`None`:
/// the legacy default): copied on that stream, which is then waited for (a
/// host copy is complete when it returns). `pinned` puts it in page-locked
/// memory (device `cuda_host`), in a compact layout; otherwise it is made
/// C-contiguous in ordinary memory. A CPU-accessible source is copied on the
/// host, after its `ready` stream (for CUDA managed memory) is waited for.
/// IS_COPIED is set; a padded sub-byte tensor stays padded.
///
/// # Safety
/// `ready`, when given, is 1, 2 or the handle of a live stream of the view's device.
pub unsafe fn to_host<M: ManagedAbi>(view: &TensorView<'_>, ready: Option<i64>, pinned: bool) -> Result<Owned<M>, Error> {
    let padded = padded_flags::<M>(view)?;
    if view.device().is_cpu_accessible() {
        // The host reads it below.
        view.check_host_readable()?;
        if let (Some(ready), true) = (ready, view.device().device_type.has_streams()) {
            // A kernel may still be writing managed memory on that stream.
            // SAFETY: a stream the caller vouches for.
            unsafe { wait_on_host(view.device().device_id, ready) }?;
        }
        if !pinned {
            return crate::to_contiguous(view);
        }
        // Pinned memory of host data: in the context of a device already awake.
        let device_id = if view.device().device_type.has_streams() { view.device().device_id } else { awake_device(super::api()?) };
        return pinned_copy_of_host(view, device_id, padded);
    }
    require_cuda(view)?;
    let device_id = view.device().device_id;
    let stream = queue_on(ready);
    let gather = thin_gather(view);
    let (len, strides, first_byte) = staging(view, gather.as_ref());
    let copy_into = |dst: *mut u8| {
        in_context(device_id, |api| {
            if capturing(api, stream)? {
                return Err(Error::StreamCapture {
                    reason: format!("cannot copy to the host from stream {stream} while it captures a CUDA graph"),
                });
            }
            let (dst, start) = (dst as usize, extent(view).0);
            // A copy into pageable memory blocks until the stream reaches it: the
            // copies are blocking calls too.
            host_side(api, || {
                // SAFETY: `dst` has room for `len` bytes; the source is device
                // memory the view's producer vouched for; the stream is the one
                // its data is ready on, and is waited for before returning.
                unsafe {
                    match &gather {
                        Some(g) => queue_gather(api, g, view.as_ptr() as usize, dst, false, stream)?,
                        None => {
                            let to: *mut c_void = core::ptr::with_exposed_provenance_mut(dst);
                            check("cuMemcpyDtoHAsync", (api.memcpy_dtoh_async)(to, start as DevicePtr, len, stream_handle(stream)))?
                        }
                    }
                    check("cuStreamSynchronize", (api.stream_synchronize)(stream_handle(stream)))
                }
            })
        })
    };
    let layout = RawLayout { strides: Some(&strides), ..layout_of(view, Device::CPU) };
    if pinned {
        let buffer = PinnedBuffer::new(device_id, len)?;
        let base = buffer.ptr.as_ptr();
        if len > 0 {
            copy_into(base)?;
        }
        let layout = RawLayout { device: Device::new(DeviceType::CUDA_HOST, 0), ..layout };
        // SAFETY: the buffer holds the staged elements, element 0 at `first_byte`,
        // and is the owner; it is page-locked host memory, readable and writable.
        let staged: Owned<M> = unsafe { export_raw(buffer, base.wrapping_add(first_byte).cast(), layout, padded) }?;
        return compact_pinned(staged, device_id, padded);
    }
    // The copy writes every byte of the staged extent or gather: no zeroing first.
    // SAFETY: `copy_into` fills all `len` bytes before the buffer is exported
    // below; when it fails the buffer is dropped unread.
    let buffer = unsafe { crate::AlignedBuffer::uninit(len) }?;
    let base = buffer.base();
    if len > 0 {
        copy_into(base)?;
    }
    // SAFETY: as above, in ordinary memory that the buffer owns.
    let staged: Owned<M> = unsafe { export_raw(buffer, base.wrapping_add(first_byte).cast(), layout, padded) }?;
    let mut owned = if staged.view().is_c_contiguous() { staged } else { crate::to_contiguous(staged.view())? };
    owned.mark_copied();
    Ok(owned)
}

/// `staged`, pinned memory in any layout, as a pinned copy whose elements do
/// not share memory: as it is when dense, else made C-contiguous in fresh
/// pinned memory. IS_COPIED is set.
fn compact_pinned<M: ManagedAbi>(staged: Owned<M>, device_id: i32, padded: u64) -> Result<Owned<M>, Error> {
    let mut owned = if is_dense(staged.view()) { staged } else { pinned_copy_of_host(staged.view(), device_id, padded)? };
    owned.mark_copied();
    Ok(owned)
}

/// A pinned copy of CPU-accessible data: its extent when dense (the layout
/// kept), else C-contiguous. IS_COPIED is set.
fn pinned_copy_of_host<M: ManagedAbi>(view: &TensorView<'_>, device_id: i32, padded: u64) -> Result<Owned<M>, Error> {
    let contiguous;
    let (source, layout_view) = if is_dense(view) {
        (view, view)
    } else {
        contiguous = crate::to_contiguous::<DLManagedTensorVersioned>(view)?;
        (contiguous.view(), contiguous.view())
    };
    let (_, len, first) = extent(source);
    let buffer = PinnedBuffer::new(device_id, len)?;
    let base = buffer.ptr.as_ptr();
    if len > 0 {
        // SAFETY: the source's extent is readable host memory (validated), and
        // `base` has room for `len` bytes of a fresh, separate allocation.
        unsafe { core::ptr::copy_nonoverlapping(source.as_ptr().cast::<u8>().wrapping_sub(first), base, len) };
    }
    let layout = layout_of(layout_view, Device::new(DeviceType::CUDA_HOST, 0));
    // SAFETY: the buffer holds the whole extent, element 0 at `first`, and is the
    // owner; it is page-locked host memory, readable and writable.
    let mut owned: Owned<M> = unsafe { export_raw(buffer, base.wrapping_add(first).cast(), layout, padded) }?;
    owned.mark_copied();
    Ok(owned)
}

/// A CUDA copy, on `device_id`, of a CPU-accessible tensor: C-contiguous, in
/// memory dlbridge allocated and its deleter frees. Staged through pinned
/// buffers and queued on the legacy default stream (1), without waiting for
/// other work there: the copy is then ready on that stream, not complete.
/// IS_COPIED is set.
pub fn to_device<M: ManagedAbi>(view: &TensorView<'_>, device_id: i32) -> Result<Owned<M>, Error> {
    let padded = padded_flags::<M>(view)?;
    let contiguous;
    let view = if view.is_c_contiguous() {
        view
    } else {
        contiguous = crate::to_contiguous::<DLManagedTensorVersioned>(view)?;
        contiguous.view()
    };
    let bytes = view.try_as_bytes()?;
    // SAFETY: the legacy stream.
    let buffer = unsafe { DeviceBuffer::new(device_id, bytes.len(), LEGACY) }?;
    // SAFETY: the view's bytes into a fresh allocation of that size, on the stream it was made for.
    unsafe { upload(device_id, &buffer, bytes, LEGACY) }?;
    let data = core::ptr::without_provenance_mut(buffer.ptr as usize);
    let layout = RawLayout { strides: None, ..layout_of(view, Device::cuda(device_id)) };
    // SAFETY: device memory of the view's contiguous size, owned by the buffer;
    // the host never dereferences it.
    let mut owned: Owned<M> = unsafe { export_raw(buffer, data, layout, padded) }?;
    owned.mark_copied();
    Ok(owned)
}

/// Copies `bytes` to the start of `buffer` on `stream`, through the staging
/// buffers (without the GIL: the host copies and may wait for earlier pieces).
///
/// # Safety
/// `buffer` holds at least `bytes.len()` bytes and is usable on `stream`, 1, 2
/// or a live stream of `device_id`.
unsafe fn upload(device_id: i32, buffer: &DeviceBuffer, bytes: &[u8], stream: i64) -> Result<(), Error> {
    if bytes.is_empty() {
        return Ok(());
    }
    // Passed as an address: another thread may run while the copy blocks.
    let (dst, src, len) = (buffer.ptr, bytes.as_ptr() as usize, bytes.len());
    in_context(device_id, |api| {
        // SAFETY: the caller's promises, for the bytes the caller keeps alive.
        host_side(api, || unsafe { super::staging::upload(api, device_id, dst, src, len, stream) })?;
        // SAFETY: forwarded from the caller.
        unsafe { buffer.used_on(api, stream) }
    })
}

/// A copy of a CUDA tensor in fresh memory of the same kind on the same
/// device. Device memory is copied on `ready` (the stream its data is ready
/// on, which the copy is then ready on too), with no host synchronisation:
/// the extent with the same layout when dense, the elements gathered into a
/// compact layout when thin; a broadcast (whose copy must not share
/// elements) goes through host memory and is then queued on `ready` too.
/// Managed memory is copied by the host once the host has waited for
/// `ready`, into managed memory: the copy is then complete for any consumer,
/// host or device. IS_COPIED is set.
///
/// # Safety
/// As [`to_host`], for `ready`.
pub unsafe fn copy_on_device<M: ManagedAbi>(view: &TensorView<'_>, ready: Option<i64>) -> Result<Owned<M>, Error> {
    if view.device().device_type == DeviceType::CUDA_MANAGED {
        // SAFETY: forwarded from the caller.
        return unsafe { copy_managed(view, ready) };
    }
    require_cuda(view)?;
    let padded = padded_flags::<M>(view)?;
    let device_id = view.device().device_id;
    let gather = match device_copy(view) {
        DeviceCopy::Extent => None,
        DeviceCopy::Gather(g) => Some(g),
        // SAFETY: forwarded from the caller.
        DeviceCopy::ThroughHost => return unsafe { copy_through_host(view, ready, padded) },
    };
    let (len, strides, first_byte) = staging(view, gather.as_ref());
    let stream = queue_on(ready);
    // SAFETY: a stream the caller vouches for.
    let buffer = unsafe { DeviceBuffer::new(device_id, len, stream) }?;
    let dst = buffer.ptr;
    if len > 0 {
        in_context(device_id, |api| {
            // SAFETY: both sides are device memory (the source by the producer's
            // promise, the destination `len` fresh bytes, usable on `stream`), on
            // the stream the source is ready on; the free waits for the copy.
            unsafe {
                match &gather {
                    Some(g) => queue_gather(api, g, view.as_ptr() as usize, dst as usize, true, stream)?,
                    None => {
                        let (start, _, _) = extent(view);
                        check("cuMemcpyDtoDAsync", (api.memcpy_dtod_async)(dst, start as DevicePtr, len, stream_handle(stream)))?
                    }
                }
                buffer.used_on(api, stream)
            }
        })?;
    }
    let data = core::ptr::without_provenance_mut((dst as usize).wrapping_add(first_byte));
    let layout = RawLayout { strides: Some(&strides), ..layout_of(view, Device::cuda(device_id)) };
    // SAFETY: the buffer holds the copied elements, element 0 at `first_byte`.
    let mut owned: Owned<M> = unsafe { export_raw(buffer, data, layout, padded) }?;
    owned.mark_copied();
    Ok(owned)
}

/// [`copy_on_device`] through host memory: a compact host copy (complete when
/// it returns), then a staged copy to the device on the queue stream, ready there.
///
/// # Safety
/// As [`to_host`], for `ready`.
unsafe fn copy_through_host<M: ManagedAbi>(view: &TensorView<'_>, ready: Option<i64>, padded: u64) -> Result<Owned<M>, Error> {
    let device_id = view.device().device_id;
    let stream = queue_on(ready);
    // SAFETY: forwarded from the caller.
    let host: Owned<DLManagedTensorVersioned> = unsafe { to_host(view, ready, false) }?;
    let bytes = host.view().try_as_bytes()?;
    // SAFETY: a stream the caller vouches for.
    let buffer = unsafe { DeviceBuffer::new(device_id, bytes.len(), stream) }?;
    // SAFETY: the host copy's bytes into a fresh allocation of that size, usable on `stream`.
    unsafe { upload(device_id, &buffer, bytes, stream) }?;
    let layout = RawLayout { strides: None, ..layout_of(host.view(), Device::cuda(device_id)) };
    let data = core::ptr::without_provenance_mut(buffer.ptr as usize);
    // SAFETY: the buffer holds the C-contiguous host copy's bytes.
    let mut owned: Owned<M> = unsafe { export_raw(buffer, data, layout, padded) }?;
    owned.mark_copied();
    Ok(owned)
}

/// [`copy_on_device`] for managed memory.
///
/// # Safety
/// As [`to_host`], for `ready`.
unsafe fn copy_managed<M: ManagedAbi>(view: &TensorView<'_>, ready: Option<i64>) -> Result<Owned<M>, Error> {
    let padded = padded_flags::<M>(view)?;
    let device_id = view.device().device_id;
    if let Some(ready) = ready {
        // SAFETY: forwarded from the caller.
        unsafe { wait_on_host(device_id, ready) }?;
    }
    let contiguous;
    let view = if is_dense(view) {
        view
    } else {
        contiguous = crate::to_contiguous::<DLManagedTensorVersioned>(view)?;
        contiguous.view()
    };
    let (_, len, first) = extent(view);
    let buffer = DeviceBuffer::new_managed(device_id, len)?;
    // Managed memory comes from the driver as an address: exposed to Rust here.
    let dst: *mut u8 = core::ptr::with_exposed_provenance_mut(buffer.ptr as usize);
    if len > 0 {
        // SAFETY: the view's extent is host-readable managed memory (validated,
        // and waited for above) or a host copy of it; `dst` is a fresh
        // allocation of `len` bytes.
        unsafe { core::ptr::copy_nonoverlapping(view.as_ptr().cast::<u8>().wrapping_sub(first), dst, len) };
    }
    let device = Device::new(DeviceType::CUDA_MANAGED, device_id);
    // SAFETY: the buffer holds the whole extent, element 0 at `first`, and is the owner.
    let mut owned: Owned<M> = unsafe { export_raw(buffer, dst.wrapping_add(first).cast(), layout_of(view, device), padded) }?;
    owned.mark_copied();
    Ok(owned)
}
