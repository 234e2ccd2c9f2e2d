//! Copies with the driver: fresh device memory and page-locked host memory
//! (each freed by its owner's `Drop`, in the right context), and the copies
//! between them and ordinary host memory. Each copy is queued on the stream
//! the source's data is ready on.

use core::ffi::c_uint;
use core::ptr::NonNull;

use super::{check, in_context, queue_on, wait_on_host, DevicePtr};
use crate::error::Error;
use crate::export::{export_raw, RawLayout};
use crate::owned::{ManagedAbi, Owned};
use crate::view::TensorView;
use crate::{Device, DeviceType};

/// Device memory from `cuMemAlloc`, freed in its device's context.
struct DeviceBuffer {
    ptr: DevicePtr,
    device_id: i32,
}

/// `CU_MEM_ATTACH_GLOBAL`: managed memory any stream may reach.
const CU_MEM_ATTACH_GLOBAL: c_uint = 1;

impl DeviceBuffer {
    fn new(device_id: i32, len: usize) -> Result<Self, Error> {
        in_context(device_id, |api| {
            let mut ptr = 0;
            // SAFETY: an allocation with a writable out pointer.
            check("cuMemAlloc", unsafe { (api.mem_alloc)(&mut ptr, len.max(1)) })?;
            Ok(DeviceBuffer { ptr, device_id })
        })
    }

    /// Managed memory (`cuMemAllocManaged`), readable and writable from the
    /// host as from the device; freed by `cuMemFree` as well.
    fn new_managed(device_id: i32, len: usize) -> Result<Self, Error> {
        in_context(device_id, |api| {
            let mut ptr = 0;
            // SAFETY: an allocation with a writable out pointer.
            check("cuMemAllocManaged", unsafe { (api.mem_alloc_managed)(&mut ptr, len.max(1), CU_MEM_ATTACH_GLOBAL) })?;
            Ok(DeviceBuffer { ptr, device_id })
        })
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let ptr = self.ptr;
        // SAFETY: allocated by `new` on this device, freed once.
        let _ = in_context(self.device_id, |api| check("cuMemFree", unsafe { (api.mem_free)(ptr) }));
    }
}

/// Page-locked host memory from `cuMemAllocHost`, which copies at full link
/// speed; allocated and freed with a device's context current, as the driver
/// requires.
struct PinnedBuffer {
    ptr: NonNull<u8>,
    device_id: i32,
}

// SAFETY: plain host memory owned by this value alone.
unsafe impl Send for PinnedBuffer {}

impl PinnedBuffer {
    fn new(device_id: i32, len: usize) -> Result<Self, Error> {
        in_context(device_id, |api| {
            let mut ptr = core::ptr::null_mut();
            // SAFETY: an allocation with a writable out pointer.
            check("cuMemAllocHost", unsafe { (api.mem_alloc_host)(&mut ptr, len.max(1)) })?;
            let ptr = NonNull::new(ptr.cast()).ok_or(Error::AllocationFailed { bytes: len })?;
            Ok(PinnedBuffer { ptr, device_id })
        })
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        let ptr = self.ptr.as_ptr().cast();
        // SAFETY: allocated by `new`, freed once.
        let _ = in_context(self.device_id, |api| check("cuMemFreeHost", unsafe { (api.mem_free_host)(ptr) }));
    }
}

/// The byte extent of a view: its lowest byte and length, and element 0's offset in it.
fn extent(view: &TensorView<'_>) -> (usize, usize, usize) {
    let range = view.byte_range();
    (range.start, range.len(), (view.as_ptr() as usize).wrapping_sub(range.start))
}

fn layout_of<'v>(view: &'v TensorView<'_>, device: Device) -> RawLayout<'v> {
    RawLayout { dtype: view.dtype(), device, shape: view.shape(), strides: Some(view.strides()), byte_offset: 0 }
}

/// The flags a copy of `view` carries: IS_SUBBYTE_TYPE_PADDED for padded
/// sub-byte data, which a legacy tensor cannot carry (refused then).
fn padded_flags<M: ManagedAbi>(view: &TensorView<'_>) -> Result<u64, Error> {
    if !view.is_subbyte_padded() {
        return Ok(0);
    }
    if !M::VERSIONED {
        return Err(Error::UnsupportedDtype { dtype: view.dtype(), operation: "a legacy tensor, which cannot flag padding," });
    }
    Ok(crate::ffi::DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED)
}

fn require_cuda(view: &TensorView<'_>) -> Result<(), Error> {
    match view.device().device_type {
        DeviceType::CUDA | DeviceType::CUDA_MANAGED => Ok(()),
        _ => Err(Error::NotOnCuda { device: view.device() }),
    }
}

/// A host copy of a CUDA tensor whose data is ready on stream `ready` (`None`:
/// the legacy default): the byte extent is copied on that stream, which is
/// then waited for (a host copy must be complete when it returns). `pinned`
/// puts it in page-locked memory (device `cuda_host`), keeping the layout;
/// otherwise the copy is made C-contiguous in ordinary memory. A
/// CPU-accessible source is copied on the host, after its `ready` stream (for
/// CUDA managed memory) is waited for. IS_COPIED is set; a padded sub-byte
/// tensor stays padded.
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
    } else {
        require_cuda(view)?;
    }
    let (start, len, first) = extent(view);
    let stream = queue_on(ready);
    let copy_into = |dst: *mut u8| {
        if view.device().is_cpu_accessible() {
            // SAFETY: the view's extent is readable host memory (validated), and
            // `dst` has room for `len` bytes of a fresh, separate allocation.
            unsafe { core::ptr::copy_nonoverlapping(view.as_ptr().cast::<u8>().wrapping_sub(first), dst, len) };
            return Ok(());
        }
        in_context(view.device().device_id, |api| {
            // SAFETY: `dst` has room for `len` bytes; the source extent is
            // device memory the view's producer vouched for; the stream is the
            // one its data is ready on, and is waited for before returning.
            unsafe {
                check("cuMemcpyDtoHAsync", (api.memcpy_dtoh_async)(dst.cast(), start as DevicePtr, len, stream))?;
                check("cuStreamSynchronize", (api.stream_synchronize)(stream))
            }
        })
    };
    let mut owned: Owned<M> = if pinned {
        // A CUDA source's own device; host memory has none, so device 0's context.
        let context = if view.device().device_type.has_streams() { view.device().device_id } else { 0 };
        let buffer = PinnedBuffer::new(context, len)?;
        let base = buffer.ptr.as_ptr();
        if len > 0 {
            copy_into(base)?;
        }
        let device = Device::new(DeviceType::CUDA_HOST, 0);
        // SAFETY: the buffer holds the whole extent, element 0 at `first`, and
        // is the owner; it is page-locked host memory, readable and writable.
        unsafe { export_raw(buffer, base.wrapping_add(first).cast(), layout_of(view, device), padded) }?
    } else {
        let mut buffer = crate::AlignedBuffer::zeroed(len)?;
        let base = buffer.as_mut_slice().as_mut_ptr();
        if len > 0 {
            copy_into(base)?;
        }
        // SAFETY: as above, in ordinary memory that the buffer owns.
        let staged: Owned<M> = unsafe { export_raw(buffer, base.wrapping_add(first).cast(), layout_of(view, Device::CPU), padded) }?;
        if staged.view().is_c_contiguous() {
            staged
        } else {
            crate::to_contiguous(staged.view())?
        }
    };
    owned.mark_copied();
    Ok(owned)
}

/// A CUDA copy, on `device_id`, of a CPU-accessible tensor: C-contiguous, in
/// memory dlbridge allocated and its deleter frees. The copy is complete when
/// this returns. IS_COPIED is set.
pub fn to_device<M: ManagedAbi>(view: &TensorView<'_>, device_id: i32) -> Result<Owned<M>, Error> {
    let padded = padded_flags::<M>(view)?;
    let contiguous;
    let view = if view.is_c_contiguous() {
        view
    } else {
        contiguous = crate::to_contiguous::<crate::ffi::DLManagedTensorVersioned>(view)?;
        contiguous.view()
    };
    let bytes = view.try_as_bytes()?;
    let buffer = DeviceBuffer::new(device_id, bytes.len())?;
    let ptr = buffer.ptr;
    if !bytes.is_empty() {
        // SAFETY: `bytes.len()` readable host bytes into a fresh allocation of that size.
        in_context(device_id, |api| check("cuMemcpyHtoD", unsafe { (api.memcpy_htod)(ptr, bytes.as_ptr().cast(), bytes.len()) }))?;
    }
    let layout = RawLayout { strides: None, ..layout_of(view, Device::cuda(device_id)) };
    // SAFETY: device memory of the view's contiguous size, owned by the buffer;
    // the host never dereferences it.
    let mut owned: Owned<M> = unsafe { export_raw(buffer, core::ptr::without_provenance_mut(ptr as usize), layout, padded) }?;
    owned.mark_copied();
    Ok(owned)
}

/// A copy of a CUDA tensor in fresh memory of the same kind on the same
/// device, with the same layout. Device memory is copied on `ready` (the
/// stream its data is ready on, which the copy is then ready on too), with no
/// host synchronisation. Managed memory is copied by the host once the host
/// has waited for `ready`, into managed memory: the copy is then complete for
/// any consumer, host or device. IS_COPIED is set.
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
    let (start, len, first) = extent(view);
    let device_id = view.device().device_id;
    let buffer = DeviceBuffer::new(device_id, len)?;
    let dst = buffer.ptr;
    if len > 0 {
        let stream = queue_on(ready);
        in_context(device_id, |api| {
            // SAFETY: both extents are `len` bytes of device memory (the source by
            // the producer's promise), on the stream the source is ready on.
            let code = unsafe { (api.memcpy_dtod_async)(dst, start as DevicePtr, len, stream) };
            check("cuMemcpyDtoDAsync", code)
        })?;
    }
    let data = core::ptr::without_provenance_mut((dst as usize).wrapping_add(first));
    // SAFETY: the buffer holds the whole extent, element 0 at `first`.
    let mut owned: Owned<M> = unsafe { export_raw(buffer, data, layout_of(view, Device::cuda(device_id)), padded) }?;
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
    let (_, len, first) = extent(view);
    let buffer = DeviceBuffer::new_managed(device_id, len)?;
    // Managed memory comes from the driver as an address: exposed to Rust here.
    let dst: *mut u8 = core::ptr::with_exposed_provenance_mut(buffer.ptr as usize);
    if len > 0 {
        // SAFETY: the view's extent is host-readable managed memory (validated,
        // and waited for above); `dst` is a fresh allocation of `len` bytes.
        unsafe { core::ptr::copy_nonoverlapping(view.as_ptr().cast::<u8>().wrapping_sub(first), dst, len) };
    }
    let device = Device::new(DeviceType::CUDA_MANAGED, device_id);
    // SAFETY: the buffer holds the whole extent, element 0 at `first`, and is the owner.
    let mut owned: Owned<M> = unsafe { export_raw(buffer, dst.wrapping_add(first).cast(), layout_of(view, device), padded) }?;
    owned.mark_copied();
    Ok(owned)
}
