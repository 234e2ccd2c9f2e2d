//! CUDA through the driver API (feature `cuda`): stream hand-off with events
//! and no host synchronisation, copies between host and device, and the device
//! a pointer lives on.
//!
//! The driver is loaded when first needed (`libcuda.so`, found by cudarc's
//! loader), so a build with this feature runs on a machine with no CUDA: every
//! function here then returns [`Error::CudaUnavailable`]. The few driver
//! functions used are declared here returning the raw `CUresult`, so that an
//! error code newer than any bindings is a number, never an invalid enum.
//!
//! Device memory is never read on the host; a view of device memory carries
//! the producer's promise (made to [`TensorView::from_dltensor`]) that the
//! bytes it reaches are valid device memory.

use core::ffi::{c_int, c_uint, c_void};
use core::ptr::NonNull;
use std::sync::{Mutex, OnceLock};

use crate::error::Error;
use crate::export::{export_raw, RawLayout};
use crate::owned::{ManagedAbi, Owned};
use crate::streams::SyncPlan;
use crate::view::TensorView;
use crate::{Device, DeviceType};

type CuResult = c_uint;
type Handle = *mut c_void;
type DevicePtr = u64;

const CUDA_SUCCESS: CuResult = 0;
const CU_EVENT_DISABLE_TIMING: c_uint = 2;
const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_uint = 9;

/// The driver functions dlbridge calls.
struct Api {
    init: unsafe extern "C" fn(c_uint) -> CuResult,
    device_get: unsafe extern "C" fn(*mut c_int, c_int) -> CuResult,
    primary_ctx_retain: unsafe extern "C" fn(*mut Handle, c_int) -> CuResult,
    ctx_push: unsafe extern "C" fn(Handle) -> CuResult,
    ctx_pop: unsafe extern "C" fn(*mut Handle) -> CuResult,
    event_create: unsafe extern "C" fn(*mut Handle, c_uint) -> CuResult,
    event_record: unsafe extern "C" fn(Handle, Handle) -> CuResult,
    event_destroy: unsafe extern "C" fn(Handle) -> CuResult,
    stream_wait_event: unsafe extern "C" fn(Handle, Handle, c_uint) -> CuResult,
    stream_synchronize: unsafe extern "C" fn(Handle) -> CuResult,
    pointer_get_attribute: unsafe extern "C" fn(*mut c_void, c_uint, DevicePtr) -> CuResult,
    mem_alloc: unsafe extern "C" fn(*mut DevicePtr, usize) -> CuResult,
    mem_free: unsafe extern "C" fn(DevicePtr) -> CuResult,
    mem_alloc_host: unsafe extern "C" fn(*mut *mut c_void, usize) -> CuResult,
    mem_free_host: unsafe extern "C" fn(*mut c_void) -> CuResult,
    memcpy_dtoh_async: unsafe extern "C" fn(*mut c_void, DevicePtr, usize, Handle) -> CuResult,
    memcpy_htod: unsafe extern "C" fn(DevicePtr, *const c_void, usize) -> CuResult,
    memcpy_dtod_async: unsafe extern "C" fn(DevicePtr, DevicePtr, usize, Handle) -> CuResult,
}

fn check(call: &'static str, code: CuResult) -> Result<(), Error> {
    if code == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::Cuda { call, code })
    }
}

fn load() -> Result<Api, Error> {
    // SAFETY: only tries to open the library by its usual names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(Error::CudaUnavailable { reason: "the CUDA driver library (libcuda.so) was not found".into() });
    }
    // SAFETY: present (checked just above), so the loader does not panic; the
    // library stays loaded for the process.
    let lib = unsafe { cudarc::driver::sys::culib() };
    macro_rules! symbol {
        ($name:literal) => {
            // SAFETY: each symbol is declared with the driver API's C signature
            // (`CUresult` as its underlying unsigned int).
            *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                .map_err(|_| Error::CudaUnavailable { reason: format!("the CUDA driver has no {}", $name) })?
        };
    }
    let api = Api {
        init: symbol!("cuInit"),
        device_get: symbol!("cuDeviceGet"),
        primary_ctx_retain: symbol!("cuDevicePrimaryCtxRetain"),
        ctx_push: symbol!("cuCtxPushCurrent_v2"),
        ctx_pop: symbol!("cuCtxPopCurrent_v2"),
        event_create: symbol!("cuEventCreate"),
        event_record: symbol!("cuEventRecord"),
        event_destroy: symbol!("cuEventDestroy_v2"),
        stream_wait_event: symbol!("cuStreamWaitEvent"),
        stream_synchronize: symbol!("cuStreamSynchronize"),
        pointer_get_attribute: symbol!("cuPointerGetAttribute"),
        mem_alloc: symbol!("cuMemAlloc_v2"),
        mem_free: symbol!("cuMemFree_v2"),
        mem_alloc_host: symbol!("cuMemAllocHost_v2"),
        mem_free_host: symbol!("cuMemFreeHost"),
        memcpy_dtoh_async: symbol!("cuMemcpyDtoHAsync_v2"),
        memcpy_htod: symbol!("cuMemcpyHtoD_v2"),
        memcpy_dtod_async: symbol!("cuMemcpyDtoDAsync_v2"),
    };
    // SAFETY: cuInit may be called any number of times.
    check("cuInit", unsafe { (api.init)(0) }).map_err(|err| Error::CudaUnavailable { reason: err.to_string() })?;
    Ok(api)
}

fn api() -> Result<&'static Api, Error> {
    static API: OnceLock<Result<Api, Error>> = OnceLock::new();
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// Whether a CUDA driver could be loaded and initialised, or why not.
pub fn driver_available() -> Result<(), Error> {
    api().map(|_| ())
}

/// The handle of a DLPack stream value: 1 and 2 are the driver's own
/// `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`; others are handles.
fn stream_handle(value: i64) -> Handle {
    // A handle is an opaque number to the host; it is never dereferenced here.
    core::ptr::without_provenance_mut(value as usize)
}

/// The stream to queue work on for data ready on `ready`: the legacy default
/// when none is known (`None`, or -1 from a producer told not to synchronise).
fn queue_on(ready: Option<i64>) -> Handle {
    stream_handle(ready.filter(|&s| s > 0).unwrap_or(1))
}

/// Runs `body` with the device's primary context current (the one torch, CuPy
/// and JAX use), retained once per device for the process.
fn in_context<T>(device_id: i32, body: impl FnOnce(&Api) -> Result<T, Error>) -> Result<T, Error> {
    static CONTEXTS: Mutex<Vec<(i32, usize)>> = Mutex::new(Vec::new());
    let api = api()?;
    let mut contexts = CONTEXTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let context = match contexts.iter().find(|(id, _)| *id == device_id) {
        Some(&(_, context)) => context,
        None => {
            let (mut device, mut context) = (0, core::ptr::null_mut());
            // SAFETY: driver calls with writable out pointers.
            unsafe {
                check("cuDeviceGet", (api.device_get)(&mut device, device_id))?;
                check("cuDevicePrimaryCtxRetain", (api.primary_ctx_retain)(&mut context, device))?;
            }
            contexts.push((device_id, context as usize));
            context as usize
        }
    };
    drop(contexts);
    // SAFETY: a retained primary context, made current on this thread for the
    // body and popped after it.
    check("cuCtxPushCurrent", unsafe { (api.ctx_push)(core::ptr::without_provenance_mut(context)) })?;
    let out = body(api);
    let mut popped = core::ptr::null_mut();
    // SAFETY: pops the context pushed above.
    let _ = unsafe { (api.ctx_pop)(&mut popped) };
    out
}

/// Makes `consumer` wait for the work queued on `ready` so far, without
/// blocking the host: an event recorded on `ready` and waited on by `consumer`.
///
/// # Safety
/// Each stream value is 1 (legacy default), 2 (per-thread default) or the
/// handle of a live stream of device `device_id`: the driver dereferences it.
pub unsafe fn order_streams(device_id: i32, ready: i64, consumer: i64) -> Result<(), Error> {
    in_context(device_id, |api| {
        let mut event = core::ptr::null_mut();
        // SAFETY: driver calls on the current context, with streams named by
        // the producer and consumer. The event is destroyed once the wait is
        // queued: the driver releases it when the wait completes.
        unsafe {
            check("cuEventCreate", (api.event_create)(&mut event, CU_EVENT_DISABLE_TIMING))?;
            let recorded = check("cuEventRecord", (api.event_record)(event, stream_handle(ready)));
            let waited = recorded.and_then(|()| check("cuStreamWaitEvent", (api.stream_wait_event)(stream_handle(consumer), event, 0)));
            let _ = (api.event_destroy)(event);
            waited
        }
    })
}

/// Carries out a [`SyncPlan`] for memory on `device`.
///
/// # Safety
/// As [`order_streams`], for the plan's streams.
pub unsafe fn carry_out(device: Device, plan: SyncPlan) -> Result<(), Error> {
    match plan {
        SyncPlan::Nothing => Ok(()),
        // SAFETY: forwarded from the caller.
        SyncPlan::Wait { ready, consumer } => unsafe { order_streams(device.device_id, ready, consumer) },
    }
}

/// The ordinal of the device that `address` (a CUDA pointer) belongs to.
pub fn pointer_device(address: usize) -> Result<i32, Error> {
    let api = api()?;
    let mut ordinal: c_int = 0;
    // SAFETY: a query with a writable out value; any address is allowed (an
    // unknown one is an error code).
    check("cuPointerGetAttribute", unsafe {
        (api.pointer_get_attribute)((&mut ordinal as *mut c_int).cast(), CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, address as DevicePtr)
    })?;
    Ok(ordinal)
}

/// Device memory from `cuMemAlloc`, freed in its device's context.
struct DeviceBuffer {
    ptr: DevicePtr,
    device_id: i32,
}

impl DeviceBuffer {
    fn new(device_id: i32, len: usize) -> Result<Self, Error> {
        in_context(device_id, |api| {
            let mut ptr = 0;
            // SAFETY: an allocation with a writable out pointer.
            check("cuMemAlloc", unsafe { (api.mem_alloc)(&mut ptr, len.max(1)) })?;
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

/// Page-locked host memory from `cuMemAllocHost`, which copies at full link speed.
struct PinnedBuffer {
    ptr: NonNull<u8>,
}

// SAFETY: plain host memory owned by this value alone.
unsafe impl Send for PinnedBuffer {}

impl PinnedBuffer {
    fn new(len: usize) -> Result<Self, Error> {
        let api = api()?;
        let mut ptr = core::ptr::null_mut();
        // SAFETY: an allocation with a writable out pointer.
        check("cuMemAllocHost", unsafe { (api.mem_alloc_host)(&mut ptr, len.max(1)) })?;
        let ptr = NonNull::new(ptr.cast()).ok_or(Error::AllocationFailed { bytes: len })?;
        Ok(PinnedBuffer { ptr })
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // SAFETY: allocated by `new`, freed once.
            let _ = unsafe { (api.mem_free_host)(self.ptr.as_ptr().cast()) };
        }
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
        _ => Err(Error::UnsupportedDtype { dtype: view.dtype(), operation: "a CUDA copy of memory not on CUDA" }),
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
        if ready.is_some() && view.device().device_type.has_streams() {
            // A kernel may still be writing managed memory on that stream.
            in_context(view.device().device_id, |api| {
                // SAFETY: a stream the caller vouches for.
                check("cuStreamSynchronize", unsafe { (api.stream_synchronize)(queue_on(ready)) })
            })?;
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
        let buffer = PinnedBuffer::new(len)?;
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
    let bytes = view.as_bytes().ok_or(Error::NotCpuAccessible { device: view.device() })?;
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

/// A copy of a CUDA tensor in fresh memory on the same device, with the same
/// layout, queued on `ready` (the stream its data is ready on, which the copy
/// is then ready on too): no host synchronisation. IS_COPIED is set.
///
/// # Safety
/// As [`to_host`], for `ready`.
pub unsafe fn copy_on_device<M: ManagedAbi>(view: &TensorView<'_>, ready: Option<i64>) -> Result<Owned<M>, Error> {
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
    let mut owned: Owned<M> = unsafe { export_raw(buffer, data, layout_of(view, view.device()), padded) }?;
    owned.mark_copied();
    Ok(owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "loads a shared library")]
    fn without_a_driver_every_call_says_so() {
        if driver_available().is_ok() {
            return; // a machine with CUDA: the GPU suite covers it
        }
        assert!(matches!(driver_available(), Err(Error::CudaUnavailable { .. })));
        // SAFETY: the two default streams; no driver is loaded anyway.
        assert!(matches!(unsafe { order_streams(0, 1, 2) }, Err(Error::CudaUnavailable { .. })));
        assert!(matches!(pointer_device(0x1000), Err(Error::CudaUnavailable { .. })));
        let t = crate::OwnedTensor::from_vec(vec![1.0f32; 4], &[4]).unwrap();
        assert!(matches!(to_device::<crate::ffi::DLManagedTensorVersioned>(t.view(), 0), Err(Error::CudaUnavailable { .. })));
        let message = driver_available().unwrap_err().to_string();
        assert!(message.contains("libcuda"), "{message}");
    }
}
