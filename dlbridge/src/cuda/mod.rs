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
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | loading the driver, contexts, stream hand-off, pointer attributes |
//! | `copies.rs` | device and pinned buffers; copies to the host, to a device, on a device |

mod copies;

pub use copies::{copy_on_device, to_device, to_host};

use core::ffi::{c_int, c_uint, c_void};
use std::sync::{Mutex, OnceLock};

use crate::error::Error;
use crate::streams::SyncPlan;
#[cfg(doc)]
use crate::view::TensorView;
use crate::Device;

type CuResult = c_uint;
type Handle = *mut c_void;
type DevicePtr = u64;

const CUDA_SUCCESS: CuResult = 0;
const CUDA_ERROR_INVALID_CONTEXT: CuResult = 201;
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
    mem_alloc_managed: unsafe extern "C" fn(*mut DevicePtr, usize, c_uint) -> CuResult,
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
        mem_alloc_managed: symbol!("cuMemAllocManaged"),
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

/// Blocks the host until the work queued on `ready` so far is done: for
/// CUDA managed memory that the host is about to read. -1 (unknown) waits for
/// nothing.
///
/// # Safety
/// As [`order_streams`], for `ready`.
pub unsafe fn wait_on_host(device_id: i32, ready: i64) -> Result<(), Error> {
    if ready == -1 {
        return Ok(());
    }
    in_context(device_id, |api| {
        // SAFETY: a stream the caller vouches for.
        check("cuStreamSynchronize", unsafe { (api.stream_synchronize)(stream_handle(ready)) })
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
/// Asked with no context first (unified addressing needs none); a driver that
/// wants one is asked again with the context of `likely_device`, the device
/// the caller expects (so that no other device's context is created).
pub fn pointer_device(address: usize, likely_device: i32) -> Result<i32, Error> {
    let query = |api: &Api| {
        let mut ordinal: c_int = 0;
        // SAFETY: a query with a writable out value; any address is allowed (an
        // unknown one is an error code).
        let code = unsafe {
            (api.pointer_get_attribute)((&mut ordinal as *mut c_int).cast(), CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, address as DevicePtr)
        };
        check("cuPointerGetAttribute", code).map(|()| ordinal)
    };
    match query(api()?) {
        Err(Error::Cuda { code: CUDA_ERROR_INVALID_CONTEXT, .. }) => in_context(likely_device, |api| query(api)),
        other => other,
    }
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
        assert!(matches!(pointer_device(0x1000, 0), Err(Error::CudaUnavailable { .. })));
        let t = crate::OwnedTensor::from_vec(vec![1.0f32; 4], &[4]).unwrap();
        assert!(matches!(to_device::<crate::ffi::DLManagedTensorVersioned>(t.view(), 0), Err(Error::CudaUnavailable { .. })));
        let message = driver_available().unwrap_err().to_string();
        assert!(message.contains("libcuda"), "{message}");
    }
}
