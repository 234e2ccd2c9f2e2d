//! Memory the driver allocates for dlbridge: device (or managed) memory and
//! page-locked host memory, each freed by its owner's `Drop` in stream order
//! (`release.rs`); and the driver's 2-D copy description.
//!
//! Device memory comes from the device's pool, ordered on the stream that
//! first uses it (`cuMemAllocAsync`), where the device has pools and that
//! stream is not capturing a graph; otherwise from `cuMemAlloc`, usable on any
//! stream at once.

use core::ffi::{c_uint, c_void};
use core::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError};

use super::release::{self, Block};
use super::{capturing, check, has_pools, host_side, in_context, stream_handle, Api, DevicePtr, LEGACY};
use crate::error::Error;

/// `CU_MEM_ATTACH_GLOBAL`: managed memory any stream may reach.
const CU_MEM_ATTACH_GLOBAL: c_uint = 1;
const CUDA_ERROR_OUT_OF_MEMORY: u32 = 2;

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

/// Events (of the buffer's context) that mark work dlbridge queued on the
/// memory on streams other than the legacy one: its free waits for them.
pub(super) type Writers = Arc<Mutex<Vec<usize>>>;

/// An event marking the work queued on `stream` so far, for a free to wait
/// for: none for the legacy stream, which the free is ordered on, nor for a
/// stream that captures a graph (that work runs only with the graph, and
/// waiting on it from outside would break the capture).
///
/// # Safety
/// `stream` is 1, 2 or a live stream of the current context.
pub(super) unsafe fn writer_event(api: &Api, stream: i64) -> Result<Option<usize>, Error> {
    if stream == LEGACY || capturing(api, stream)? {
        return Ok(None);
    }
    // SAFETY: forwarded from the caller.
    unsafe { release::record(api, stream) }.map(Some)
}

/// Runs an allocation; out of memory, once more after the frees still waiting
/// on the release thread are done.
fn allocating(api: &Api, mut allocate: impl FnMut() -> Result<(), Error>) -> Result<(), Error> {
    match host_side(api, &mut allocate) {
        Err(Error::Cuda { code: CUDA_ERROR_OUT_OF_MEMORY, .. }) => {
            release::drain();
            host_side(api, allocate)
        }
        other => other,
    }
}

/// Device memory dlbridge owns, freed in its device's context.
pub(super) struct DeviceBuffer {
    pub(super) ptr: DevicePtr,
    device_id: i32,
    /// From the device's pool (freed with `cuMemFreeAsync`).
    pooled: bool,
    pub(super) writers: Writers,
}

impl DeviceBuffer {
    /// `len` bytes of device memory for work queued on `stream` (1, 2 or a live
    /// stream of the device): from the pool in that stream's order, or usable
    /// everywhere at once when the device has no pools or `stream` captures.
    ///
    /// # Safety
    /// `stream` is 1, 2 or the handle of a live stream of the device.
    pub(super) unsafe fn new(device_id: i32, len: usize, stream: i64) -> Result<Self, Error> {
        in_context(device_id, |api| {
            let mut ptr = 0;
            // A graph would own a pool allocation made while it captures.
            let pooled = has_pools(device_id) && !capturing(api, stream)?;
            match (pooled, api.mem_alloc_async) {
                (true, Some(alloc_async)) => {
                    // SAFETY: an allocation with a writable out pointer, on the caller's stream.
                    allocating(api, || check("cuMemAllocAsync", unsafe { alloc_async(&mut ptr, len.max(1), stream_handle(stream)) }))?
                }
                // SAFETY: an allocation with a writable out pointer.
                _ => allocating(api, || check("cuMemAlloc", unsafe { (api.mem_alloc)(&mut ptr, len.max(1)) }))?,
            }
            Ok(DeviceBuffer { ptr, device_id, pooled: pooled && api.mem_alloc_async.is_some(), writers: Writers::default() })
        })
    }

    /// Managed memory (`cuMemAllocManaged`), readable and writable from the
    /// host as from the device; freed by `cuMemFree` as well.
    pub(super) fn new_managed(device_id: i32, len: usize) -> Result<Self, Error> {
        in_context(device_id, |api| {
            let mut ptr = 0;
            // SAFETY: an allocation with a writable out pointer.
            allocating(api, || check("cuMemAllocManaged", unsafe { (api.mem_alloc_managed)(&mut ptr, len.max(1), CU_MEM_ATTACH_GLOBAL) }))?;
            Ok(DeviceBuffer { ptr, device_id, pooled: false, writers: Writers::default() })
        })
    }

    /// Notes that work queued on `stream` of the current context (this
    /// buffer's) uses the memory: the free waits for it.
    ///
    /// # Safety
    /// `stream` is 1, 2 or a live stream of the current context.
    pub(super) unsafe fn used_on(&self, api: &Api, stream: i64) -> Result<(), Error> {
        // SAFETY: forwarded from the caller.
        if let Some(event) = unsafe { writer_event(api, stream) }? {
            self.writers.lock().unwrap_or_else(PoisonError::into_inner).push(event);
        }
        Ok(())
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let writers = core::mem::take(&mut *self.writers.lock().unwrap_or_else(PoisonError::into_inner));
        release::free(Block::Device { ptr: self.ptr, pooled: self.pooled }, self.device_id, writers);
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
            allocating(api, || check("cuMemAllocHost", unsafe { (api.mem_alloc_host)(&mut ptr, len.max(1)) }))?;
            let ptr = NonNull::new(ptr.cast()).ok_or(Error::AllocationFailed { bytes: len })?;
            Ok(PinnedBuffer { ptr, device_id })
        })
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        release::free(Block::Pinned(self.ptr.as_ptr() as usize), self.device_id, Vec::new());
    }
}
