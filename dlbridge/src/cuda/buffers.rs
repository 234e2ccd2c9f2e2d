//! Memory the driver allocates for copies: device (or managed) memory and
//! page-locked host memory, each freed by its owner's `Drop` in the context it
//! was allocated in; and the driver's 2-D copy description.

use core::ffi::{c_uint, c_void};
use core::ptr::NonNull;

use super::{check, host_side, in_context, DevicePtr};
use crate::error::Error;

/// `CU_MEM_ATTACH_GLOBAL`: managed memory any stream may reach.
const CU_MEM_ATTACH_GLOBAL: c_uint = 1;

/// `CUDA_MEMCPY2D`.
#[repr(C)]
pub(super) struct Memcpy2D {
    pub(super) src_x_in_bytes: usize,
    pub(super) src_y: usize,
    pub(super) src_memory_type: c_uint,
    pub(super) src_host: *const c_void,
    pub(super) src_device: DevicePtr,
    pub(super) src_array: *mut c_void,
    pub(super) src_pitch: usize,
    pub(super) dst_x_in_bytes: usize,
    pub(super) dst_y: usize,
    pub(super) dst_memory_type: c_uint,
    pub(super) dst_host: *mut c_void,
    pub(super) dst_device: DevicePtr,
    pub(super) dst_array: *mut c_void,
    pub(super) dst_pitch: usize,
    pub(super) width_in_bytes: usize,
    pub(super) height: usize,
}

/// Device memory from `cuMemAlloc`, freed in its device's context.
pub(super) struct DeviceBuffer {
    pub(super) ptr: DevicePtr,
    device_id: i32,
}

impl DeviceBuffer {
    pub(super) fn new(device_id: i32, len: usize) -> Result<Self, Error> {
        in_context(device_id, |api| {
            let mut ptr = 0;
            // SAFETY: an allocation with a writable out pointer.
            host_side(api, || check("cuMemAlloc", unsafe { (api.mem_alloc)(&mut ptr, len.max(1)) }))?;
            Ok(DeviceBuffer { ptr, device_id })
        })
    }

    /// Managed memory (`cuMemAllocManaged`), readable and writable from the
    /// host as from the device; freed by `cuMemFree` as well.
    pub(super) fn new_managed(device_id: i32, len: usize) -> Result<Self, Error> {
        in_context(device_id, |api| {
            let mut ptr = 0;
            // SAFETY: an allocation with a writable out pointer.
            host_side(api, || check("cuMemAllocManaged", unsafe { (api.mem_alloc_managed)(&mut ptr, len.max(1), CU_MEM_ATTACH_GLOBAL) }))?;
            Ok(DeviceBuffer { ptr, device_id })
        })
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let ptr = self.ptr;
        // SAFETY: allocated by `new` on this device, freed once (the driver
        // waits for the device's work first: a blocking call).
        let _ = in_context(self.device_id, |api| host_side(api, || check("cuMemFree", unsafe { (api.mem_free)(ptr) })));
    }
}

/// Page-locked host memory from `cuMemAllocHost`, which copies at full link
/// speed; allocated and freed with a device's context current, as the driver
/// requires.
pub(super) struct PinnedBuffer {
    pub(super) ptr: NonNull<u8>,
    device_id: i32,
}

// SAFETY: plain host memory owned by this value alone.
unsafe impl Send for PinnedBuffer {}

impl PinnedBuffer {
    pub(super) fn new(device_id: i32, len: usize) -> Result<Self, Error> {
        in_context(device_id, |api| {
            let mut ptr = core::ptr::null_mut();
            // SAFETY: an allocation with a writable out pointer.
            host_side(api, || check("cuMemAllocHost", unsafe { (api.mem_alloc_host)(&mut ptr, len.max(1)) }))?;
            let ptr = NonNull::new(ptr.cast()).ok_or(Error::AllocationFailed { bytes: len })?;
            Ok(PinnedBuffer { ptr, device_id })
        })
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        let ptr = self.ptr.as_ptr().cast();
        // SAFETY: allocated by `new`, freed once.
        let _ = in_context(self.device_id, |api| host_side(api, || check("cuMemFreeHost", unsafe { (api.mem_free_host)(ptr) })));
    }
}
